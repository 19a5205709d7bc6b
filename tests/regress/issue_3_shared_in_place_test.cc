// Regression (issue 3, found while writing the power-loss tests): a block
// shared by two devices through a refcount became writable in place as
// soon as one device dropped its reference, before that drop was
// committed. A crash then brought the other device's reference back, and
// that device read the first device's newer write: data crossing between
// devices. A reference drop, like a free, must wait for the commit.

#include <gtest/gtest.h>

#include "tests/util/engine_fixture.h"

namespace thinfs {
namespace {

using testing::EngineFixture;
using testing::Pattern;

TEST(Issue3SharedInPlaceTest, UncommittedUnshareDoesNotAllowInPlaceWrites) {
  constexpr uint64_t kBs = 4096;
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("a", 4 * kBs).ok());
  ASSERT_TRUE(f.pool->CreateDevice("b", 4 * kBs).ok());
  auto a = f.pool->OpenVolume("a");
  auto b = f.pool->OpenVolume("b");
  ASSERT_TRUE(a.ok() && b.ok());
  const auto x = Pattern(kBs, 1), y = Pattern(kBs, 2);
  ASSERT_OK((*a)->Write(0, x));
  // To b's block 1 (not a whole-device clone, which would be a snapshot).
  ASSERT_OK(f.pool->ShareRange((*a)->id(), 0, (*b)->id(), kBs, kBs));
  ASSERT_OK(f.pool->Commit());  // a's block 0, b's block 1: one data block, count 2
  auto shared = f.pool->MappedBlockForTesting((*a)->id(), 0);
  ASSERT_TRUE(shared.ok() && shared->has_value());
  ASSERT_EQ(*f.store->GetRefcount(**shared), 2u);

  ASSERT_OK((*b)->Discard(kBs, kBs));  // b drops its reference (uncommitted)
  ASSERT_OK((*a)->Write(0, y));      // must not land in the block b still maps on disk
  // The data reaches the disk, the metadata commit does not.
  f.store->FailNextCommit();
  EXPECT_FALSE(f.pool->Commit().ok());
  a->reset();
  b->reset();
  f.Crash();

  EXPECT_EQ(f.ReadAll("b"), [&] {
    std::vector<std::byte> want(4 * kBs);
    std::copy(x.begin(), x.end(), want.begin() + kBs);
    return want;
  }()) << "b shows a's uncommitted write";
  // a may show its own write (the data was synced) or its committed data.
  std::vector<std::byte> got = f.ReadAll("a");
  EXPECT_TRUE(std::equal(x.begin(), x.end(), got.begin()) ||
              std::equal(y.begin(), y.end(), got.begin()));
  f.CheckConsistency(false);
}

}  // namespace
}  // namespace thinfs
