// Pool::Commit skips the data sync when no data write completed since the
// last one (a snapshot, create or rename commits metadata only). These tests
// prove the skip never loses a write that a Flush or a snapshot promised,
// including a write that races a commit, and that it is taken where it may.

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
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
  std::shared_ptr<Volume> v = NewVolume();
  ASSERT_NE(v, nullptr);
  ASSERT_OK(v->Flush());
  const uint64_t syncs = data_->sync_count();
  ASSERT_OK(v->Provision(0, 2 * kBs));
  ASSERT_OK(v->Flush());
  EXPECT_EQ(data_->sync_count(), syncs + 1);
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

}  // namespace
}  // namespace thinfs
