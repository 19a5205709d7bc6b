// No stale data, through the real stack (DESIGN.md invariant 3, issue 6):
// fill the whole pool with a pattern, delete everything, collect, then a
// new device reads zeros except exactly what was written to it, with
// partial writes at every offset, and also after a power cut in the middle
// (tests/util/power_loss_stack.h: unsynced and torn writes).

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/util/engine_fixture.h"
#include "tests/util/power_loss_stack.h"

namespace thinfs {
namespace {

using testing::Pattern;
using testing::PowerLossStack;

constexpr uint64_t kBs = 4096;
constexpr uint64_t kBlocks = 256;

// Writes a nonzero pattern over every block of the pool through `n`
// devices, commits, deletes them all and collects.
void FillAndFree(Pool& pool, int n) {
  const uint64_t per = kBlocks / n;
  for (int i = 0; i < n; ++i) {
    const std::string name = "fill" + std::to_string(i);
    ASSERT_TRUE(pool.CreateDevice(name, per * kBs).ok());
    auto v = pool.OpenVolume(name);
    ASSERT_TRUE(v.ok());
    ASSERT_OK((*v)->Write(0, Pattern(per * kBs, 1000 + i)));
  }
  ASSERT_OK(pool.Commit());
  EXPECT_LE(pool.Stats().free_blocks, kBlocks % n) << "the pattern covers the pool";
  for (int i = 0; i < n; ++i) ASSERT_OK(pool.DeleteDevice("fill" + std::to_string(i)));
  ASSERT_OK(pool.RunGcForTesting());
  ASSERT_EQ(pool.Stats().free_blocks, kBlocks);
}

// Partial writes at odd offsets over a fresh device; returns the model.
std::vector<std::byte> PartialWrites(Pool& pool, const std::string& name, uint64_t size,
                                     uint32_t seed) {
  std::vector<std::byte> model(size);
  auto v = pool.OpenVolume(name);
  EXPECT_TRUE(v.ok());
  if (!v.ok()) return model;
  for (uint64_t b = 0; b + 1 < size / kBs; b += 3) {
    uint64_t off = b * kBs + 17 * (b % 7) + 1;
    uint64_t len = 100 + 211 * (b % 5);
    auto data = Pattern(len, seed + static_cast<uint32_t>(b));
    EXPECT_OK((*v)->Write(off, data));
    std::memcpy(model.data() + off, data.data(), len);
  }
  return model;
}

std::vector<std::byte> ReadAll(Pool& pool, const std::string& name) {
  auto v = pool.OpenVolume(name);
  EXPECT_TRUE(v.ok());
  if (!v.ok()) return {};
  std::vector<std::byte> buf((*v)->size());
  auto n = (*v)->Read(0, buf);
  EXPECT_TRUE(n.ok());
  return buf;
}

void ExpectSame(const std::vector<std::byte>& got, const std::vector<std::byte>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      FAIL() << "byte " << i << " (block " << i / kBs << ") reads " << int(got[i])
             << ", expected " << int(want[i]) << ": stale data";
    }
  }
}

TEST(NoStaleDataTest, ANewDeviceReadsOnlyWhatWasWritten) {
  PowerLossStack s(kBs, kBlocks, 1);
  s.Open();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  FillAndFree(*s.pool, 4);
  ASSERT_TRUE(s.pool->CreateDevice("new", kBlocks * kBs).ok());
  ExpectSame(ReadAll(*s.pool, "new"), std::vector<std::byte>(kBlocks * kBs));
  auto model = PartialWrites(*s.pool, "new", kBlocks * kBs, 7);
  ExpectSame(ReadAll(*s.pool, "new"), model);
  ASSERT_OK(s.pool->Commit());
  ExpectSame(ReadAll(*s.pool, "new"), model);
}

TEST(NoStaleDataTest, PowerCutsMidWayShowNoStaleData) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    PowerLossStack s(kBs, kBlocks, seed);
    s.Open();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    FillAndFree(*s.pool, 2);
    // Cut after the frees are committed but (seed odd) before the bitmap
    // is closed cleanly: the reopened pool rebuilds its allocation state.
    if (seed % 2 == 1) {
      s.PowerCut(/*torn=*/true);
      s.Open();
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    ASSERT_TRUE(s.pool->CreateDevice("new", kBlocks * kBs).ok());
    auto committed = PartialWrites(*s.pool, "new", kBlocks * kBs, 11);
    ASSERT_OK(s.pool->Commit());
    // More partial writes, uncommitted, then the power goes (torn writes).
    auto pending = PartialWrites(*s.pool, "new", kBlocks * kBs, 23);
    s.PowerCut(/*torn=*/true);
    s.Open();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    // Every byte is zero, the committed write, or (for a block rewritten
    // in place) the later one: never the fill pattern.
    auto got = ReadAll(*s.pool, "new");
    ASSERT_EQ(got.size(), committed.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != committed[i] && got[i] != pending[i] && got[i] != std::byte{0}) {
        FAIL() << "byte " << i << " (block " << i / kBs << ") reads " << int(got[i])
               << ": neither written nor zero";
      }
    }
    // Blocks never written read zeros exactly.
    for (uint64_t b = 0; b < kBlocks; ++b) {
      if (b % 3 == 0 && b + 1 < kBlocks) continue;
      for (uint64_t i = 0; i < kBs; ++i) {
        ASSERT_EQ(got[b * kBs + i], std::byte{0}) << "block " << b << " byte " << i;
      }
    }
  }
}

}  // namespace
}  // namespace thinfs
