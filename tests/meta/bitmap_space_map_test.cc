// Tests of meta::BitmapSpaceMap: allocation, the pending-free protocol,
// reopen (clean and after a crash), corruption detection, grow and
// concurrency.

#include "meta/bitmap_space_map.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meta/format.h"
#include "tests/util/pool_test_util.h"

namespace thinfs::meta {
namespace {

constexpr uint64_t kBs = 64 * 1024;

class BitmapSpaceMapTest : public ::testing::Test {
 protected:
  // A "threadsafe" death test runs the test again in a child process (a new
  // exec of this binary), which runs SetUp again and then dies inside
  // EXPECT_DEATH without reaching TearDown. So the parent names its directory
  // in the environment, and a child makes its own inside it: the parent's
  // TearDown removes both.
  static constexpr const char* kParentDirEnv = "THINFS_BITMAP_TEST_PARENT_DIR";

  void SetUp() override {
    const char* parent = std::getenv(kParentDirEnv);
    std::string tmpl = parent != nullptr ? std::string(parent) + "/child_XXXXXX"
                                         : std::string("/tmp/thinfs_bitmap_XXXXXX");
    char* p = ::mkdtemp(tmpl.data());
    ASSERT_NE(p, nullptr) << tmpl << ": " << std::strerror(errno);
    dir_ = p;
    path_ = dir_ + "/bitmap";
    if (parent == nullptr) {
      ASSERT_EQ(::setenv(kParentDirEnv, dir_.c_str(), 1), 0);
      owns_env_ = true;
    }
  }
  void TearDown() override {
    if (owns_env_) ::unsetenv(kParentDirEnv);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::unique_ptr<BitmapSpaceMap> CreateDirty(uint64_t blocks) {
    auto m = BitmapSpaceMap::Create(path_, blocks, kBs);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return nullptr;
    EXPECT_TRUE((*m)->MarkDirty().ok());
    return std::move(*m);
  }

  std::unique_ptr<BitmapSpaceMap> Reopen(uint64_t blocks) {
    auto m = BitmapSpaceMap::Open(path_, blocks, kBs, false);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return nullptr;
    return std::move(*m);
  }

  Status OpenStatus(uint64_t blocks, uint64_t block_size = kBs) {
    return BitmapSpaceMap::Open(path_, blocks, block_size, false).status();
  }

  std::vector<uint8_t> ReadFileBytes() {
    std::vector<uint8_t> v(std::filesystem::file_size(path_));
    int fd = ::open(path_.c_str(), O_RDONLY);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::pread(fd, v.data(), v.size(), 0), static_cast<ssize_t>(v.size()));
    ::close(fd);
    return v;
  }

  void WriteFileBytes(uint64_t offset, const void* data, size_t n) {
    int fd = ::open(path_.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, data, n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
    ::close(fd);
  }

  void FlipByte(uint64_t offset) {
    uint8_t b = ReadFileBytes().at(offset);
    b ^= 0x40;
    WriteFileBytes(offset, &b, 1);
  }

  // Rewrites header field bytes and re-seals the header checksum, so that
  // the check after the checksum is what fails.
  void PatchHeaderAndReseal(uint64_t offset, const void* data, size_t n) {
    std::vector<uint8_t> page = ReadFileBytes();
    page.resize(kBitmapHeaderSize);
    std::memcpy(page.data() + offset, data, n);
    std::memset(page.data() + 56, 0, 8);
    uint64_t sum = XXH64(page.data(), page.size(), kBitmapChecksumSeed);
    std::memcpy(page.data() + 56, &sum, 8);  // little-endian host
    WriteFileBytes(0, page.data(), page.size());
  }

  std::string dir_;
  std::string path_;
  bool owns_env_ = false;
};

std::vector<uint64_t> AllocateAll(BitmapSpaceMap& m) {
  std::vector<uint64_t> got;
  while (true) {
    Result<PoolBlock> b = m.Allocate();
    if (!b.ok()) {
      EXPECT_TRUE(b.status().IsNoSpace()) << b.status().ToString();
      break;
    }
    got.push_back(b->value);
  }
  return got;
}

void FreeAndRelease(BitmapSpaceMap& m, const std::vector<uint64_t>& blocks) {
  for (uint64_t b : blocks) m.Free(PoolBlock(b));
  std::vector<PoolBlock> taken = m.TakePendingFrees();
  ASSERT_EQ(taken.size(), blocks.size());
  m.Release(taken);
}

// ------------------------------------------------------------ basics

TEST_F(BitmapSpaceMapTest, CreateIsCleanAndFreeAndRefusesToOverwrite) {
  auto m = BitmapSpaceMap::Create(path_, 1000, kBs);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE((*m)->was_clean());
  EXPECT_EQ((*m)->generation(), 0u);
  EXPECT_EQ((*m)->total_blocks(), 1000u);
  EXPECT_EQ((*m)->free_blocks(), 1000u);
  EXPECT_FALSE((*m)->IsAllocated(PoolBlock(999)));
  EXPECT_EQ(std::filesystem::file_size(path_), kBitmapHeaderSize + 16 * 8);

  auto again = BitmapSpaceMap::Create(path_, 10, kBs);
  EXPECT_EQ(again.status().code(), Status::Code::kExists) << again.status().ToString();
  auto bad = BitmapSpaceMap::Create(dir_ + "/other", 10, 5000);
  EXPECT_TRUE(bad.status().IsInvalidArgument()) << bad.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/other"));
}

class BitmapSizeTest : public BitmapSpaceMapTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(BitmapSizeTest, AllocatesEveryBlockOnceThenNoSpace) {
  const uint64_t n = GetParam();
  auto m = CreateDirty(n);
  ASSERT_NE(m, nullptr);
  std::vector<uint64_t> got = AllocateAll(*m);
  ASSERT_EQ(got.size(), n);
  // A fresh pool allocates sequentially.
  for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], i);
  EXPECT_EQ(m->free_blocks(), 0u);
  Result<PoolBlock> r = m->Allocate();
  EXPECT_TRUE(r.status().IsNoSpace());
  for (uint64_t i = 0; i < n; ++i) EXPECT_TRUE(m->IsAllocated(PoolBlock(i)));
  ASSERT_TRUE(m->Sync(1).ok());

  // Padding bits past nr_blocks stay zero in the file.
  std::vector<uint8_t> file = ReadFileBytes();
  ASSERT_EQ(file.size(), kBitmapHeaderSize + BitmapBodyBytes(n));
  for (uint64_t bit = n; bit < BitmapBodyBytes(n) * 8; ++bit) {
    EXPECT_EQ((file[kBitmapHeaderSize + bit / 8] >> (bit % 8)) & 1, 0) << bit;
  }
  for (uint64_t bit = 0; bit < n; ++bit) {
    EXPECT_EQ((file[kBitmapHeaderSize + bit / 8] >> (bit % 8)) & 1, 1) << bit;
  }

  // The last block, once released, is found again (it sits in the padded word).
  FreeAndRelease(*m, {n - 1});
  Result<PoolBlock> last = m->Allocate();
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->value, n - 1);
}

INSTANTIATE_TEST_SUITE_P(Sizes, BitmapSizeTest,
                         ::testing::Values(uint64_t{1}, uint64_t{63}, uint64_t{64}, uint64_t{65},
                                           uint64_t{1000}, uint64_t{4096}));

TEST_F(BitmapSpaceMapTest, EmptyPoolHasNoSpace) {
  auto m = CreateDirty(0);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->Allocate().status().IsNoSpace());
  ASSERT_TRUE(m->MarkClean(1).ok());
  m.reset();
  EXPECT_NE(Reopen(0), nullptr);
}

TEST_F(BitmapSpaceMapTest, FreesStayAllocatedUntilRelease) {
  auto m = CreateDirty(128);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(AllocateAll(*m).size(), 128u);
  m->Free(PoolBlock(5));
  m->Free(PoolBlock(77));
  // Queued: still allocated, not counted free, not handed out.
  EXPECT_TRUE(m->IsAllocated(PoolBlock(5)));
  EXPECT_EQ(m->free_blocks(), 0u);
  EXPECT_TRUE(m->Allocate().status().IsNoSpace());

  std::vector<PoolBlock> taken = m->TakePendingFrees();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].value, 5u);
  EXPECT_EQ(taken[1].value, 77u);
  EXPECT_TRUE(m->TakePendingFrees().empty());
  // Taken but not released (the commit is in flight): still invisible.
  EXPECT_TRUE(m->IsAllocated(PoolBlock(77)));
  EXPECT_EQ(m->free_blocks(), 0u);
  EXPECT_TRUE(m->Allocate().status().IsNoSpace());

  // A free queued during the commit belongs to the next one.
  m->Free(PoolBlock(100));
  m->Release(taken);
  EXPECT_EQ(m->free_blocks(), 2u);
  EXPECT_FALSE(m->IsAllocated(PoolBlock(5)));
  EXPECT_TRUE(m->IsAllocated(PoolBlock(100)));
  std::set<uint64_t> again;
  for (int i = 0; i < 2; ++i) {
    Result<PoolBlock> b = m->Allocate();
    ASSERT_TRUE(b.ok());
    again.insert(b->value);
  }
  EXPECT_EQ(again, (std::set<uint64_t>{5, 77}));
  EXPECT_TRUE(m->Allocate().status().IsNoSpace());
  std::vector<PoolBlock> next = m->TakePendingFrees();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].value, 100u);
}

TEST_F(BitmapSpaceMapTest, FreeCounterMatchesAModel) {
  const uint64_t n = 777;
  const uint64_t seed = std::random_device()();
  std::cerr << "seed " << seed << "\n";
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto m = CreateDirty(n);
  ASSERT_NE(m, nullptr);
  std::set<uint64_t> used, queued;
  // Blocks of runs not yet written to: what Unallocate may give back.
  std::vector<uint64_t> spare;
  std::vector<PoolBlock> in_flight;
  for (int step = 0; step < 20000; ++step) {
    switch (rng() % 8) {
      case 6: {
        const uint64_t max = 1 + rng() % 100;
        uint64_t count = 0;
        Result<PoolBlock> r = m->AllocateRun(max, &count);
        if (used.size() == n) {
          ASSERT_TRUE(r.status().IsNoSpace());
          break;
        }
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        ASSERT_GE(count, 1u);
        ASSERT_LE(count, max);
        ASSERT_LE(r->value + count, n);
        for (uint64_t b = r->value; b < r->value + count; ++b) {
          ASSERT_TRUE(used.insert(b).second) << "handed out twice: " << b;
          if (rng() % 2 == 0) spare.push_back(b);
        }
        // Maximal: it stopped at max, the end, or a block in use.
        const uint64_t end = r->value + count;
        ASSERT_TRUE(count == max || end == n || used.count(end) == 1) << "stopped early at " << end;
        break;
      }
      case 7: {
        if (spare.empty()) break;
        const size_t k = rng() % spare.size();
        const uint64_t b = spare[k];
        spare[k] = spare.back();
        spare.pop_back();
        if (queued.count(b) != 0 || used.count(b) == 0) break;
        m->Unallocate(PoolBlock(b), 1);
        used.erase(b);
        break;
      }
      case 0:
      case 1:
      case 2: {
        Result<PoolBlock> b = m->Allocate();
        if (used.size() == n) {
          ASSERT_TRUE(b.status().IsNoSpace());
        } else {
          ASSERT_TRUE(b.ok()) << b.status().ToString();
          ASSERT_LT(b->value, n);
          ASSERT_TRUE(used.insert(b->value).second) << "handed out twice: " << b->value;
        }
        break;
      }
      case 3: {
        if (used.empty()) break;
        auto it = used.begin();
        std::advance(it, static_cast<long>(rng() % used.size()));
        if (queued.count(*it) != 0) break;
        m->Free(PoolBlock(*it));
        queued.insert(*it);
        break;
      }
      case 4:
        if (in_flight.empty()) in_flight = m->TakePendingFrees();
        break;
      case 5:
        for (PoolBlock b : in_flight) {
          used.erase(b.value);
          queued.erase(b.value);
        }
        m->Release(in_flight);
        in_flight.clear();
        break;
    }
    ASSERT_EQ(m->free_blocks(), n - used.size());
  }
  for (uint64_t b = 0; b < n; ++b) EXPECT_EQ(m->IsAllocated(PoolBlock(b)), used.count(b) == 1);
}

TEST_F(BitmapSpaceMapTest, CursorContinuesAfterLastAllocationAndWraps) {
  auto m = CreateDirty(200);
  ASSERT_NE(m, nullptr);
  for (int i = 0; i < 150; ++i) ASSERT_TRUE(m->Allocate().ok());
  FreeAndRelease(*m, {20, 149});
  // Not 20 nor 149: the cursor is past them.
  Result<PoolBlock> b = m->Allocate();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->value, 150u);
  for (uint64_t want = 151; want < 200; ++want) {
    b = m->Allocate();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->value, want);
  }
  // Wrapped around to the holes.
  b = m->Allocate();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->value, 20u);
  b = m->Allocate();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->value, 149u);
  EXPECT_TRUE(m->Allocate().status().IsNoSpace());

  // A hole just before the cursor in the cursor's own word is found after
  // a full lap.
  FreeAndRelease(*m, {130});
  b = m->Allocate();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->value, 130u);
}

// AllocateRun (lever 38): the block Allocate() would return and the free
// blocks after it, across words, up to a used block, `max` or the end.
TEST_F(BitmapSpaceMapTest, AllocateRunTakesTheFreeBlocksThatFollow) {
  auto m = CreateDirty(300);
  ASSERT_NE(m, nullptr);
  // The run AllocateRun(max) takes, as [first, first + count).
  auto run = [&m](uint64_t max) -> std::pair<uint64_t, uint64_t> {
    uint64_t count = 0;
    Result<PoolBlock> r = m->AllocateRun(max, &count);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::pair{r->value, count} : std::pair{uint64_t{0}, uint64_t{0}};
  };
  using Run = std::pair<uint64_t, uint64_t>;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(m->Allocate().ok());
  m->MarkUsed(PoolBlock(150));
  EXPECT_EQ(run(100), Run(3, 100));     // 3..102: across words 0 and 1
  EXPECT_EQ(run(1000), Run(103, 47));   // stops before the used block 150
  EXPECT_EQ(run(1000), Run(151, 149));  // stops at the end, no wrap
  EXPECT_EQ(m->free_blocks(), 0u);
  for (uint64_t b = 0; b < 300; ++b) EXPECT_TRUE(m->IsAllocated(PoolBlock(b))) << b;
  uint64_t n = 0;
  EXPECT_TRUE(m->AllocateRun(4, &n).status().IsNoSpace());

  // The unused tail of the last run comes back at once, and the cursor
  // goes back to where it began.
  m->Unallocate(PoolBlock(200), 100);
  EXPECT_EQ(m->free_blocks(), 100u);
  Result<PoolBlock> b = m->Allocate();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->value, 200u);
  // A tail that is not the last run's leaves the cursor where it is.
  m->Unallocate(PoolBlock(10), 20);
  EXPECT_EQ(run(2), Run(201, 2));
  EXPECT_EQ(run(1000), Run(203, 97));
  // After a lap: a run up to a used block, one that ends with its word's
  // last bit, and a run of one where the next block is used.
  m->Unallocate(PoolBlock(128 + 60), 4);  // 188..191, the end of word 2
  EXPECT_EQ(run(64), Run(10, 20));
  EXPECT_EQ(run(64), Run(188, 4));
  m->Unallocate(PoolBlock(250), 1);
  m->Unallocate(PoolBlock(252), 1);
  EXPECT_EQ(run(64), Run(250, 1));
}

TEST_F(BitmapSpaceMapTest, MarkUsedAndClearAllForRebuild) {
  auto m = CreateDirty(300);
  ASSERT_NE(m, nullptr);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(m->Allocate().ok());
  m->Free(PoolBlock(3));
  m->ClearAllForRebuild();
  EXPECT_EQ(m->free_blocks(), 300u);
  EXPECT_TRUE(m->TakePendingFrees().empty());
  m->MarkUsed(PoolBlock(0));
  m->MarkUsed(PoolBlock(1));
  m->MarkUsed(PoolBlock(1));  // idempotent: shared blocks are seen twice
  m->MarkUsed(PoolBlock(299));
  EXPECT_EQ(m->free_blocks(), 297u);
  std::vector<uint64_t> got = AllocateAll(*m);
  ASSERT_EQ(got.size(), 297u);
  EXPECT_EQ(got.front(), 2u);
  EXPECT_EQ(std::count(got.begin(), got.end(), 299u), 0);
}

// ------------------------------------------------------------ reopen

TEST_F(BitmapSpaceMapTest, CleanReopenKeepsStateAndVerifiesBody) {
  std::vector<uint64_t> expect_used;
  {
    auto m = CreateDirty(1000);
    ASSERT_NE(m, nullptr);
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(m->Allocate().ok());
    std::vector<uint64_t> freed;
    for (uint64_t b = 0; b < 300; b += 3) freed.push_back(b);
    FreeAndRelease(*m, freed);
    for (uint64_t b = 0; b < 300; ++b) {
      if (b % 3 != 0) expect_used.push_back(b);
    }
    ASSERT_TRUE(m->MarkClean(42).ok());
    EXPECT_EQ(m->generation(), 42u);
  }
  auto m = Reopen(1000);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->was_clean());
  EXPECT_EQ(m->generation(), 42u);
  EXPECT_EQ(m->free_blocks(), 1000u - expect_used.size());
  for (uint64_t b = 0; b < 1000; ++b) {
    bool want = std::binary_search(expect_used.begin(), expect_used.end(), b);
    EXPECT_EQ(m->IsAllocated(PoolBlock(b)), want) << b;
  }
  ASSERT_TRUE(m->MarkDirty().ok());
  Result<PoolBlock> b = m->Allocate();
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(std::binary_search(expect_used.begin(), expect_used.end(), b->value));
  m.reset();
  // MarkDirty reached the file: the next open is an unclean one.
  m = Reopen(1000);
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->was_clean());
}

TEST_F(BitmapSpaceMapTest, UncleanReopenKeepsEveryBitSetBeforeTheLastSync) {
  std::vector<uint64_t> synced;
  {
    auto m = CreateDirty(5000);
    ASSERT_NE(m, nullptr);
    for (int i = 0; i < 1234; ++i) {
      Result<PoolBlock> b = m->Allocate();
      ASSERT_TRUE(b.ok());
      synced.push_back(b->value);
    }
    ASSERT_TRUE(m->Sync(9).ok());
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(m->Allocate().ok());
    // Crash: no MarkClean, no further Sync.
  }
  auto m = Reopen(5000);
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->was_clean());
  EXPECT_EQ(m->generation(), 9u);
  for (uint64_t b : synced) EXPECT_TRUE(m->IsAllocated(PoolBlock(b))) << b;
  // Over-reporting is allowed (the later bits reached the page cache), so
  // only a lower bound on what is used.
  EXPECT_LE(m->free_blocks(), 5000u - synced.size());
}

TEST_F(BitmapSpaceMapTest, CrashBetweenBitmapAndMetadataNeverDoubleAllocates) {
  std::set<uint64_t> before_crash;
  {
    auto m = CreateDirty(2000);
    ASSERT_NE(m, nullptr);
    for (int i = 0; i < 1500; ++i) {
      Result<PoolBlock> b = m->Allocate();
      ASSERT_TRUE(b.ok());
      before_crash.insert(b->value);
    }
    // Frees queued and taken for a commit whose metadata write never
    // happens: their bits must survive.
    for (uint64_t b = 0; b < 1500; b += 2) m->Free(PoolBlock(b));
    std::vector<PoolBlock> taken = m->TakePendingFrees();
    ASSERT_EQ(taken.size(), 750u);
    for (uint64_t b = 1; b < 1500; b += 2) m->Free(PoolBlock(b));
    ASSERT_TRUE(m->Sync(1).ok());
    // The object dies without Release or MarkClean.
  }
  auto m = Reopen(2000);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->MarkDirty().ok());
  std::vector<uint64_t> after = AllocateAll(*m);
  EXPECT_EQ(after.size(), 500u);
  for (uint64_t b : after) EXPECT_EQ(before_crash.count(b), 0u) << "double allocation of " << b;
}

TEST_F(BitmapSpaceMapTest, SyncRecordsGenerationAndReadOnlyOpenRefusesWrites) {
  {
    auto m = CreateDirty(64);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(m->Allocate().ok());
    ASSERT_TRUE(m->Sync(5).ok());
    EXPECT_EQ(m->generation(), 5u);
    ASSERT_TRUE(m->Allocate().ok());
    ASSERT_TRUE(m->Sync(6).ok());
  }
  auto r = BitmapSpaceMap::Open(path_, 64, kBs, /*read_only=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  BitmapSpaceMap& m = **r;
  EXPECT_EQ(m.generation(), 6u);
  EXPECT_TRUE(m.IsAllocated(PoolBlock(0)));
  EXPECT_TRUE(m.IsAllocated(PoolBlock(1)));
  EXPECT_EQ(m.free_blocks(), 62u);
  EXPECT_EQ(m.Allocate().status().code(), Status::Code::kReadOnly);
  EXPECT_EQ(m.MarkDirty().code(), Status::Code::kReadOnly);
  EXPECT_EQ(m.Sync(7).code(), Status::Code::kReadOnly);
  EXPECT_EQ(m.MarkClean(7).code(), Status::Code::kReadOnly);
  EXPECT_EQ(m.Grow(100).code(), Status::Code::kReadOnly);
}

TEST_F(BitmapSpaceMapTest, SyncWithoutAChangedBitWritesOnlyTheGeneration) {
  auto m = CreateDirty(256);
  ASSERT_NE(m, nullptr);
  Result<PoolBlock> a = m->Allocate();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(m->Sync(5).ok());
  const std::vector<uint8_t> after_sync = ReadFileBytes();
  // No bit changed: the body is not synced again, but the generation is
  // (it is what detects a metadata WAL that lost its tail).
  ASSERT_TRUE(m->Sync(6).ok());
  EXPECT_EQ(m->generation(), 6u);
  const std::vector<uint8_t> after_skip = ReadFileBytes();
  ASSERT_EQ(after_skip.size(), after_sync.size());
  EXPECT_TRUE(std::equal(after_skip.begin() + kBitmapHeaderSize, after_skip.end(),
                         after_sync.begin() + kBitmapHeaderSize));
  EXPECT_NE(after_skip, after_sync) << "the header's generation moved";
  // A cleared bit is a change too: the file follows the memory again.
  m->Free(*a);
  m->Release(m->TakePendingFrees());
  ASSERT_TRUE(m->Sync(7).ok());
  EXPECT_EQ(m->generation(), 7u);
  EXPECT_NE(ReadFileBytes(), after_sync);
  ASSERT_TRUE(m->Sync(8).ok());
  EXPECT_EQ(m->generation(), 8u);
  // A bit set after a skipped Sync is made durable by the next one.
  Result<PoolBlock> b = m->Allocate();
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(m->Sync(9).ok());
  EXPECT_EQ(m->generation(), 9u);
  // Every other way to change a bit counts too.
  m->MarkUsed(PoolBlock(200));
  ASSERT_TRUE(m->Sync(10).ok());
  EXPECT_EQ(m->generation(), 10u);
  m->ClearAllForRebuild();
  ASSERT_TRUE(m->Sync(11).ok());
  EXPECT_EQ(m->generation(), 11u);
  m->MarkUsed(*b);
  ASSERT_TRUE(m->Sync(12).ok());
  EXPECT_EQ(m->generation(), 12u);
  m.reset();  // a crash: no MarkClean
  m = Reopen(256);
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->was_clean());
  EXPECT_EQ(m->generation(), 12u);
  EXPECT_TRUE(m->IsAllocated(*b));
  EXPECT_FALSE(m->IsAllocated(PoolBlock(200)));
}

// -------------------------------------------------------- corruption

TEST_F(BitmapSpaceMapTest, MissingFileIsNotFound) {
  EXPECT_TRUE(OpenStatus(10).IsNotFound()) << OpenStatus(10).ToString();
}

TEST_F(BitmapSpaceMapTest, HeaderByteFlipIsChecksumCorruption) {
  {
    auto m = CreateDirty(1000);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(m->MarkClean(3).ok());
  }
  // The generation field, a reserved byte, and the checksum itself.
  for (uint64_t off : {uint64_t{33}, uint64_t{2000}, uint64_t{60}}) {
    SCOPED_TRACE(off);
    FlipByte(off);
    Status s = OpenStatus(1000);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find("bitmap header checksum mismatch: expected 0x"), std::string::npos)
        << s.ToString();
    EXPECT_NE(s.message().find(", found 0x"), std::string::npos) << s.ToString();
    FlipByte(off);
    EXPECT_TRUE(OpenStatus(1000).ok());
  }
}

TEST_F(BitmapSpaceMapTest, BadMagicIsCorruption) {
  { ASSERT_NE(CreateDirty(10), nullptr); }
  FlipByte(0);
  Status s = OpenStatus(10);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("magic mismatch: expected 0x31504d424e494854"), std::string::npos)
      << s.ToString();
}

TEST_F(BitmapSpaceMapTest, BodyByteFlipOfCleanBitmapIsCorruption) {
  {
    auto m = CreateDirty(1000);
    ASSERT_NE(m, nullptr);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(m->Allocate().ok());
    ASSERT_TRUE(m->MarkClean(3).ok());
  }
  FlipByte(kBitmapHeaderSize + 100);
  Status s = OpenStatus(1000);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("bitmap body checksum mismatch: expected 0x"), std::string::npos)
      << s.ToString();
}

TEST_F(BitmapSpaceMapTest, DirtyBodyIsNotChecksummed) {
  {
    auto m = CreateDirty(1000);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(m->Sync(1).ok());
  }
  // A set bit in a dirty bitmap is a legal leak after a crash.
  FlipByte(kBitmapHeaderSize + 100);
  auto m = Reopen(1000);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->free_blocks(), 999u);
}

TEST_F(BitmapSpaceMapTest, TruncatedFileIsCorruption) {
  {
    auto m = CreateDirty(1000);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(m->MarkClean(1).ok());
  }
  std::filesystem::resize_file(path_, kBitmapHeaderSize + BitmapBodyBytes(1000) - 8);
  Status s = OpenStatus(1000);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("truncated: expected 4224 bytes, found 4216 bytes"), std::string::npos)
      << s.ToString();
  std::filesystem::resize_file(path_, 100);
  s = OpenStatus(1000);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  std::filesystem::resize_file(path_, 0);
  EXPECT_TRUE(OpenStatus(1000).IsCorruption());
}

TEST_F(BitmapSpaceMapTest, LongerFileFromAnInterruptedGrowOpens) {
  {
    auto m = CreateDirty(1000);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(m->MarkClean(1).ok());
  }
  std::filesystem::resize_file(path_, kBitmapHeaderSize + BitmapBodyBytes(1000) + 4096);
  EXPECT_TRUE(OpenStatus(1000).ok()) << OpenStatus(1000).ToString();
}

TEST_F(BitmapSpaceMapTest, WrongGeometryIsInvalidArgument) {
  { ASSERT_NE(CreateDirty(1000), nullptr); }
  Status s = OpenStatus(1001);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("block count: expected at least 1001, found 1000"), std::string::npos)
      << s.ToString();
  s = OpenStatus(1000, 4096);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("block size: expected 4096, found 65536"), std::string::npos)
      << s.ToString();
}

TEST_F(BitmapSpaceMapTest, UnknownVersionOrIncompatFlagIsRefused) {
  { ASSERT_NE(CreateDirty(10), nullptr); }
  const uint32_t v2 = 2;
  PatchHeaderAndReseal(8, &v2, 4);
  Status s = OpenStatus(10);
  EXPECT_EQ(s.code(), Status::Code::kNotSupported) << s.ToString();
  EXPECT_NE(s.message().find("expected 1, found 2"), std::string::npos) << s.ToString();

  const uint32_t v1 = 1, flag = 4;
  PatchHeaderAndReseal(8, &v1, 4);
  EXPECT_TRUE(OpenStatus(10).ok());
  PatchHeaderAndReseal(12, &flag, 4);
  s = OpenStatus(10);
  EXPECT_EQ(s.code(), Status::Code::kNotSupported) << s.ToString();

  const uint32_t no_flags = 0, clean = 7;
  PatchHeaderAndReseal(12, &no_flags, 4);
  PatchHeaderAndReseal(40, &clean, 4);
  s = OpenStatus(10);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

TEST_F(BitmapSpaceMapTest, NonzeroReservedHeaderBytesAreCorruption) {
  // format.h: the reserved field (offset 44) and the page past the fields
  // must be zero in version 1. A resealed header with anything there was
  // not written by thinfs (found by fuzz/bitmap_header_fuzzer.cc).
  { ASSERT_NE(CreateDirty(10), nullptr); }
  const uint8_t one = 1, zero = 0;
  for (uint64_t offset : {uint64_t{44}, uint64_t{47}, uint64_t{64}, kBitmapHeaderSize - 1}) {
    PatchHeaderAndReseal(offset, &one, 1);
    Status s = OpenStatus(10);
    EXPECT_TRUE(s.IsCorruption()) << offset << ": " << s.ToString();
    EXPECT_NE(s.message().find("reserved header byte " + std::to_string(offset) + " not zero"),
              std::string::npos)
        << s.ToString();
    PatchHeaderAndReseal(offset, &zero, 1);
    EXPECT_TRUE(OpenStatus(10).ok()) << offset;
  }
}

TEST_F(BitmapSpaceMapTest, BlockCountBeyondAnyPoolIsCorruption) {
  // A resealed header claiming 2^64 - 1 blocks: the body size computation
  // overflowed to 0 bytes and the map read past its mapping (found by
  // fuzz/bitmap_header_fuzzer.cc). More blocks than expected is otherwise
  // accepted (an interrupted grow), so the bound is the superblock's.
  { ASSERT_NE(CreateDirty(10), nullptr); }
  for (uint64_t n : {~uint64_t{0}, ~uint64_t{0} - 62, uint64_t{1} << 62}) {
    PatchHeaderAndReseal(24, &n, 8);
    Status s = OpenStatus(10);
    EXPECT_TRUE(s.IsCorruption()) << n << ": " << s.ToString();
    EXPECT_NE(s.message().find("block count out of range"), std::string::npos) << s.ToString();
  }
}

// -------------------------------------------------------------- grow

TEST_F(BitmapSpaceMapTest, GrowAddsFreeBlocks) {
  auto m = CreateDirty(100);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(AllocateAll(*m).size(), 100u);
  EXPECT_TRUE(m->Grow(50).IsInvalidArgument());
  ASSERT_TRUE(m->Grow(100).ok());
  ASSERT_TRUE(m->Grow(130).ok());  // within the same last word and the next
  EXPECT_EQ(m->total_blocks(), 130u);
  EXPECT_EQ(m->free_blocks(), 30u);
  std::vector<uint64_t> got = AllocateAll(*m);
  ASSERT_EQ(got.size(), 30u);
  for (uint64_t i = 0; i < 30; ++i) EXPECT_EQ(got[i], 100 + i);
  ASSERT_TRUE(m->Grow(100000).ok());
  EXPECT_EQ(m->free_blocks(), 100000u - 130u);
  EXPECT_FALSE(m->IsAllocated(PoolBlock(99999)));
  ASSERT_TRUE(m->MarkClean(2).ok());
  m.reset();

  // A superblock still at the old size (a grow interrupted before its
  // commit) opens the larger map; one larger than the map is refused.
  EXPECT_TRUE(OpenStatus(130).ok()) << OpenStatus(130).ToString();
  EXPECT_TRUE(OpenStatus(100001).IsInvalidArgument());
  m = Reopen(100000);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->free_blocks(), 100000u - 130u);
  for (uint64_t b = 0; b < 130; ++b) EXPECT_TRUE(m->IsAllocated(PoolBlock(b)));
}

TEST_F(BitmapSpaceMapTest, GrowOfACleanMapKeepsItClean) {
  {
    auto m = BitmapSpaceMap::Create(path_, 65, kBs);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE((*m)->Grow(1000).ok());
  }
  auto m = Reopen(1000);  // verifies the new body checksum
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->was_clean());
  EXPECT_EQ(m->free_blocks(), 1000u);
}

// A daemon that dies (SIGKILL, a crash, the OOM killer) leaves in the page
// cache whatever its last header write got to, and the kernel writes that
// back. So the header must go from one whole state to the next: a child
// that does nothing but commit (Sync) is killed at random moments, and the
// file must open after each kill. Killed while the header was encoded in
// place in the mapping, it failed within a few dozen kills ("header
// checksum mismatch: expected 0x0000000000000000", or a zeroed magic). On
// tmpfs when there is one, where Sync does no I/O and the child spends its
// time writing headers rather than waiting for the disk.
TEST_F(BitmapSpaceMapTest, HeaderIsWholeAfterTheProcessIsKilledWhileCommitting) {
  const thinfs::testing::TempDir kill_dir(thinfs::testing::TmpfsOrTmp());
  const std::string path = kill_dir.Sub("bitmap");
  constexpr uint64_t kBlocks = 1000;
  {
    auto m = BitmapSpaceMap::Create(path, kBlocks, kBs);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_TRUE((*m)->MarkDirty().ok());
  }
  std::mt19937_64 rng(std::random_device{}());
  constexpr int kKills = 200;
  uint64_t last_generation = 0;
  for (int i = 0; i < kKills; ++i) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0) << std::strerror(errno);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      // The child: commits with a new generation, a changed bit every
      // other time, until it is killed.
      ::close(ready[0]);
      auto m = BitmapSpaceMap::Open(path, kBlocks, kBs, false);
      if (!m.ok()) ::_exit(2);
      if (!(*m)->MarkDirty().ok()) ::_exit(3);
      if (::write(ready[1], "r", 1) != 1) ::_exit(4);
      for (uint64_t g = (*m)->generation() + 1;; ++g) {
        const PoolBlock b(g % kBlocks);
        if (g % 2 == 0 && !(*m)->IsAllocated(b)) (*m)->MarkUsed(b);
        if (!(*m)->Sync(g).ok()) ::_exit(5);
      }
    }
    ::close(ready[1]);
    char c = 0;
    const bool started = ::read(ready[0], &c, 1) == 1;
    ::close(ready[0]);
    if (started) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::uniform_int_distribution<int>(0, 2000)(rng)));
    }
    ASSERT_EQ(::kill(pid, SIGKILL), 0) << std::strerror(errno);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid) << std::strerror(errno);
    ASSERT_TRUE(started) << "the child did not open the bitmap: exit status " << wstatus;
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "the child stopped committing: exit status " << WEXITSTATUS(wstatus);
    auto m = BitmapSpaceMap::Open(path, kBlocks, kBs, true);
    ASSERT_TRUE(m.ok()) << "kill " << i + 1 << " of " << kKills << ": " << m.status().ToString();
    EXPECT_FALSE((*m)->was_clean());
    // Each child starts from what the last one left: the generation only
    // grows (a header left half written would not have opened above).
    EXPECT_GE((*m)->generation(), last_generation);
    last_generation = (*m)->generation();
  }
  EXPECT_GT(last_generation, uint64_t{kKills}) << "the children committed";
}

// -------------------------------------------------------------- bugs

using BitmapSpaceMapDeathTest = BitmapSpaceMapTest;

TEST_F(BitmapSpaceMapDeathTest, FreeOfUnallocatedOrQueuedBlockAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto m = CreateDirty(100);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Allocate().ok());
  EXPECT_DEATH(m->Free(PoolBlock(50)), "check failed");
  m->Free(PoolBlock(0));
  EXPECT_DEATH(m->Free(PoolBlock(0)), "check failed");
  std::vector<PoolBlock> taken = m->TakePendingFrees();
  EXPECT_DEATH(m->Free(PoolBlock(0)), "check failed");
  m->Release(taken);
  EXPECT_DEATH(m->Release(taken), "check failed");
}

TEST_F(BitmapSpaceMapDeathTest, UnallocateOfAFreeOrQueuedBlockAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto m = CreateDirty(100);
  ASSERT_NE(m, nullptr);
  uint64_t n = 0;
  ASSERT_TRUE(m->AllocateRun(10, &n).ok());
  ASSERT_EQ(n, 10u);
  EXPECT_DEATH(m->Unallocate(PoolBlock(8), 3), "check failed");  // 10 is free
  m->Free(PoolBlock(5));
  EXPECT_DEATH(m->Unallocate(PoolBlock(4), 2), "check failed");   // 5 is queued
  EXPECT_DEATH(m->Unallocate(PoolBlock(99), 2), "check failed");  // past the end
  m->Unallocate(PoolBlock(6), 4);
  EXPECT_EQ(m->free_blocks(), 94u);
}

TEST_F(BitmapSpaceMapDeathTest, ChangingACleanMapAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto m = BitmapSpaceMap::Create(path_, 100, kBs);
  ASSERT_TRUE(m.ok());
  EXPECT_DEATH((void)(*m)->Allocate(), "check failed");
  EXPECT_DEATH((*m)->MarkUsed(PoolBlock(1)), "check failed");
}

// ------------------------------------------------------- concurrency

TEST_F(BitmapSpaceMapTest, ConcurrentAllocateFreeNeverHandsOutABlockTwice) {
  const uint64_t n = 4096;
  auto m = CreateDirty(n);
  ASSERT_NE(m, nullptr);
  // owner[b] != 0 while some thread holds b.
  std::vector<std::atomic<int>> owner(n);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> double_allocs{0};
  const uint64_t seed = std::random_device()();
  std::cerr << "seed " << seed << "\n";

  // The committer: takes and releases queued frees, like a commit would.
  std::thread committer([&] {
    while (!stop.load()) {
      m->Release(m->TakePendingFrees());
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> workers;
  for (int t = 1; t <= 4; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(t));
      std::vector<uint64_t> held;
      for (int i = 0; i < 50000; ++i) {
        if (held.empty() || rng() % 2 == 0) {
          // Threads 1 and 2 take runs and give half of each straight back.
          uint64_t count = 1;
          Result<PoolBlock> b = t <= 2 ? m->AllocateRun(1 + rng() % 16, &count) : m->Allocate();
          if (!b.ok()) {
            ASSERT_TRUE(b.status().IsNoSpace());
            continue;
          }
          for (uint64_t x = b->value; x < b->value + count; ++x) {
            int expected = 0;
            if (!owner[x].compare_exchange_strong(expected, t)) ++double_allocs;
          }
          const uint64_t keep = count - count / 2;
          for (uint64_t x = b->value; x < b->value + keep; ++x) held.push_back(x);
          for (uint64_t x = b->value + keep; x < b->value + count; ++x) owner[x].store(0);
          if (count > keep) m->Unallocate(PoolBlock(b->value + keep), count - keep);
        } else {
          size_t k = rng() % held.size();
          uint64_t b = held[k];
          held[k] = held.back();
          held.pop_back();
          owner[b].store(0);
          m->Free(PoolBlock(b));
        }
      }
      for (uint64_t b : held) {
        owner[b].store(0);
        m->Free(PoolBlock(b));
      }
    });
  }
  for (auto& w : workers) w.join();
  stop.store(true);
  committer.join();
  EXPECT_EQ(double_allocs.load(), 0u);
  m->Release(m->TakePendingFrees());
  EXPECT_EQ(m->free_blocks(), n);
}

}  // namespace
}  // namespace thinfs::meta
