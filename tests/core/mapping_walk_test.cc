// MappingWalk against the engine itself: after random writes, discards,
// snapshots (of snapshots), deletes that hide origins, resizes and range
// clones, every visible device's walk must list exactly the blocks a read
// of the device finds (Pool::MappedBlockForTesting), in order.
//
// Seeds: THINFS_WALK_SEEDS (default 20) from 1; a failing seed is printed.

#include "core/mapping_walk.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "tests/util/engine_fixture.h"

namespace thinfs {
namespace {
namespace THINFS_TEST_FILE {  // unique per file in a unity build (tests/CMakeLists.txt)

using testing::EngineFixture;
using testing::Pattern;

constexpr uint64_t kBs = 4096;
constexpr uint64_t kBlocks = 24;  // per device

std::vector<ResolvedMapping> Walk(const MappingWalk& w, VolumeId id, uint64_t begin = 0,
                                  uint64_t end = UINT64_MAX) {
  std::vector<ResolvedMapping> out;
  Status s = w.ForEach(id, begin, end, [&](const ResolvedMapping& m) {
    out.push_back(m);
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

// Compares every visible device's walk with what the engine reads.
void ExpectWalkMatchesReads(EngineFixture& f, const std::string& where) {
  ASSERT_OK(f.pool->Commit());
  Result<MappingWalk> w = MappingWalk::Open(f.store.get());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<DeviceInfo> listed = f.pool->ListDevices();
  ASSERT_EQ(w->VisibleDevices().size(), listed.size()) << where;
  for (const DeviceInfo& d : listed) {
    std::vector<ResolvedMapping> walked = Walk(*w, d.id);
    std::vector<std::pair<uint64_t, uint64_t>> got, want;
    for (const ResolvedMapping& m : walked) got.emplace_back(m.vblock.value, m.block.value);
    for (uint64_t b = 0; b < f.geometry.BlocksFor(d.size); ++b) {
      Result<std::optional<PoolBlock>> m = f.pool->MappedBlockForTesting(d.id, b);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      if (*m) want.emplace_back(b, (*m)->value);
    }
    ASSERT_EQ(got, want) << where << ", device " << d.name;
    // The engine's count (st_blocks, what thinfs check verifies) is exact,
    // range clones over holes of the source included.
    EXPECT_EQ(d.mapped_blocks, walked.size()) << where << ", device " << d.name;
    // A sub-range is the matching slice of the whole walk.
    std::vector<ResolvedMapping> part = Walk(*w, d.id, 5, 11);
    std::vector<ResolvedMapping> slice;
    for (const ResolvedMapping& m : walked) {
      if (m.vblock.value >= 5 && m.vblock.value < 11) slice.push_back(m);
    }
    EXPECT_EQ(part, slice) << where << ", device " << d.name;
  }
}

TEST(MappingWalkTest, EmptyAndUnknownDevices) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kBs).ok());
  ASSERT_OK(f.pool->Commit());
  Result<MappingWalk> w = MappingWalk::Open(f.store.get());
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(Walk(*w, f.pool->GetDevice("v")->id).empty());
  Status s = w->ForEach(VolumeId(999), [](const ResolvedMapping&) { return Status::Ok(); });
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
}

TEST(MappingWalkTest, SnapshotSharesAndTombstonesHide) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("o", 8 * kBs).ok());
  auto o = *f.pool->OpenVolume("o");
  ASSERT_OK(o->Write(0, Pattern(4 * kBs, 1)));
  ASSERT_TRUE(f.pool->CreateSnapshot("o", "s").ok());
  ASSERT_OK(o->Write(kBs, Pattern(kBs, 2)));  // COW in o
  ASSERT_OK(o->Discard(2 * kBs, kBs));        // tombstone in o
  auto s = *f.pool->OpenVolume("s");
  ASSERT_OK(s->Discard(3 * kBs, kBs));  // tombstone in s
  ASSERT_OK(f.pool->Commit());
  Result<MappingWalk> w = MappingWalk::Open(f.store.get());
  ASSERT_TRUE(w.ok());
  std::vector<ResolvedMapping> wo = Walk(*w, f.pool->GetDevice("o")->id);
  std::vector<ResolvedMapping> ws = Walk(*w, f.pool->GetDevice("s")->id);
  ASSERT_EQ(wo.size(), 3u);  // 0, 1 (new), 3
  ASSERT_EQ(ws.size(), 3u);  // 0, 1 (old), 2 through the parent
  EXPECT_EQ(wo[0].block, ws[0].block);
  EXPECT_NE(wo[1].block, ws[1].block);
  EXPECT_EQ(ws[2].vblock.value, 2u);
  EXPECT_EQ(ws[2].owner, f.pool->GetDevice("o")->id);
  ExpectWalkMatchesReads(f, "fixed scenario");
}

TEST(MappingWalkTest, RandomOperationsMatchEngineReads) {
  const char* env = std::getenv("THINFS_WALK_SEEDS");  // NOLINT(concurrency-mt-unsafe)
  const uint64_t seeds = env ? std::strtoull(env, nullptr, 10) : 20;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    EngineFixture f(kBs, 1024);
    std::vector<std::string> names;
    int next = 0;
    auto pick = [&]() -> const std::string& { return names[rng() % names.size()]; };
    ASSERT_TRUE(f.pool->CreateDevice("d0", kBlocks * kBs).ok());
    names.push_back("d0");
    for (int step = 0; step < 120; ++step) {
      const std::string where = "seed " + std::to_string(seed) + " step " + std::to_string(step);
      const int op = static_cast<int>(rng() % 10);
      if (op <= 3) {
        auto v = *f.pool->OpenVolume(pick());
        const uint64_t b = rng() % (v->size() / kBs);
        const uint64_t n = 1 + rng() % std::min<uint64_t>(3, v->size() / kBs - b);
        ASSERT_OK(v->Write(b * kBs, Pattern(n * kBs, static_cast<uint32_t>(rng()))));
      } else if (op == 4) {
        auto v = *f.pool->OpenVolume(pick());
        const uint64_t b = rng() % (v->size() / kBs);
        ASSERT_OK(v->Discard(b * kBs, kBs * (1 + rng() % 2)));
      } else if (op == 5 && names.size() < 8) {
        std::string name = "s" + std::to_string(++next);
        ASSERT_TRUE(f.pool->CreateSnapshot(pick(), name).ok());
        names.push_back(name);
      } else if (op == 6 && names.size() > 1) {
        const size_t i = rng() % names.size();
        ASSERT_OK(f.pool->DeleteDevice(names[i]));
        names.erase(names.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (op == 7) {
        const std::string& name = pick();
        const uint64_t blocks = kBlocks / 2 + rng() % kBlocks;
        ASSERT_OK(f.pool->ResizeDevice(name, blocks * kBs));
      } else if (op == 8 && names.size() < 8) {
        // Whole-device clone (O(1) snapshot with parent_limit) or a range share.
        const DeviceInfo src = *f.pool->GetDevice(pick());
        std::string name = "c" + std::to_string(++next);
        Result<VolumeId> dst = f.pool->CreateDevice(name, src.size);
        ASSERT_TRUE(dst.ok());
        const uint64_t len = (rng() % 2 == 0) ? src.size : kBs * (1 + rng() % 4);
        ASSERT_OK(f.pool->ShareRange(src.id, 0, *dst, 0, len));
        names.push_back(name);
      } else if (op == 9) {
        ASSERT_OK(f.pool->RunGcForTesting());
      }
      ASSERT_NO_FATAL_FAILURE(ExpectWalkMatchesReads(f, where));
    }
  }
}

}  // namespace THINFS_TEST_FILE
}  // namespace
}  // namespace thinfs
