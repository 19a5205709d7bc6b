// BitmapSpaceMap::Allocate cost, in ns per call, on a 16 Mi-block pool
// (a 2 MiB bitmap in a temp file under /tmp):
//   Sequential     a fresh pool, allocated front to back;
//   EveryOther     pre-filled, then every other block freed and released;
//   Random50       pre-filled, then a random half freed (seed 42);
//   Random999Full  pre-filled, then a random 0.1% freed: the search skips
//                  ~16 full words per hit, the worst realistic case.
// When the pool fills up, the blocks handed out are freed again with the
// clock paused, which restores the pattern.

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "meta/bitmap_space_map.h"

namespace thinfs::meta {
namespace {

constexpr uint64_t kBlocks = uint64_t{16} << 20;
constexpr uint64_t kBlockSize = 64 * 1024;

enum class Pattern { kSequential, kEveryOther, kRandom50, kRandom999 };

class TempBitmap {
 public:
  TempBitmap() {
    char tmpl[] = "/tmp/thinfs_allocator_bench_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    dir_ = tmpl;
    auto m = BitmapSpaceMap::Create(dir_ + "/bitmap", kBlocks, kBlockSize);
    if (!m.ok() || !(*m)->MarkDirty().ok()) {
      std::fprintf(stderr, "bench setup: %s\n", m.status().ToString().c_str());
      std::abort();
    }
    map_ = std::move(*m);
  }
  ~TempBitmap() {
    map_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TempBitmap(const TempBitmap&) = delete;
  TempBitmap& operator=(const TempBitmap&) = delete;

  BitmapSpaceMap& map() { return *map_; }

 private:
  std::string dir_;
  std::unique_ptr<BitmapSpaceMap> map_;
};

// Brings the map into `pattern` through the public protocol: fill,
// free, take, release.
void Prepare(BitmapSpaceMap& m, Pattern pattern, std::mt19937_64& rng) {
  m.ClearAllForRebuild();
  if (pattern == Pattern::kSequential) return;
  for (uint64_t i = 0; i < kBlocks; ++i) {
    if (!m.Allocate().ok()) std::abort();
  }
  for (uint64_t b = 0; b < kBlocks; ++b) {
    bool free_it = false;
    switch (pattern) {
      case Pattern::kEveryOther:
        free_it = b % 2 == 1;
        break;
      case Pattern::kRandom50:
        free_it = rng() % 2 == 0;
        break;
      case Pattern::kRandom999:
        free_it = rng() % 1000 == 0;
        break;
      case Pattern::kSequential:
        break;
    }
    if (free_it) m.Free(PoolBlock(b));
  }
  m.Release(m.TakePendingFrees());
}

void BM_Allocate(benchmark::State& state, Pattern pattern) {
  TempBitmap bitmap;
  BitmapSpaceMap& m = bitmap.map();
  std::mt19937_64 rng(42);
  Prepare(m, pattern, rng);
  // The blocks handed out since the pattern was built: freeing exactly
  // these restores it, at a cost proportional to the work measured.
  std::vector<uint64_t> handed(kBlocks);
  uint64_t n = 0;
  for (auto _ : state) {
    Result<PoolBlock> b = m.Allocate();
    if (!b.ok()) {
      state.PauseTiming();
      for (uint64_t i = 0; i < n; ++i) m.Free(PoolBlock(handed[i]));
      m.Release(m.TakePendingFrees());
      n = 0;
      state.ResumeTiming();
      b = m.Allocate();
    }
    handed[n++] = b->value;
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

BENCHMARK_CAPTURE(BM_Allocate, Sequential, Pattern::kSequential);
BENCHMARK_CAPTURE(BM_Allocate, EveryOther, Pattern::kEveryOther);
BENCHMARK_CAPTURE(BM_Allocate, Random50, Pattern::kRandom50);
BENCHMARK_CAPTURE(BM_Allocate, Random999Full, Pattern::kRandom999);

}  // namespace
}  // namespace thinfs::meta

BENCHMARK_MAIN();
