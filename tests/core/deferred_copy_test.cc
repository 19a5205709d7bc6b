// DeferredCopies: what an owed copy reads as, in-place writes into it, the
// copy made by CompleteAll, and all of it racing (run under TSan too).
// Every check compares with a model: the bytes the block is meant to hold.
// The cases run twice: owed copies that write their sectors through, and
// held ones that keep them in memory until the block is written whole.

#include "core/deferred_copy.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/fault_injection_block_device.h"
#include "core/folio_census.h"
#include "core/mem_block_device.h"
#include "tests/util/cache_file_fixture.h"
#include "tests/util/forwarding.h"

namespace thinfs {
namespace {
namespace THINFS_TEST_FILE {  // unique per file in a unity build (tests/CMakeLists.txt)

constexpr uint64_t kBs = 64 * 1024;

std::vector<std::byte> Pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(seed * 31 + i * 7 + i / 4096));
  return v;
}

std::vector<std::byte> ReadRaw(BlockDevice& d, PoolBlock b) {
  std::vector<std::byte> v(d.geometry().block_size());
  EXPECT_TRUE(d.Read(b, 0, v).ok());
  return v;
}

std::vector<std::byte> ReadVia(DeferredCopies& c, PoolBlock b, uint64_t off, size_t n) {
  std::vector<std::byte> v(n);
  Status s = c.Read(b, off, v);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return v;
}

struct Fixture {
  explicit Fixture(uint64_t bs = kBs, size_t capacity = 16, size_t held = 0)
      : geometry(bs, 8), data(geometry), copies(&data, bs, capacity, held) {
    source = Pattern(bs, 1);
    EXPECT_TRUE(data.Write(PoolBlock(0), 0, source).ok());
    // Whatever a freshly allocated block held before: must never show.
    EXPECT_TRUE(data.Write(PoolBlock(1), 0, Pattern(bs, 99)).ok());
  }
  Geometry geometry;
  MemBlockDevice data;
  DeferredCopies copies;
  std::vector<std::byte> source;
};

// The parameter: how many owed copies may hold their sectors in memory.
class DeferredCopiesTest : public ::testing::TestWithParam<size_t> {
 protected:
  bool Held() const { return GetParam() > 0; }
};

INSTANTIATE_TEST_SUITE_P(Modes, DeferredCopiesTest, ::testing::Values(size_t{0}, size_t{16}),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return i.param == 0 ? std::string("WriteThrough") : std::string("Held");
                         });

TEST(DeferredCopiesGeometryTest, SectorsSplitABlockInAtMost64) {
  Fixture f;
  EXPECT_EQ(f.copies.sector_size(), 4096u);
  Geometry g(uint64_t{1} << 20, 2);
  MemBlockDevice d(g);
  EXPECT_EQ(DeferredCopies(&d, uint64_t{1} << 20, 1).sector_size(), 16384u);
  Geometry odd(12 * 4096 * 7, 2);  // not a power of two
  MemBlockDevice d2(odd);
  EXPECT_EQ(DeferredCopies(&d2, 12 * 4096 * 7, 1).sector_size(), 8192u);
}

TEST_P(DeferredCopiesTest, OwedBlockReadsWrittenBytesAndTheSourceElsewhere) {
  Fixture f(kBs, 16, GetParam());
  auto w = Pattern(4096, 2);
  ASSERT_TRUE(f.copies.Start(PoolBlock(1), PoolBlock(0), 8192, w).ok());
  EXPECT_TRUE(f.copies.Owes(PoolBlock(1)));
  EXPECT_EQ(f.copies.size(), 1u);
  std::vector<std::byte> want = f.source;
  std::memcpy(want.data() + 8192, w.data(), w.size());
  EXPECT_EQ(ReadVia(f.copies, PoolBlock(1), 0, kBs), want);
  // A read inside one sector, and one across the written sector's edges.
  EXPECT_EQ(ReadVia(f.copies, PoolBlock(1), 100, 50),
            std::vector<std::byte>(want.begin() + 100, want.begin() + 150));
  EXPECT_EQ(ReadVia(f.copies, PoolBlock(1), 8000, 5000),
            std::vector<std::byte>(want.begin() + 8000, want.begin() + 13000));
  auto raw = ReadRaw(f.data, PoolBlock(1));
  if (Held()) {
    EXPECT_EQ(raw, Pattern(kBs, 99)) << "a held copy writes nothing before the copy";
    EXPECT_EQ(f.copies.held(), 1u);
  } else {
    // Only the written bytes reached the new block.
    EXPECT_NE(raw, want);
    EXPECT_EQ(std::memcmp(raw.data() + 8192, w.data(), w.size()), 0);
  }

  uint64_t made = 0;
  ASSERT_TRUE(f.copies.CompleteAll(&made).ok());
  EXPECT_EQ(made, 1u);
  EXPECT_FALSE(f.copies.Owes(PoolBlock(1)));
  EXPECT_EQ(f.copies.size(), 0u);
  EXPECT_EQ(f.copies.completed(), 1u);
  EXPECT_EQ(f.copies.held(), 0u);
  made = 0;
  ASSERT_TRUE(f.copies.CompleteAll(&made).ok());
  EXPECT_EQ(made, 0u) << "nothing left to make";
  EXPECT_EQ(ReadRaw(f.data, PoolBlock(1)), want) << "the commit's copy completes the block";
}

TEST_P(DeferredCopiesTest, UnalignedWritesCopyTheRestOfTheirSectorsAtOnce) {
  Fixture f(kBs, 16, GetParam());
  auto w = Pattern(5000, 3);  // from the middle of sector 1 into sector 2
  ASSERT_TRUE(f.copies.Start(PoolBlock(1), PoolBlock(0), 4096 + 300, w).ok());
  std::vector<std::byte> want = f.source;
  std::memcpy(want.data() + 4096 + 300, w.data(), w.size());
  auto raw = ReadRaw(f.data, PoolBlock(1));
  if (Held()) {
    EXPECT_EQ(raw, Pattern(kBs, 99)) << "a held copy writes nothing before the copy";
  } else {
    EXPECT_EQ(std::memcmp(raw.data() + 4096, want.data() + 4096, 2 * 4096), 0)
        << "sectors 1 and 2 hold their whole contents in the new block";
  }
  EXPECT_EQ(ReadVia(f.copies, PoolBlock(1), 0, kBs), want);
  // In place, inside one sector still owed (the last), at both its ends.
  auto w2 = Pattern(10, 4);
  ASSERT_TRUE(f.copies.Write(PoolBlock(1), kBs - 4096 + 7, w2).ok());
  std::memcpy(want.data() + kBs - 4096 + 7, w2.data(), w2.size());
  EXPECT_EQ(ReadVia(f.copies, PoolBlock(1), 0, kBs), want);
  ASSERT_TRUE(f.copies.CompleteAll().ok());
  EXPECT_EQ(ReadRaw(f.data, PoolBlock(1)), want);
}

TEST_P(DeferredCopiesTest, WritesThatCoverEverySectorOweNothing) {
  Fixture f(kBs, 16, GetParam());
  auto w = Pattern(kBs - 100, 5);
  ASSERT_TRUE(f.copies.Start(PoolBlock(1), PoolBlock(0), 100, w).ok());
  EXPECT_FALSE(f.copies.Owes(PoolBlock(1))) << "the first sector's rest was copied at once";
  std::vector<std::byte> want = f.source;
  std::memcpy(want.data() + 100, w.data(), w.size());
  EXPECT_EQ(ReadRaw(f.data, PoolBlock(1)), want);

  ASSERT_TRUE(f.copies.Start(PoolBlock(2), PoolBlock(0), 0, Pattern(kBs / 2, 6)).ok());
  ASSERT_TRUE(f.copies.Owes(PoolBlock(2)));
  ASSERT_TRUE(f.copies.Write(PoolBlock(2), kBs / 2, Pattern(kBs / 2, 7)).ok());
  EXPECT_FALSE(f.copies.Owes(PoolBlock(2))) << "in-place writes filled the rest";
  EXPECT_EQ(f.copies.held(), 0u);
  want = Pattern(kBs / 2, 6);
  auto rest = Pattern(kBs / 2, 7);
  want.insert(want.end(), rest.begin(), rest.end());
  EXPECT_EQ(ReadRaw(f.data, PoolBlock(2)), want) << "the block holds both writes";
  ASSERT_TRUE(f.copies.CompleteAll().ok());
  EXPECT_EQ(f.copies.completed(), 0u) << "nothing was left to copy";
}

TEST_P(DeferredCopiesTest, DroppedBlocksAreNotCopied) {
  Fixture f(kBs, 16, GetParam());
  ASSERT_TRUE(f.copies.Start(PoolBlock(1), PoolBlock(0), 0, Pattern(4096, 2)).ok());
  f.copies.Drop(PoolBlock(1));
  EXPECT_FALSE(f.copies.Owes(PoolBlock(1)));
  EXPECT_EQ(f.copies.size(), 0u);
  EXPECT_EQ(f.copies.held(), 0u) << "the buffer goes with the copy";
  ASSERT_TRUE(f.copies.CompleteAll().ok());
  EXPECT_EQ(f.copies.completed(), 0u);
  f.copies.Drop(PoolBlock(5));  // never owed: nothing happens
}

TEST_P(DeferredCopiesTest, CapacityBoundsWhatMayBeOwed) {
  Fixture f(kBs, 2, GetParam());
  EXPECT_TRUE(f.copies.HasRoom());
  ASSERT_TRUE(f.copies.Start(PoolBlock(1), PoolBlock(0), 0, Pattern(4096, 2)).ok());
  ASSERT_TRUE(f.copies.Start(PoolBlock(2), PoolBlock(0), 0, Pattern(4096, 3)).ok());
  EXPECT_FALSE(f.copies.HasRoom());
  ASSERT_TRUE(f.copies.CompleteAll().ok());
  EXPECT_TRUE(f.copies.HasRoom());
  EXPECT_FALSE(DeferredCopies(&f.data, kBs, 0).HasRoom()) << "capacity 0: never defer";
}

// A failed copy stays owed and readable; the next CompleteAll makes it.
TEST_P(DeferredCopiesTest, AFailedCopyStaysOwed) {
  Geometry g(kBs, 8);
  FaultInjectionBlockDevice data(g, /*seed=*/3);
  DeferredCopies copies(&data, kBs, 4, GetParam());
  auto src = Pattern(kBs, 1);
  ASSERT_TRUE(data.Write(PoolBlock(0), 0, src).ok());
  auto w = Pattern(4096, 2);
  ASSERT_TRUE(copies.Start(PoolBlock(1), PoolBlock(0), 0, w).ok());
  data.FailNthIo(1);
  EXPECT_FALSE(copies.CompleteAll().ok());
  EXPECT_TRUE(copies.Owes(PoolBlock(1)));
  std::vector<std::byte> want = src;
  std::memcpy(want.data(), w.data(), w.size());
  EXPECT_EQ(ReadVia(copies, PoolBlock(1), 0, kBs), want);
  ASSERT_TRUE(copies.CompleteAll().ok());
  EXPECT_EQ(ReadRaw(data, PoolBlock(1)), want);
}

// Writers (one per block, as the stripe lock guarantees), readers and
// CompleteAll at once; every read must show the model's bytes for the
// sectors whose writes completed before it started.
TEST_P(DeferredCopiesTest, ConcurrentReadersWritersAndCompletion) {
  constexpr int kBlocks = 4;
  Geometry g(kBs, 1 + kBlocks);
  MemBlockDevice data(g);
  DeferredCopies copies(&data, kBs, 64, GetParam());
  auto src = Pattern(kBs, 1);
  ASSERT_TRUE(data.Write(PoolBlock(0), 0, src).ok());
  // Each writer fills its block sector by sector with a stamp; a sector
  // reads as the source until its stamp was written, then as the stamp.
  std::atomic<int> done_writers{0};
  std::atomic<bool> bad{false};
  std::vector<std::thread> threads;
  std::vector<std::atomic<int>> progress(kBlocks);
  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE(copies.Start(PoolBlock(1 + i), PoolBlock(0), 0, std::vector<std::byte>(4096, std::byte(0xA0 + i))).ok());
    progress[i].store(1);
  }
  for (int i = 0; i < kBlocks; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 1; k < 16; ++k) {
        std::vector<std::byte> stamp(4096, std::byte(0xA0 + i));
        if (!copies.Write(PoolBlock(1 + i), k * 4096, stamp).ok()) bad = true;
        progress[i].store(k + 1);
      }
      done_writers.fetch_add(1);
    });
  }
  threads.emplace_back([&] {
    std::mt19937 rng(7);
    while (done_writers.load() < kBlocks) {
      int i = static_cast<int>(rng() % kBlocks);
      int written = progress[i].load();  // sectors [0, written) are stamped
      std::vector<std::byte> buf(kBs);
      if (!copies.Read(PoolBlock(1 + i), 0, buf).ok()) bad = true;
      for (int k = 0; k < written; ++k) {
        if (buf[k * 4096] != std::byte(0xA0 + i)) bad = true;
      }
      for (int k = 0; k < 16; ++k) {
        // Unstamped sectors (at read time) are the source or the stamp.
        if (buf[k * 4096] != std::byte(0xA0 + i) && buf[k * 4096] != src[k * 4096]) bad = true;
      }
    }
  });
  threads.emplace_back([&] {
    while (done_writers.load() < kBlocks) {
      if (!copies.CompleteAll().ok()) bad = true;
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_FALSE(bad.load());
  ASSERT_TRUE(copies.CompleteAll().ok());
  for (int i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(ReadRaw(data, PoolBlock(1 + i)), std::vector<std::byte>(kBs, std::byte(0xA0 + i)));
  }
}

// The point of holding: the new block reaches the device in one write of
// the whole block, whatever the writes into it were, and not before.
TEST(DeferredCopiesHeldTest, TheBlockIsWrittenOnceAndWhole) {
  Geometry g(kBs, 8);
  MemBlockDevice mem(g);
  testing::ForwardingBlockDevice data(&mem);
  auto src = Pattern(kBs, 1);
  ASSERT_TRUE(data.Write(PoolBlock(0), 0, src).ok());
  data.record_writes = true;
  DeferredCopies copies(&data, kBs, 4, 4);
  std::vector<std::byte> want = src;
  auto w1 = Pattern(4096, 2);
  ASSERT_TRUE(copies.Start(PoolBlock(1), PoolBlock(0), 5 * 4096, w1).ok());
  std::memcpy(want.data() + 5 * 4096, w1.data(), w1.size());
  auto w2 = Pattern(700, 3);  // unaligned, in place, in a sector still owed
  ASSERT_TRUE(copies.Write(PoolBlock(1), 9 * 4096 + 13, w2).ok());
  std::memcpy(want.data() + 9 * 4096 + 13, w2.data(), w2.size());
  EXPECT_TRUE(data.writes.empty()) << "nothing written before the copy";
  EXPECT_EQ(ReadVia(copies, PoolBlock(1), 0, kBs), want);
  ASSERT_TRUE(copies.CompleteAll().ok());
  EXPECT_EQ(data.writes, (std::vector<testing::ForwardingBlockDevice::WriteIo>{{1, 0, kBs}}));
  EXPECT_EQ(ReadRaw(mem, PoolBlock(1)), want);
  EXPECT_EQ(copies.held(), 0u);

  // In-place writes that fill the block write it whole too, at once.
  data.writes.clear();
  ASSERT_TRUE(copies.Start(PoolBlock(2), PoolBlock(0), 0, Pattern(kBs / 2, 4)).ok());
  ASSERT_TRUE(copies.Write(PoolBlock(2), kBs / 2, Pattern(kBs / 2, 5)).ok());
  EXPECT_FALSE(copies.Owes(PoolBlock(2)));
  EXPECT_EQ(data.writes, (std::vector<testing::ForwardingBlockDevice::WriteIo>{{2, 0, kBs}}));
}

// Beyond held_capacity, owed copies write through; the count of buffers
// goes back to zero as copies are made or dropped.
TEST(DeferredCopiesHeldTest, HeldCapacityBoundsTheBuffers) {
  Fixture f(kBs, 4, 1);
  auto w = Pattern(4096, 2);
  ASSERT_TRUE(f.copies.Start(PoolBlock(1), PoolBlock(0), 0, w).ok());
  ASSERT_TRUE(f.copies.Start(PoolBlock(2), PoolBlock(0), 0, w).ok());
  EXPECT_EQ(f.copies.held(), 1u);
  EXPECT_EQ(f.copies.size(), 2u);
  EXPECT_EQ(ReadRaw(f.data, PoolBlock(1)), Pattern(kBs, 99)) << "held";
  EXPECT_EQ(std::memcmp(ReadRaw(f.data, PoolBlock(2)).data(), w.data(), w.size()), 0)
      << "written through";
  f.copies.Drop(PoolBlock(1));
  EXPECT_EQ(f.copies.held(), 0u);
  ASSERT_TRUE(f.copies.Start(PoolBlock(3), PoolBlock(0), 0, w).ok());
  EXPECT_EQ(f.copies.held(), 1u) << "a dropped copy's buffer is free again";
  ASSERT_TRUE(f.copies.CompleteAll().ok());
  EXPECT_EQ(f.copies.held(), 0u);
  std::vector<std::byte> want = f.source;
  std::memcpy(want.data(), w.data(), w.size());
  EXPECT_EQ(ReadRaw(f.data, PoolBlock(2)), want);
  EXPECT_EQ(ReadRaw(f.data, PoolBlock(3)), want);
}

// Where a copy is a reflink, the written sectors go to the block at once
// and the rest is cloned: nothing is held.
TEST(DeferredCopiesHeldTest, CopiesThatShareDataAreNeverHeld) {
  Geometry g(kBs, 8);
  MemBlockDevice mem(g);
  testing::ForwardingBlockDevice data(&mem);
  data.shares_copies = true;
  DeferredCopies copies(&data, kBs, 4, 4);
  auto w = Pattern(4096, 2);
  ASSERT_TRUE(copies.Start(PoolBlock(1), PoolBlock(0), 4096, w).ok());
  EXPECT_EQ(copies.held(), 0u);
  EXPECT_EQ(std::memcmp(ReadRaw(mem, PoolBlock(1)).data() + 4096, w.data(), w.size()), 0);
}

// The whole-block write of a held copy fails: the copy stays owed and
// reads as before, from the buffer and the source; the next CompleteAll
// writes it. The same when in-place writes fill the block and its write
// fails: the write is kept (in the buffer), the copy stays owed.
TEST(DeferredCopiesHeldTest, AFailedBlockWriteKeepsTheCopyOwed) {
  Geometry g(kBs, 8);
  FaultInjectionBlockDevice data(g, /*seed=*/5);
  auto src = Pattern(kBs, 1);
  ASSERT_TRUE(data.Write(PoolBlock(0), 0, src).ok());
  DeferredCopies copies(&data, kBs, 4, 4);
  auto w = Pattern(4096, 2);
  std::vector<std::byte> want = src;
  std::memcpy(want.data() + 4096, w.data(), w.size());
  ASSERT_TRUE(copies.Start(PoolBlock(1), PoolBlock(0), 4096, w).ok());
  // CompleteAll reads the source, then writes the block: fail the write.
  data.FailNthIo(2);
  EXPECT_FALSE(copies.CompleteAll().ok());
  EXPECT_TRUE(copies.Owes(PoolBlock(1)));
  EXPECT_EQ(copies.held(), 1u);
  EXPECT_EQ(ReadVia(copies, PoolBlock(1), 0, kBs), want);
  ASSERT_TRUE(copies.CompleteAll().ok());
  EXPECT_EQ(ReadRaw(data, PoolBlock(1)), want);
  EXPECT_EQ(copies.held(), 0u);

  ASSERT_TRUE(copies.Start(PoolBlock(2), PoolBlock(0), 0, Pattern(kBs / 2, 3)).ok());
  data.FailNthIo(1);
  auto rest = Pattern(kBs / 2, 4);
  EXPECT_TRUE(copies.Write(PoolBlock(2), kBs / 2, rest).ok());
  EXPECT_TRUE(copies.Owes(PoolBlock(2))) << "its write failed";
  want = Pattern(kBs / 2, 3);
  want.insert(want.end(), rest.begin(), rest.end());
  EXPECT_EQ(ReadVia(copies, PoolBlock(2), 0, kBs), want);
  ASSERT_TRUE(copies.CompleteAll().ok());
  EXPECT_FALSE(copies.Owes(PoolBlock(2)));
  EXPECT_EQ(ReadRaw(data, PoolBlock(2)), want);
}

// On a real file: a block filled by a held copy is cached like a block
// written whole (one large folio where the kernel makes them), not in the
// pieces its writes came in. Which folios a kernel makes differs, so the
// check is against a block written whole on the same file.
class DeferredCopiesFolioTest : public CacheFileTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "/proc/kpageflags is root's only";
    CreateFile(4 * kBs);
  }
  uint64_t Folios(PoolBlock b) {
    Result<FolioCensus> c = CensusFolios(fd_, b.value * kBs, kBs);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return 0;
    EXPECT_EQ(c->uncached, 0u);
    return c->folios;
  }
};

TEST_F(DeferredCopiesFolioTest, AHeldCopyIsCachedLikeABlockWrittenWhole) {
  Geometry g(kBs, 4);
  Result<std::unique_ptr<FileBlockDevice>> dev =
      FileBlockDevice::Open(path_, g, /*direct=*/false, /*read_only=*/false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  (*dev)->DisableClones();  // a reflinking /var/tmp would clone, not write
  ASSERT_TRUE((*dev)->Write(PoolBlock(0), 0, Pattern(kBs, 1)).ok());
  const uint64_t whole = Folios(PoolBlock(0));

  DeferredCopies held(dev->get(), kBs, 4, 4);
  ASSERT_TRUE(held.Start(PoolBlock(1), PoolBlock(0), 5 * 4096, Pattern(4096, 2)).ok());
  ASSERT_TRUE(held.CompleteAll().ok());
  EXPECT_EQ(Folios(PoolBlock(1)), whole);

  // The same copy written through, for the record (not a bound: a kernel
  // without large folios caches both in 4 KiB pages).
  DeferredCopies through(dev->get(), kBs, 4, 0);
  ASSERT_TRUE(through.Start(PoolBlock(2), PoolBlock(0), 5 * 4096, Pattern(4096, 2)).ok());
  ASSERT_TRUE(through.CompleteAll().ok());
  const uint64_t pieces = Folios(PoolBlock(2));
  EXPECT_GE(pieces, whole);
  RecordProperty("folios_whole", static_cast<int>(whole));
  RecordProperty("folios_written_through", static_cast<int>(pieces));
}

}  // namespace THINFS_TEST_FILE
}  // namespace
}  // namespace thinfs
