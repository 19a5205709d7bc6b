// Reproducer (issue 6, found by TSan on PoolModelTest: lock-order-inversion
// in Pool::ShareRange). The clone fast path (src != dst, same offsets)
// takes both devices' io_mu exclusively in id order; the general path takes
// src's io_mu (shared), then dst's, whatever the ids. Two concurrent copies
// in opposite directions, one on each path, can each hold the lock the
// other waits for: copy_file_range A->B at equal offsets and B->A at
// different offsets deadlock the mount.
//
// Fixed by taking the two io_mu in id order on both paths. When the bug
// is back this test hangs; the watchdog aborts after 20 s.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "tests/util/engine_fixture.h"

namespace thinfs {
namespace {

using testing::EngineFixture;
using testing::Pattern;

TEST(Issue6ShareRangeLockOrderTest, OppositeCopiesDoNotDeadlock) {
  constexpr uint64_t kBs = 4096;
  EngineFixture f(kBs, 4096);
  ASSERT_TRUE(f.pool->CreateDevice("a", 64 * kBs).ok());
  ASSERT_TRUE(f.pool->CreateDevice("b", 64 * kBs).ok());
  auto a = f.pool->OpenVolume("a");
  auto b = f.pool->OpenVolume("b");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_OK((*a)->Write(0, Pattern(16 * kBs, 1)));
  ASSERT_OK((*b)->Write(0, Pattern(16 * kBs, 2)));
  const VolumeId ida = (*a)->id(), idb = (*b)->id();
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 200 && !done.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!done.load()) {
      fprintf(stderr, "deadlock: ShareRange a->b and b->a never finished\n");
      std::abort();
    }
  });
  std::thread fast([&] {  // same offsets: the clone path, id order
    for (int i = 0; i < 2000; ++i) {
      EXPECT_OK(f.pool->ShareRange(ida, 0, idb, 0, 4 * kBs));
    }
  });
  std::thread general([&] {  // different offsets: src then dst
    for (int i = 0; i < 2000; ++i) {
      EXPECT_OK(f.pool->ShareRange(idb, 8 * kBs, ida, 32 * kBs, 4 * kBs));
    }
  });
  fast.join();
  general.join();
  done.store(true);
  watchdog.join();
}

}  // namespace
}  // namespace thinfs
