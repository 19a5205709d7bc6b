// pool_builder: fills a formatted, unmounted pool through the engine (no
// FUSE, so thousands of snapshots take seconds), for the replication and
// list benchmarks (bench/replication_bench.py).
//
//   pool_builder snapshots POOL N
//       origin: 1024 blocks, all written; then N snapshots s0..s(N-1) of
//       it, with one block of the origin rewritten after each.
//   pool_builder changed POOL SIZE MAPPED_PERCENT CHANGED_PERCENT SEED
//       vol of SIZE bytes with MAPPED_PERCENT of its blocks written (runs
//       of 16 blocks at random places), snapshot s1, then CHANGED_PERCENT
//       of its blocks rewritten (random blocks anywhere), snapshot s2.
//       Prints the number of changed blocks.
//
// Data is pseudo-random (never all zeros, which zero detection would not
// store).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/pool.h"
#include "meta/pool_dir.h"

namespace {

[[noreturn]] void Die(const std::string& what, const thinfs::Status& s) {
  std::fprintf(stderr, "pool_builder: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

void Fill(std::vector<std::byte>* buf, std::mt19937_64* rng) {
  for (size_t i = 0; i + 8 <= buf->size(); i += 8) {
    uint64_t v = (*rng)() | 1;
    std::memcpy(buf->data() + i, &v, 8);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: pool_builder snapshots POOL N\n"
                 "       pool_builder changed POOL SIZE MAPPED_PERCENT CHANGED_PERCENT SEED\n");
    return 2;
  }
  const std::string mode = argv[1];
  auto files = thinfs::meta::OpenPoolFiles(argv[2], {});
  if (!files.ok()) Die("open", files.status());
  const uint64_t bs = files->superblock.block_size;
  thinfs::PoolOptions o;
  o.commit_interval = std::chrono::milliseconds(0);
  auto opened = thinfs::Pool::Open(std::move(files->data), std::move(files->bitmap),
                                   std::move(files->store), o);
  if (!opened.ok()) Die("open", opened.status());
  thinfs::Pool& pool = **opened;
  std::vector<std::byte> block(bs);
  std::mt19937_64 rng(1);

  if (mode == "snapshots" && argc == 4) {
    const uint64_t n = std::strtoull(argv[3], nullptr, 10);
    const uint64_t blocks = 1024;
    if (auto id = pool.CreateDevice("origin", blocks * bs); !id.ok()) Die("create", id.status());
    auto vol = pool.OpenVolume("origin");
    if (!vol.ok()) Die("open origin", vol.status());
    for (uint64_t b = 0; b < blocks; ++b) {
      Fill(&block, &rng);
      if (auto s = (*vol)->Write(b * bs, block); !s.ok()) Die("write", s);
    }
    for (uint64_t i = 0; i < n; ++i) {
      if (auto id = pool.CreateSnapshot("origin", "s" + std::to_string(i)); !id.ok()) {
        Die("snapshot", id.status());
      }
      Fill(&block, &rng);
      if (auto s = (*vol)->Write((rng() % blocks) * bs, block); !s.ok()) Die("write", s);
    }
  } else if (mode == "changed" && argc == 7) {
    const uint64_t size = std::strtoull(argv[3], nullptr, 10);
    const uint64_t mapped_pct = std::strtoull(argv[4], nullptr, 10);
    const uint64_t changed_pct = std::strtoull(argv[5], nullptr, 10);
    rng.seed(std::strtoull(argv[6], nullptr, 10));
    const uint64_t blocks = size / bs;
    if (auto id = pool.CreateDevice("vol", size); !id.ok()) Die("create", id.status());
    auto vol = pool.OpenVolume("vol");
    if (!vol.ok()) Die("open vol", vol.status());
    std::vector<std::byte> run(16 * bs);
    std::unordered_set<uint64_t> written;
    while (written.size() * 100 < blocks * mapped_pct) {
      uint64_t first = (rng() % (blocks / 16)) * 16;
      Fill(&run, &rng);
      if (auto s = (*vol)->Write(first * bs, run); !s.ok()) Die("write", s);
      for (uint64_t b = first; b < first + 16; ++b) written.insert(b);
    }
    if (auto id = pool.CreateSnapshot("vol", "s1"); !id.ok()) Die("snapshot", id.status());
    std::unordered_set<uint64_t> changed;
    while (changed.size() * 100 < blocks * changed_pct) {
      uint64_t b = rng() % blocks;
      if (!changed.insert(b).second) continue;
      Fill(&block, &rng);
      if (auto s = (*vol)->Write(b * bs, block); !s.ok()) Die("write", s);
    }
    if (auto id = pool.CreateSnapshot("vol", "s2"); !id.ok()) Die("snapshot", id.status());
    std::printf("%zu\n", changed.size());
  } else {
    std::fprintf(stderr, "pool_builder: bad arguments (run without any for the usage)\n");
    return 2;
  }
  if (auto s = pool.Close(); !s.ok()) Die("close", s);
  return 0;
}
