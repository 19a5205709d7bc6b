// Tests of the BlockDevice implementations: FileBlockDevice on a temp file,
// MemBlockDevice, and FaultInjectionBlockDevice's crash and fault model.

#include "core/block_device.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/fault_injection_block_device.h"
#include "core/mem_block_device.h"
#include "core/page_cache.h"
#include "tests/util/cache_file_fixture.h"
#include "tests/util/e2e_util.h"

namespace thinfs {
namespace {

std::vector<std::byte> Pattern(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

std::vector<std::byte> ReadBack(BlockDevice& dev, uint64_t block, uint64_t offset, size_t n) {
  std::vector<std::byte> v(n, std::byte{0x5a});
  EXPECT_TRUE(dev.Read(PoolBlock(block), offset, v).ok());
  return v;
}

bool AllZero(const std::vector<std::byte>& v) {
  for (std::byte b : v) {
    if (b != std::byte{0}) return false;
  }
  return true;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/thinfs_bdev_XXXXXX";
    char* p = ::mkdtemp(tmpl);
    EXPECT_NE(p, nullptr);
    path_ = p ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string CreateEmptyFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  EXPECT_GE(fd, 0) << path;
  ::close(fd);
  return path;
}

// ---------------------------------------------------------------- File

class FileBlockDeviceTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(FileBlockDeviceTest, RoundTripAndZerosWhereNeverWritten) {
  const uint64_t bs = GetParam();
  TempDir dir;
  const std::string path = CreateEmptyFile(dir.path() + "/data");
  const Geometry g(bs, 16);
  {
    auto dev = FileBlockDevice::Open(path, g, /*direct=*/false, /*read_only=*/false);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    // Whole block 3, a partial write straddling nothing into block 5, and
    // block 9; blocks 0-2, 4, 6-8 stay holes inside the file, 10+ past EOF.
    ASSERT_TRUE((*dev)->Write(PoolBlock(3), 0, Pattern(bs, 3)).ok());
    ASSERT_TRUE((*dev)->Write(PoolBlock(5), 100, Pattern(777, 5)).ok());
    ASSERT_TRUE((*dev)->Write(PoolBlock(9), 0, Pattern(bs, 9)).ok());
    ASSERT_TRUE((*dev)->Sync().ok());
    EXPECT_EQ(ReadBack(**dev, 3, 0, bs), Pattern(bs, 3));
    EXPECT_EQ(ReadBack(**dev, 5, 100, 777), Pattern(777, 5));
  }
  // File offsets follow block * block_size, also for non-power-of-two sizes.
  EXPECT_EQ(std::filesystem::file_size(path), 10 * bs);

  auto dev = FileBlockDevice::Open(path, g, false, /*read_only=*/true);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ(ReadBack(**dev, 3, 0, bs), Pattern(bs, 3));
  EXPECT_EQ(ReadBack(**dev, 9, 0, bs), Pattern(bs, 9));
  EXPECT_EQ(ReadBack(**dev, 5, 100, 777), Pattern(777, 5));
  EXPECT_TRUE(AllZero(ReadBack(**dev, 5, 0, 100)));
  EXPECT_TRUE(AllZero(ReadBack(**dev, 5, 877, bs - 877)));
  // Partial read inside a written block.
  std::vector<std::byte> whole = Pattern(bs, 9);
  EXPECT_EQ(ReadBack(**dev, 9, bs / 2 - 1, 2),
            std::vector<std::byte>(whole.begin() + bs / 2 - 1, whole.begin() + bs / 2 + 1));
  EXPECT_TRUE(AllZero(ReadBack(**dev, 0, 0, bs)));   // hole inside the file
  EXPECT_TRUE(AllZero(ReadBack(**dev, 4, 0, bs)));   // hole between blocks
  EXPECT_TRUE(AllZero(ReadBack(**dev, 12, 0, bs)));  // past end of file
}

// ReadPieces reads a piece of several blocks (one pread for a file) as
// Read() of each block would: across holes, into the blocks after its
// first, past the end of the file; MemBlockDevice takes the default, block
// by block. Pieces land in their own buffers, nothing beside them.
TEST_P(FileBlockDeviceTest, ReadPiecesReadsWhatReadOfEachBlockReads) {
  const uint64_t bs = GetParam();
  TempDir dir;
  const Geometry g(bs, 16);
  auto file = FileBlockDevice::Open(CreateEmptyFile(dir.path() + "/data"), g, false, false);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  (*file)->EnableMappedReads();
  MemBlockDevice mem(g);
  for (BlockDevice* dev : std::initializer_list<BlockDevice*>{file->get(), &mem}) {
    for (uint64_t b : {1, 2, 3, 6, 7, 9}) {
      ASSERT_TRUE(dev->Write(PoolBlock(b), 0, Pattern(bs, 100 + b)).ok());
    }
    // Block 8 partly written, 4, 5 and 10+ never (10+ past the file's end).
    ASSERT_TRUE(dev->Write(PoolBlock(8), 10, Pattern(300, 8)).ok());
    std::vector<std::byte> expect;
    for (uint64_t b = 0; b < 16; ++b) {
      std::vector<std::byte> v = ReadBack(*dev, b, 0, bs);
      expect.insert(expect.end(), v.begin(), v.end());
    }
    // Pieces: mid block 1 to mid block 3; blocks 6-9 whole (8 half
    // written); the tail of block 4 and block 5 (holes); blocks 12-13 past
    // the end; a single byte of block 9. Guard bytes between them.
    struct Want {
      uint64_t block, offset, len;
    };
    const Want wants[] = {{1, bs / 3, 2 * bs},   {6, 0, 4 * bs},  {4, bs - 512, 512 + bs},
                          {12, 0, 2 * bs}, {9, bs - 1, 1}};
    std::vector<std::byte> buf(16 * bs, std::byte{0x5a});
    std::vector<BlockDevice::ReadPiece> pieces;
    std::vector<size_t> at;
    size_t pos = 1;
    for (const Want& w : wants) {
      at.push_back(pos);
      pieces.push_back({PoolBlock(w.block), w.offset, std::span(buf).subspan(pos, w.len)});
      pos += w.len + 1;
    }
    // Through pread, through the file's mapping, and past the cache (these
    // pieces are not aligned: pread again; ReadPiecesPastTheCache* below).
    using Cache = BlockDevice::Cache;
    for (Cache cached : {Cache::kUnknown, Cache::kHeld, Cache::kBypass}) {
      std::fill(buf.begin(), buf.end(), std::byte{0x5a});
      ASSERT_TRUE(dev->ReadPieces(pieces, cached).ok());
      EXPECT_EQ(buf[0], std::byte{0x5a});
      for (size_t i = 0; i < std::size(wants); ++i) {
        const Want& w = wants[i];
        const auto from = expect.begin() + static_cast<ptrdiff_t>(w.block * bs + w.offset);
        EXPECT_TRUE(std::equal(from, from + static_cast<ptrdiff_t>(w.len),
                               buf.begin() + static_cast<ptrdiff_t>(at[i])))
            << "piece " << i << " block size " << bs << " cache " << static_cast<int>(cached);
        EXPECT_EQ(buf[at[i] + w.len], std::byte{0x5a}) << "after piece " << i;
      }
    }
  }
}

// ReadPieces of cached data copies out of a mapping of the file (lever 35),
// and the mapping follows the file: rewrites, hole punches and reflinks
// made after it are what the next read sees, and Grow() maps the blocks it
// adds (and maps nothing for a device that never enabled mapped reads).
TEST_P(FileBlockDeviceTest, ReadPiecesSeeWritesDiscardsCopiesAndGrowth) {
  const uint64_t bs = GetParam();
  TempDir dir;
  auto dev = FileBlockDevice::Open(CreateEmptyFile(dir.path() + "/data"), Geometry(bs, 8),
                                   false, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  FileBlockDevice& d = **dev;
  EXPECT_EQ(d.mapped_length(), 0u) << "mapped without EnableMappedReads()";
  d.EnableMappedReads();
  ASSERT_GE(d.mapped_length(), 8 * bs);
  std::vector<std::byte> buf(3 * bs);
  const BlockDevice::ReadPiece piece{PoolBlock(1), 0, buf};
  auto block_of_buf = [&](uint64_t i) {
    return std::vector<std::byte>(buf.begin() + static_cast<ptrdiff_t>(i * bs),
                                  buf.begin() + static_cast<ptrdiff_t>((i + 1) * bs));
  };
  for (uint64_t b = 1; b <= 3; ++b) ASSERT_TRUE(d.Write(PoolBlock(b), 0, Pattern(bs, b)).ok());
  ASSERT_TRUE(d.ReadPieces({&piece, 1}, BlockDevice::Cache::kHeld).ok());
  EXPECT_EQ(block_of_buf(1), Pattern(bs, 2));
  ASSERT_TRUE(d.Write(PoolBlock(2), 0, Pattern(bs, 20)).ok());
  ASSERT_TRUE(d.Discard(PoolBlock(3), 1).ok());
  ASSERT_TRUE(d.Copy(PoolBlock(2), PoolBlock(1), 0, bs).ok());
  ASSERT_TRUE(d.ReadPieces({&piece, 1}, BlockDevice::Cache::kHeld).ok());
  EXPECT_EQ(block_of_buf(0), Pattern(bs, 20));
  EXPECT_EQ(block_of_buf(1), Pattern(bs, 20));
  EXPECT_TRUE(AllZero(block_of_buf(2)));

  ASSERT_TRUE(d.Grow(64).ok());
  EXPECT_GE(d.mapped_length(), 64 * bs);
  // A device that never enabled mapped reads does not map when it grows.
  auto plain = FileBlockDevice::Open(CreateEmptyFile(dir.path() + "/plain"), Geometry(bs, 8),
                                     false, false);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_TRUE((*plain)->Grow(64).ok());
  EXPECT_EQ((*plain)->mapped_length(), 0u) << "Grow() mapped a device without mapped reads";
  ASSERT_TRUE(d.Write(PoolBlock(40), 0, Pattern(bs, 40)).ok());
  const BlockDevice::ReadPiece grown{PoolBlock(39), 0, buf};
  ASSERT_TRUE(d.ReadPieces({&grown, 1}, BlockDevice::Cache::kHeld).ok());
  EXPECT_TRUE(AllZero(block_of_buf(0)));
  EXPECT_EQ(block_of_buf(1), Pattern(bs, 40));
  EXPECT_TRUE(AllZero(block_of_buf(2)));
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, FileBlockDeviceTest,
                         ::testing::Values(uint64_t{4096}, uint64_t{12 * 1024},
                                           uint64_t{64 * 1024}));

// A copy out of the mapping that faults (here: the file was cut short
// under it, so the kernel raises SIGBUS) reads as pread reads, zeros past
// the end, and the process lives. Twice, so that the first fault's escape
// leaves the signal deliverable for the second.
TEST(FileBlockDeviceTest, ReadPiecesOfAFileCutShortReadZerosAndDoNotDie) {
  const uint64_t bs = 64 * 1024;
  TempDir dir;
  const std::string path = CreateEmptyFile(dir.path() + "/data");
  auto dev = FileBlockDevice::Open(path, Geometry(bs, 8), false, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  (*dev)->EnableMappedReads();
  ASSERT_GE((*dev)->mapped_length(), 8 * bs);
  for (uint64_t b = 0; b < 8; ++b) {
    ASSERT_TRUE((*dev)->Write(PoolBlock(b), 0, Pattern(bs, b)).ok());
  }
  std::vector<std::byte> buf(6 * bs);
  const BlockDevice::ReadPiece piece{PoolBlock(1), 0, buf};
  ASSERT_TRUE((*dev)->ReadPieces({&piece, 1}, BlockDevice::Cache::kHeld).ok());
  ASSERT_EQ(std::vector<std::byte>(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(bs)),
            Pattern(bs, 1));
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(2 * bs + 100)), 0);
  for (int round = 0; round < 2; ++round) {
    std::fill(buf.begin(), buf.end(), std::byte{0x5a});
    ASSERT_TRUE((*dev)->ReadPieces({&piece, 1}, BlockDevice::Cache::kHeld).ok()) << "round " << round;
    const std::vector<std::byte> want1 = Pattern(bs, 1);
    const std::vector<std::byte> want2 = Pattern(100, 2);
    EXPECT_TRUE(std::equal(want1.begin(), want1.end(), buf.begin())) << "round " << round;
    EXPECT_TRUE(std::equal(want2.begin(), want2.end(), buf.begin() + static_cast<ptrdiff_t>(bs)))
        << "round " << round;
    EXPECT_TRUE(std::all_of(buf.begin() + static_cast<ptrdiff_t>(bs + 100), buf.end(),
                            [](std::byte b) { return b == std::byte{0}; }))
        << "round " << round;
  }
}

// The handler that rescues ReadPieces' copies leaves every other SIGBUS
// deadly, as it was before the device mapped anything.
TEST(FileBlockDeviceDeathTest, ASigbusOutsideAReadStillKills) {
  TempDir dir;
  auto dev = FileBlockDevice::Open(CreateEmptyFile(dir.path() + "/data"), Geometry(4096, 4),
                                   false, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  (*dev)->EnableMappedReads();
  ASSERT_GT((*dev)->mapped_length(), 0u);
  const int fd = ::open(dir.path().c_str(), O_TMPFILE | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  void* map = ::mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  const volatile char* past_end = static_cast<const char*>(map) + 4096;
  EXPECT_DEATH((void)*past_end, "");
  ::munmap(map, 8192);
  ::close(fd);
}

TEST(FileBlockDeviceTest, OpenMissingIsNotFound) {
  TempDir dir;
  auto dev = FileBlockDevice::Open(dir.path() + "/nope", Geometry(4096, 1), false, false);
  ASSERT_FALSE(dev.ok());
  EXPECT_TRUE(dev.status().IsNotFound()) << dev.status().ToString();
}

TEST(FileBlockDeviceTest, WriteToReadOnlyFails) {
  TempDir dir;
  const std::string path = CreateEmptyFile(dir.path() + "/data");
  auto dev = FileBlockDevice::Open(path, Geometry(4096, 4), false, /*read_only=*/true);
  ASSERT_TRUE(dev.ok());
  Status s = (*dev)->Write(PoolBlock(0), 0, Pattern(16, 1));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.saved_errno(), EBADF) << s.ToString();
}

// ReadPieces is told the data is cached, but the cache has lost it: the
// copy out of the mapping reads what the piece needs and nothing around
// it. With read-around (the mapping without MADV_RANDOM) a fault reads the
// disk's whole readahead size, 2.5 MiB on the VMs this was measured on, and
// never less than 128 KiB around the page.
class MappedReadCacheTest : public CacheFileTest {};

TEST_F(MappedReadCacheTest, ACopyOfPagesTheCacheLostReadsOnlyThem) {
  const uint64_t bs = 64 * 1024;
  const uint64_t blocks = 64;
  CreateWrittenUncached(blocks * bs);
  auto dev = FileBlockDevice::Open(path_, Geometry(bs, blocks), false, /*read_only=*/true);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  (*dev)->EnableMappedReads();
  ASSERT_GE((*dev)->mapped_length(), blocks * bs);
  Residency residency(fd_, blocks * bs);
  ASSERT_EQ(residency.Resident(0, blocks * bs), 0u) << "the file did not leave the cache";
  std::vector<std::byte> buf(bs);
  const BlockDevice::ReadPiece piece{PoolBlock(32), 0, buf};
  ASSERT_TRUE((*dev)->ReadPieces({&piece, 1}, BlockDevice::Cache::kHeld).ok());
  EXPECT_TRUE(
      std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0x5a}; }));
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(residency.Resident(32 * bs, bs), bs / page);
  EXPECT_EQ(residency.Resident(0, blocks * bs), bs / page) << "the copy read around its block";
}

// ----------------------------------------------------------------- Mem

// kBypass pieces (lever 46): aligned ones are read with O_DIRECT, so the
// host's cache of the file stays empty, and they read what Read() reads:
// written data, data written but not yet written back (the kernel writes
// it back first), zeros past the file's end. A piece that is not aligned
// is read through the cache (its pages then cached), and RunsCached
// tells which.
class ReadPastCacheTest : public CacheFileTest {};

TEST_F(ReadPastCacheTest, AlignedPiecesLeaveTheCacheEmptyAndReadWhatReadReads) {
  const uint64_t bs = 64 * 1024;
  const uint64_t blocks = 16;
  CreateWrittenUncached(blocks * bs);
  // Blocks past the file's end: the geometry addresses 4 more.
  auto dev = FileBlockDevice::Open(path_, Geometry(bs, blocks + 4), false, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  FileBlockDevice& d = **dev;
  ASSERT_TRUE(d.CanReadPastCache()) << "O_DIRECT refused on " << path_;
  Residency residency(fd_, blocks * bs);
  ASSERT_EQ(residency.Resident(0, blocks * bs), 0u) << "the file did not leave the cache";
  using Cache = BlockDevice::Cache;
  const BlockDevice::Run run{PoolBlock(4), 4};
  EXPECT_FALSE(d.RunsCached({&run, 1}));

  const AlignedBytes mem(8 * bs);
  const std::span<std::byte> buf = mem.span();
  ASSERT_FALSE(buf.empty());
  auto equal = [](std::span<const std::byte> got, const std::vector<std::byte>& want) {
    return std::equal(got.begin(), got.end(), want.begin(), want.end());
  };
  const std::vector<std::byte> written(bs, std::byte{0x5a});
  // Blocks 4-7 from 8 KiB in, and 2 blocks past the end.
  const BlockDevice::ReadPiece pieces[] = {{PoolBlock(4), 8192, buf.first(4 * bs - 8192)},
                                           {PoolBlock(blocks + 1), 0, buf.subspan(4 * bs, 2 * bs)}};
  std::fill(buf.begin(), buf.end(), std::byte{1});
  ASSERT_TRUE(d.ReadPieces(pieces, Cache::kBypass).ok());
  // The first at once with the second, which the file's end cut short and
  // which was read again alone.
  EXPECT_EQ(d.pieces_read_at_once(), 1u);
  EXPECT_TRUE(std::all_of(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(4 * bs - 8192),
                          [](std::byte b) { return b == std::byte{0x5a}; }));
  EXPECT_TRUE(std::all_of(buf.begin() + static_cast<ptrdiff_t>(4 * bs),
                          buf.begin() + static_cast<ptrdiff_t>(6 * bs),
                          [](std::byte b) { return b == std::byte{0}; }))
      << "past the end";
  EXPECT_EQ(residency.Resident(0, blocks * bs), 0u) << "a bypassing read filled the cache";

  // Written through the cache and not yet written back.
  ASSERT_TRUE(d.Write(PoolBlock(5), 4096, Pattern(bs - 8192, 5)).ok());
  const BlockDevice::ReadPiece block5{PoolBlock(5), 0, buf.first(bs)};
  ASSERT_TRUE(d.ReadPieces({&block5, 1}, Cache::kBypass).ok());
  std::vector<std::byte> want5 = written;
  const std::vector<std::byte> p5 = Pattern(bs - 8192, 5);
  std::copy(p5.begin(), p5.end(), want5.begin() + 4096);
  EXPECT_TRUE(equal(buf.first(bs), want5)) << "dirty cached data not read";

  // Not aligned (the buffer one byte on): through the cache.
  Evict();
  const BlockDevice::ReadPiece odd{PoolBlock(8), 0, buf.subspan(1, 2 * bs)};
  ASSERT_TRUE(d.ReadPieces({&odd, 1}, Cache::kBypass).ok());
  EXPECT_TRUE(equal(buf.subspan(1, bs), written));
  EXPECT_GT(residency.Resident(8 * bs, 2 * bs), 0u) << "an unaligned piece bypassed the cache";
  const BlockDevice::Run run8{PoolBlock(8), 2};
  if (CachedPages(fd_, 0, 4096).ok()) {
    EXPECT_TRUE(d.RunsCached({&run8, 1}));
  } else {
    // No cachestat(2) (Linux < 6.5): nothing counts as cached, since the
    // other probe would read the page in.
    EXPECT_FALSE(d.RunsCached({&run8, 1}));
  }
  EXPECT_TRUE(d.CanReadPastCache());
}

// WritePastCache (lever 52): a 4 KiB-aligned write goes with O_DIRECT, so
// the host's cache of the file stays empty, from a buffer that is not
// aligned too (FUSE's are not), over data cached before (the kernel drops
// those pages) and across blocks; Read() then reads it. A write that is
// not aligned, or a device opened read-only, writes nothing and says so.
class WritePastCacheTest : public CacheFileTest {};

TEST_F(WritePastCacheTest, AlignedWritesLeaveTheCacheEmpty) {
  const uint64_t bs = 64 * 1024;
  const uint64_t blocks = 16;
  CreateWrittenUncached(blocks * bs);
  auto dev = FileBlockDevice::Open(path_, Geometry(bs, blocks), false, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  FileBlockDevice& d = **dev;
  ASSERT_TRUE(d.CanReadPastCache()) << "O_DIRECT refused on " << path_;
  Residency residency(fd_, blocks * bs);
  // Three blocks from 4 KiB into block 2, from a buffer one byte on.
  const std::vector<std::byte> bytes = Pattern(3 * bs, 7);
  std::vector<std::byte> odd(3 * bs + 1);
  std::copy(bytes.begin(), bytes.end(), odd.begin() + 1);
  Result<bool> past = d.WritePastCache(PoolBlock(2), 4096, std::span(odd).subspan(1));
  ASSERT_TRUE(past.ok()) << past.status().ToString();
  EXPECT_TRUE(*past);
  EXPECT_EQ(residency.Resident(0, blocks * bs), 0u) << "the write filled the cache";
  // Over cached pages: the cache does not keep the old data.
  ASSERT_TRUE(d.Write(PoolBlock(8), 0, Pattern(bs, 8)).ok());
  ASSERT_GT(residency.Resident(8 * bs, bs), 0u);
  past = d.WritePastCache(PoolBlock(8), 0, Pattern(bs, 9));
  ASSERT_TRUE(past.ok() && *past) << past.status().ToString();
  EXPECT_EQ(ReadBack(d, 8, 0, bs), Pattern(bs, 9));
  std::vector<std::byte> want(blocks * bs, std::byte{0x5a});
  std::copy(bytes.begin(), bytes.end(), want.begin() + static_cast<ptrdiff_t>(2 * bs + 4096));
  const std::vector<std::byte> p9 = Pattern(bs, 9);
  std::copy(p9.begin(), p9.end(), want.begin() + static_cast<ptrdiff_t>(8 * bs));
  for (uint64_t b = 0; b < blocks; ++b) {
    EXPECT_EQ(ReadBack(d, b, 0, bs),
              std::vector<std::byte>(want.begin() + static_cast<ptrdiff_t>(b * bs),
                                     want.begin() + static_cast<ptrdiff_t>((b + 1) * bs)))
        << "block " << b;
  }
  // Not aligned: nothing written.
  past = d.WritePastCache(PoolBlock(12), 512, Pattern(4096, 10));
  ASSERT_TRUE(past.ok());
  EXPECT_FALSE(*past);
  past = d.WritePastCache(PoolBlock(12), 0, Pattern(4096 + 512, 10));
  ASSERT_TRUE(past.ok());
  EXPECT_FALSE(*past);
  EXPECT_EQ(ReadBack(d, 12, 0, bs), std::vector<std::byte>(bs, std::byte{0x5a}));
  // Read-only: nothing written.
  auto ro = FileBlockDevice::Open(path_, Geometry(bs, blocks), false, /*read_only=*/true);
  ASSERT_TRUE(ro.ok());
  past = (*ro)->WritePastCache(PoolBlock(12), 0, Pattern(bs, 11));
  ASSERT_TRUE(past.ok());
  EXPECT_FALSE(*past);
}

// StartWriteback (lever 51) starts writing the runs' dirty pages to the
// disk at once: cachestat(2) soon counts none of them dirty or under
// write-back, while a block written but not hinted stays dirty (the
// kernel's own write-back leaves pages younger than dirty_expire_centisecs,
// 30 s, to their writer). Anything on the machine that syncs every file
// (sync(1) before drop_caches, as other benchmarks run) also cleans the
// block not hinted; such a try proves nothing and is made again. The data
// read back is what was written.
class WritebackTest : public CacheFileTest {};

TEST_F(WritebackTest, StartWritebackWritesTheRunsBack) {
  const uint64_t bs = 64 * 1024;
  const uint64_t pages_per_block = bs / static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  CreateFile(16 * bs);
  auto dev = FileBlockDevice::Open(path_, Geometry(bs, 16), false, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  FileBlockDevice& d = **dev;
  auto counts = [&](uint64_t first, uint64_t n) {
    Result<PageCacheCounts> c = CountPages(fd_, first * bs, n * bs);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : PageCacheCounts{};
  };
  if (Result<PageCacheCounts> probe = CountPages(fd_, 0, bs); !probe.ok()) {
    GTEST_SKIP() << "no cachestat(2) here (" << probe.status().ToString()
                 << "): nothing tells dirty pages from clean ones";
  }
  const BlockDevice::Run runs[] = {{PoolBlock(1), 3}, {PoolBlock(6), 1}};
  constexpr int kTries = 5;
  int tries = 0;
  for (; tries < kTries; ++tries) {
    for (uint64_t b : {1, 2, 3, 6, 10}) {
      ASSERT_TRUE(d.Write(PoolBlock(b), 0, Pattern(bs, static_cast<uint32_t>(b + tries))).ok());
    }
    const PageCacheCounts before = counts(1, 3);
    ASSERT_EQ(before.dirty + before.writeback, 3 * pages_per_block) << "not dirty after writing";
    d.StartWriteback(runs);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    auto pending = [&] {
      const PageCacheCounts a = counts(1, 3), b = counts(6, 1);
      return a.dirty + a.writeback + b.dirty + b.writeback;
    };
    while (pending() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(pending(), 0u) << "the hinted runs were not written back within 5 s";
    if (counts(10, 1).dirty > 0) break;  // the block not hinted: still dirty
  }
  EXPECT_LT(tries, kTries) << "every try saw the block not hinted written back too";
  const int last = std::min(tries, kTries - 1);  // the try whose data the blocks hold
  for (uint64_t b : {1, 2, 3, 6, 10}) {
    EXPECT_EQ(ReadBack(d, b, 0, bs), Pattern(bs, static_cast<uint32_t>(b + last))) << b;
  }
}

// More pieces than one batch of the at-once read (32): every other 4 KiB
// block of a file, 40 pieces, all read at once and right.
TEST_F(ReadPastCacheTest, PiecesBeyondOneBatchAreReadAtOnceToo) {
  const uint64_t bs = 4096;
  CreateWrittenUncached(128 * bs);
  auto dev = FileBlockDevice::Open(path_, Geometry(bs, 128), false, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_TRUE((*dev)->CanReadPastCache());
  constexpr size_t kPieces = 40;
  const AlignedBytes mem(kPieces * bs);
  const std::span<std::byte> buf = mem.span();
  ASSERT_FALSE(buf.empty());
  std::fill(buf.begin(), buf.end(), std::byte{1});
  std::vector<BlockDevice::ReadPiece> pieces;
  for (size_t i = 0; i < kPieces; ++i) {
    pieces.push_back({PoolBlock(2 * i + 1), 0, buf.subspan(i * bs, bs)});
  }
  ASSERT_TRUE((*dev)->ReadPieces(pieces, BlockDevice::Cache::kBypass).ok());
  EXPECT_EQ((*dev)->pieces_read_at_once(), kPieces);
  EXPECT_TRUE(
      std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0x5a}; }));
  Residency residency(fd_, 128 * bs);
  EXPECT_EQ(residency.Resident(0, 128 * bs), 0u);
}

// A device opened with O_DIRECT throughout has no cache to go past.
TEST_F(ReadPastCacheTest, ADirectDeviceHasNoSecondDescriptor) {
  CreateFile(1 << 20);
  auto dev = FileBlockDevice::Open(path_, Geometry(64 * 1024, 16), /*direct=*/true, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_FALSE((*dev)->CanReadPastCache());
}

TEST(MemBlockDeviceTest, RoundTripSparseAndDiscard) {
  const uint64_t bs = 12 * 1024;
  MemBlockDevice dev(Geometry(bs, 1000));
  EXPECT_TRUE(AllZero(ReadBack(dev, 999, 0, bs)));
  EXPECT_EQ(dev.resident_blocks(), 0u);

  ASSERT_TRUE(dev.Write(PoolBlock(7), 0, Pattern(bs, 7)).ok());
  ASSERT_TRUE(dev.Write(PoolBlock(8), 5000, Pattern(10, 8)).ok());
  EXPECT_EQ(dev.resident_blocks(), 2u);
  EXPECT_EQ(ReadBack(dev, 7, 0, bs), Pattern(bs, 7));
  EXPECT_EQ(ReadBack(dev, 8, 5000, 10), Pattern(10, 8));
  EXPECT_TRUE(AllZero(ReadBack(dev, 8, 0, 5000)));
  EXPECT_TRUE(AllZero(ReadBack(dev, 8, 5010, bs - 5010)));

  // Overwrite part of block 7.
  ASSERT_TRUE(dev.Write(PoolBlock(7), 1, Pattern(3, 70)).ok());
  std::vector<std::byte> expect = Pattern(bs, 7);
  std::vector<std::byte> patch = Pattern(3, 70);
  std::copy(patch.begin(), patch.end(), expect.begin() + 1);
  EXPECT_EQ(ReadBack(dev, 7, 0, bs), expect);

  ASSERT_TRUE(dev.Sync().ok());
  ASSERT_TRUE(dev.Discard(PoolBlock(7), 2).ok());
  EXPECT_EQ(dev.resident_blocks(), 0u);
  EXPECT_TRUE(AllZero(ReadBack(dev, 7, 0, bs)));
  // A huge discard range over few resident blocks.
  ASSERT_TRUE(dev.Write(PoolBlock(500), 0, Pattern(1, 1)).ok());
  ASSERT_TRUE(dev.Discard(PoolBlock(0), 1000).ok());
  EXPECT_EQ(dev.resident_blocks(), 0u);
}

TEST(MemBlockDeviceTest, ConcurrentWritersToDistinctBlocks) {
  const uint64_t bs = 4096;
  MemBlockDevice dev(Geometry(bs, 400));
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&dev, t] {
      for (uint64_t b = t; b < 400; b += 4) {
        ASSERT_TRUE(dev.Write(PoolBlock(b), 0, Pattern(bs, b)).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (uint64_t b = 0; b < 400; ++b) EXPECT_EQ(ReadBack(dev, b, 0, bs), Pattern(bs, b)) << b;
}

// ------------------------------------------------------ FaultInjection

TEST(FaultInjectionBlockDeviceTest, DropsExactlyUnsyncedWrites) {
  const uint64_t bs = 4096;
  FaultInjectionBlockDevice dev(Geometry(bs, 64));
  ASSERT_TRUE(dev.Write(PoolBlock(1), 0, Pattern(bs, 1)).ok());
  ASSERT_TRUE(dev.Write(PoolBlock(2), 0, Pattern(bs, 2)).ok());
  ASSERT_TRUE(dev.Sync().ok());
  EXPECT_EQ(dev.sync_count(), 1u);
  EXPECT_EQ(dev.unsynced_ops(), 0u);

  // After the sync: overwrite a synced block, write a new one, discard one.
  ASSERT_TRUE(dev.Write(PoolBlock(1), 10, Pattern(20, 11)).ok());
  ASSERT_TRUE(dev.Write(PoolBlock(3), 0, Pattern(bs, 3)).ok());
  ASSERT_TRUE(dev.Discard(PoolBlock(2), 1).ok());
  EXPECT_EQ(dev.unsynced_ops(), 3u);
  EXPECT_EQ(ReadBack(dev, 1, 10, 20), Pattern(20, 11));  // reads see current
  EXPECT_TRUE(AllZero(ReadBack(dev, 2, 0, bs)));

  dev.DropUnsyncedWrites();
  EXPECT_EQ(dev.unsynced_ops(), 0u);
  EXPECT_EQ(ReadBack(dev, 1, 0, bs), Pattern(bs, 1));
  EXPECT_EQ(ReadBack(dev, 2, 0, bs), Pattern(bs, 2));
  EXPECT_TRUE(AllZero(ReadBack(dev, 3, 0, bs)));
  EXPECT_EQ(dev.sync_count(), 1u);

  // What is synced now survives the next crash.
  ASSERT_TRUE(dev.Write(PoolBlock(3), 0, Pattern(bs, 33)).ok());
  ASSERT_TRUE(dev.Sync().ok());
  dev.DropUnsyncedWrites();
  EXPECT_EQ(ReadBack(dev, 3, 0, bs), Pattern(bs, 33));
  EXPECT_EQ(dev.sync_count(), 2u);
}

TEST(FaultInjectionBlockDeviceTest, FailsTheNthIoOnce) {
  const uint64_t bs = 4096;
  FaultInjectionBlockDevice dev(Geometry(bs, 8));
  dev.FailNthIo(3);
  ASSERT_TRUE(dev.Write(PoolBlock(0), 0, Pattern(bs, 0)).ok());  // 1
  EXPECT_EQ(ReadBack(dev, 0, 0, bs), Pattern(bs, 0));            // 2
  Status s = dev.Write(PoolBlock(1), 0, Pattern(bs, 1));         // 3: fails
  EXPECT_EQ(s.code(), Status::Code::kIOError) << s.ToString();
  EXPECT_EQ(s.saved_errno(), EIO);
  EXPECT_TRUE(AllZero(ReadBack(dev, 1, 0, bs)));                 // the failed write had no effect
  ASSERT_TRUE(dev.Write(PoolBlock(1), 0, Pattern(bs, 1)).ok());  // later ones pass

  // A failed Sync makes nothing durable.
  dev.FailNthIo(1);
  s = dev.Sync();
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_EQ(s.saved_errno(), EIO);
  EXPECT_EQ(dev.sync_count(), 0u);
  dev.DropUnsyncedWrites();
  EXPECT_TRUE(AllZero(ReadBack(dev, 0, 0, bs)));

  // A failed Read fails; 0 disables a pending failure.
  dev.FailNthIo(1);
  std::vector<std::byte> buf(16);
  EXPECT_EQ(dev.Read(PoolBlock(0), 0, buf).code(), Status::Code::kIOError);
  dev.FailNthIo(2);
  dev.FailNthIo(0);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(dev.Read(PoolBlock(0), 0, buf).ok());
}

TEST(FaultInjectionBlockDeviceTest, TornWritesPersistNothingHalfOrAllPerWrite) {
  const uint64_t bs = 4096;
  const uint64_t seed = std::random_device()();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::cerr << "torn write seed " << seed << "\n";
  FaultInjectionBlockDevice dev(Geometry(bs, 256), seed);
  EXPECT_EQ(dev.seed(), seed);
  ASSERT_TRUE(dev.Write(PoolBlock(0), 0, Pattern(bs, 1000)).ok());
  ASSERT_TRUE(dev.Sync().ok());
  for (uint64_t b = 1; b < 256; ++b) ASSERT_TRUE(dev.Write(PoolBlock(b), 0, Pattern(bs, b)).ok());
  dev.SetTornWriteOnCrash(true);
  dev.DropUnsyncedWrites();

  EXPECT_EQ(ReadBack(dev, 0, 0, bs), Pattern(bs, 1000));  // synced: intact
  int lost = 0, half = 0, whole = 0;
  for (uint64_t b = 1; b < 256; ++b) {
    std::vector<std::byte> got = ReadBack(dev, b, 0, bs);
    std::vector<std::byte> want = Pattern(bs, b);
    std::vector<std::byte> first(got.begin(), got.begin() + bs / 2);
    std::vector<std::byte> second(got.begin() + bs / 2, got.end());
    if (AllZero(got)) {
      ++lost;
    } else if (got == want) {
      ++whole;
    } else {
      ASSERT_EQ(first, std::vector<std::byte>(want.begin(), want.begin() + bs / 2)) << b;
      ASSERT_TRUE(AllZero(second)) << b;
      ++half;
    }
  }
  // 255 independent three-way choices: each outcome occurs.
  EXPECT_GT(lost, 0);
  EXPECT_GT(half, 0);
  EXPECT_GT(whole, 0);
}

}  // namespace
}  // namespace thinfs

namespace thinfs {
namespace {

// O_DIRECT wants aligned offsets, lengths and buffers; the engine hands over
// anything (partial in-place writes, FUSE buffers). Compares a direct and a
// buffered device over random unaligned I/O. /var/tmp rather than /tmp:
// tmpfs has no O_DIRECT.
TEST(FileBlockDeviceTest, DirectIoAcceptsUnalignedRequests) {
  char tmpl[] = "/var/tmp/thinfs_direct_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const uint64_t bs = 12288;
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(8 * bs)), 0);
  ::close(fd);
  Geometry g(bs, 8);
  auto direct = FileBlockDevice::Open(tmpl, g, /*direct=*/true, /*read_only=*/false);
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  std::vector<std::byte> model(8 * bs);
  uint32_t x = 7;
  for (int i = 0; i < 300; ++i) {
    x = x * 1103515245 + 12345;
    uint64_t b = (x >> 4) % 8;
    uint64_t off = (x >> 9) % bs;
    uint64_t len = 1 + (x >> 3) % (bs - off);
    std::vector<std::byte> data(len + 1);  // +1: write from an odd address
    for (size_t k = 0; k < data.size(); ++k) data[k] = static_cast<std::byte>(x + k);
    std::span<const std::byte> src(data.data() + 1, len);
    ASSERT_TRUE((*direct)->Write(PoolBlock(b), off, src).ok());
    std::memcpy(model.data() + b * bs + off, src.data(), len);
    std::vector<std::byte> got(len + 3);
    std::span<std::byte> dst(got.data() + 3, len);
    ASSERT_TRUE((*direct)->Read(PoolBlock(b), off, dst).ok());
    ASSERT_EQ(std::memcmp(dst.data(), model.data() + b * bs + off, len), 0) << "op " << i;
  }
  ASSERT_TRUE((*direct)->Sync().ok());
  auto buffered = FileBlockDevice::Open(tmpl, g, /*direct=*/false, /*read_only=*/true);
  ASSERT_TRUE(buffered.ok());
  std::vector<std::byte> all(bs);
  for (uint64_t b = 0; b < 8; ++b) {
    ASSERT_TRUE((*buffered)->Read(PoolBlock(b), 0, all).ok());
    EXPECT_EQ(std::memcmp(all.data(), model.data() + b * bs, bs), 0) << "block " << b;
  }
  ::unlink(tmpl);
}

// Copy() against a model over random ranges (aligned and not, whole blocks
// and slivers), buffered and O_DIRECT, and the default (read and write) in
// MemBlockDevice. /var/tmp has no reflink here, so FileBlockDevice copies
// through a buffer; tests/e2e/reflink_host_test.cc covers the reflink.
void CheckCopiesMatchAModel(BlockDevice& dev) {
  const uint64_t bs = dev.geometry().block_size();
  const uint64_t blocks = dev.geometry().data_blocks();
  std::vector<std::byte> model(blocks * bs);
  for (uint64_t b = 0; b < blocks; ++b) {
    const std::vector<std::byte> p = Pattern(bs, 1000 + b);
    ASSERT_TRUE(dev.Write(PoolBlock(b), 0, p).ok());
    std::memcpy(model.data() + b * bs, p.data(), bs);
  }
  std::mt19937_64 rng(5);
  for (int i = 0; i < 200; ++i) {
    const uint64_t from = rng() % blocks;
    const uint64_t to = (from + 1 + rng() % (blocks - 1)) % blocks;
    uint64_t off = rng() % bs;
    uint64_t len = 1 + rng() % (bs - off);
    if (i % 4 == 0) {  // whole 4 KiB pages, the part a reflink can share
      off &= ~uint64_t{4095};
      len = std::max<uint64_t>(4096, len & ~uint64_t{4095});
      len = std::min(len, bs - off);
    }
    ASSERT_TRUE(dev.Copy(PoolBlock(from), PoolBlock(to), off, len).ok()) << "op " << i;
    std::memmove(model.data() + to * bs + off, model.data() + from * bs + off, len);
  }
  ASSERT_TRUE(dev.Sync().ok());
  std::vector<std::byte> got(bs);
  for (uint64_t b = 0; b < blocks; ++b) {
    ASSERT_TRUE(dev.Read(PoolBlock(b), 0, got).ok());
    EXPECT_EQ(std::memcmp(got.data(), model.data() + b * bs, bs), 0) << "block " << b;
  }
}

TEST(FileBlockDeviceTest, CopyMatchesAModelBufferedAndDirect) {
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    char tmpl[] = "/var/tmp/thinfs_copy_XXXXXX";
    int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    ::close(fd);
    auto dev = FileBlockDevice::Open(tmpl, Geometry(65536, 6), direct, /*read_only=*/false);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    CheckCopiesMatchAModel(**dev);
    ::unlink(tmpl);
  }
}

// PrefetchForRead starts reading runs that are not in the page cache, and
// leaves them alone when the last run's last byte is (the kernel's
// readahead is ahead of the reader there, and a hint would cut it short).
TEST(FileBlockDeviceTest, PrefetchForReadHintsOnlyRunsNotCachedAtTheirEnd) {
  char tmpl[] = "/var/tmp/thinfs_prefetch_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const uint64_t bs = 65536;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto dev = FileBlockDevice::Open(tmpl, Geometry(bs, 8), /*direct=*/false, /*read_only=*/false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  for (uint64_t b = 0; b < 8; ++b) ASSERT_TRUE((*dev)->Write(PoolBlock(b), 0, Pattern(bs, b)).ok());
  ASSERT_TRUE((*dev)->Sync().ok());
  Residency cache(fd, 8 * bs);
  auto evict = [&] {
    ASSERT_EQ(::fdatasync(fd), 0);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  };

  evict();
  if (cache.Resident(0, 8 * bs) != 0) {
    ::unlink(tmpl);
    ::close(fd);
    GTEST_FAIL() << "the page cache kept pages of " << tmpl << " after DONTNEED";
  }
  const BlockDevice::Run cold[] = {{PoolBlock(2), 2}, {PoolBlock(6), 1}};
  // The probe reads nothing in where the kernel has cachestat(2), so every
  // probe after an eviction is a miss. Elsewhere it is preadv2(RWF_NOWAIT),
  // which on a miss starts reading its page, and when that read completes
  // before the probe looks the end counts as cached: try again there.
  const int tries = CachedPages(fd, 0, 1).ok() ? 1 : 3;
  bool hinted = (*dev)->PrefetchForRead(cold, 0, {});
  for (int attempt = 1; attempt < tries && !hinted; ++attempt) {
    evict();
    hinted = (*dev)->PrefetchForRead(cold, 0, {});
  }
  EXPECT_TRUE(hinted) << "the runs' end read as cached after DONTNEED, tries: " << tries;
  EXPECT_EQ(cache.WaitResident(2 * bs, 2 * bs), 2 * bs / page) << "cold runs are read in";
  EXPECT_EQ(cache.WaitResident(6 * bs, bs), bs / page) << "cold runs are read in";

  // The run's last page is cached: no hint, so block 4 stays out.
  evict();
  std::vector<std::byte> last(1);
  ASSERT_TRUE((*dev)->Read(PoolBlock(5), bs - 1, last).ok());
  ASSERT_GT(cache.Resident(5 * bs + bs - page, page), 0u);
  const BlockDevice::Run cached_end[] = {{PoolBlock(4), 2}};
  EXPECT_FALSE((*dev)->PrefetchForRead(cached_end, 0, {}));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cache.Resident(4 * bs, bs), 0u) << "a run cached at its end was hinted";

  // O_DIRECT: nothing is hinted (reads bypass the cache).
  evict();
  auto direct = FileBlockDevice::Open(tmpl, Geometry(bs, 8), /*direct=*/true, /*read_only=*/false);
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  const BlockDevice::Run direct_run[] = {{PoolBlock(0), 2}};
  std::vector<std::byte> scratch(2 * bs);
  EXPECT_FALSE((*direct)->PrefetchForRead(direct_run, 0, scratch));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cache.Resident(0, 2 * bs), 0u);
  ::unlink(tmpl);
  ::close(fd);
}

// Removes the file at `path` and closes `fd` when the test ends, failed
// or not.
struct ScratchFile {
  const char* path;
  int fd;
  ~ScratchFile() {
    ::unlink(path);
    ::close(fd);
  }
};

// A device over the file at `path` (made by mkstemp) of `blocks` blocks of
// `bs` bytes, block b holding Pattern(bs, b + 1), synced; null on failure
// (reported).
std::unique_ptr<FileBlockDevice> PatternBlocks(const char* path, uint64_t bs, uint64_t blocks) {
  auto dev = FileBlockDevice::Open(path, Geometry(bs, blocks), /*direct=*/false, /*read_only=*/false);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  if (!dev.ok()) return nullptr;
  for (uint64_t b = 0; b < blocks; ++b) {
    if (!(*dev)->Write(PoolBlock(b), 0, Pattern(bs, b + 1)).ok()) return nullptr;
  }
  if (!(*dev)->Sync().ok()) return nullptr;
  return std::move(*dev);
}

// ReadAround (lever 44): a read within a block whose page is not cached
// makes the disk read the whole read-around window of the block that holds
// it, and nothing beyond; without a window, with O_DIRECT, for a read as
// long as the window or across its end, or for a page already cached, it
// reads nothing in. What the read returns is the same either way.
TEST(FileBlockDeviceTest, ReadAroundReadsTheWindowOfAColdReadAndNothingElse) {
  char tmpl[] = "/var/tmp/thinfs_readaround_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ScratchFile scratch{tmpl, fd};
  const uint64_t bs = 65536, blocks = 8;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  ASSERT_NE(PatternBlocks(tmpl, bs, blocks), nullptr);
  Residency cache(fd, blocks * bs);
  auto evict = [&] {
    ASSERT_EQ(::fdatasync(fd), 0);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ASSERT_EQ(cache.Resident(0, blocks * bs), 0u) << "the page cache kept pages after DONTNEED";
  };
  // A device with `window` bytes of read-around (0: none), or O_DIRECT.
  auto open = [&](uint64_t window, bool direct) {
    auto dev = FileBlockDevice::Open(tmpl, Geometry(bs, blocks), direct, /*read_only=*/false);
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    if (dev.ok()) (*dev)->EnableReadAround(window);
    return dev.ok() ? std::move(*dev) : nullptr;
  };
  // ReadAround of `len` bytes at `offset` into block b, checked against
  // what was written.
  auto read = [&](FileBlockDevice& dev, uint64_t b, uint64_t offset, size_t len) {
    std::vector<std::byte> got(len);
    ASSERT_TRUE(dev.ReadAround(PoolBlock(b), offset, got).ok());
    const std::vector<std::byte> want = Pattern(bs, b + 1);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + static_cast<ptrdiff_t>(offset)))
        << "block " << b << " at " << offset;
  };
  // Pages resident once the reads have had time to land.
  auto settled = [&](uint64_t from, uint64_t len) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return cache.Resident(from, len);
  };

  // The whole 64 KiB block around a cold 4 KiB read, and no other block.
  std::unique_ptr<FileBlockDevice> dev = open(64 << 10, false);
  ASSERT_NE(dev, nullptr);
  evict();
  read(*dev, 3, 8192, 4096);
  EXPECT_EQ(cache.WaitResident(3 * bs, bs), bs / page) << "the block was not read around";
  EXPECT_EQ(settled(0, 3 * bs) + cache.Resident(4 * bs, (blocks - 4) * bs), 0u);
  // A window of 16 KiB: the aligned 16 KiB that holds the read.
  dev = open(16 << 10, false);
  ASSERT_NE(dev, nullptr);
  evict();
  read(*dev, 5, 20480, 4096);
  EXPECT_EQ(cache.WaitResident(5 * bs + 16384, 16384), 16384 / page);
  EXPECT_EQ(settled(0, 5 * bs + 16384) + cache.Resident(5 * bs + 32768, blocks * bs - 5 * bs - 32768),
            0u);
  // Across the window's end, or as long as the window: no hint, so only
  // what the read itself brings in.
  evict();
  read(*dev, 5, 14336, 4096);
  read(*dev, 6, 0, 16384);
  EXPECT_LT(settled(5 * bs, bs), bs / page);
  EXPECT_EQ(cache.Resident(5 * bs + 32768, 32768), 0u);
  EXPECT_LT(cache.Resident(6 * bs, bs), bs / page);
  // A page already cached: its block is not read around.
  dev = open(64 << 10, false);
  ASSERT_NE(dev, nullptr);
  evict();
  {
    std::vector<std::byte> one(4096);
    ASSERT_TRUE(dev->Read(PoolBlock(2), 4096, one).ok());
  }
  const size_t before = settled(2 * bs, bs);
  ASSERT_LT(before, bs / page);
  read(*dev, 2, 4096, 4096);
  EXPECT_EQ(settled(2 * bs, bs), before) << "a cached read was read around";
  // No window, or O_DIRECT: nothing read around.
  for (const bool direct : {false, true}) {
    dev = open(direct ? 64 << 10 : 0, direct);
    ASSERT_NE(dev, nullptr);
    evict();
    read(*dev, 1, 8192, 4096);
    EXPECT_LT(settled(bs, bs), bs / page) << (direct ? "O_DIRECT" : "no window");
  }
}

// A memory cgroup of its own for a child process, limited to `limit`
// bytes (cgroup v2 where its root offers the memory controller, else v1's
// memory hierarchy); removed on destruction. why() says why there is none.
class MemoryCgroup {
 public:
  explicit MemoryCgroup(uint64_t limit) {
    const std::string name = "thinfs_test." + std::to_string(::getpid());
    std::ifstream controllers("/sys/fs/cgroup/cgroup.controllers");
    std::string word;
    bool v2 = false;
    while (controllers >> word) v2 = v2 || word == "memory";
    if (v2) {
      std::ofstream("/sys/fs/cgroup/cgroup.subtree_control") << "+memory";
      dir_ = "/sys/fs/cgroup/" + name, limit_file_ = "memory.max", procs_file_ = "cgroup.procs";
    } else {
      dir_ = "/sys/fs/cgroup/memory/" + name, limit_file_ = "memory.limit_in_bytes";
      procs_file_ = "tasks";
    }
    if (::mkdir(dir_.c_str(), 0755) != 0) {
      why_ = "mkdir " + dir_ + ": " + std::strerror(errno);
      dir_.clear();
      return;
    }
    std::ofstream out(dir_ + "/" + limit_file_);
    out << limit;
    out.flush();
    if (!out) why_ = "cannot write " + dir_ + "/" + limit_file_;
  }
  ~MemoryCgroup() {
    // Its last process has exited; the kernel lets go of it shortly after.
    for (int i = 0; !dir_.empty() && i < 100 && ::rmdir(dir_.c_str()) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;
  const std::string& why() const { return why_; }
  // Moves the calling process in; false if that failed.
  bool Enter() const {
    const int fd = ::open((dir_ + "/" + procs_file_).c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const std::string pid = std::to_string(::getpid());
    const bool ok = ::write(fd, pid.data(), pid.size()) == static_cast<ssize_t>(pid.size());
    ::close(fd);
    return ok;
  }

 private:
  std::string dir_, limit_file_, procs_file_, why_;
};

// Read-around is for a working set the host's cache holds. Where reclaim
// has evicted pages of a window (cachestat(2) still counts them), the
// window is not read around again: its other pages would be evicted before
// they are read. Here a child in a memory cgroup of 8 MiB reads 40 MiB of
// the file, so reclaim evicts its first blocks; those are then not read
// around, while blocks the child never read still are.
TEST(FileBlockDeviceTest, ReadAroundLeavesWindowsThatReclaimEvicted) {
  if (::geteuid() != 0) {
    if (testing::InCi()) FAIL() << "CI runs as root";
    GTEST_SKIP() << "a memory cgroup needs root";
  }
  char tmpl[] = "/var/tmp/thinfs_readaround_reclaim_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ScratchFile scratch{tmpl, fd};
  const uint64_t bs = 65536, blocks = 768, read_by_child = 640;  // 48 MiB, 40 MiB
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::unique_ptr<FileBlockDevice> dev = PatternBlocks(tmpl, bs, blocks);
  ASSERT_NE(dev, nullptr);
  dev->EnableReadAround(bs);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  Result<PageCacheCounts> probe = CountPages(fd, 0, blocks * bs);
  if (!probe.ok()) {
    GTEST_SKIP() << "no cachestat(2) here (" << probe.status().ToString()
                 << "): read-around cannot tell evicted windows, and reads them all";
  }
  // The child reads in a fresh cgroup each try: on this project's VM about
  // half the tries leave no record of an eviction at all (4 in a row seen).
  // A likely cause, not proven: the records are shadow entries, and the
  // shrinker of shadow nodes takes them whenever anything on the machine
  // writes 2 or 3 to /proc/sys/vm/drop_caches, which other benchmarks on
  // a shared VM do every few seconds. In a probe of the same reads, `echo
  // 2` took 2009 records down to 537 (2026-12-05). The failures come in
  // runs: 12 tries in a row failed once at the end of a full test run
  // (2026-12-05, 11:51 UTC). So up to 100 tries, 50 ms apart, for the
  // conditions to change.
  auto child_reads = [&] {
    MemoryCgroup cgroup(8 << 20);
    if (!cgroup.why().empty()) return cgroup.why();
    std::vector<char> buf(1 << 20);  // allocated before the child enters
    const pid_t child = ::fork();
    if (child < 0) return std::string("fork: ") + std::strerror(errno);
    if (child == 0) {
      if (!cgroup.Enter()) ::_exit(2);
      for (uint64_t off = 0; off < read_by_child * bs; off += buf.size()) {
        if (::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off)) <= 0) ::_exit(3);
      }
      ::_exit(0);
    }
    int status = 0;
    if (::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return "the child failed, status " + std::to_string(status);
    }
    return std::string();
  };
  // The block the child read with the most pages that reclaim evicted,
  // none left cached. (Reading one page refaults it, which takes its
  // eviction's record: others must be left to show.) A try counts only if
  // it leaves such a block: one stray record is not enough (CI, stop 49,
  // saw a single partly evicted block and failed on it).
  uint64_t evicted_block = blocks, whole = 0, partly = 0;
  auto find_evicted_block = [&] {
    uint64_t most = 1;
    evicted_block = blocks, whole = 0, partly = 0;
    for (uint64_t b = 0; b < read_by_child; ++b) {
      Result<PageCacheCounts> c = CountPages(fd, b * bs, bs);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      whole += c->evicted == bs / page;
      partly += c->evicted != 0;
      if (c->cached == 0 && c->evicted > most) evicted_block = b, most = c->evicted;
    }
  };
  for (int attempt = 0; attempt < 100 && evicted_block == blocks; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    const std::string why = child_reads();
    if (!why.empty()) {
      if (testing::InCi()) FAIL() << "no memory cgroup under CI: " << why;
      GTEST_SKIP() << "no memory cgroup: " << why;
    }
    find_evicted_block();
    ASSERT_FALSE(HasFatalFailure());
  }
  ASSERT_LT(evicted_block, blocks) << "100 tries of the 8 MiB cgroup's reads left no block with"
                                   << " evicted pages and none cached; in the last, blocks"
                                   << " evicted whole " << whole << ", in part " << partly;
  Residency cache(fd, blocks * bs);
  auto read = [&](uint64_t b) {
    std::vector<std::byte> got(4096);
    ASSERT_TRUE(dev->ReadAround(PoolBlock(b), 8192, got).ok());
    const std::vector<std::byte> want = Pattern(bs, b + 1);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + 8192)) << "block " << b;
  };
  read(evicted_block);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(cache.Resident(evicted_block * bs, bs), bs / page)
      << "block " << evicted_block << ", evicted by reclaim, was read around";
  // Never read by the child: no page of it was evicted, so it is read around.
  ASSERT_EQ(::posix_fadvise(fd, static_cast<off_t>(read_by_child * bs), 0, POSIX_FADV_DONTNEED), 0);
  read(700);
  EXPECT_EQ(cache.WaitResident(700 * bs, bs), bs / page) << "a block never evicted";
}

// A read of one cold run is read through the page cache, so the kernel's
// readahead follows it as it follows a reader's pread; a WILLNEED hint
// leaves nothing beyond the run (docs/benchmarks.md, lever 21).
TEST(FileBlockDeviceTest, PrefetchForReadReadsOneColdRunThroughTheCache) {
  char tmpl[] = "/var/tmp/thinfs_readthrough_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const uint64_t bs = 65536, blocks = 64;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto dev =
      FileBlockDevice::Open(tmpl, Geometry(bs, blocks), /*direct=*/false, /*read_only=*/false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::vector<std::byte> file(blocks * bs);
  for (uint64_t b = 0; b < blocks; ++b) {
    std::vector<std::byte> p = Pattern(bs, b + 1);
    std::memcpy(file.data() + b * bs, p.data(), bs);
    ASSERT_TRUE((*dev)->Write(PoolBlock(b), 0, p).ok());
  }
  ASSERT_TRUE((*dev)->Sync().ok());
  Residency cache(fd, blocks * bs);
  auto evict = [&] {
    ASSERT_EQ(::fdatasync(fd), 0);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ASSERT_EQ(cache.Resident(0, blocks * bs), 0u) << "the page cache kept pages after DONTNEED";
  };
  // PrefetchForRead after an eviction; again, where the probe is preadv2,
  // while the probe's own read made the end look cached (see the test
  // above).
  const int tries = CachedPages(fd, 0, 1).ok() ? 1 : 3;
  auto cold_read = [&](std::span<const BlockDevice::Run> runs, uint64_t head,
                       std::span<std::byte> buf) {
    bool cold = false;
    for (int attempt = 0; attempt < tries && !cold; ++attempt) {
      evict();
      cold = (*dev)->PrefetchForRead(runs, head, buf);
    }
    EXPECT_TRUE(cold) << "the run's end read as cached after DONTNEED, tries: " << tries;
  };
  // Pages resident past the first two blocks once readahead has settled.
  auto resident_beyond = [&] {
    size_t n = 0;
    for (int i = 0; i < 50; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      size_t now = cache.Resident(2 * bs, (blocks - 2) * bs);
      if (now == n && n != 0) break;
      n = now;
    }
    return n;
  };

  // What the host's readahead does for a reader: a pread of blocks 0-1 on
  // a descriptor of its own (so that the device's is fresh below).
  evict();
  {
    int other = ::open(tmpl, O_RDONLY);
    ASSERT_GE(other, 0);
    std::vector<std::byte> buf(2 * bs - 100);
    ASSERT_EQ(::pread(other, buf.data(), buf.size(), 100), static_cast<ssize_t>(buf.size()));
    ::close(other);
  }
  const size_t pread_ahead = resident_beyond();

  std::vector<std::byte> scratch(2 * bs - 100);
  const BlockDevice::Run run[] = {{PoolBlock(0), 2}};
  cold_read(run, 100, scratch);
  EXPECT_EQ(std::memcmp(scratch.data(), file.data() + 100, scratch.size()), 0)
      << "the run is read from `head` bytes into its first block";
  EXPECT_EQ(cache.Resident(0, 2 * bs), 2 * bs / page);
  const size_t prefetch_ahead = resident_beyond();
  EXPECT_GT(pread_ahead, 0u) << "the file system under /var/tmp read nothing ahead of a pread, "
                                "so this test cannot tell a read-through from a hint";
  EXPECT_GT(prefetch_ahead, 0u) << "no readahead followed the read of one cold run";

  // scratch bounds the read, and so does the run's end.
  std::vector<std::byte> small(bs / 2);
  const BlockDevice::Run far[] = {{PoolBlock(40), 2}};
  cold_read(far, 0, small);
  EXPECT_EQ(std::memcmp(small.data(), file.data() + 40 * bs, small.size()), 0);
  std::vector<std::byte> big(4 * bs, std::byte{0x5a});
  cold_read(far, bs / 2, big);
  EXPECT_EQ(std::memcmp(big.data(), file.data() + 40 * bs + bs / 2, bs + bs / 2), 0);
  EXPECT_EQ(big[bs + bs / 2], std::byte{0x5a}) << "read past the run's end";

  // No scratch: one run is hinted like several.
  const BlockDevice::Run hinted[] = {{PoolBlock(20), 2}};
  cold_read(hinted, 0, {});
  EXPECT_EQ(cache.WaitResident(20 * bs, 2 * bs), 2 * bs / page) << "a run without scratch was not hinted";
  ::unlink(tmpl);
  ::close(fd);
}

TEST(MemBlockDeviceTest, CopyMatchesAModel) {
  MemBlockDevice dev(Geometry(12288, 5));
  CheckCopiesMatchAModel(dev);
}

}  // namespace
}  // namespace thinfs
