// CensusFolios on a real file in /var/tmp: what it says of cached, evicted
// and piecewise written ranges. How many folios the kernel makes depends
// on the kernel and the file system, so the checks are bounds that hold on
// any of them, plus the cases where the answer is forced.

#include "core/folio_census.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/util/cache_file_fixture.h"

namespace thinfs {
namespace {
namespace THINFS_TEST_FILE {  // unique per file in a unity build (tests/CMakeLists.txt)

constexpr uint64_t kPage = 4096;
constexpr uint64_t kBlock = 16 * kPage;

class FolioCensusTest : public CacheFileTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "/proc/kpageflags is root's only";
    CreateFile(4 * kBlock);
  }
  FolioCensus Census(uint64_t offset, uint64_t len) {
    Result<FolioCensus> c = CensusFolios(fd_, offset, len);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : FolioCensus{};
  }
};

TEST_F(FolioCensusTest, CountsWhatIsCachedAndWhatIsNot) {
  WriteAt(0, kBlock);
  FolioCensus whole = Census(0, kBlock);
  EXPECT_EQ(whole.uncached, 0u) << "just written";
  EXPECT_GE(whole.folios, 1u);
  EXPECT_LE(whole.folios, kBlock / kPage);

  // Never written: a hole, nothing cached.
  FolioCensus hole = Census(2 * kBlock, kBlock);
  EXPECT_EQ(hole.folios, 0u);
  EXPECT_EQ(hole.uncached, kBlock / kPage);

  Evict();
  FolioCensus evicted = Census(0, kBlock);
  if (evicted.uncached != kBlock / kPage) {
    GTEST_FAIL() << "the page cache kept " << kBlock / kPage - evicted.uncached
                 << " pages of " << path_ << " after DONTNEED";
  }
  EXPECT_EQ(evicted.folios, 0u);
  // The census only looks: it read nothing in.
  EXPECT_EQ(Census(0, kBlock).uncached, kBlock / kPage);
}

// A block written 4 KiB first, the rest after (as a copy-on-write fills
// it), is cached in at least as many folios as one written whole; a range
// starting inside a folio counts that folio.
TEST_F(FolioCensusTest, PiecewiseWritesMakeNoFewerFolios) {
  WriteAt(0, kBlock);
  const uint64_t whole = Census(0, kBlock).folios;
  WriteAt(kBlock + 5 * kPage, kPage);
  WriteAt(kBlock, 5 * kPage);
  WriteAt(kBlock + 6 * kPage, kBlock - 6 * kPage);
  FolioCensus pieces = Census(kBlock, kBlock);
  EXPECT_EQ(pieces.uncached, 0u);
  EXPECT_GE(pieces.folios, whole);
  EXPECT_GE(pieces.folios, 2u) << "the 4 KiB at offset 20 KiB cannot share a folio with page 0";
  EXPECT_LE(pieces.folios, kBlock / kPage);

  // The last page of the whole-written block: one folio, whichever size.
  EXPECT_EQ(Census(kBlock - kPage, kPage).folios, 1u);
  EXPECT_EQ(Census(kBlock - kPage, kPage).uncached, 0u);
}

// The folios' sizes: the touched folios cover every cached page of the
// range, and a folio reaching into the range counts whole. So their summed
// size is at least the range's pages and at least their count, and a
// page inside a folio of N pages reports N.
TEST_F(FolioCensusTest, FolioSizesCoverTheRange) {
  WriteAt(0, kBlock);
  const FolioCensus whole = Census(0, kBlock);
  ASSERT_EQ(whole.uncached, 0u);
  EXPECT_GE(whole.folio_pages, kBlock / kPage);
  EXPECT_GE(whole.folio_pages, whole.folios);
  // Each page alone: the folio holding it, whole, so the mean over the
  // pages is the block's pages per folio (16 in one folio, 1 in pages).
  uint64_t sum = 0;
  for (uint64_t p = 0; p < kBlock / kPage; ++p) {
    const FolioCensus one = Census(p * kPage, kPage);
    ASSERT_EQ(one.folios, 1u);
    EXPECT_GE(one.folio_pages, 1u);
    sum += one.folio_pages;
  }
  if (whole.folios == 1) {
    EXPECT_EQ(sum, (kBlock / kPage) * whole.folio_pages) << "every page in the one folio";
  } else {
    EXPECT_GE(sum, kBlock / kPage);
  }
}

TEST_F(FolioCensusTest, RefusesUnalignedRanges) {
  EXPECT_FALSE(CensusFolios(fd_, 1, kPage).ok());
  EXPECT_FALSE(CensusFolios(fd_, 0, kPage + 1).ok());
  Result<FolioCensus> empty = CensusFolios(fd_, 0, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->folios, 0u);
}

}  // namespace THINFS_TEST_FILE
}  // namespace
}  // namespace thinfs
