#include "core/zeros.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace thinfs {
namespace {

TEST(IsAllZeroTest, EmptyIsZero) { EXPECT_TRUE(IsAllZero({})); }

// Every length from 0 to past two heads, every position of a single
// non-zero byte, at several misalignments of the buffer's start.
TEST(IsAllZeroTest, FindsOneNonZeroByteAnywhere) {
  std::vector<std::byte> storage(200 + 8);
  for (size_t shift = 0; shift < 8; ++shift) {
    for (size_t n = 0; n <= 200; ++n) {
      std::span<std::byte> buf(storage.data() + shift, n);
      std::fill(storage.begin(), storage.end(), std::byte{0});
      EXPECT_TRUE(IsAllZero(buf)) << "n " << n << " shift " << shift;
      for (size_t at = 0; at < n; ++at) {
        buf[at] = std::byte{0x80};
        EXPECT_FALSE(IsAllZero(buf)) << "n " << n << " shift " << shift << " at " << at;
        buf[at] = std::byte{0};
      }
    }
  }
}

// Bytes around the buffer do not count.
TEST(IsAllZeroTest, LooksOnlyInsideTheBuffer) {
  std::vector<std::byte> storage(64, std::byte{1});
  std::fill(storage.begin() + 8, storage.begin() + 40, std::byte{0});
  EXPECT_TRUE(IsAllZero(std::span<const std::byte>(storage.data() + 8, 32)));
  EXPECT_FALSE(IsAllZero(std::span<const std::byte>(storage.data() + 7, 33)));
  EXPECT_FALSE(IsAllZero(std::span<const std::byte>(storage.data() + 8, 33)));
}

// A block of 64 KiB, as the pool checks: zeros, and a non-zero byte at the
// first, last and a middle position; and zeros for the first 16 bytes, then
// a pattern of period 16 (the check compares the buffer with itself 16
// bytes on, where such a pattern matches but for its start).
TEST(IsAllZeroTest, WholeBlocks) {
  std::vector<std::byte> block(64 * 1024);
  EXPECT_TRUE(IsAllZero(block));
  for (size_t at : {size_t{0}, size_t{15}, size_t{16}, block.size() / 2, block.size() - 1}) {
    block[at] = std::byte{1};
    EXPECT_FALSE(IsAllZero(block)) << at;
    block[at] = std::byte{0};
  }
  for (size_t i = 16; i < block.size(); ++i) block[i] = std::byte(i % 16 == 3 ? 7 : 0);
  EXPECT_FALSE(IsAllZero(block));
}

}  // namespace
}  // namespace thinfs
