#include "meta/bitmap_space_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "core/check.h"
#include "meta/format.h"

namespace thinfs::meta {

static_assert(offsetof(BitmapHeaderDisk, magic) == 0);
static_assert(offsetof(BitmapHeaderDisk, format_version) == 8);
static_assert(offsetof(BitmapHeaderDisk, incompat_flags) == 12);
static_assert(offsetof(BitmapHeaderDisk, block_size) == 16);
static_assert(offsetof(BitmapHeaderDisk, nr_blocks) == 24);
static_assert(offsetof(BitmapHeaderDisk, generation) == 32);
static_assert(offsetof(BitmapHeaderDisk, clean) == 40);
static_assert(offsetof(BitmapHeaderDisk, body_checksum) == 48);
static_assert(offsetof(BitmapHeaderDisk, header_checksum) == 56);

namespace {

constexpr uint64_t Le64(uint64_t v) {
  if constexpr (std::endian::native == std::endian::little) {
    return v;
  } else {
    return __builtin_bswap64(v);
  }
}
constexpr uint32_t Le32(uint32_t v) {
  if constexpr (std::endian::native == std::endian::little) {
    return v;
  } else {
    return __builtin_bswap32(v);
  }
}

// In-core view of the header, in host byte order.
struct BitmapHeader {
  uint64_t magic = kBitmapMagic;
  uint32_t format_version = kBitmapFormatVersion;
  uint32_t incompat_flags = 0;
  uint64_t block_size = 0;
  uint64_t nr_blocks = 0;
  uint64_t generation = 0;
  uint32_t clean = 0;
  uint64_t body_checksum = 0;
  uint64_t header_checksum = 0;
};

uint64_t HeaderChecksum(const std::byte* page) {
  std::array<std::byte, kBitmapHeaderSize> copy;
  std::memcpy(copy.data(), page, copy.size());
  std::memset(copy.data() + offsetof(BitmapHeaderDisk, header_checksum), 0, sizeof(uint64_t));
  return XXH64(copy.data(), copy.size(), kBitmapChecksumSeed);
}

// Fills the whole header page: the encoded header, zeros, and the checksum.
void EncodeHeader(const BitmapHeader& h, std::byte* page) {
  BitmapHeaderDisk d{};
  d.magic = Le64(h.magic);
  d.format_version = Le32(h.format_version);
  d.incompat_flags = Le32(h.incompat_flags);
  d.block_size = Le64(h.block_size);
  d.nr_blocks = Le64(h.nr_blocks);
  d.generation = Le64(h.generation);
  d.clean = Le32(h.clean);
  d.reserved = 0;
  d.body_checksum = Le64(h.body_checksum);
  d.header_checksum = 0;
  std::memset(page, 0, kBitmapHeaderSize);
  std::memcpy(page, &d, sizeof d);
  const uint64_t checksum = Le64(HeaderChecksum(page));
  std::memcpy(page + offsetof(BitmapHeaderDisk, header_checksum), &checksum, sizeof checksum);
}

BitmapHeader DecodeHeader(const std::byte* page) {
  BitmapHeaderDisk d;
  std::memcpy(&d, page, sizeof d);
  BitmapHeader h;
  h.magic = Le64(d.magic);
  h.format_version = Le32(d.format_version);
  h.incompat_flags = Le32(d.incompat_flags);
  h.block_size = Le64(d.block_size);
  h.nr_blocks = Le64(d.nr_blocks);
  h.generation = Le64(d.generation);
  h.clean = Le32(d.clean);
  h.body_checksum = Le64(d.body_checksum);
  h.header_checksum = Le64(d.header_checksum);
  return h;
}

// The offset of the first nonzero byte among those the header reserves
// (the `reserved` field and everything after the fields), 0 if none.
size_t FirstNonzeroReservedByte(const std::byte* page) {
  for (size_t i = offsetof(BitmapHeaderDisk, reserved); i < kBitmapHeaderSize; ++i) {
    if (i == offsetof(BitmapHeaderDisk, body_checksum)) i = sizeof(BitmapHeaderDisk);
    if (page[i] != std::byte{0}) return i;
  }
  return 0;
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

std::string Mismatch(const std::string& what, const std::string& expected,
                     const std::string& found) {
  return "bitmap " + what + ": expected " + expected + ", found " + found;
}

uint64_t TailMask(uint64_t nr_blocks) {
  uint64_t r = nr_blocks & 63;
  return r == 0 ? 0 : ~((uint64_t{1} << r) - 1);
}

// Owns a file descriptor until released.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Reserves the file's blocks as well as its size: a write through the
// mapping into a hole of a full file system would be a SIGBUS.
Status ExtendFile(int fd, uint64_t len, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "stat bitmap " + path);
  if (static_cast<uint64_t>(st.st_size) < len && ::ftruncate(fd, static_cast<off_t>(len)) != 0) {
    return Status::FromErrno(errno, "extend bitmap " + path);
  }
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(len));
  // Some file systems cannot preallocate; the size is set either way.
  if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    return Status::FromErrno(err, "allocate bitmap " + path);
  }
  return Status::Ok();
}

Status FsyncParentDir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open directory " + dir);
  ScopedFd guard(fd);
  if (::fsync(fd) != 0) return Status::FromErrno(errno, "fsync directory " + dir);
  return Status::Ok();
}

}  // namespace

BitmapSpaceMap::BitmapSpaceMap(std::string path, int fd, bool read_only, uint64_t block_size,
                               std::byte* base, uint64_t map_len, uint64_t nr_blocks,
                               uint64_t generation, bool clean)
    : path_(std::move(path)),
      fd_(fd),
      read_only_(read_only),
      block_size_(block_size),
      was_clean_(clean),
      base_(base),
      map_len_(map_len),
      nr_blocks_(nr_blocks),
      nr_words_(BitmapBodyBytes(nr_blocks) / 8),
      tail_mask_(TailMask(nr_blocks)),
      generation_(generation),
      clean_(clean),
      pending_bits_(nr_words_, 0) {
  MutexLock l(&mu_);
  uint64_t used = 0;
  for (uint64_t i = 0; i < nr_words_; ++i) {
    uint64_t w = Word(i);
    // Padding bits are not blocks, set or not.
    if (i + 1 == nr_words_) w &= ~tail_mask_;
    used += static_cast<uint64_t>(std::popcount(w));
  }
  free_blocks_ = nr_blocks_ - used;
}

BitmapSpaceMap::~BitmapSpaceMap() {
  MutexLock l(&mu_);
  ::munmap(base_, map_len_);
  ::close(fd_);
}

Result<std::unique_ptr<BitmapSpaceMap>> BitmapSpaceMap::Create(const std::string& path,
                                                               uint64_t blocks,
                                                               uint64_t block_size) {
  const char* why = Geometry::Validate(block_size);
  if (why[0] != '\0') return Status::InvalidArgument(std::string("bitmap ") + why);
  int raw = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (raw < 0) return Status::FromErrno(errno, "create bitmap " + path);
  ScopedFd fd(raw);
  const uint64_t len = kBitmapHeaderSize + BitmapBodyBytes(blocks);
  auto fail = [&](Status s) {
    ::unlink(path.c_str());
    return s;
  };
  if (Status s = ExtendFile(fd.get(), len, path); !s.ok()) return fail(s);
  void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return fail(Status::FromErrno(errno, "mmap bitmap " + path));
  std::unique_ptr<BitmapSpaceMap> map(new BitmapSpaceMap(
      path, fd.release(), false, block_size, static_cast<std::byte*>(base), len, blocks, 0, true));
  HeaderPage page;
  {
    MutexLock l(&map->mu_);
    page = map->EncodeHeaderPage(true, blocks, 0);
  }
  if (Status s = map->WriteHeaderPage(page); !s.ok()) {
    map.reset();
    return fail(s);
  }
  // fsync rather than msync: the file's size must be durable too.
  if (::fsync(map->fd_) != 0) {
    Status s = Status::FromErrno(errno, "fsync bitmap " + path);
    map.reset();
    return fail(s);
  }
  if (Status s = FsyncParentDir(path); !s.ok()) {
    map.reset();
    return fail(s);
  }
  return map;
}

Result<std::unique_ptr<BitmapSpaceMap>> BitmapSpaceMap::Open(const std::string& path,
                                                             uint64_t expected_blocks,
                                                             uint64_t expected_block_size,
                                                             bool read_only) {
  int raw = ::open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (raw < 0) return Status::FromErrno(errno, "open bitmap " + path);
  ScopedFd fd(raw);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat bitmap " + path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kBitmapHeaderSize) {
    return Status::Corruption(
        Mismatch("file truncated", "at least 4096 bytes", std::to_string(size) + " bytes") +
        " in " + path);
  }

  std::array<std::byte, kBitmapHeaderSize> page;
  size_t done = 0;
  while (done < page.size()) {
    ssize_t n = ::pread(fd.get(), page.data() + done, page.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read bitmap header " + path);
    }
    if (n == 0) return Status::Corruption("bitmap header: unexpected end of file in " + path);
    done += static_cast<size_t>(n);
  }
  const BitmapHeader h = DecodeHeader(page.data());

  // Magic first, so that a foreign file is named as such; then the header
  // checksum, so that every other field is trusted only once it matches.
  if (h.magic != kBitmapMagic) {
    return Status::Corruption(Mismatch("magic mismatch", Hex(kBitmapMagic), Hex(h.magic)) + " in " +
                              path);
  }
  const uint64_t header_sum = HeaderChecksum(page.data());
  if (header_sum != h.header_checksum) {
    return Status::Corruption(
        Mismatch("header checksum mismatch", Hex(h.header_checksum), Hex(header_sum)) + " in " +
        path);
  }
  if (h.format_version != kBitmapFormatVersion) {
    return Status::NotSupported(Mismatch("format version unsupported",
                                         std::to_string(kBitmapFormatVersion),
                                         std::to_string(h.format_version)) +
                                " in " + path);
  }
  if ((h.incompat_flags & ~kBitmapIncompatSupported) != 0) {
    return Status::NotSupported(Mismatch("incompat flags unsupported",
                                         Hex(kBitmapIncompatSupported), Hex(h.incompat_flags)) +
                                " in " + path);
  }
  if (h.clean > 1) {
    return Status::Corruption(Mismatch("clean flag invalid", "0 or 1", std::to_string(h.clean)) +
                              " in " + path);
  }
  // Version 1 has no use for the reserved field or the rest of the page:
  // anything there was not written by thinfs (found by
  // fuzz/bitmap_header_fuzzer.cc).
  if (const size_t nonzero = FirstNonzeroReservedByte(page.data()); nonzero != 0) {
    return Status::Corruption(Mismatch("reserved header byte " + std::to_string(nonzero) +
                                           " not zero",
                                       "0", Hex(static_cast<uint8_t>(page[nonzero]))) +
                              " in " + path);
  }
  if (h.block_size != expected_block_size) {
    return Status::InvalidArgument(Mismatch("geometry mismatch: block size",
                                            std::to_string(expected_block_size),
                                            std::to_string(h.block_size)) +
                                   " in " + path);
  }
  // The superblock's bound (meta::ValidateSuperblock): a larger count is
  // no pool's, and would overflow the body size below (found by
  // fuzz/bitmap_header_fuzzer.cc: 2^64 - 1 blocks made a 0-byte body).
  const uint64_t max_blocks =
      h.block_size == 0 ? 0 : static_cast<uint64_t>(std::numeric_limits<off_t>::max()) / h.block_size;
  if (h.nr_blocks > max_blocks) {
    return Status::Corruption(Mismatch("block count out of range",
                                       "at most " + std::to_string(max_blocks),
                                       std::to_string(h.nr_blocks)) +
                              " in " + path);
  }
  // Larger is a grow interrupted between the bitmap and the superblock
  // (Pool::Grow grows the bitmap first); the pool completes it at open.
  if (h.nr_blocks < expected_blocks) {
    return Status::InvalidArgument(Mismatch("geometry mismatch: block count",
                                            "at least " + std::to_string(expected_blocks),
                                            std::to_string(h.nr_blocks)) +
                                   " in " + path);
  }
  const uint64_t len = kBitmapHeaderSize + BitmapBodyBytes(h.nr_blocks);
  // Longer is fine: a grow extends the file before it rewrites the header.
  if (size < len) {
    return Status::Corruption(Mismatch("file truncated", std::to_string(len) + " bytes",
                                       std::to_string(size) + " bytes") +
                              " in " + path);
  }

  const int prot = read_only ? PROT_READ : PROT_READ | PROT_WRITE;
  void* base = ::mmap(nullptr, len, prot, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return Status::FromErrno(errno, "mmap bitmap " + path);
  std::unique_ptr<BitmapSpaceMap> map(
      new BitmapSpaceMap(path, fd.release(), read_only, h.block_size, static_cast<std::byte*>(base),
                         len, h.nr_blocks, h.generation, h.clean == 1));
  if (h.clean == 1) {
    MutexLock l(&map->mu_);
    const uint64_t body_sum = map->BodyChecksum(map->nr_blocks_);
    if (body_sum != h.body_checksum) {
      return Status::Corruption(
          Mismatch("body checksum mismatch", Hex(h.body_checksum), Hex(body_sum)) + " in " + path);
    }
  }
  return map;
}

uint64_t BitmapSpaceMap::Word(uint64_t i) const {
  return Le64(reinterpret_cast<const uint64_t*>(base_ + kBitmapHeaderSize)[i]);
}

void BitmapSpaceMap::SetWord(uint64_t i, uint64_t w) {
  uint64_t& word = reinterpret_cast<uint64_t*>(base_ + kBitmapHeaderSize)[i];
  if (word != Le64(w)) changed_since_sync_ = true;
  word = Le64(w);
}

bool BitmapSpaceMap::TestBit(uint64_t block) const {
  return ((Word(block >> 6) >> (block & 63)) & 1) != 0;
}

uint64_t BitmapSpaceMap::BodyChecksum(uint64_t nr_blocks) const {
  return XXH64(base_ + kBitmapHeaderSize, BitmapBodyBytes(nr_blocks), kBitmapChecksumSeed);
}

BitmapSpaceMap::HeaderPage BitmapSpaceMap::EncodeHeaderPage(bool clean, uint64_t nr_blocks,
                                                            uint64_t generation) const {
  BitmapHeader h;
  h.block_size = block_size_;
  h.nr_blocks = nr_blocks;
  h.generation = generation;
  h.clean = clean ? 1 : 0;
  h.body_checksum = clean ? BodyChecksum(nr_blocks) : 0;
  HeaderPage page;
  EncodeHeader(h, page.data());
  return page;
}

Status BitmapSpaceMap::WriteHeaderPage(const HeaderPage& page) const {
  const ssize_t n = ::pwrite(fd_, page.data(), page.size(), 0);
  if (n < 0) return Status::FromErrno(errno, "write bitmap header " + path_);
  if (static_cast<size_t>(n) != page.size()) {
    return Status::IOError("write bitmap header " + path_ + ": wrote " + std::to_string(n) +
                           " of " + std::to_string(page.size()) + " bytes");
  }
  return Status::Ok();
}

Status BitmapSpaceMap::MsyncRange(std::byte* base, uint64_t offset, uint64_t len) {
  if (len == 0) return Status::Ok();
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  if (::msync(base + start, offset + len - start, MS_SYNC) != 0) {
    return Status::FromErrno(errno, "msync bitmap");
  }
  return Status::Ok();
}

Result<PoolBlock> BitmapSpaceMap::Allocate() {
  MutexLock l(&mu_);
  return AllocateLocked();
}

Result<PoolBlock> BitmapSpaceMap::AllocateLocked() {
  if (read_only_) return Status::ReadOnly("bitmap " + path_ + " is open read-only");
  THINFS_CHECK(!clean_);  // MarkDirty() first
  if (free_blocks_ == 0) {
    return Status::NoSpace("bitmap: all " + std::to_string(nr_blocks_) +
                           " blocks are used or pending free");
  }
  // Start at the cursor's word with the bits before the cursor masked as
  // used; after a full lap, look at that word again unmasked.
  uint64_t i = cursor_ >> 6;
  uint64_t w = Word(i) | ((uint64_t{1} << (cursor_ & 63)) - 1);
  for (uint64_t n = 0; n <= nr_words_; ++n) {
    if (i + 1 == nr_words_) w |= tail_mask_;
    if (~w != 0) {
      const uint64_t bit = static_cast<uint64_t>(std::countr_one(w));
      const uint64_t block = (i << 6) | bit;
      THINFS_CHECK(block < nr_blocks_);
      SetWord(i, Word(i) | (uint64_t{1} << bit));
      --free_blocks_;
      cursor_ = block + 1 == nr_blocks_ ? 0 : block + 1;
      return PoolBlock(block);
    }
    if (++i == nr_words_) i = 0;
    w = Word(i);
  }
  // free_blocks_ said there was a zero bit.
  internal::CheckFailed(__FILE__, __LINE__, "free_blocks_ agrees with the bits");
}

Result<PoolBlock> BitmapSpaceMap::AllocateRun(uint64_t max, uint64_t* count) {
  THINFS_CHECK(max >= 1);
  MutexLock l(&mu_);
  THINFS_ASSIGN_OR_RETURN(PoolBlock first, AllocateLocked());
  // Take the free bits that follow `first`, a word at a time, up to the
  // first used one.
  uint64_t end = first.value + 1;
  const uint64_t limit = first.value + std::min<uint64_t>(max, nr_blocks_ - first.value);
  while (end < limit) {
    const uint64_t i = end >> 6;
    const uint64_t shift = end & 63;
    // Free bits from `end` on in this word, as ones from bit 0 (at most
    // 64 - shift: the shift brings in zeros).
    const uint64_t free_from_end = ~Word(i) >> shift;
    const uint64_t n =
        std::min<uint64_t>(static_cast<uint64_t>(std::countr_one(free_from_end)), limit - end);
    if (n == 0) break;
    const uint64_t mask = (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1)) << shift;
    SetWord(i, Word(i) | mask);
    end += n;
    if (shift + n < 64 && end < limit) break;  // stopped at a used bit
  }
  const uint64_t extra = end - (first.value + 1);
  free_blocks_ -= extra;
  if (extra > 0) cursor_ = end == nr_blocks_ ? 0 : end;
  *count = end - first.value;
  return first;
}

void BitmapSpaceMap::Unallocate(PoolBlock first, uint64_t count) {
  MutexLock l(&mu_);
  THINFS_CHECK(!read_only_);
  THINFS_CHECK(count <= nr_blocks_ && first.value <= nr_blocks_ - count);
  for (uint64_t b = first.value; b < first.value + count; ++b) {
    const uint64_t mask = uint64_t{1} << (b & 63);
    THINFS_CHECK(TestBit(b));                           // not allocated
    THINFS_CHECK((pending_bits_[b >> 6] & mask) == 0);  // queued by Free()
    SetWord(b >> 6, Word(b >> 6) & ~mask);
  }
  free_blocks_ += count;
  // The unused tail of the last run: the next allocation starts there again.
  if (cursor_ == first.value + count || (cursor_ == 0 && first.value + count == nr_blocks_)) {
    cursor_ = first.value;
  }
}

void BitmapSpaceMap::Free(PoolBlock block) {
  const uint64_t b = block.value;
  MutexLock l(&mu_);
  THINFS_CHECK(!read_only_);
  THINFS_CHECK(b < nr_blocks_);
  THINFS_CHECK(TestBit(b));  // freeing a free block
  uint64_t& p = pending_bits_[b >> 6];
  const uint64_t mask = uint64_t{1} << (b & 63);
  THINFS_CHECK((p & mask) == 0);  // freeing a block twice
  p |= mask;
  queued_.push_back(block);
}

std::vector<PoolBlock> BitmapSpaceMap::TakePendingFrees() {
  MutexLock l(&mu_);
  std::vector<PoolBlock> taken;
  taken.swap(queued_);
  in_flight_ += taken.size();
  return taken;
}

void BitmapSpaceMap::Release(const std::vector<PoolBlock>& blocks) {
  MutexLock l(&mu_);
  if (blocks.empty()) return;
  THINFS_CHECK(!read_only_);
  THINFS_CHECK(!clean_);  // MarkDirty() first
  for (PoolBlock block : blocks) {
    const uint64_t b = block.value;
    THINFS_CHECK(in_flight_ > 0);  // not taken by TakePendingFrees()
    THINFS_CHECK(b < nr_blocks_);
    uint64_t& p = pending_bits_[b >> 6];
    const uint64_t mask = uint64_t{1} << (b & 63);
    THINFS_CHECK((p & mask) != 0);  // not freed, or released twice
    THINFS_CHECK(TestBit(b));
    p &= ~mask;
    SetWord(b >> 6, Word(b >> 6) & ~mask);
    ++free_blocks_;
    --in_flight_;
  }
}

Status BitmapSpaceMap::Sync(uint64_t generation) {
  MutexLock sl(&sync_mu_);
  if (read_only_) return Status::ReadOnly("bitmap " + path_ + " is open read-only");
  std::byte* base;
  uint64_t len;
  bool body_changed;
  {
    MutexLock l(&mu_);
    // Not a bit changed since the last Sync: the file already holds these
    // bits, and only the header's generation is new.
    body_changed = changed_since_sync_;
    // Cleared before the msync: a bit changed from here on is either in
    // this msync or flags the next Sync.
    changed_since_sync_ = false;
    base = base_;
    len = map_len_;
  }
  // The bits must be durable before any mapping to their blocks is.
  Status s = body_changed ? MsyncRange(base, kBitmapHeaderSize, len - kBitmapHeaderSize)
                          : Status::Ok();
  if (!s.ok()) {
    MutexLock l(&mu_);
    changed_since_sync_ = true;  // the next Sync must not skip
    return s;
  }
  HeaderPage page;
  {
    MutexLock l(&mu_);
    page = EncodeHeaderPage(clean_, nr_blocks_, generation);
  }
  THINFS_RETURN_IF_ERROR(WriteHeaderPage(page));
  {
    MutexLock l(&mu_);
    generation_ = generation;
  }
  // The header's write-back is started, not waited for. Nothing needs the
  // new generation on disk: CheckBitmapGeneration accepts a dirty bitmap
  // behind the metadata, and this generation can never lead it by more
  // than the commit in flight, since the next one is written only after
  // this commit returned. Once written, the generation is durable with
  // the next flush of the device (this commit's WAL sync or the next
  // commit's, as a rule), and from then on betrays a WAL that lost this
  // commit. Waiting here cost an fsync of the file per commit: a device
  // flush, in a snapshot's commit half of its I/O (docs/benchmarks.md,
  // lever 25). SYNC_FILE_RANGE_WAIT_BEFORE: a write-back of the previous
  // generation still in flight would make this one skip the page.
  if (::sync_file_range(fd_, 0, kBitmapHeaderSize,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE) != 0) {
    return Status::FromErrno(errno, "start write-back of bitmap header " + path_);
  }
  return Status::Ok();
}

void BitmapSpaceMap::MarkUsed(PoolBlock block) {
  const uint64_t b = block.value;
  MutexLock l(&mu_);
  THINFS_CHECK(!read_only_);
  THINFS_CHECK(!clean_);  // MarkDirty() first
  THINFS_CHECK(b < nr_blocks_);
  if (TestBit(b)) return;
  SetWord(b >> 6, Word(b >> 6) | (uint64_t{1} << (b & 63)));
  --free_blocks_;
}

void BitmapSpaceMap::ClearAllForRebuild() {
  MutexLock l(&mu_);
  THINFS_CHECK(!read_only_);
  THINFS_CHECK(!clean_);  // MarkDirty() first
  THINFS_CHECK(in_flight_ == 0);
  std::memset(base_ + kBitmapHeaderSize, 0, nr_words_ * 8);
  changed_since_sync_ = true;
  std::fill(pending_bits_.begin(), pending_bits_.end(), 0);
  queued_.clear();
  free_blocks_ = nr_blocks_;
  cursor_ = 0;
}

bool BitmapSpaceMap::IsAllocated(PoolBlock block) const {
  MutexLock l(&mu_);
  THINFS_CHECK(block.value < nr_blocks_);
  return TestBit(block.value);
}

uint64_t BitmapSpaceMap::total_blocks() const {
  MutexLock l(&mu_);
  return nr_blocks_;
}

uint64_t BitmapSpaceMap::free_blocks() const {
  MutexLock l(&mu_);
  return free_blocks_;
}

uint64_t BitmapSpaceMap::generation() const {
  MutexLock l(&mu_);
  return generation_;
}

Status BitmapSpaceMap::MarkDirty() {
  MutexLock sl(&sync_mu_);
  if (read_only_) return Status::ReadOnly("bitmap " + path_ + " is open read-only");
  std::byte* base;
  HeaderPage page;
  {
    MutexLock l(&mu_);
    if (!clean_) return Status::Ok();
    page = EncodeHeaderPage(false, nr_blocks_, generation_);
    base = base_;
  }
  // Bits may change only once the file no longer claims a clean body.
  THINFS_RETURN_IF_ERROR(WriteHeaderPage(page));
  THINFS_RETURN_IF_ERROR(MsyncRange(base, 0, kBitmapHeaderSize));
  MutexLock l(&mu_);
  clean_ = false;
  return Status::Ok();
}

Status BitmapSpaceMap::MarkClean(uint64_t generation) {
  MutexLock sl(&sync_mu_);
  if (read_only_) return Status::ReadOnly("bitmap " + path_ + " is open read-only");
  std::byte* base;
  uint64_t len;
  {
    MutexLock l(&mu_);
    clean_ = true;  // freezes the body: mutators now fail their check
    base = base_;
    len = map_len_;
  }
  // The body must be on disk before a header vouches for its checksum.
  if (Status s = MsyncRange(base, kBitmapHeaderSize, len - kBitmapHeaderSize); !s.ok()) {
    MutexLock l(&mu_);
    clean_ = false;
    return s;
  }
  HeaderPage page;
  {
    MutexLock l(&mu_);
    page = EncodeHeaderPage(true, nr_blocks_, generation);
  }
  if (Status s = WriteHeaderPage(page); !s.ok()) {
    MutexLock l(&mu_);
    clean_ = false;
    return s;
  }
  {
    MutexLock l(&mu_);
    generation_ = generation;
  }
  return MsyncRange(base, 0, kBitmapHeaderSize);
}

Status BitmapSpaceMap::Grow(uint64_t new_blocks) {
  MutexLock sl(&sync_mu_);
  if (read_only_) return Status::ReadOnly("bitmap " + path_ + " is open read-only");
  uint64_t old_blocks;
  {
    MutexLock l(&mu_);
    old_blocks = nr_blocks_;
  }
  if (new_blocks < old_blocks) {
    return Status::InvalidArgument("bitmap cannot shrink from " + std::to_string(old_blocks) +
                                   " to " + std::to_string(new_blocks) + " blocks");
  }
  if (new_blocks == old_blocks) return Status::Ok();
  const uint64_t new_len = kBitmapHeaderSize + BitmapBodyBytes(new_blocks);
  THINFS_RETURN_IF_ERROR(ExtendFile(fd_, new_len, path_));

  std::byte* base;
  {
    MutexLock l(&mu_);
    if (new_len != map_len_) {
      void* p = ::mremap(base_, map_len_, new_len, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) return Status::FromErrno(errno, "mremap bitmap " + path_);
      base_ = static_cast<std::byte*>(p);
      map_len_ = new_len;
    }
    // An interrupted grow may have left bytes past the old body; the new
    // blocks start free whatever the file held. Clearing the old last
    // word's padding bits keeps the header's checksum valid: they are zero.
    const uint64_t old_words = nr_words_;
    const uint64_t new_words = BitmapBodyBytes(new_blocks) / 8;
    if (tail_mask_ != 0 && (Word(old_words - 1) & tail_mask_) != 0) {
      SetWord(old_words - 1, Word(old_words - 1) & ~tail_mask_);
    }
    std::memset(base_ + kBitmapHeaderSize + old_words * 8, 0, (new_words - old_words) * 8);
    changed_since_sync_ = true;
    pending_bits_.resize(new_words, 0);
    base = base_;
  }
  // New blocks become allocatable only once the header naming them is
  // durable, and the header names them only once the file's size is.
  if (::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync bitmap " + path_);
  HeaderPage page;
  {
    MutexLock l(&mu_);
    page = EncodeHeaderPage(clean_, new_blocks, generation_);
  }
  THINFS_RETURN_IF_ERROR(WriteHeaderPage(page));
  THINFS_RETURN_IF_ERROR(MsyncRange(base, 0, kBitmapHeaderSize));
  MutexLock l(&mu_);
  nr_words_ = BitmapBodyBytes(new_blocks) / 8;
  nr_blocks_ = new_blocks;
  tail_mask_ = TailMask(new_blocks);
  free_blocks_ += new_blocks - old_blocks;
  return Status::Ok();
}

}  // namespace thinfs::meta
