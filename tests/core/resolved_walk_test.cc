// ResolvedWalk, DiffWalks and ScanUsage against the engine's own per-block
// answers (MappedBlockForTesting, ComputeUsage) on random histories of
// writes, discards, snapshots of snapshots, resizes, range clones, deletes
// and garbage collection. Seeds: THINFS_WALK_SEEDS (default 30); a failing
// seed is printed.

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/resolved_walk.h"
#include "core/usage_scan.h"
#include "tests/util/engine_fixture.h"

namespace thinfs {
namespace {
namespace THINFS_TEST_FILE {  // unique per file in a unity build (tests/CMakeLists.txt)

using testing::EngineFixture;
using testing::Pattern;

constexpr uint64_t kBs = 4096;

// block -> data block, from the engine's point lookups.
std::map<uint64_t, uint64_t> EngineMap(Pool* pool, const DeviceInfo& d) {
  std::map<uint64_t, uint64_t> out;
  const uint64_t blocks = d.size / kBs + (d.size % kBs != 0);
  for (uint64_t b = 0; b < blocks; ++b) {
    auto m = pool->MappedBlockForTesting(d.id, b);
    EXPECT_TRUE(m.ok());
    if (m.ok() && *m) out[b] = (*m)->value;
  }
  return out;
}

std::map<uint64_t, uint64_t> WalkMap(Pool* pool, VolumeId id) {
  auto devices = pool->store()->LoadDevices();
  EXPECT_TRUE(devices.ok());
  auto walk = ResolvedWalk::Create(pool->store(), *devices, id, kBs);
  EXPECT_TRUE(walk.ok()) << walk.status().ToString();
  std::map<uint64_t, uint64_t> out;
  if (!walk.ok()) return out;
  uint64_t last = 0;
  bool first = true;
  while (true) {
    auto b = (*walk)->Next();
    EXPECT_TRUE(b.ok());
    if (!b.ok() || !*b) break;
    EXPECT_TRUE(first || (*b)->vblock > last) << "not in increasing order";
    first = false;
    last = (*b)->vblock;
    out[(*b)->vblock] = (*b)->block.value;
  }
  return out;
}

// The expected per-block diff of two maps, as ranges.
std::vector<std::string> ExpectedDiff(const std::map<uint64_t, uint64_t>& l,
                                      const std::map<uint64_t, uint64_t>& r, bool same) {
  std::map<uint64_t, DiffKind> kinds;
  for (auto& [b, p] : l) {
    auto it = r.find(b);
    kinds[b] = it == r.end() ? DiffKind::kLeftOnly
                             : (it->second == p ? DiffKind::kSame : DiffKind::kDifferent);
  }
  for (auto& [b, p] : r) {
    if (!l.count(b)) kinds[b] = DiffKind::kRightOnly;
  }
  std::vector<std::string> out;
  std::optional<DiffRange> open;
  auto emit = [&]() {
    if (open && (same || open->kind != DiffKind::kSame)) {
      out.push_back(std::string(DiffKindName(open->kind)) + " " + std::to_string(open->begin) +
                    "-" + std::to_string(open->end));
    }
  };
  for (auto& [b, k] : kinds) {
    if (open && open->kind == k && open->end == b) {
      open->end++;
      continue;
    }
    emit();
    open = DiffRange{b, b + 1, k};
  }
  emit();
  return out;
}

std::vector<std::string> ActualDiff(Pool* pool, VolumeId a, VolumeId b, bool same) {
  auto devices = pool->store()->LoadDevices();
  EXPECT_TRUE(devices.ok());
  auto wa = ResolvedWalk::Create(pool->store(), *devices, a, kBs);
  auto wb = ResolvedWalk::Create(pool->store(), *devices, b, kBs);
  EXPECT_TRUE(wa.ok() && wb.ok());
  std::vector<std::string> out;
  Status s = DiffWalks(wa->get(), wb->get(), same, [&](const DiffRange& r) {
    out.push_back(std::string(DiffKindName(r.kind)) + " " + std::to_string(r.begin) + "-" +
                  std::to_string(r.end));
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

void RunSeed(uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun: THINFS_WALK_SEED=" +
               std::to_string(seed) + " THINFS_WALK_SEEDS=1)");
  std::mt19937_64 rng(seed);
  EngineFixture f(kBs, 4096);
  Pool* pool = f.pool.get();
  std::vector<std::string> names = {"origin"};
  ASSERT_TRUE(pool->CreateDevice("origin", 48 * kBs + 1000).ok());
  int next = 0;
  auto pick = [&]() -> std::string { return names[rng() % names.size()]; };
  for (int step = 0; step < 120; ++step) {
    const int op = static_cast<int>(rng() % 100);
    const std::string dev = pick();
    auto info = pool->GetDevice(dev);
    ASSERT_TRUE(info.ok());
    const uint64_t blocks = info->size / kBs;
    if (op < 45 && blocks > 0) {
      auto v = pool->OpenVolume(dev);
      ASSERT_TRUE(v.ok());
      uint64_t b = rng() % blocks;
      uint64_t n = 1 + rng() % std::min<uint64_t>(4, blocks - b);
      ASSERT_OK((*v)->Write(b * kBs, Pattern(n * kBs, static_cast<uint32_t>(rng()))));
    } else if (op < 55 && blocks > 0) {
      auto v = pool->OpenVolume(dev);
      ASSERT_TRUE(v.ok());
      uint64_t b = rng() % blocks;
      ASSERT_OK((*v)->Discard(b * kBs, (1 + rng() % 3) * kBs));
    } else if (op < 75 && names.size() < 10) {
      std::string s = "s" + std::to_string(next++);
      ASSERT_TRUE(pool->CreateSnapshot(dev, s).ok());
      names.push_back(s);
    } else if (op < 82) {
      ASSERT_OK(pool->ResizeDevice(dev, (8 + rng() % 56) * kBs));
    } else if (op < 90 && names.size() > 1) {
      const std::string dst = pick();
      auto di = pool->GetDevice(dst);
      ASSERT_TRUE(di.ok());
      uint64_t n = std::min(info->size, di->size) / kBs;
      if (n > 2 && dst != dev) {
        uint64_t len = 1 + rng() % (n / 2);
        ASSERT_OK(pool->ShareRange(info->id, 0, di->id, (rng() % (n - len)) * kBs, len * kBs));
      }
    } else if (op < 95 && names.size() > 2) {
      ASSERT_OK(pool->DeleteDevice(dev));
      names.erase(std::find(names.begin(), names.end(), dev));
    } else {
      ASSERT_OK(pool->RunGcForTesting());
    }
    if (step % 20 != 19) continue;

    ASSERT_OK(pool->Commit());
    std::map<std::string, std::map<uint64_t, uint64_t>> maps;
    for (const DeviceInfo& d : pool->ListDevices()) {
      maps[d.name] = EngineMap(pool, d);
      ASSERT_EQ(WalkMap(pool, d.id), maps[d.name]) << "walk of " << d.name;
    }
    // Usage by definition, from the engine's point lookups: a mapped block
    // is shared when another live device (or another block) reads the same
    // data block. (Pool::ComputeUsage follows one version's readers and
    // can miss sharing through range clones; only its mapped count is
    // compared.)
    std::map<uint64_t, int> readers;
    for (auto& [name, m] : maps) {
      for (auto& [b, p] : m) readers[p]++;
    }
    std::unordered_map<uint64_t, DeviceUsage> scan, scan_by_iterators;
    ASSERT_OK(ScanUsage(pool->store(), kBs, &scan));
    // Too large for memory: the same through store iterators.
    ASSERT_OK(ScanUsage(pool->store(), kBs, &scan_by_iterators, /*max_entries_in_memory=*/0));
    for (const DeviceInfo& d : pool->ListDevices()) {
      DeviceUsage want;
      for (auto& [b, p] : maps[d.name]) {
        want.mapped_blocks++;
        (readers[p] >= 2 ? want.shared_blocks : want.exclusive_blocks)++;
      }
      const DeviceUsage& got = scan[d.id.value];
      const DeviceUsage& by_iterators = scan_by_iterators[d.id.value];
      EXPECT_EQ(by_iterators.mapped_blocks, want.mapped_blocks) << d.name;
      EXPECT_EQ(by_iterators.shared_blocks, want.shared_blocks) << d.name;
      EXPECT_EQ(got.mapped_blocks, want.mapped_blocks) << d.name;
      EXPECT_EQ(got.exclusive_blocks, want.exclusive_blocks) << d.name;
      EXPECT_EQ(got.shared_blocks, want.shared_blocks) << d.name;
      auto u = pool->ComputeUsage(d.id);
      ASSERT_TRUE(u.ok());
      EXPECT_EQ(got.mapped_blocks, u->mapped_blocks) << d.name;
    }
    for (const DeviceInfo& a : pool->ListDevices()) {
      for (const DeviceInfo& b : pool->ListDevices()) {
        for (bool same : {false, true}) {
          ASSERT_EQ(ActualDiff(pool, a.id, b.id, same), ExpectedDiff(maps[a.name], maps[b.name], same))
              << a.name << " vs " << b.name;
        }
      }
    }
  }
}

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

TEST(ResolvedWalkTest, AgreesWithTheEngineOnRandomHistories) {
  const uint64_t first = EnvOr("THINFS_WALK_SEED", 1);
  const uint64_t seeds = EnvOr("THINFS_WALK_SEEDS", 30);
  for (uint64_t seed = first; seed < first + seeds; ++seed) {
    RunSeed(seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(ResolvedWalkTest, SnapshotsOfOneOriginDiffOnlyWhereWritten) {
  EngineFixture f(kBs, 1024);
  Pool* pool = f.pool.get();
  ASSERT_TRUE(pool->CreateDevice("o", 64 * kBs).ok());
  auto v = pool->OpenVolume("o");
  ASSERT_TRUE(v.ok());
  ASSERT_OK((*v)->Write(0, Pattern(32 * kBs, 1)));
  ASSERT_TRUE(pool->CreateSnapshot("o", "s1").ok());
  ASSERT_OK((*v)->Write(4 * kBs, Pattern(2 * kBs, 2)));     // different 4-5
  ASSERT_OK((*v)->Write(40 * kBs, Pattern(kBs, 3)));        // right only 40
  ASSERT_OK((*v)->Discard(10 * kBs, kBs));                  // left only 10
  ASSERT_TRUE(pool->CreateSnapshot("o", "s2").ok());
  ASSERT_OK(pool->Commit());
  auto s1 = pool->GetDevice("s1");
  auto s2 = pool->GetDevice("s2");
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(ActualDiff(pool, s1->id, s2->id, false),
            (std::vector<std::string>{"different 4-6", "left_only 10-11", "right_only 40-41"}));
  EXPECT_EQ(ActualDiff(pool, s1->id, s2->id, true),
            (std::vector<std::string>{"same 0-4", "different 4-6", "same 6-10", "left_only 10-11",
                                      "same 11-32", "right_only 40-41"}));
  EXPECT_TRUE(ActualDiff(pool, s2->id, s2->id, false).empty());
}

TEST(ResolvedWalkTest, MissingDeviceIsNotFound) {
  EngineFixture f(kBs, 64);
  auto devices = f.pool->store()->LoadDevices();
  ASSERT_TRUE(devices.ok());
  auto w = ResolvedWalk::Create(f.pool->store(), *devices, VolumeId(99), kBs);
  EXPECT_TRUE(w.status().IsNotFound());
}

}  // namespace THINFS_TEST_FILE
}  // namespace
}  // namespace thinfs
