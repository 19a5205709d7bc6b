// CachedPages on a real file in /var/tmp: what it counts, and that asking
// reads nothing in, which the preadv2(RWF_NOWAIT) probe it replaced in
// FileBlockDevice::PrefetchForRead did not (a miss started reading the page,
// and the next look could find it there).

#include "core/page_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "tests/util/cache_file_fixture.h"

namespace thinfs {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kPages = 64;

// Whether the running kernel is 6.5 or later, which has cachestat(2).
bool KernelHasCachestat() {
  utsname u{};
  if (::uname(&u) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 6 || (major == 6 && minor >= 5);
}

class PageCacheTest : public CacheFileTest {
 protected:
  void SetUp() override {
    CreateFile(kPages * kPage);
    if (HasFatalFailure()) return;
    Result<uint64_t> probe = CachedPages(fd_, 0, kPage);
    if (!probe.ok()) {
      ASSERT_EQ(probe.status().code(), Status::Code::kNotSupported) << probe.status().ToString();
      ASSERT_FALSE(KernelHasCachestat()) << "Linux 6.5 on has cachestat(2)";
      GTEST_SKIP() << "this kernel has no cachestat(2): PrefetchForRead probes with preadv2";
    }
  }
  uint64_t Cached(uint64_t offset, uint64_t len) {
    Result<uint64_t> n = CachedPages(fd_, offset, len);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n.ok() ? *n : UINT64_MAX;
  }
  // Pages of the file resident by mincore(2), a second opinion.
  uint64_t Resident() { return Residency(fd_, kPages * kPage).Resident(0, kPages * kPage); }
};

TEST_F(PageCacheTest, CountsCachedPagesOfTheRange) {
  WriteAt(4 * kPage, 8 * kPage);
  EXPECT_EQ(Cached(4 * kPage, 8 * kPage), 8u);
  EXPECT_EQ(Cached(0, kPages * kPage), 8u) << "the pages outside were never written";
  EXPECT_EQ(Cached(0, 4 * kPage), 0u);
  EXPECT_EQ(Cached(12 * kPage, kPage), 0u);
  // One byte asks about the page holding it.
  EXPECT_EQ(Cached(12 * kPage - 1, 1), 1u);
  EXPECT_EQ(Cached(4 * kPage, 1), 1u);
  EXPECT_EQ(Cached(4 * kPage - 1, 1), 0u);
  // A range reaching into a cached page counts it.
  EXPECT_EQ(Cached(4 * kPage - 1, 2), 1u);
  // Beyond the end of the file: nothing.
  EXPECT_EQ(Cached(kPages * kPage, 16 * kPage), 0u);

  Evict();
  EXPECT_EQ(Resident(), 0u) << "the page cache kept pages of " << path_ << " after DONTNEED";
  EXPECT_EQ(Cached(0, kPages * kPage), 0u);
}

// The property PrefetchForRead's tests rely on: after an eviction every
// probe sees a miss, and none brings its page in. The preadv2(RWF_NOWAIT)
// probe fails this: its miss reads the page in, and on a fast disk the
// probe saw that page cached now and then (2 of 20 tries on the test VM).
TEST_F(PageCacheTest, AskingReadsNothingIn) {
  WriteAt(0, kPages * kPage);
  for (int round = 0; round < 50; ++round) {
    Evict();
    ASSERT_EQ(Resident(), 0u) << "the page cache kept pages of " << path_ << " after DONTNEED";
    const uint64_t page = static_cast<uint64_t>(round) % kPages;
    ASSERT_EQ(Cached(page * kPage + kPage - 1, 1), 0u) << "round " << round;
    ASSERT_EQ(Cached(0, kPages * kPage), 0u) << "round " << round;
    ASSERT_EQ(Resident(), 0u) << "asking read a page in, round " << round;
  }
}

}  // namespace
}  // namespace thinfs
