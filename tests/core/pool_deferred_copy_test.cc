// Copy-on-write whose copy is left to the commit (PoolOptions::
// deferred_copy_bytes, core/deferred_copy.h), through the engine: what
// devices read before and after the commit, across crashes, and when the
// block copied from loses its last reader before the copy is made.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/engine_fixture.h"

namespace thinfs {
namespace {

using testing::EngineFixture;
using testing::Pattern;

constexpr uint64_t kBs = 64 * 1024;
constexpr auto& Open = testing::OpenOrFail;

// A 4-block origin "o", fully written, and its snapshot "s".
struct SnapFixture {
  explicit SnapFixture(PoolOptions options = EngineFixture::DefaultOptions())
      : f(kBs, 64, options) {
    EXPECT_TRUE(f.pool->CreateDevice("o", 4 * kBs).ok());
    origin = Pattern(4 * kBs, 11);
    EXPECT_OK(Open(*f.pool, "o")->Write(0, origin));
    EXPECT_OK(f.pool->Commit());
    EXPECT_TRUE(f.pool->CreateSnapshot("o", "s").ok());
  }
  // Writes `n` bytes of a pattern at `off` into device `name` and into `model`.
  void Write(const std::string& name, uint64_t off, size_t n, uint32_t seed,
             std::vector<std::byte>* model) {
    auto w = Pattern(n, seed);
    ASSERT_OK(Open(*f.pool, name)->Write(off, w));
    std::memcpy(model->data() + off, w.data(), n);
  }
  // The data area's bytes of the block device `name` maps at vblock b.
  std::vector<std::byte> RawBlock(const std::string& name, uint64_t b) {
    auto id = f.pool->GetDevice(name);
    EXPECT_TRUE(id.ok());
    auto p = f.pool->MappedBlockForTesting(id->id, b);
    EXPECT_TRUE(p.ok() && p->has_value());
    std::vector<std::byte> buf(kBs);
    EXPECT_OK(f.data->Read(**p, 0, buf));
    return buf;
  }
  EngineFixture f;
  std::vector<std::byte> origin;
};

std::vector<std::byte> Slice(const std::vector<std::byte>& v, uint64_t off, uint64_t n) {
  return {v.begin() + static_cast<long>(off), v.begin() + static_cast<long>(off + n)};
}

TEST(PoolDeferredCopyTest, PartialWriteIntoASnapshotCopiesAtTheCommit) {
  SnapFixture t;
  std::vector<std::byte> snap = t.origin;
  t.Write("s", kBs + 8192, 4096, 2, &snap);
  EXPECT_EQ(t.f.pool->Stats().cow_copies, 1u);
  EXPECT_EQ(t.f.pool->Stats().deferred_copies, 0u) << "not copied yet";
  EXPECT_NE(t.RawBlock("s", 1), Slice(snap, kBs, kBs)) << "the new block holds only the write";
  EXPECT_EQ(t.f.ReadAll("s"), snap) << "reads take the rest from the origin's block";
  EXPECT_EQ(t.f.ReadAll("o"), t.origin);
  // A second write into the same block, in place, in a sector still owed.
  t.Write("s", kBs + 100, 10, 3, &snap);
  EXPECT_EQ(t.f.pool->Stats().cow_copies, 1u);
  EXPECT_EQ(t.f.ReadAll("s"), snap);

  ASSERT_OK(t.f.pool->Commit());
  EXPECT_EQ(t.f.pool->Stats().deferred_copies, 1u);
  EXPECT_EQ(t.RawBlock("s", 1), Slice(snap, kBs, kBs)) << "the commit completed the block";
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  t.f.CheckConsistency(false);
}

// Where the data device shares copies (a reflink), copy-on-write never
// reads the old block itself, whether the copy is owed to the commit or
// made at once: it asks the device to copy. Same contents either way.
TEST(PoolDeferredCopyTest, CopiesThatShareDataReadNothing) {
  for (uint64_t budget : {uint64_t{256} << 20, uint64_t{0}}) {
    SCOPED_TRACE(budget == 0 ? "copied at once" : "owed to the commit");
    for (bool share : {false, true}) {
      SCOPED_TRACE(share ? "device shares copies" : "device copies data");
      PoolOptions options = EngineFixture::DefaultOptions();
      options.deferred_copy_bytes = budget;
      SnapFixture t(options);
      t.f.data_forwarder->shares_copies = share;
      t.f.data_forwarder->reads = 0;
      std::vector<std::byte> snap = t.origin;
      t.Write("s", kBs + 8192, 4096, 2, &snap);  // whole sectors
      t.Write("s", 2 * kBs + 5000, 3000, 3, &snap);  // parts of two sectors
      t.Write("s", 3 * kBs, kBs - 1, 4, &snap);  // all but one byte
      ASSERT_OK(t.f.pool->Commit());
      if (share) {
        EXPECT_EQ(t.f.data_forwarder->reads.load(), 0u);
      } else {
        EXPECT_GT(t.f.data_forwarder->reads.load(), 0u);
      }
      EXPECT_EQ(t.f.pool->Stats().cow_copies, 3u);
      for (uint64_t b = 1; b < 4; ++b) {
        EXPECT_EQ(t.RawBlock("s", b), Slice(snap, b * kBs, kBs)) << "block " << b;
      }
      EXPECT_EQ(t.f.ReadAll("s"), snap);
      EXPECT_EQ(t.f.ReadAll("o"), t.origin);
      t.f.CheckConsistency(false);
    }
  }
}

// The copy is made before the commit's data sync: a power cut right after
// the commit keeps the whole block. (Copied after the sync, or not at all,
// the unwritten sectors of the new block would read as zeros here.)
TEST(PoolDeferredCopyTest, CommittedBlockIsWholeAfterAPowerCut) {
  SnapFixture t;
  std::vector<std::byte> snap = t.origin;
  t.Write("s", 3 * kBs + 60000, 4096, 4, &snap);
  t.Write("s", 0, 1, 5, &snap);
  ASSERT_OK(t.f.pool->Commit());
  t.f.Crash();
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  EXPECT_EQ(t.f.ReadAll("o"), t.origin);
  t.f.CheckConsistency(false);
}

TEST(PoolDeferredCopyTest, PowerCutBeforeTheCommitLosesOnlyTheWrite) {
  SnapFixture t;
  std::vector<std::byte> snap = t.origin;
  t.Write("s", 2 * kBs + 4096, 4096, 6, &snap);
  t.f.Crash();
  EXPECT_EQ(t.f.ReadAll("s"), t.origin);
  EXPECT_EQ(t.f.ReadAll("o"), t.origin);
  t.f.CheckConsistency(false);
}

// The block copied from loses its last reader while the copy is owed (its
// device was deleted; the collector frees it): it must stay unused until
// the commit has made the copy.
TEST(PoolDeferredCopyTest, SourceFreedBeforeTheCopyIsNotReusedFirst) {
  SnapFixture t;
  ASSERT_OK(t.f.pool->DeleteDevice("o"));    // hidden: s still reads it
  ASSERT_OK(t.f.pool->RunGcForTesting());
  std::vector<std::byte> snap = t.origin;
  t.Write("s", 0, 4096, 7, &snap);           // owes the copy of o's block 0
  ASSERT_OK(t.f.pool->RunGcForTesting());    // frees o's block 0, no commit
  // Every block the allocator hands out, written with new data (the last
  // allocations find only the block freed above, and commit to get it).
  ASSERT_TRUE(t.f.pool->CreateDevice("n", 64 * kBs).ok());
  const uint64_t free = t.f.pool->Stats().free_blocks;
  ASSERT_GT(free, 0u);
  ASSERT_OK(Open(*t.f.pool, "n")->Write(0, Pattern(free * kBs, 8)));
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  ASSERT_OK(t.f.pool->Commit());
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  t.f.Crash();
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  ASSERT_OK(t.f.pool->RunGcForTesting());
  t.f.CheckConsistency(true);
}

// A block owing its copy is read by reflinked copies like any other; a
// copy-on-write from it copies at once (owed copies never chain). (A
// snapshot commits, which makes the copy, so only a reflink of part of a
// device shares such a block.)
TEST(PoolDeferredCopyTest, ReflinkOfABlockOwingItsCopy) {
  SnapFixture t;
  ASSERT_TRUE(t.f.pool->CreateDevice("r", 4 * kBs).ok());  // commits
  std::vector<std::byte> r(4 * kBs);
  t.Write("r", 3 * kBs, 1, 8, &r);  // not empty: sharing into it does not commit
  std::vector<std::byte> s = t.origin;
  t.Write("s", kBs + 4096, 4096, 9, &s);
  ASSERT_OK(t.f.pool->ShareRange(t.f.pool->GetDevice("s")->id, kBs, t.f.pool->GetDevice("r")->id,
                                 kBs, kBs));
  std::memcpy(r.data() + kBs, s.data() + kBs, kBs);
  EXPECT_EQ(t.f.ReadAll("r"), r);
  EXPECT_EQ(t.f.pool->Stats().deferred_copies, 0u) << "no commit yet";
  // s's block is shared with r now: this write copies from a block that
  // still owes its own copy; owed copies never chain, so it copies now.
  t.Write("s", kBs + 20000, 100, 10, &s);
  EXPECT_EQ(t.f.ReadAll("s"), s);
  EXPECT_EQ(t.f.ReadAll("r"), r);
  EXPECT_EQ(t.RawBlock("s", 1), Slice(s, kBs, kBs)) << "copied at once";
  ASSERT_OK(t.f.pool->Commit());
  EXPECT_EQ(t.f.pool->Stats().deferred_copies, 1u) << "the block r and s shared, only";
  t.f.Crash();
  EXPECT_EQ(t.f.ReadAll("s"), s);
  EXPECT_EQ(t.f.ReadAll("r"), r);
  EXPECT_EQ(t.f.ReadAll("o"), t.origin);
  t.f.CheckConsistency(false);
}

TEST(PoolDeferredCopyTest, DiscardedBlockOwesNothing) {
  SnapFixture t;
  std::vector<std::byte> snap = t.origin;
  t.Write("s", 4096, 4096, 12, &snap);
  ASSERT_OK(Open(*t.f.pool, "s")->Discard(0, kBs));
  std::fill(snap.begin(), snap.begin() + kBs, std::byte{0});
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  ASSERT_OK(t.f.pool->Commit());
  EXPECT_EQ(t.f.pool->Stats().deferred_copies, 0u);
  t.f.Crash();
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  t.f.CheckConsistency(false);
}

TEST(PoolDeferredCopyTest, OffOrFullCopiesAtOnce) {
  for (uint64_t room : {uint64_t{0}, 2 * kBs}) {
    SCOPED_TRACE("deferred_copy_bytes " + std::to_string(room));
    PoolOptions o = EngineFixture::DefaultOptions();
    o.deferred_copy_bytes = room;
    SnapFixture t(o);
    std::vector<std::byte> snap = t.origin;
    for (uint64_t b = 0; b < 4; ++b) t.Write("s", b * kBs + 4096, 4096, 13 + b, &snap);
    EXPECT_EQ(t.f.pool->Stats().cow_copies, 4u);
    // Copied at once: the data area holds the whole block before any commit.
    EXPECT_EQ(t.RawBlock("s", 3), Slice(snap, 3 * kBs, kBs));
    EXPECT_EQ(t.f.ReadAll("s"), snap);
    ASSERT_OK(t.f.pool->Commit());
    EXPECT_EQ(t.f.pool->Stats().deferred_copies, room / kBs);
    t.f.Crash();
    EXPECT_EQ(t.f.ReadAll("s"), snap);
  }
}

// A failed copy fails the commit, and the pool stops writing (as for any
// failed commit); what the devices read does not change.
TEST(PoolDeferredCopyTest, FailedCopyFailsTheCommit) {
  SnapFixture t;
  std::vector<std::byte> snap = t.origin;
  t.Write("s", 4096, 4096, 20, &snap);
  t.f.data->FailNthIo(1);
  EXPECT_FALSE(t.f.pool->Commit().ok());
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  EXPECT_FALSE(Open(*t.f.pool, "s")->Write(0, Pattern(10, 1)).ok()) << "stopped writing";
  t.f.Crash();
  EXPECT_EQ(t.f.ReadAll("s"), t.origin);
}

// What an fsync waits for includes the owed copies: a commit's latency in
// the pool's statistics, and in its slow-commit log line, counts the time
// the copies take (they used to be left out, so a commit spending seconds
// copying reported milliseconds).
TEST(PoolDeferredCopyTest, CommitLatencyCountsTheOwedCopies) {
  auto messages = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  PoolOptions o = EngineFixture::DefaultOptions();
  o.slow_commit = std::chrono::milliseconds(-1);  // every commit is "slow"
  o.log = [messages, mu](int, const std::string& m) {
    std::lock_guard<std::mutex> l(*mu);
    messages->push_back(m);
  };
  SnapFixture t(o);
  std::vector<std::byte> snap = t.origin;
  for (uint64_t b = 0; b < 4; ++b) t.Write("s", b * kBs + 4096, 4096, 30 + b, &snap);
  constexpr auto kDelay = std::chrono::milliseconds(25);
  t.f.data->SetReadDelay(kDelay);  // each copy reads its source once
  ASSERT_OK(t.f.pool->Commit());
  t.f.data->SetReadDelay(std::chrono::microseconds(0));
  EXPECT_EQ(t.f.pool->Stats().deferred_copies, 4u);
  const uint64_t copying_us = 4 * std::chrono::microseconds(kDelay).count();
  EXPECT_GE(t.f.pool->Stats().commit_max_us, copying_us);
  std::lock_guard<std::mutex> l(*mu);
  auto it = std::find_if(messages->rbegin(), messages->rend(), [](const std::string& m) {
    return m.find("slow commit") != std::string::npos;
  });
  ASSERT_NE(it, messages->rend()) << "no slow-commit line";
  const std::string& last = *it;
  EXPECT_NE(last.find("(4 owed copies "), std::string::npos) << last;
  const size_t ms = last.find(": ");
  ASSERT_NE(ms, std::string::npos) << last;
  EXPECT_GE(std::stoull(last.substr(ms + 2)), copying_us / 1000) << last;
}

// The background copier (PoolOptions::background_copies) makes owed copies
// without a commit and without a sync: the data area holds whole blocks
// soon after the writes, a power cut still loses what no commit made
// durable, and a commit after the copier has nothing left to copy.
TEST(PoolDeferredCopyTest, BackgroundCopierMakesOwedCopiesWithoutACommit) {
  PoolOptions o = EngineFixture::DefaultOptions();
  o.background_copies = true;
  SnapFixture t(o);
  auto wait_for_copies = [&](uint64_t n) {
    for (int i = 0; i < 2000 && t.f.pool->Stats().deferred_copies < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return t.f.pool->Stats().deferred_copies;
  };
  const uint64_t syncs = t.f.data->sync_count();
  std::vector<std::byte> snap = t.origin;
  for (uint64_t b = 0; b < 4; ++b) t.Write("s", b * kBs + 4096, 4096, 40 + b, &snap);
  ASSERT_EQ(wait_for_copies(4), 4u) << "the copier made the owed copies";
  for (uint64_t b = 0; b < 4; ++b) {
    EXPECT_EQ(t.RawBlock("s", b), Slice(snap, b * kBs, kBs)) << "block " << b << " is whole";
  }
  EXPECT_EQ(t.f.data->sync_count(), syncs) << "the copier never syncs";
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  t.f.Crash();
  EXPECT_EQ(t.f.ReadAll("s"), t.origin) << "no commit: the writes are lost with their copies";
  EXPECT_EQ(t.f.ReadAll("o"), t.origin);

  snap = t.origin;
  for (uint64_t b = 0; b < 4; ++b) t.Write("s", b * kBs + 8192, 4096, 50 + b, &snap);
  ASSERT_EQ(wait_for_copies(4), 4u) << "again, after the reopen";
  ASSERT_OK(t.f.pool->Commit());
  EXPECT_EQ(t.f.pool->Stats().deferred_copies, 4u) << "the commit had nothing left to copy";
  t.f.Crash();
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  EXPECT_EQ(t.f.ReadAll("o"), t.origin);
  t.f.CheckConsistency(false);
}

// A copy the background copier fails to make stays owed and readable, and
// the commit makes it (the copier waits a second before trying again).
TEST(PoolDeferredCopyTest, FailedBackgroundCopyStaysOwedForTheCommit) {
  PoolOptions o = EngineFixture::DefaultOptions();
  o.background_copies = true;
  SnapFixture t(o);
  std::vector<std::byte> snap = t.origin;
  t.f.data->FailNthIo(2);  // 1: the write's own bytes; 2: the copier's read of the source
  t.Write("s", kBs + 4096, 4096, 60, &snap);
  for (int i = 0; i < 2000 && t.f.data->FailurePending(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_FALSE(t.f.data->FailurePending()) << "the copier tried the copy";
  // Well within the copier's second before it tries again.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(t.f.pool->Stats().deferred_copies, 0u) << "it failed, and the copy stays owed";
  EXPECT_EQ(t.f.ReadAll("s"), snap) << "and readable";
  ASSERT_OK(t.f.pool->Commit());
  EXPECT_EQ(t.f.pool->Stats().deferred_copies, 1u) << "the commit made it";
  t.f.Crash();
  EXPECT_EQ(t.f.ReadAll("s"), snap);
  EXPECT_EQ(t.f.ReadAll("o"), t.origin);
}

// Writers copying on write into a snapshot (each its own blocks), readers
// of the snapshot and of its origin, and commits, all at once (also run
// under TSan); with the background copier, it makes copies at the same
// time. The origin never changes; the snapshot ends as the model, also
// after a power cut.
void ConcurrentCowWritersReadersAndCommits(bool background_copies) {
  constexpr uint64_t kBlocks = 16;
  PoolOptions options = EngineFixture::DefaultOptions();
  options.background_copies = background_copies;
  EngineFixture f(kBs, 4 * kBlocks, options);
  ASSERT_TRUE(f.pool->CreateDevice("o", kBlocks * kBs).ok());
  const auto origin = Pattern(kBlocks * kBs, 30);
  ASSERT_OK(Open(*f.pool, "o")->Write(0, origin));
  ASSERT_TRUE(f.pool->CreateSnapshot("o", "s").ok());
  auto s = Open(*f.pool, "s");
  auto o = Open(*f.pool, "o");
  std::vector<std::byte> model = origin;
  std::atomic<int> writers_left{2};
  std::atomic<bool> bad{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(w + 1);
      for (int i = 0; i < 200; ++i) {
        // Writer w owns the even (w = 0) or odd (w = 1) blocks.
        const uint64_t b = 2 * (rng() % (kBlocks / 2)) + w;
        const uint64_t off = b * kBs + rng() % (kBs - 5000);
        const size_t n = 1 + rng() % 5000;
        auto data = Pattern(n, static_cast<uint32_t>(rng()));
        if (!s->Write(off, data).ok()) bad = true;
        std::memcpy(model.data() + off, data.data(), n);  // disjoint per writer
      }
      writers_left.fetch_sub(1);
    });
  }
  threads.emplace_back([&] {
    std::vector<std::byte> buf(kBs);
    std::mt19937_64 rng(9);
    while (writers_left.load() > 0) {
      const uint64_t off = rng() % ((kBlocks - 1) * kBs);
      if (!s->Read(off, buf).ok()) bad = true;
      if (!o->Read(off, buf).ok() ||
          std::memcmp(buf.data(), origin.data() + off, buf.size()) != 0) {
        bad = true;
      }
    }
  });
  threads.emplace_back([&] {
    while (writers_left.load() > 0) {
      if (!f.pool->Commit().ok()) bad = true;
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_FALSE(bad.load());
  EXPECT_EQ(f.ReadAll("s"), model);
  ASSERT_OK(f.pool->Commit());
  s.reset();
  o.reset();
  f.Crash();
  EXPECT_EQ(f.ReadAll("s"), model);
  EXPECT_EQ(f.ReadAll("o"), origin);
  f.CheckConsistency(false);
}

TEST(PoolDeferredCopyTest, ConcurrentCowWritersReadersAndCommits) {
  ConcurrentCowWritersReadersAndCommits(/*background_copies=*/false);
}

TEST(PoolDeferredCopyTest, ConcurrentCowWritersReadersCommitsAndTheCopier) {
  ConcurrentCowWritersReadersAndCommits(/*background_copies=*/true);
}

}  // namespace
}  // namespace thinfs
