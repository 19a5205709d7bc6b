// A full pool: the low-water mark, Pool::Grow and writers waiting for space
// (issue 6, "Full pool").

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/engine_fixture.h"

namespace thinfs {
namespace {
namespace THINFS_TEST_FILE {  // unique per file in a unity build (tests/CMakeLists.txt)

using testing::EngineFixture;
using testing::Pattern;

constexpr uint64_t kBs = 4096;

constexpr auto& Open = testing::OpenOrFail;

// Records the engine's log lines and low-water calls.
struct Recorder {
  std::mutex mu;
  std::vector<std::string> warnings;
  std::vector<PoolStats> calls;

  void Install(PoolOptions* o) {
    o->log = [this](int level, const std::string& m) {
      std::lock_guard<std::mutex> l(mu);
      if (level == 1) warnings.push_back(m);
    };
    o->on_low_water = [this](const PoolStats& s) {
      std::lock_guard<std::mutex> l(mu);
      calls.push_back(s);
    };
  }
  size_t LowWaterWarnings() {
    std::lock_guard<std::mutex> l(mu);
    size_t n = 0;
    for (const std::string& w : warnings) {
      n += w.find("pool free space below the low-water mark") != std::string::npos;
    }
    return n;
  }
  size_t Calls() {
    std::lock_guard<std::mutex> l(mu);
    return calls.size();
  }
};

TEST(PoolGrowTest, LowWaterFiresOnceAndReArms) {
  Recorder rec;
  PoolOptions o = EngineFixture::DefaultOptions();
  o.low_water_blocks = 4;
  rec.Install(&o);
  EngineFixture f(kBs, 10, o);
  ASSERT_TRUE(f.pool->CreateDevice("v", 16 * kBs).ok());
  auto v = Open(*f.pool, "v");
  // 10 free -> 5 free: still at or above the mark.
  ASSERT_OK(v->Write(0, Pattern(5 * kBs, 1)));
  EXPECT_EQ(rec.Calls(), 0u);
  EXPECT_FALSE(f.pool->Stats().below_low_water);
  // 3 free: below. Then 2, 1: no second report.
  ASSERT_OK(v->Write(5 * kBs, Pattern(kBs, 2)));
  ASSERT_OK(v->Write(6 * kBs, Pattern(2 * kBs, 3)));
  EXPECT_EQ(rec.Calls(), 1u);
  EXPECT_EQ(rec.LowWaterWarnings(), 1u);
  {
    std::lock_guard<std::mutex> l(rec.mu);
    EXPECT_EQ(rec.calls[0].free_blocks, 3u);
    EXPECT_EQ(rec.calls[0].data_blocks, 10u);
    EXPECT_EQ(rec.calls[0].low_water_blocks, 4u);
    EXPECT_TRUE(rec.calls[0].below_low_water);
    EXPECT_NE(rec.warnings[0].find("3 of 10 blocks free"), std::string::npos) << rec.warnings[0];
  }
  PoolStats st = f.pool->Stats();
  EXPECT_TRUE(st.below_low_water);
  EXPECT_EQ(st.low_water_blocks, 4u);
  // Deletes free blocks (after the commit): above the mark again re-arms.
  ASSERT_OK(v->Discard(0, 6 * kBs));
  ASSERT_OK(f.pool->Commit());
  EXPECT_FALSE(f.pool->Stats().below_low_water);
  ASSERT_OK(v->Write(0, Pattern(6 * kBs, 4)));
  EXPECT_EQ(rec.Calls(), 2u);
  EXPECT_EQ(rec.LowWaterWarnings(), 2u);
  // Grow re-arms too (2 + 9 free, then 3).
  ASSERT_OK(f.pool->Grow(19));
  EXPECT_FALSE(f.pool->Stats().below_low_water);
  ASSERT_OK(v->Write(8 * kBs, Pattern(8 * kBs, 5)));
  EXPECT_EQ(rec.Calls(), 3u);
}

TEST(PoolGrowTest, OffByDefault) {
  Recorder rec;
  PoolOptions o = EngineFixture::DefaultOptions();
  rec.Install(&o);
  EngineFixture f(kBs, 4, o);
  ASSERT_TRUE(f.pool->CreateDevice("v", 4 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(0, Pattern(4 * kBs, 1)));
  EXPECT_EQ(rec.Calls(), 0u);
  EXPECT_FALSE(f.pool->Stats().below_low_water);
}

TEST(PoolGrowTest, GrowAddsFreeBlocksAndPersists) {
  EngineFixture f(kBs, 4);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kBs).ok());
  auto v = Open(*f.pool, "v");
  auto data = Pattern(8 * kBs, 7);
  ASSERT_OK(v->Write(0, std::span(data).first(4 * kBs)));
  EXPECT_TRUE(v->Write(4 * kBs, std::span(data).subspan(4 * kBs, kBs)).IsNoSpace());
  ASSERT_OK(f.pool->Grow(8));
  PoolStats st = f.pool->Stats();
  EXPECT_EQ(st.data_blocks, 8u);
  EXPECT_EQ(st.free_blocks, 4u);
  ASSERT_OK(v->Write(4 * kBs, std::span(data).subspan(4 * kBs)));
  EXPECT_EQ(f.pool->Stats().free_blocks, 0u);
  ASSERT_OK(v->Flush());
  v.reset();
  // The new size is committed: a power loss keeps it and every block.
  f.Crash();
  EXPECT_EQ(f.pool->Stats().data_blocks, 8u);
  auto all = f.ReadAll("v");
  ASSERT_EQ(all.size(), data.size());
  EXPECT_EQ(std::memcmp(all.data(), data.data(), data.size()), 0);
  f.CheckConsistency(true);
}

TEST(PoolGrowTest, ShrinkIsRefusedAndSameSizeIsANoOp) {
  EngineFixture f(kBs, 8);
  Status s = f.pool->Grow(7);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(f.pool->Stats().data_blocks, 8u);
  ASSERT_OK(f.pool->Grow(8));
  EXPECT_EQ(f.pool->Stats().data_blocks, 8u);
}

TEST(PoolGrowTest, ReadOnlyPoolRefusesGrow) {
  PoolOptions o = EngineFixture::DefaultOptions();
  o.read_only = true;
  EngineFixture f(kBs, 8, o);
  EXPECT_EQ(f.pool->Grow(16).code(), Status::Code::kReadOnly);
}

TEST(PoolGrowTest, WaitingWriterCompletesAfterGrow) {
  PoolOptions o = EngineFixture::DefaultOptions();
  o.no_space_timeout = std::chrono::seconds(20);
  EngineFixture f(kBs, 2, o);
  ASSERT_TRUE(f.pool->CreateDevice("v", 4 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(0, Pattern(2 * kBs, 1)));
  std::atomic<bool> done{false};
  Status writer_status;
  std::thread writer([&] {
    writer_status = v->Write(2 * kBs, Pattern(2 * kBs, 2));
    done.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load()) << "the writer did not wait for space";
  auto start = std::chrono::steady_clock::now();
  ASSERT_OK(f.pool->Grow(4));
  writer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_OK(writer_status);
  auto all = f.ReadAll("v");
  auto want = Pattern(2 * kBs, 1);
  auto more = Pattern(2 * kBs, 2);
  want.insert(want.end(), more.begin(), more.end());
  EXPECT_EQ(all, want);
}

TEST(PoolGrowTest, FullPoolFailsAtOnceByDefaultAndKeepsData) {
  EngineFixture f(kBs, 3);
  ASSERT_TRUE(f.pool->CreateDevice("v", 6 * kBs).ok());
  auto v = Open(*f.pool, "v");
  auto data = Pattern(3 * kBs, 3);
  ASSERT_OK(v->Write(0, data));
  ASSERT_OK(f.pool->Commit());
  auto start = std::chrono::steady_clock::now();
  Status s = v->Write(3 * kBs, Pattern(kBs, 4));
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  // In-place overwrites and reads go on while full.
  auto over = Pattern(kBs, 5);
  ASSERT_OK(v->Write(2 * kBs, over));
  std::memcpy(data.data() + 2 * kBs, over.data(), kBs);
  std::vector<std::byte> got(3 * kBs);
  Result<size_t> n = v->Read(0, got);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(got, data);
  ASSERT_OK(v->Flush());
  v.reset();
  f.Crash();
  auto all = f.ReadAll("v");
  EXPECT_EQ(std::memcmp(all.data(), data.data(), data.size()), 0);
}

TEST(PoolGrowTest, LargerSpaceMapFromAnInterruptedGrowIsCompletedAtOpen) {
  Recorder rec;
  PoolOptions o = EngineFixture::DefaultOptions();
  std::vector<std::string> infos;
  std::mutex mu;
  o.log = [&](int level, const std::string& m) {
    std::lock_guard<std::mutex> l(mu);
    if (level == 2) infos.push_back(m);
  };
  EngineFixture f(kBs, 4, o);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(0, Pattern(4 * kBs, 1)));
  ASSERT_OK(v->Flush());
  v.reset();
  // The crash window of Grow: device and space map grown, superblock not.
  ASSERT_OK(f.data->Grow(6));
  ASSERT_OK(f.space->Grow(6));
  f.Crash();
  EXPECT_EQ(f.pool->Stats().data_blocks, 6u);
  EXPECT_EQ(f.pool->Stats().free_blocks, 2u);
  {
    std::lock_guard<std::mutex> l(mu);
    bool logged = false;
    for (const std::string& m : infos) logged |= m.find("interrupted grow") != std::string::npos;
    EXPECT_TRUE(logged);
  }
  // And it is durable now.
  f.Crash();
  EXPECT_EQ(f.pool->Stats().data_blocks, 6u);
  f.CheckConsistency(true);
}

}  // namespace THINFS_TEST_FILE
}  // namespace
}  // namespace thinfs
