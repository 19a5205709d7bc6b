#include "core/block_device.h"

#include <fcntl.h>
#include <linux/aio_abi.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/page_cache.h"

namespace thinfs {

Status BlockDevice::WriteZeroes(PoolBlock block, uint64_t count) {
  const uint64_t bs = geometry().block_size();
  std::vector<std::byte> zeros(std::min<uint64_t>(bs, 1 << 20));
  for (uint64_t i = 0; i < count; ++i) {
    for (uint64_t off = 0; off < bs; off += zeros.size()) {
      uint64_t n = std::min<uint64_t>(zeros.size(), bs - off);
      THINFS_RETURN_IF_ERROR(
          Write(PoolBlock(block.value + i), off, std::span<const std::byte>(zeros.data(), n)));
    }
  }
  return Status::Ok();
}

Status BlockDevice::Copy(PoolBlock from, PoolBlock to, uint64_t offset, uint64_t len) {
  std::vector<std::byte> buf(std::min<uint64_t>(len, 1 << 20));
  for (uint64_t done = 0; done < len; done += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), len - done);
    std::span<std::byte> part(buf.data(), n);
    THINFS_RETURN_IF_ERROR(Read(from, offset + done, part));
    THINFS_RETURN_IF_ERROR(Write(to, offset + done, part));
  }
  return Status::Ok();
}

namespace {

// Whether files in `dir` can be reflinked at `align`-byte granularity:
// clones the first `align` bytes of a scratch O_TMPFILE to its second.
bool DirectoryClones(const std::string& dir, uint64_t align) {
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  std::vector<char> page(align, 't');
  bool ok = ::pwrite(fd, page.data(), page.size(), 0) == static_cast<ssize_t>(page.size());
  if (ok) {
    file_clone_range r{};
    r.src_fd = fd;
    r.src_offset = 0;
    r.src_length = align;
    r.dest_offset = align;
    ok = ::ioctl(fd, FICLONERANGE, &r) == 0;
  }
  ::close(fd);
  return ok;
}

}  // namespace

Result<std::unique_ptr<FileBlockDevice>> FileBlockDevice::Open(const std::string& path,
                                                               const Geometry& geometry,
                                                               bool direct, bool read_only) {
  int flags = (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  if (direct) flags |= O_DIRECT;
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return Status::FromErrno(errno, "open data " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Status::FromErrno(errno, "stat data " + path);
    ::close(fd);
    return s;
  }
  bool is_blockdev = S_ISBLK(st.st_mode);
  std::unique_ptr<FileBlockDevice> dev(new FileBlockDevice(fd, geometry, direct, is_blockdev));
  // Not fatal: without it every read goes through the host's cache.
  if (!direct) {
    dev->bypass_fd_ = ::open(path.c_str(), flags | O_DIRECT, 0);
    dev->bypass_writes_ = dev->bypass_fd_ >= 0 && !read_only;
  }
  if (!is_blockdev && !read_only) {
    dev->clone_align_ = std::max<uint64_t>(static_cast<uint64_t>(st.st_blksize), 512);
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    dev->clone_.store(DirectoryClones(dir, dev->clone_align_));
  }
  return dev;
}

FileBlockDevice::~FileBlockDevice() {
  MutexLock lock(&mappings_mu_);
  for (const std::unique_ptr<Mapping>& m : mappings_) {
    ::munmap(const_cast<std::byte*>(m->base), m->len);
  }
  if (bypass_fd_ >= 0) ::close(bypass_fd_);
  ::close(fd_);
}

// Reads out of a mapping of the data file (lever 35). A copy that touches a
// page the kernel cannot provide, past the file's end or unreadable, raises
// SIGBUS in the copying thread. The handler below turns that into a false
// return of MappedCopy when the thread is inside one, and otherwise acts as
// the handler it replaced (by default: the process dies of SIGBUS).
namespace {

[[gnu::tls_model("initial-exec")]] thread_local sigjmp_buf* t_mapped_copy = nullptr;
struct sigaction g_previous_sigbus;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  sigjmp_buf* jump = t_mapped_copy;
  if (jump != nullptr) {
    t_mapped_copy = nullptr;
    siglongjmp(*jump, 1);
  }
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) != 0) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN) {
    g_previous_sigbus.sa_handler(sig);
    return;
  }
  // The default action, which a fault cannot ignore: die of SIGBUS.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGBUS, &dfl, nullptr);
  ::raise(SIGBUS);
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    // SA_NODEFER: a siglongjmp out of the handler leaves SIGBUS unblocked
    // without the system call that sigsetjmp(..., 1) would cost per copy.
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

// memcpy from a mapping; false if it faulted (dst then holds part of it).
bool MappedCopy(std::byte* dst, const std::byte* src, size_t n) {
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) return false;
  t_mapped_copy = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_mapped_copy = nullptr;
  return true;
}

}  // namespace

void FileBlockDevice::EnableMappedReads() {
  // The data area at open; Grow() maps the blocks it adds (Pool::Open grows
  // a device opened at an older size to the superblock's).
  if (!direct_) MapUpTo(geometry_.data_bytes());
}

void FileBlockDevice::MapUpTo(uint64_t len) {
  MutexLock lock(&mappings_mu_);
  const Mapping* current = mapping_.load();
  if (len == 0 || (current != nullptr && current->len >= len)) return;
  InstallSigbusHandler();
  void* base = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd_, 0);
  if (base == MAP_FAILED) return;
  // A fault reads the page it lacks and nothing around it: the mapping is
  // only read where the cache was found to hold the data, and read-around
  // would read the disk's readahead size (2.5 MiB on the VMs of
  // docs/benchmarks.md) per lost page. Only a hint: without it, more is read.
  (void)::madvise(base, len, MADV_RANDOM);
  mappings_.push_back(std::make_unique<Mapping>(Mapping{static_cast<std::byte*>(base), len}));
  mapping_.store(mappings_.back().get());
}

bool FileBlockDevice::CopyMapped(uint64_t pos, std::span<std::byte> buf) const {
  const Mapping* m = mapping_.load(std::memory_order_acquire);
  if (m == nullptr || pos > m->len || buf.size() > m->len - pos) return false;
  return MappedCopy(buf.data(), m->base + pos, buf.size());
}

namespace {

constexpr uint64_t kDirectAlign = 4096;

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) {
    if (posix_memalign(&p, kDirectAlign, n) != 0) p = nullptr;
  }
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* p = nullptr;
};

bool Aligned(uint64_t pos, size_t len, const void* ptr) {
  return pos % kDirectAlign == 0 && len % kDirectAlign == 0 &&
         reinterpret_cast<uintptr_t>(ptr) % kDirectAlign == 0;
}

Status PreadAll(int fd, void* data, size_t len, uint64_t pos) {
  auto* out = static_cast<std::byte*>(data);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, out + done, len - done, static_cast<off_t>(pos + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "pread data");
    }
    if (n == 0) {
      // Past the end of a data file that was never extended: zeros.
      std::memset(out + done, 0, len - done);
      return Status::Ok();
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status PwriteAll(int fd, const void* data, size_t len, uint64_t pos) {
  const auto* in = static_cast<const std::byte*>(data);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pwrite(fd, in + done, len - done, static_cast<off_t>(pos + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "pwrite data");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status FileBlockDevice::Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf) {
  uint64_t pos = geometry_.BytesOf(block.value) + offset;
  if (!direct_ || Aligned(pos, buf.size(), buf.data())) {
    return PreadAll(fd_, buf.data(), buf.size(), pos);
  }
  // O_DIRECT wants 4 KiB-aligned offsets, lengths and buffers: bounce.
  uint64_t start = pos / kDirectAlign * kDirectAlign;
  uint64_t end = (pos + buf.size() + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  AlignedBuffer bounce(end - start);
  if (bounce.p == nullptr) return Status::IOError("out of memory for an O_DIRECT bounce buffer");
  THINFS_RETURN_IF_ERROR(PreadAll(fd_, bounce.p, end - start, start));
  std::memcpy(buf.data(), static_cast<std::byte*>(bounce.p) + (pos - start), buf.size());
  return Status::Ok();
}

Status FileBlockDevice::Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf) {
  uint64_t pos = geometry_.BytesOf(block.value) + offset;
  if (!direct_ || Aligned(pos, buf.size(), buf.data())) {
    return PwriteAll(fd_, buf.data(), buf.size(), pos);
  }
  // Read-modify-write of the 4 KiB sectors the write touches. The engine
  // serialises writes to one block (its stripe lock), so no concurrent
  // writer can be lost between the read and the write.
  uint64_t start = pos / kDirectAlign * kDirectAlign;
  uint64_t end = (pos + buf.size() + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  AlignedBuffer bounce(end - start);
  if (bounce.p == nullptr) return Status::IOError("out of memory for an O_DIRECT bounce buffer");
  auto* b = static_cast<std::byte*>(bounce.p);
  if (pos != start) THINFS_RETURN_IF_ERROR(PreadAll(fd_, b, kDirectAlign, start));
  if (pos + buf.size() != end && end - kDirectAlign != start) {
    THINFS_RETURN_IF_ERROR(PreadAll(fd_, b + (end - start - kDirectAlign), kDirectAlign,
                                    end - kDirectAlign));
  } else if (pos + buf.size() != end && pos == start) {
    THINFS_RETURN_IF_ERROR(PreadAll(fd_, b, kDirectAlign, start));
  }
  std::memcpy(b + (pos - start), buf.data(), buf.size());
  return PwriteAll(fd_, b, end - start, start);
}

Status FileBlockDevice::Sync() {
  if (::fdatasync(fd_) != 0) return Status::FromErrno(errno, "fdatasync data");
  return Status::Ok();
}

Status FileBlockDevice::WriteZeroes(PoolBlock block, uint64_t count) {
  uint64_t start = geometry_.BytesOf(block.value);
  uint64_t len = geometry_.BytesOf(count);
  if (is_blockdev_) {
    uint64_t range[2] = {start, len};
    if (::ioctl(fd_, BLKZEROOUT, range) == 0) return Status::Ok();
  } else if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         static_cast<off_t>(start), static_cast<off_t>(len)) == 0) {
    // A punched range of a regular file reads as zeros.
    return Status::Ok();
  }
  if (errno != EOPNOTSUPP && errno != ENOTTY && errno != EINVAL) {
    return Status::FromErrno(errno, "zero data");
  }
  return BlockDevice::WriteZeroes(block, count);
}

void BlockDevice::Prefetch(PoolBlock, uint64_t) {}

void BlockDevice::StartWriteback(std::span<const Run>) {}

void FileBlockDevice::StartWriteback(std::span<const Run> runs) {
  if (direct_) return;
  const uint64_t bs = geometry_.block_size();
  for (const Run& run : runs) {
    // A hint: its failure changes nothing but speed.
    (void)::sync_file_range(fd_, static_cast<off64_t>(run.first.value * bs),
                            static_cast<off64_t>(run.count * bs), SYNC_FILE_RANGE_WRITE);
  }
}

void FileBlockDevice::Prefetch(PoolBlock block, uint64_t count) {
  if (direct_ || count == 0) return;
  const uint64_t bs = geometry_.block_size();
  // A hint: its failure changes nothing but speed.
  (void)::posix_fadvise(fd_, static_cast<off_t>(block.value * bs), static_cast<off_t>(count * bs),
                        POSIX_FADV_WILLNEED);
}

Status BlockDevice::ReadAround(PoolBlock block, uint64_t offset, std::span<std::byte> buf) {
  return Read(block, offset, buf);
}

Status FileBlockDevice::ReadAround(PoolBlock block, uint64_t offset, std::span<std::byte> buf) {
  const uint64_t bs = geometry_.block_size();
  const uint64_t window = std::min(read_around_, bs);
  if (direct_ || buf.size() >= window) return Read(block, offset, buf);  // also no window
  const uint64_t start = offset / window * window;
  const uint64_t window_len = std::min(window, bs - start);
  if (offset + buf.size() > start + window_len) return Read(block, offset, buf);
  const uint64_t base = geometry_.BytesOf(block.value);
  // The probe: the read itself, from the cache only. On a miss the kernel
  // has started reading the pages it could not copy.
  size_t cached = 0;
  if (nowait_.load(std::memory_order_relaxed)) {
    struct iovec iov {buf.data(), buf.size()};
    const ssize_t n = ::preadv2(fd_, &iov, 1, static_cast<off_t>(base + offset), RWF_NOWAIT);
    if (n == static_cast<ssize_t>(buf.size())) return Status::Ok();
    if (n > 0) cached = static_cast<size_t>(n);
    if (n < 0 && errno == EOPNOTSUPP) nowait_.store(false, std::memory_order_relaxed);
  } else if (CachedAt(base + offset)) {
    return Read(block, offset, buf);
  }
  // Reclaim has evicted pages of the window before: the host's cache does
  // not hold this working set, and the window's other pages would most
  // likely be evicted again before they are read (lever 44). Only the
  // read's own pages are read then, as without read-around. Without
  // cachestat(2) there is no telling, and the window is read.
  bool thrashing = false;
  if (cachestat_.load(std::memory_order_relaxed)) {
    Result<PageCacheCounts> window_pages = CountPages(fd_, base + start, window_len);
    thrashing = window_pages.ok() && window_pages->evicted != 0;
  }
  if (!thrashing) {
    // A hint: its failure changes nothing but speed.
    (void)::posix_fadvise(fd_, static_cast<off_t>(base + start), static_cast<off_t>(window_len),
                          POSIX_FADV_WILLNEED);
  }
  return Read(block, offset + cached, buf.subspan(cached));
}

bool BlockDevice::PrefetchForRead(std::span<const Run>, uint64_t, std::span<std::byte>) {
  return false;
}

bool BlockDevice::RunsCached(std::span<const Run>) { return false; }

Status BlockDevice::ReadPieces(std::span<const ReadPiece> pieces, Cache /*cache*/) {
  const uint64_t bs = geometry().block_size();
  for (const ReadPiece& p : pieces) {
    for (size_t done = 0; done < p.buf.size();) {
      const uint64_t pos = p.offset + done;  // from the start of p.block
      const uint64_t off = pos % bs;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(bs - off, p.buf.size() - done));
      THINFS_RETURN_IF_ERROR(
          Read(PoolBlock(p.block.value + pos / bs), off, p.buf.subspan(done, n)));
      done += n;
    }
  }
  return Status::Ok();
}

namespace {

// The calling thread's Linux AIO context (io_setup(2)) for reads past the
// cache: made at its first use, destroyed when the thread ends. No
// library: the system calls, as for pread.
class AioContext {
 public:
  static constexpr long kDepth = 32;
  AioContext() = default;
  AioContext(const AioContext&) = delete;
  AioContext& operator=(const AioContext&) = delete;
  ~AioContext() {
    if (ctx_ != 0) ::syscall(SYS_io_destroy, ctx_);
  }
  // 0 where the kernel refused one (fs.aio-max-nr reached).
  aio_context_t Get() {
    if (!tried_) {
      tried_ = true;
      if (::syscall(SYS_io_setup, kDepth, &ctx_) != 0) ctx_ = 0;
    }
    return ctx_;
  }

 private:
  aio_context_t ctx_ = 0;
  bool tried_ = false;
};

thread_local AioContext t_aio;

}  // namespace

Result<bool> BlockDevice::WritePastCache(PoolBlock, uint64_t, std::span<const std::byte>) {
  return false;
}

namespace {

// The calling thread's 4 KiB-aligned buffer for WritePastCache of data
// that are not aligned: kept, and grown to the largest write, so that a
// stream's writes neither allocate nor touch fresh pages.
class BounceBuffer {
 public:
  BounceBuffer() = default;
  BounceBuffer(const BounceBuffer&) = delete;
  BounceBuffer& operator=(const BounceBuffer&) = delete;
  ~BounceBuffer() { std::free(p_); }
  // nullptr when out of memory.
  std::byte* Get(size_t n) {
    if (n > size_) {
      std::free(p_);
      p_ = nullptr;
      size_ = 0;
      void* q = nullptr;
      if (posix_memalign(&q, kDirectAlign, n) != 0) return nullptr;
      p_ = q;
      size_ = n;
    }
    return static_cast<std::byte*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

thread_local BounceBuffer t_bounce;

}  // namespace

Result<bool> FileBlockDevice::WritePastCache(PoolBlock block, uint64_t offset,
                                             std::span<const std::byte> buf) {
  const uint64_t pos = geometry_.BytesOf(block.value) + offset;
  if (!bypass_writes_ || !bypass_.load(std::memory_order_relaxed) || buf.empty() ||
      pos % kDirectAlign != 0 || buf.size() % kDirectAlign != 0) {
    return false;
  }
  const std::byte* src = buf.data();
  if (reinterpret_cast<uintptr_t>(src) % kDirectAlign != 0) {
    std::byte* b = t_bounce.Get(buf.size());
    if (b == nullptr) return false;
    std::memcpy(b, src, buf.size());
    src = b;
  }
  // Submitted, the write holds the inode lock only while it is queued;
  // pwrite(2) would hold it until the disk is done.
  size_t done = 0;
  const aio_context_t ctx = t_aio.Get();
  if (ctx != 0) {
    iocb cb{};
    cb.aio_lio_opcode = IOCB_CMD_PWRITE;
    cb.aio_fildes = static_cast<uint32_t>(bypass_fd_);
    cb.aio_buf = reinterpret_cast<uint64_t>(src);
    cb.aio_nbytes = buf.size();
    cb.aio_offset = static_cast<int64_t>(pos);
    iocb* ptr = &cb;
    long n;
    do {
      n = ::syscall(SYS_io_submit, ctx, 1L, &ptr);
    } while (n < 0 && errno == EINTR);
    if (n == 1) {
      io_event ev{};
      do {
        n = ::syscall(SYS_io_getevents, ctx, 1L, 1L, &ev, nullptr);
      } while (n < 0 && errno == EINTR);
      // Only a bug gets here (EFAULT, EINVAL), with the write in flight
      // from a buffer the caller may free: log where, and stop.
      THINFS_CHECK(n == 1);
      if (ev.res == -EINVAL) {
        // The file system wants a larger alignment: nothing was written.
        bypass_.store(false, std::memory_order_relaxed);
        return false;
      }
      if (ev.res < 0) return Status::FromErrno(static_cast<int>(-ev.res), "write data");
      done = static_cast<size_t>(ev.res);
    }
  }
  if (done == 0) {
    // No AIO context (fs.aio-max-nr reached) or the submission was
    // refused: the same write, waited for under the inode lock.
    ssize_t n;
    do {
      n = ::pwrite(bypass_fd_, src, buf.size(), static_cast<off_t>(pos));
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EINVAL) {
      bypass_.store(false, std::memory_order_relaxed);
      return false;
    }
    if (n < 0) return Status::FromErrno(errno, "write data");
    done = static_cast<size_t>(n);
  }
  // A short write (rare: a signal, a full file system) ends through the
  // cache, which reports what stops it.
  if (done < buf.size()) {
    THINFS_RETURN_IF_ERROR(PwriteAll(fd_, src + done, buf.size() - done, pos + done));
  }
  return true;
}

size_t FileBlockDevice::ReadPastCacheAtOnce(std::span<const ReadPiece> pieces,
                                            std::vector<bool>* done) {
  const aio_context_t ctx = t_aio.Get();
  if (ctx == 0) return 0;
  constexpr size_t kDepth = AioContext::kDepth;
  std::array<iocb, kDepth> cbs;
  std::array<iocb*, kDepth> ptrs;
  std::array<io_event, kDepth> events;
  size_t read = 0;
  // Up to kDepth pieces at a time (a 1 MiB read is at most 17 pieces of
  // 64 KiB blocks, but 257 of 4 KiB ones).
  for (size_t next = 0; next < pieces.size();) {
    size_t n_cbs = 0;
    for (; next < pieces.size() && n_cbs < kDepth; ++next) {
      const ReadPiece& p = pieces[next];
      const uint64_t pos = geometry_.BytesOf(p.block.value) + p.offset;
      if (!Aligned(pos, p.buf.size(), p.buf.data())) continue;
      iocb& cb = cbs[n_cbs];
      cb = iocb{};
      cb.aio_data = next;
      cb.aio_lio_opcode = IOCB_CMD_PREAD;
      cb.aio_fildes = static_cast<uint32_t>(bypass_fd_);
      cb.aio_buf = reinterpret_cast<uint64_t>(p.buf.data());
      cb.aio_nbytes = p.buf.size();
      cb.aio_offset = static_cast<int64_t>(pos);
      ptrs[n_cbs++] = &cb;
    }
    long submitted = 0;
    while (submitted < static_cast<long>(n_cbs)) {
      const long n = ::syscall(SYS_io_submit, ctx, static_cast<long>(n_cbs) - submitted,
                               ptrs.data() + submitted);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the rest are read one by one
      submitted += n;
    }
    for (long reaped = 0; reaped < submitted;) {
      const long n = ::syscall(SYS_io_getevents, ctx, submitted - reaped, submitted - reaped,
                               events.data(), nullptr);
      if (n < 0 && errno == EINTR) continue;
      // Only a bug gets here (EFAULT, EINVAL), and reads in flight would
      // write into buffers the caller frees: log where, and stop.
      THINFS_CHECK(n >= 0);
      for (const io_event& ev : std::span(events).first(static_cast<size_t>(n))) {
        const size_t i = static_cast<size_t>(ev.data);
        // Short (the file's end) or failed: read again alone, which zero
        // fills or reports as a pread would.
        if (ev.res == static_cast<int64_t>(pieces[i].buf.size())) {
          (*done)[i] = true;
          ++read;
        }
      }
      reaped += n;
    }
    if (submitted < static_cast<long>(n_cbs)) break;
  }
  at_once_.fetch_add(read, std::memory_order_relaxed);
  return read;
}

Status FileBlockDevice::ReadPieces(std::span<const ReadPiece> pieces, Cache cache) {
  // Past the cache, the disk reads every piece at once, as a WILLNEED of
  // each would have it read them (lever 46): one at a time, a scattered
  // request waits for each piece in turn.
  std::vector<bool> done;
  if (cache == Cache::kBypass && pieces.size() > 1 && CanReadPastCache()) {
    done.assign(pieces.size(), false);
    ReadPastCacheAtOnce(pieces, &done);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!done.empty() && done[i]) continue;
    const ReadPiece& p = pieces[i];
    const uint64_t pos = geometry_.BytesOf(p.block.value) + p.offset;
    if (cache == Cache::kHeld && CopyMapped(pos, p.buf)) continue;
    if (cache == Cache::kBypass && ReadPastCache(pos, p.buf)) continue;
    // One pread, however many blocks the piece covers.
    THINFS_RETURN_IF_ERROR(Read(p.block, p.offset, p.buf));
  }
  return Status::Ok();
}

bool FileBlockDevice::ReadPastCache(uint64_t pos, std::span<std::byte> buf) {
  if (!CanReadPastCache() || !Aligned(pos, buf.size(), buf.data())) return false;
  const Status s = PreadAll(bypass_fd_, buf.data(), buf.size(), pos);
  // EINVAL: the file system wants more than 4 KiB alignment. Anything
  // else the read through the cache meets again and reports.
  if (!s.ok() && s.saved_errno() == EINVAL) bypass_.store(false, std::memory_order_relaxed);
  return s.ok();
}

uint64_t FileBlockDevice::EndOf(std::span<const Run> runs) const {
  const Run& tail = runs.back();
  return geometry_.BytesOf(tail.first.value + tail.count);
}

bool FileBlockDevice::RunsCached(std::span<const Run> runs) {
  if (direct_ || runs.empty()) return false;
  // cachestat(2) only: the RWF_NOWAIT probe of CachedAt starts reading
  // (and the host's readahead after it) the page it misses, which a read
  // past the cache must not (lever 46). Without it (Linux < 6.5) nothing
  // counts as cached, and the O_DIRECT read writes dirty pages back first.
  return CachestatAt(EndOf(runs) - 1).value_or(false);
}

std::optional<bool> FileBlockDevice::CachestatAt(uint64_t offset) {
  if (!cachestat_.load(std::memory_order_relaxed)) return std::nullopt;
  Result<uint64_t> pages = CachedPages(fd_, offset, 1);
  if (pages.ok()) return *pages != 0;
  // Not on this kernel or for this descriptor: no later call would do
  // better.
  cachestat_.store(false, std::memory_order_relaxed);
  return std::nullopt;
}

bool FileBlockDevice::CachedAt(uint64_t offset) {
  if (std::optional<bool> cached = CachestatAt(offset)) return *cached;
  char byte;
  struct iovec iov {&byte, 1};
  return ::preadv2(fd_, &iov, 1, static_cast<off_t>(offset), RWF_NOWAIT) == 1;
}

bool FileBlockDevice::PrefetchForRead(std::span<const Run> runs, uint64_t head,
                                      std::span<std::byte> scratch) {
  if (direct_ || runs.empty()) return false;
  // Cached already (the kernel read ahead of a sequential reader): leave
  // its readahead alone. A WILLNEED over pages it would read ahead anyway
  // loses their readahead mark, and the reader then waits for each window.
  const uint64_t end = EndOf(runs);
  if (CachedAt(end - 1)) return false;
  if (runs.size() > 1 || scratch.empty()) {
    for (const Run& r : runs) Prefetch(r.first, r.count);
    return true;
  }
  // One run: the kernel's readahead follows a read, and a sequential
  // reader's next request then finds its blocks cached (or on their way)
  // where after a WILLNEED, which leaves no readahead mark, every request
  // would wait for its own blocks (lever 21).
  const uint64_t start = geometry_.BytesOf(runs.back().first.value) + head;
  const size_t len = static_cast<size_t>(std::min<uint64_t>(scratch.size(), end - start));
  // A hint: a failure is the caller's to see when it reads.
  (void)::pread(fd_, scratch.data(), len, static_cast<off_t>(start));
  return true;
}

Status FileBlockDevice::Copy(PoolBlock from, PoolBlock to, uint64_t offset, uint64_t len) {
  const uint64_t src = geometry_.BytesOf(from.value) + offset;
  const uint64_t dst = geometry_.BytesOf(to.value) + offset;
  // The part of the range where source and destination are both on the
  // file system's block boundaries can be shared; the edges are copied.
  const uint64_t head = std::min(len, (clone_align_ - src % clone_align_) % clone_align_);
  const uint64_t middle = (len - head) / clone_align_ * clone_align_;
  if (!clone_.load(std::memory_order_relaxed) || middle == 0 || (dst + head) % clone_align_ != 0) {
    return BlockDevice::Copy(from, to, offset, len);
  }
  file_clone_range r{};
  r.src_fd = fd_;
  r.src_offset = src + head;
  r.src_length = middle;
  r.dest_offset = dst + head;
  int rc;
  do {
    rc = ::ioctl(fd_, FICLONERANGE, &r);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    if (errno != EOPNOTSUPP && errno != ENOTTY && errno != EXDEV && errno != EINVAL &&
        errno != ENOSYS) {
      return Status::FromErrno(errno, "clone data");
    }
    // The scratch file could, this one cannot after all: copy from now on.
    clone_.store(false, std::memory_order_relaxed);
    return BlockDevice::Copy(from, to, offset, len);
  }
  if (head != 0) THINFS_RETURN_IF_ERROR(BlockDevice::Copy(from, to, offset, head));
  const uint64_t tail = head + middle;
  if (tail < len) THINFS_RETURN_IF_ERROR(BlockDevice::Copy(from, to, offset + tail, len - tail));
  return Status::Ok();
}

Status FileBlockDevice::Discard(PoolBlock block, uint64_t count) {
  uint64_t start = geometry_.BytesOf(block.value);
  uint64_t len = geometry_.BytesOf(count);
  if (is_blockdev_) {
    uint64_t range[2] = {start, len};
    // Best effort: not every device supports discard.
    (void)::ioctl(fd_, BLKDISCARD, range);
    return Status::Ok();
  }
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(start),
                  static_cast<off_t>(len)) != 0) {
    if (errno == EOPNOTSUPP) return Status::Ok();
    return Status::FromErrno(errno, "punch data");
  }
  return Status::Ok();
}

Status BlockDevice::Grow(uint64_t /*new_data_blocks*/) {
  return Status::NotSupported("this data area cannot grow");
}

Status FileBlockDevice::Grow(uint64_t new_data_blocks) {
  if (new_data_blocks < geometry_.data_blocks()) {
    return Status::InvalidArgument("the data area cannot shrink");
  }
  const uint64_t need = geometry_.BytesOf(new_data_blocks);
  uint64_t have = 0;
  struct stat st;
  if (::fstat(fd_, &st) != 0) return Status::FromErrno(errno, "stat data area");
  if (is_blockdev_) {
    if (::ioctl(fd_, BLKGETSIZE64, &have) != 0) return Status::FromErrno(errno, "BLKGETSIZE64");
  } else {
    have = static_cast<uint64_t>(st.st_size);
  }
  if (have < need) {
    if (is_blockdev_ || fixed_size_) {
      return Status::NoSpace(std::string("the data ") + (is_blockdev_ ? "device" : "file") +
                             " holds " + std::to_string(have) + " bytes, " +
                             std::to_string(need) + " are needed: enlarge it first");
    }
    // A sparse extension: the new blocks cost nothing until written. The
    // size must be durable before the bitmap names the new blocks.
    if (::ftruncate(fd_, static_cast<off_t>(need)) != 0) {
      return Status::FromErrno(errno, "extend data area");
    }
    if (::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync data area");
  }
  // Mapped reads reach the new blocks too.
  if (mapping_.load() != nullptr) MapUpTo(need);
  return Status::Ok();
}

}  // namespace thinfs
