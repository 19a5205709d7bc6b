// CpuLatencyHold (fs/cpu_latency.h) against a regular file standing in for
// /dev/cpu_dma_latency: every value it writes lands in the file in order.
// FuseTest.CpuLatencyOptionHoldsTheLimitWhileRequestsArrive checks the
// real device through a mount.

#include "fs/cpu_latency.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/pool_test_util.h"

namespace thinfs::fs {
namespace {

using std::chrono::milliseconds;
using thinfs::testing::TempDir;
using std::chrono::steady_clock;

// The s32 values written to `path` so far.
std::vector<int32_t> Written(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> out(bytes.size() / sizeof(int32_t));
  // Not with an empty vector: memcpy's arguments must not be null.
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(int32_t));
  return out;
}

// Waits up to 2 s for `path` to hold `n` values.
bool WaitForValues(const std::string& path, size_t n) {
  const auto end = steady_clock::now() + std::chrono::seconds(2);
  while (Written(path).size() < n && steady_clock::now() < end) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  return Written(path).size() >= n;
}

TEST(CpuLatencyHoldTest, HeldWhileTouchedAndLiftedAfterAQuietPeriod) {
  TempDir dir;
  const std::string dev = dir.path() + "/cpu_dma_latency";
  { std::ofstream create(dev); }
  // Long enough that a loaded CI machine does not stall the touching
  // thread for a whole period (which would rightly lift the limit).
  constexpr milliseconds kHold{100};
  auto hold = CpuLatencyHold::Open(7, dev, kHold);
  ASSERT_TRUE(hold.ok()) << hold.status().ToString();
  std::this_thread::sleep_for(kHold);
  EXPECT_TRUE(Written(dev).empty()) << "held before any request";

  // Requests every 2 ms for 3 periods: set once, never lifted between.
  (*hold)->Touch();
  EXPECT_EQ(Written(dev), std::vector<int32_t>{7});
  auto last = steady_clock::now();
  for (int i = 0; i < 150; ++i) {
    std::this_thread::sleep_for(milliseconds(2));
    (*hold)->Touch();
    last = steady_clock::now();
  }
  EXPECT_EQ(Written(dev), std::vector<int32_t>{7}) << "lifted while requests kept arriving";

  // Quiet: lifted, and not before a whole period without a request.
  ASSERT_TRUE(WaitForValues(dev, 2));
  const auto lifted = steady_clock::now();
  EXPECT_EQ(Written(dev), (std::vector<int32_t>{7, CpuLatencyHold::kNoLimit}));
  EXPECT_GE(lifted - last, kHold);
  EXPECT_EQ((*hold)->times_set(), 1u);
  EXPECT_GE((*hold)->time_held(), milliseconds(300));

  // The next request sets it again.
  (*hold)->Touch();
  EXPECT_EQ(Written(dev), (std::vector<int32_t>{7, CpuLatencyHold::kNoLimit, 7}));
  EXPECT_EQ((*hold)->times_set(), 2u);
  ASSERT_TRUE(WaitForValues(dev, 4));
  EXPECT_EQ(Written(dev).back(), CpuLatencyHold::kNoLimit);
}

TEST(CpuLatencyHoldTest, TouchesFromManyThreadsSetItOnce) {
  TempDir dir;
  const std::string dev = dir.path() + "/cpu_dma_latency";
  { std::ofstream create(dev); }
  auto hold = CpuLatencyHold::Open(0, dev, milliseconds(200));
  ASSERT_TRUE(hold.ok()) << hold.status().ToString();
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) (*hold)->Touch();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(Written(dev), std::vector<int32_t>{0});
  EXPECT_EQ((*hold)->times_set(), 1u);
}

TEST(CpuLatencyHoldTest, OpenFailsWithoutTheDevice) {
  TempDir dir;
  auto hold = CpuLatencyHold::Open(0, dir.path() + "/missing/cpu_dma_latency");
  ASSERT_FALSE(hold.ok());
  EXPECT_NE(hold.status().ToString().find("cpu_latency"), std::string::npos)
      << hold.status().ToString();
}

}  // namespace
}  // namespace thinfs::fs
