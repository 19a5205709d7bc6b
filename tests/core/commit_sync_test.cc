// Pool::Commit skips the data sync when no data write completed since the
// last one (a snapshot, create or rename commits metadata only), and the
// periodic commit skips it when the only writes were overwrites in place
// (PoolOptions::sync_overwrites off). These tests prove the skips never
// lose a write that a Flush or a snapshot promised, never let a mapping
// reach new data that is not durable, including writes that race a commit,
// and that they are taken where they may.

#include <gtest/gtest.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/fault_injection_block_device.h"
#include "core/pool.h"
#include "tests/util/engine_fixture.h"

namespace thinfs {
namespace {

constexpr uint64_t kBs = 4096;
constexpr uint64_t kBlocks = 64;

// A pool over in-memory parts that survive a simulated power cut
// (testing::EngineFixture: no periodic commit, no background GC).
class CommitSyncTest : public ::testing::Test {
 protected:
  testing::EngineFixture f{kBs, kBlocks};
  std::unique_ptr<Pool>& pool_ = f.pool;
  std::unique_ptr<FaultInjectionBlockDevice>& data_ = f.data;

  // Power loss: what no sync made durable is gone.
  void PowerCut() { f.Crash(); }

  // A new 16-block device "v", open (nullptr, with a failure, if not).
  std::shared_ptr<Volume> NewVolume() {
    Status s = pool_->CreateDevice("v", 16 * kBs).status();
    EXPECT_TRUE(s.ok()) << s.ToString();
    return s.ok() ? testing::OpenOrFail(*pool_, "v") : nullptr;
  }

  // "v" with block 0 written (pattern 5) and flushed, then overwritten in
  // place (pattern 6, own unshared block) without a flush.
  std::shared_ptr<Volume> OverwrittenInPlace() {
    std::shared_ptr<Volume> v = NewVolume();
    if (v == nullptr) return nullptr;
    EXPECT_OK(v->Write(0, testing::Pattern(kBs, 5)));
    EXPECT_OK(v->Flush());
    EXPECT_OK(v->Write(0, testing::Pattern(kBs, 6)));
    return v;
  }

  // Provisioning (fallocate) writes zeroes into new blocks: `commit` must
  // sync them.
  void ExpectProvisionedZeroesSyncedBy(const std::function<Status()>& commit) {
    std::shared_ptr<Volume> v = NewVolume();
    ASSERT_NE(v, nullptr);
    ASSERT_OK(v->Flush());
    const uint64_t syncs = data_->sync_count();
    ASSERT_OK(v->Provision(0, 2 * kBs));
    ASSERT_OK(commit());
    EXPECT_EQ(data_->sync_count(), syncs + 1);
  }

  // "v"'s mtime and ctime, as the pool reports them.
  std::pair<int64_t, int64_t> Times() {
    Result<DeviceInfo> d = pool_->GetDevice("v");
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::pair{d->mtime_ns, d->ctime_ns} : std::pair<int64_t, int64_t>{};
  }

  static int64_t NowNs() {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
  }

  std::vector<std::byte> Read(const std::string& name, uint64_t off, size_t n) {
    std::shared_ptr<Volume> v = testing::OpenOrFail(*pool_, name);
    std::vector<std::byte> buf(n);
    if (v == nullptr) return buf;
    Result<size_t> r = v->Read(off, buf);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return buf;
  }
};

TEST_F(CommitSyncTest, SnapshotWithoutANewWriteSkipsTheDataSync) {
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Write(0, testing::Pattern(4 * kBs, 1)));
  ASSERT_OK(v->Flush());
  const uint64_t syncs = data_->sync_count();
  ASSERT_TRUE(pool_->CreateSnapshot("v", "s1").ok());
  ASSERT_TRUE(pool_->CreateDevice("w", kBs).ok());
  EXPECT_EQ(data_->sync_count(), syncs) << "nothing was written since the last data sync";
  // Metadata-only commits are still durable.
  PowerCut();
  EXPECT_EQ(Read("s1", 0, 4 * kBs), testing::Pattern(4 * kBs, 1));
  EXPECT_TRUE(pool_->GetDevice("w").ok());
}

TEST_F(CommitSyncTest, SnapshotAfterUnflushedWritesMakesThemDurable) {
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Write(0, testing::Pattern(4 * kBs, 2)));
  ASSERT_OK(v->Flush());
  // New blocks (provisioned) and an overwrite of an own block in place,
  // neither flushed: the snapshot's commit must sync both.
  ASSERT_OK(v->Write(8 * kBs, testing::Pattern(kBs, 3)));
  ASSERT_OK(v->Write(kBs, testing::Pattern(kBs, 4)));
  const uint64_t syncs = data_->sync_count();
  ASSERT_TRUE(pool_->CreateSnapshot("v", "s1").ok());
  EXPECT_EQ(data_->sync_count(), syncs + 1);
  PowerCut();
  std::vector<std::byte> want = testing::Pattern(4 * kBs, 2);
  std::vector<std::byte> in_place = testing::Pattern(kBs, 4);
  std::copy(in_place.begin(), in_place.end(), want.begin() + kBs);
  for (const char* name : {"v", "s1"}) {
    EXPECT_EQ(Read(name, 0, 4 * kBs), want) << name;
    EXPECT_EQ(Read(name, 8 * kBs, kBs), testing::Pattern(kBs, 3)) << name;
  }
}

TEST_F(CommitSyncTest, ProvisionedZeroesAreSyncedByTheNextCommit) {
  ExpectProvisionedZeroesSyncedBy([&] { return pool_->Commit(); });
}

// The race the flag's ordering closes: a commit (the periodic one, say)
// runs after an in-place overwrite has begun but before its bytes reach the
// data area. That commit may not cover the write; the next Flush must. Were
// data_dirty set before the write, the racing commit would consume it and
// the Flush would skip the sync.
TEST_F(CommitSyncTest, InPlaceOverwriteRacingACommitIsDurableAfterTheNextFlush) {
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Write(0, testing::Pattern(kBs, 5)));
  ASSERT_OK(v->Flush());
  ASSERT_TRUE(pool_->CreateDevice("other", kBs).ok());
  bool ran = false;
  f.data_forwarder->before_write = [&] {
    // Renaming commits metadata: a commit in the middle of the write.
    Status s = pool_->RenameDevice("other", "other2");
    EXPECT_TRUE(s.ok()) << s.ToString();
    ran = true;
  };
  ASSERT_OK(v->Write(0, testing::Pattern(kBs, 6)));  // in place: own, unshared block
  ASSERT_TRUE(ran);
  ASSERT_OK(v->Flush());
  PowerCut();
  EXPECT_EQ(Read("v", 0, kBs), testing::Pattern(kBs, 6));
}

// --- Overwrites in place need only the data sync (lever 26) ------------
// A write leaves the device's times alone within the clock's tick of their
// last update (VolumeState::TouchForWrite), so a Flush after overwrites in
// place finds no metadata to commit: it syncs the data and writes neither
// the bitmap nor the WAL. Timing: a tick is 1-4 ms, and one attempt may
// straddle a tick boundary, so each check below is tried up to 50 times.

// An overwrite in place and its Flush, right after a Flush: true when that
// Flush synced the data and committed no metadata.
bool FlushCommittedOnlyData(Pool& pool, Volume& v, FaultInjectionBlockDevice& data, int pattern) {
  EXPECT_OK(v.Write(0, testing::Pattern(kBs, pattern)));
  EXPECT_OK(v.Flush());  // the write's new mtime: committed
  const uint64_t txn = pool.Stats().transaction_id, syncs = data.sync_count();
  EXPECT_OK(v.Write(0, testing::Pattern(kBs, pattern + 1)));
  EXPECT_OK(v.Flush());
  EXPECT_EQ(data.sync_count(), syncs + 1) << "the overwrite must be synced";
  return pool.Stats().transaction_id == txn;
}

TEST_F(CommitSyncTest, FlushAfterAnOverwriteInPlaceSyncsOnlyTheData) {
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  int tries = 0;
  bool only_data = false;
  for (; tries < 50 && !only_data; ++tries) {
    only_data = FlushCommittedOnlyData(*pool_, *v, *data_, 10 + 2 * tries);
  }
  ASSERT_TRUE(only_data) << "every Flush after an overwrite committed metadata";
  const int last = 10 + 2 * (tries - 1) + 1;
  // What the data-only Flush promised survives power loss, and the pool
  // reopens at the transaction it left.
  PowerCut();
  EXPECT_EQ(Read("v", 0, kBs), testing::Pattern(kBs, last));
}

TEST_F(CommitSyncTest, AWriteKeepsTheTimesOnlyWithinTheirTick) {
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Write(0, testing::Pattern(kBs, 1)));
  ASSERT_OK(v->Flush());
  // A write's times are never later than the write, nor earlier than one
  // tick (at most 20 ms here) before it, and never go backwards.
  for (int i = 0; i < 20; ++i) {
    const auto [m0, c0] = Times();
    const int64_t before = NowNs();
    ASSERT_OK(v->Write(0, testing::Pattern(kBs, 2 + i)));
    const int64_t after = NowNs();
    const auto [m, c] = Times();
    EXPECT_GE(m, m0);
    EXPECT_GE(c, c0);
    EXPECT_LE(m, after);
    EXPECT_GE(m, before - 20'000'000);
    EXPECT_EQ(m, c);
    std::this_thread::sleep_for(std::chrono::microseconds(700));
  }
  // After a tick the next write moves them, and its Flush commits them.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto [m1, c1] = Times();
  ASSERT_OK(v->Write(0, testing::Pattern(kBs, 30)));
  const auto [m2, c2] = Times();
  EXPECT_GT(m2, m1);
  EXPECT_GT(c2, c1);
  const uint64_t txn = pool_->Stats().transaction_id;
  ASSERT_OK(v->Flush());
  EXPECT_EQ(pool_->Stats().transaction_id, txn + 1);
  PowerCut();
  EXPECT_EQ(Times().first, m2);
  // A time in the future (utimensat) is replaced by the next write at once.
  Result<DeviceInfo> d = pool_->GetDevice("v");
  ASSERT_TRUE(d.ok());
  const int64_t future = NowNs() + 3600'000'000'000;
  ASSERT_OK(pool_->SetAttrs(d->id, std::nullopt, std::nullopt, std::nullopt, std::nullopt, future));
  v = testing::OpenOrFail(*pool_, "v");
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Write(0, testing::Pattern(kBs, 31)));
  EXPECT_LE(Times().first, NowNs());
}

// fdatasync (Flush(data_only)) syncs every write but leaves a write's new
// times to the next other commit, as fdatasync(2) leaves a file's
// timestamps; a record that changed otherwise is written whole.
TEST_F(CommitSyncTest, FdatasyncLeavesAWritesNewTimesToTheNextCommit) {
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Write(0, testing::Pattern(kBs, 1)));
  ASSERT_OK(v->Flush());
  auto mtime = [&] { return Times().first; };
  // Writes a tick after the last one, so that its times move.
  auto write_later = [&](uint64_t off, int pattern) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int64_t before = mtime();
    EXPECT_OK(v->Write(off, testing::Pattern(kBs, pattern)));
    EXPECT_GT(mtime(), before);
    return mtime();
  };
  const int64_t committed = mtime();
  write_later(0, 2);  // in place
  const uint64_t txn = pool_->Stats().transaction_id, syncs = data_->sync_count();
  ASSERT_OK(v->Flush(/*data_only=*/true));
  EXPECT_EQ(data_->sync_count(), syncs + 1);
  EXPECT_EQ(pool_->Stats().transaction_id, txn) << "only the times changed";
  PowerCut();
  EXPECT_EQ(Read("v", 0, kBs), testing::Pattern(kBs, 2)) << "the data is durable";
  EXPECT_EQ(mtime(), committed) << "the times are the last commit's";

  // Reopens "v", writes a tick later, fdatasyncs, runs `then` and cuts the
  // power: the times that write set must survive.
  auto expect_times_kept = [&](uint64_t off, int pattern, const std::function<Status()>& then) {
    v = testing::OpenOrFail(*pool_, "v");
    ASSERT_NE(v, nullptr);
    const int64_t moved = write_later(off, pattern);
    ASSERT_OK(v->Flush(/*data_only=*/true));
    ASSERT_OK(then());
    PowerCut();
    EXPECT_EQ(mtime(), moved);
  };
  // A new block changes the record's mapped count: written whole.
  expect_times_kept(4 * kBs, 3, [] { return Status::Ok(); });
  EXPECT_EQ(Read("v", 4 * kBs, kBs), testing::Pattern(kBs, 3));
  // Every other commit records the times an fdatasync left: fsync...
  expect_times_kept(0, 4, [&] { return v->Flush(); });
  // ...and the periodic commit.
  expect_times_kept(0, 5, [&] { return pool_->PeriodicCommitForTesting(); });
  EXPECT_EQ(Read("v", 0, kBs), testing::Pattern(kBs, 5));
}

// --- The periodic commit (PoolOptions::sync_overwrites) ------------------
// By default it syncs every write. With sync_overwrites off it syncs the
// data only when it writes mappings to new data; overwrites in place wait
// for an explicit commit, as with ext4's data=ordered.

TEST_F(CommitSyncTest, ByDefaultThePeriodicCommitSyncsOverwritesInPlace) {
  ASSERT_TRUE(f.options.sync_overwrites);
  std::shared_ptr<Volume> v = OverwrittenInPlace();
  ASSERT_NE(v, nullptr);
  const uint64_t syncs = data_->sync_count();
  ASSERT_OK(pool_->PeriodicCommitForTesting());
  EXPECT_EQ(data_->sync_count(), syncs + 1);
  PowerCut();
  EXPECT_EQ(Read("v", 0, kBs), testing::Pattern(kBs, 6));
}

class PeriodicCommitTest : public CommitSyncTest {
 protected:
  void SetUp() override {
    f.options.sync_overwrites = false;
    f.CleanReopen();
  }
};

TEST_F(PeriodicCommitTest, LeavesOverwritesInPlaceToTheNextFlush) {
  std::shared_ptr<Volume> v = OverwrittenInPlace();
  ASSERT_NE(v, nullptr);
  const uint64_t syncs = data_->sync_count();
  // (It still commits the device's new mtime.)
  ASSERT_OK(pool_->PeriodicCommitForTesting());
  EXPECT_EQ(data_->sync_count(), syncs) << "no mapping needs the overwrite";
  ASSERT_OK(v->Flush());
  EXPECT_EQ(data_->sync_count(), syncs + 1) << "the flush must sync what the periodic left";
  PowerCut();
  EXPECT_EQ(Read("v", 0, kBs), testing::Pattern(kBs, 6));
}

// The periodic commit must leave data_dirty set for what it did not sync:
// the snapshot's commit then syncs it, or the snapshot would lose a write
// made before it.
TEST_F(PeriodicCommitTest, ASnapshotAfterItSyncsTheOverwritesItLeft) {
  std::shared_ptr<Volume> v = OverwrittenInPlace();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(pool_->PeriodicCommitForTesting());
  ASSERT_TRUE(pool_->CreateSnapshot("v", "s").ok());
  PowerCut();
  EXPECT_EQ(Read("v", 0, kBs), testing::Pattern(kBs, 6));
  EXPECT_EQ(Read("s", 0, kBs), testing::Pattern(kBs, 6));
}

TEST_F(PeriodicCommitTest, WithoutAFlushMayLoseOnlyTheOverwrite) {
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Write(0, testing::Pattern(2 * kBs, 5)));
  ASSERT_OK(v->Flush());
  ASSERT_OK(v->Write(kBs, testing::Pattern(kBs, 6)));  // in place
  ASSERT_OK(pool_->PeriodicCommitForTesting());
  PowerCut();
  // The fault-injecting device drops every unsynced write: the overwrite is
  // gone, the block reads what the last flush made durable, never anything
  // else.
  EXPECT_EQ(Read("v", 0, 2 * kBs), testing::Pattern(2 * kBs, 5));
}

TEST_F(PeriodicCommitTest, SyncsNewBlocksAndTheOverwritesWithThem) {
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Write(0, testing::Pattern(kBs, 5)));
  ASSERT_OK(v->Flush());
  ASSERT_OK(v->Write(0, testing::Pattern(kBs, 6)));       // in place
  ASSERT_OK(v->Write(8 * kBs, testing::Pattern(kBs, 7)));  // provisions a block
  const uint64_t syncs = data_->sync_count();
  ASSERT_OK(pool_->PeriodicCommitForTesting());
  EXPECT_EQ(data_->sync_count(), syncs + 1);
  PowerCut();
  EXPECT_EQ(Read("v", 0, kBs), testing::Pattern(kBs, 6));
  EXPECT_EQ(Read("v", 8 * kBs, kBs), testing::Pattern(kBs, 7));
}

TEST_F(PeriodicCommitTest, SyncsProvisionedZeroes) {
  ExpectProvisionedZeroesSyncedBy([&] { return pool_->PeriodicCommitForTesting(); });
}

// Copy-on-write into a snapshot's shared block, its copy owed to the commit
// (deferred_copy) or made at once: the periodic commit must sync the new
// block before its mapping, or after a power cut the device would read a
// block that holds neither its old nor its new bytes.
TEST_F(PeriodicCommitTest, SyncsCopyOnWriteCopies) {
  for (uint64_t deferred : {uint64_t{1} << 20, uint64_t{0}}) {
    SCOPED_TRACE("deferred_copy_bytes " + std::to_string(deferred));
    f.options.deferred_copy_bytes = deferred;
    f.CleanReopen();
    const std::string origin = "o" + std::to_string(deferred);
    const std::string snap = "s" + std::to_string(deferred);
    ASSERT_TRUE(pool_->CreateDevice(origin, 4 * kBs).ok());
    std::shared_ptr<Volume> o = testing::OpenOrFail(*pool_, origin);
    ASSERT_NE(o, nullptr);
    ASSERT_OK(o->Write(0, testing::Pattern(4 * kBs, 8)));
    ASSERT_OK(o->Flush());
    ASSERT_TRUE(pool_->CreateSnapshot(origin, snap).ok());
    // A partial write to each of two shared blocks.
    ASSERT_OK(o->Write(100, testing::Pattern(300, 9)));
    ASSERT_OK(o->Write(2 * kBs + 1000, testing::Pattern(50, 10)));
    ASSERT_OK(pool_->PeriodicCommitForTesting());
    PowerCut();
    std::vector<std::byte> want = testing::Pattern(4 * kBs, 8);
    std::vector<std::byte> a = testing::Pattern(300, 9), b = testing::Pattern(50, 10);
    std::copy(a.begin(), a.end(), want.begin() + 100);
    std::copy(b.begin(), b.end(), want.begin() + 2 * kBs + 1000);
    EXPECT_EQ(Read(origin, 0, 4 * kBs), want);
    EXPECT_EQ(Read(snap, 0, 4 * kBs), testing::Pattern(4 * kBs, 8));
  }
}

// The new-data flag's ordering: a periodic commit that runs while a write
// to a new block is under way must not consume the flag meant for that
// write's mapping, which the next periodic commit writes.
TEST_F(PeriodicCommitTest, NewBlockWriteRacingAPeriodicCommitIsSyncedByTheNextOne) {
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Flush());
  bool ran = false;
  f.data_forwarder->before_write = [&] {
    Status s = pool_->PeriodicCommitForTesting();
    EXPECT_TRUE(s.ok()) << s.ToString();
    ran = true;
  };
  ASSERT_OK(v->Write(4 * kBs, testing::Pattern(kBs, 11)));  // provisions
  ASSERT_TRUE(ran);
  ASSERT_OK(pool_->PeriodicCommitForTesting());
  PowerCut();
  EXPECT_EQ(Read("v", 4 * kBs, kBs), testing::Pattern(kBs, 11));
}

}  // namespace
}  // namespace thinfs
