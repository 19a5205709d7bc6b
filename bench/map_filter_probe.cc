// map_filter_probe: what the block map's two Bloom filters buy a lookup
// (docs/benchmarks.md, lever 43), on the case they exist for. Lever 43
// measured them on a compacted store held whole by the block cache, where
// the SST filter cost 15% of an uncached lookup and saved nothing. This
// probe builds a store as a pool that has been written for a while looks:
//
//   - an origin of N blocks written in random order, then compacted (its
//     old data, in the bottom level);
//   - K snapshots of it, each then written on 1% of its blocks, and the
//     origin rewritten on 1% of its blocks after each snapshot, in four
//     phases: each of the first three ends in a flush, so that three
//     level-0 files overlap the whole map ("between compactions": RocksDB
//     compacts level 0 at four files); the fourth stays in the memtable,
//     written again after every open.
//
// and a second store ("compacted") with the same records, fully compacted,
// the fourth phase again in the memtable. Each store is kept as a template
// and copied (table files hard-linked) before each open, so that every
// open starts from the same files. Each is opened three ways: as the
// daemon opens it (both filters), without the SST prefix filter, and
// without the memtable's. Lookups, each a MetadataStore::FindVersion as
// the engine makes them past its block-map cache, in random block order:
//
//   origin   the origin's newest version (a hit, in the bottom level or
//            newer);
//   snapshot a snapshot's own version (99% misses: the read then asks the
//            origin, DESIGN.md "Read D, block b");
//   empty    a device that has no records, whose keys sort between the
//            snapshots' (every lookup misses, as a sparse volume's holes).
//
// Both stores are also built three times more, their bottom level written
// with ZSTD (the store's choice before lever 63), with no compression, and
// in 4 KiB blocks instead of 16 KiB, and opened as the daemon opens them:
// what a lookup that misses the block cache pays to read and decompress a
// block, against the map's size on disk (docs/benchmarks.md, lever 63).
//
// Variants are interleaved round by round (their order rotates) and each
// figure is the median lookups/s of the rounds with min-max, with
// Student's t at 95% for each variant against the daemon's.
//
//   map_filter_probe --dir DIR [--blocks N] [--snapshots K] [--rounds R]
//                    [--lookups L] [--block-cache SIZE] [--quick]
//   map_filter_probe --compact-store META_DIR [--bottom NAME] [--block-size BYTES]
//
// The second form compacts an unmounted pool's metadata store (POOL/meta)
// fully, its block map's bottom level written with NAME ("LZ4", "ZSTD",
// "Snappy", "NoCompression"; default the store's own choice) and its
// table files in blocks of BYTES (default 16 KiB): how a
// long-lived pool's map looks after RocksDB's compactions, for the same
// comparison through FUSE (bench/map_compression_read.sh).
//
// Prints a Markdown table; exits non-zero if a step fails or a cell is
// empty, never on a timing. The probe works in DIR/map_filter_probe.tmp
// (made, and replaced if it exists) and removes it at the end.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_stats.h"
#include "core/metadata.h"
#include "core/size.h"
#include "meta/rocksdb_store.h"

namespace thinfs::bench {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "map_filter_probe: %s\n", what.c_str());
  std::exit(1);
}
void Must(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}
template <typename T>
T Must(Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what + ": " + r.status().ToString());
  return std::move(r).value();
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Config {
  std::string dir;
  uint64_t blocks = uint64_t{4} << 20;  // 256 GiB of 64 KiB blocks
  int snapshots = 8;
  int rounds = 6;
  uint64_t lookups = 200000;
  uint64_t block_cache = uint64_t{16} << 20;
};

constexpr uint64_t kOrigin = 1;
// The snapshots are devices 2, 4, ..., 2K; device 3 is the empty one, so
// that its keys sort between two snapshots' and inside every table file.
uint64_t SnapshotId(int k) { return 2 + 2 * static_cast<uint64_t>(k); }
constexpr uint64_t kEmpty = 3;

// The records a phase adds: for each of its snapshots, 1% of the blocks of
// the snapshot (epoch 0) and 1% of the origin's at a new epoch.
std::vector<MapEntry> PhaseRecords(const Config& c, int phase, int phases) {
  std::mt19937_64 rng(1000 + phase);
  std::vector<MapEntry> out;
  const uint64_t per = std::max<uint64_t>(1, c.blocks / 100);
  for (int k = phase; k < c.snapshots; k += phases) {
    for (uint64_t i = 0; i < per; ++i) {
      out.push_back(MapEntry{VolumeId(SnapshotId(k)), VolumeBlock(rng() % c.blocks), 0,
                             MapValue{PoolBlock(rng() % (c.blocks * 2)), 0}});
      out.push_back(MapEntry{VolumeId(kOrigin), VolumeBlock(rng() % c.blocks),
                             static_cast<Epoch>(k + 1),
                             MapValue{PoolBlock(rng() % (c.blocks * 2)), 0}});
    }
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

void CommitAll(meta::RocksDbStore& store, const std::vector<MapEntry>& records) {
  constexpr size_t kPerCommit = 16384;  // a busy second's worth of new mappings
  for (size_t i = 0; i < records.size(); i += kPerCommit) {
    MetaBatch b;
    b.put_mappings.assign(
        records.begin() + static_cast<std::ptrdiff_t>(i),
        records.begin() + static_cast<std::ptrdiff_t>(std::min(records.size(), i + kPerCommit)));
    Must(store.Commit(b, /*sync=*/false), "commit");
  }
}

constexpr int kPhases = 4;

// Builds a template store in `dir`: the origin compacted, then phases 0-2
// (each flushed, or all compacted with `compact_all`). Phase 3 is what
// each open writes into its memtable.
void BuildTemplate(const Config& c, const std::string& dir, bool compact_all,
                   const std::string& bottom, size_t block_size) {
  Superblock sb;
  sb.data_blocks = c.blocks * 2;
  meta::RocksDbOptions o;
  o.block_cache_bytes = c.block_cache;
  o.map_bottom_compression_for_testing = bottom;
  o.map_block_size_for_testing = block_size;
  auto store = Must(meta::RocksDbStore::Create(dir, sb, o), "create " + dir);
  std::vector<MapEntry> origin(c.blocks);
  std::mt19937_64 rng(7);
  for (uint64_t b = 0; b < c.blocks; ++b) {
    origin[b] = MapEntry{VolumeId(kOrigin), VolumeBlock(b), 0, MapValue{PoolBlock(b), 0}};
  }
  std::shuffle(origin.begin(), origin.end(), rng);
  CommitAll(*store, origin);
  Must(store->CompactForTesting(), "compact");
  for (int p = 0; p < kPhases - 1; ++p) {
    CommitAll(*store, PhaseRecords(c, p, kPhases));
    Must(store->FlushMapForTesting(), "flush");
  }
  if (compact_all) Must(store->CompactForTesting(), "compact");
  MetaBatch sync;
  sync.superblock = sb;
  Must(store->Commit(sync, /*sync=*/true), "sync");
}

// A copy of `from` in `to` to open: table files hard-linked, the rest
// copied (an open writes into them).
void CopyStore(const std::string& from, const std::string& to) {
  fs::remove_all(to);
  fs::create_directories(to);
  for (const fs::directory_entry& e : fs::directory_iterator(from)) {
    const fs::path dst = fs::path(to) / e.path().filename();
    if (e.path().extension() == ".sst") {
      fs::create_hard_link(e.path(), dst);
    } else if (e.is_regular_file()) {
      fs::copy_file(e.path(), dst);
    }
  }
}

std::string Shape(const std::vector<int>& files) {
  std::string s;
  for (size_t l = 0; l < files.size(); ++l) {
    if (files[l] == 0) continue;
    char level[48];
    std::snprintf(level, sizeof level, "%sL%zu %d", s.empty() ? "" : ", ", l, files[l]);
    s += level;
  }
  return s.empty() ? "none" : s;
}

// A store layout: the records' shape (level-0 files over a compacted
// origin, or all compacted) and the bottommost level's compression.
struct Layout {
  std::string key;
  bool compact_all;
  std::string bottom;     // empty: the store's own choice
  size_t block_size = 0;  // 0: the store's own (16 KiB)
};
struct Variant {
  std::string key;
  std::string label;
  bool sst_filter;
  bool memtable_filter;
};
const std::vector<Variant> kVariants = {
    {"both", "both filters (the daemon's)", true, true},
    {"no_sst", "no SST prefix filter", false, true},
    {"no_memtable", "no memtable filter", true, false},
};
const std::vector<std::string> kKinds = {"origin", "snapshot", "empty"};

using Samples = std::map<std::string, std::vector<double>>;  // layout.variant.kind

struct LayoutFacts {
  std::string shape;
  std::string bottom;
  uint64_t map_bytes = 0;
};

void MeasureOnce(const Config& c, const Layout& layout, const Variant& v, Samples* out,
                 std::map<std::string, LayoutFacts>* facts) {
  const std::string work = c.dir + "/work";
  CopyStore(c.dir + "/template_" + layout.key, work);
  meta::RocksDbOptions o;
  o.block_cache_bytes = c.block_cache;
  o.no_map_filter_for_testing = !v.sst_filter;
  o.no_map_memtable_filter_for_testing = !v.memtable_filter;
  o.map_bottom_compression_for_testing = layout.bottom;
  o.map_block_size_for_testing = layout.block_size;
  {
    auto store = Must(meta::RocksDbStore::Open(work, o), "open");
    LayoutFacts& f = (*facts)[layout.key];
    f.map_bytes = Must(store->MapBytesOnDisk(/*compact=*/false), "map bytes");
    f.bottom =
        layout.bottom.empty() ? store->bottommost_compression() + " (the store's)" : layout.bottom;
    f.bottom += layout.block_size == 0 ? ", 16 KiB blocks" : ", 4 KiB blocks";
    CommitAll(*store, PhaseRecords(c, kPhases - 1, kPhases));
    f.shape = Shape(store->MapFilesPerLevelForTesting()) + ", and a memtable";
    std::mt19937_64 rng(42);
    for (const std::string& kind : kKinds) {
      auto device = [&](uint64_t i) -> VolumeId {
        if (kind == "origin") return VolumeId(kOrigin);
        if (kind == "empty") return VolumeId(kEmpty);
        return VolumeId(SnapshotId(static_cast<int>(i % static_cast<uint64_t>(c.snapshots))));
      };
      std::vector<uint64_t> blocks(c.lookups);
      for (uint64_t& b : blocks) b = rng() % c.blocks;
      uint64_t found = 0;
      auto pass = [&](uint64_t n) {
        for (uint64_t i = 0; i < n; ++i) {
          auto r = Must(store->FindVersion(device(i), VolumeBlock(blocks[i]), UINT32_MAX), "find");
          found += r.has_value() ? 1 : 0;
        }
      };
      pass(c.lookups / 2);  // warm the block cache
      found = 0;
      const double t0 = Now();
      pass(c.lookups);
      const double secs = Now() - t0;
      if (kind == "origin" && found != c.lookups) Die("an origin lookup missed");
      if (kind == "empty" && found != 0) Die("the empty device has a record");
      (*out)[layout.key + "." + v.key + "." + kind].push_back(static_cast<double>(c.lookups) /
                                                              secs);
    }
  }
  fs::remove_all(work);
}

// A cell of the tables: every one must have its samples.
std::string FullCell(const std::vector<double>& v) {
  if (v.empty()) Die("an empty cell");
  return Cell(v, 0);
}

uint64_t ParseCount(const std::string& s) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v == 0) Die("not a positive number: " + s);
  return v;
}

int Main(int argc, char** argv) {
  Config c;
  std::string compact_store;
  std::string bottom;
  size_t block_size = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--dir") {
      c.dir = next();
    } else if (a == "--blocks") {
      c.blocks = ParseCount(next());
    } else if (a == "--snapshots") {
      c.snapshots = static_cast<int>(ParseCount(next()));
    } else if (a == "--rounds") {
      c.rounds = static_cast<int>(ParseCount(next()));
    } else if (a == "--lookups") {
      c.lookups = ParseCount(next());
    } else if (a == "--block-cache") {
      Result<uint64_t> size = ParseSize(next());
      if (!size.ok() || *size == 0) Die("--block-cache: " + size.status().ToString());
      c.block_cache = *size;
    } else if (a == "--compact-store") {
      compact_store = next();
    } else if (a == "--bottom") {
      bottom = next();
      if (bottom != "LZ4" && bottom != "ZSTD" && bottom != "Snappy" && bottom != "NoCompression") {
        Die("--bottom: LZ4, ZSTD, Snappy or NoCompression");
      }
    } else if (a == "--block-size") {
      block_size = ParseCount(next());
    } else if (a == "--quick") {
      c.blocks = 20000;
      c.snapshots = 4;
      c.rounds = 2;
      c.lookups = 5000;
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: map_filter_probe --dir DIR [--blocks N] [--snapshots K] [--rounds R]\n"
          "                        [--lookups L] [--block-cache SIZE] [--quick]\n"
          "       map_filter_probe --compact-store META_DIR [--bottom NAME]\n"
          "                        [--block-size BYTES]\n"
          "The block map's prefix Bloom filters (SST and memtable) against none, on a\n"
          "store with level-0 files over a compacted origin and on a compacted one\n"
          "(docs/benchmarks.md, lever 43). Defaults: 4194304 blocks, 8 snapshots,\n"
          "6 rounds, 200000 lookups, a 16M block cache. --compact-store compacts an\n"
          "unmounted pool's POOL/meta fully, the block map's bottom level in NAME (LZ4,\n"
          "ZSTD, Snappy, NoCompression; default the store's choice), in blocks of BYTES\n"
          "(default 16384).\n");
      return 0;
    } else {
      Die("unknown argument " + a + " (see --help)");
    }
  }
  if (!compact_store.empty()) {
    meta::RocksDbOptions o;
    o.map_bottom_compression_for_testing = bottom;
    o.map_block_size_for_testing = block_size;
    auto store = Must(meta::RocksDbStore::Open(compact_store, o), "open " + compact_store);
    Must(store->CompactForTesting(), "compact");
    const std::vector<int> files = store->MapFilesPerLevelForTesting();
    std::printf("%s: the block map in %s, %llu bytes, bottom level %s, %zu-byte blocks\n",
                compact_store.c_str(), Shape(files).c_str(),
                static_cast<unsigned long long>(Must(store->MapBytesOnDisk(false), "map bytes")),
                bottom.empty() ? store->bottommost_compression().c_str() : bottom.c_str(),
                block_size == 0 ? size_t{16384} : block_size);
    return 0;
  }
  if (c.dir.empty()) Die("--dir is required");
  c.dir += "/map_filter_probe.tmp";  // never the binary's own path
  fs::remove_all(c.dir);
  fs::create_directories(c.dir);
  // The filters on the store's own compression; the bottom level's
  // compression with both filters.
  const std::vector<Layout> layouts = {{"l0", false, ""},
                                       {"compacted", true, ""},
                                       {"l0_zstd", false, "ZSTD"},
                                       {"compacted_zstd", true, "ZSTD"},
                                       {"l0_none", false, "NoCompression"},
                                       {"compacted_none", true, "NoCompression"},
                                       {"l0_4k", false, "", 4096},
                                       {"compacted_4k", true, "", 4096}};
  std::vector<std::pair<const Layout*, const Variant*>> units;
  for (const Layout& l : layouts) {
    for (const Variant& v : kVariants) {
      const bool own = l.bottom.empty() && l.block_size == 0;
      if (own || v.key == "both") units.emplace_back(&l, &v);
    }
  }
  for (const Layout& l : layouts) {
    std::fprintf(stderr, "building the %s store: %llu blocks, %d snapshots...\n", l.key.c_str(),
                 static_cast<unsigned long long>(c.blocks), c.snapshots);
    BuildTemplate(c, c.dir + "/template_" + l.key, l.compact_all, l.bottom, l.block_size);
  }
  Samples samples;
  std::map<std::string, LayoutFacts> facts;
  for (int r = 0; r < c.rounds; ++r) {
    for (size_t k = 0; k < units.size(); ++k) {
      const auto& [l, v] = units[(k + static_cast<size_t>(r)) % units.size()];
      MeasureOnce(c, *l, *v, &samples, &facts);
    }
    std::fprintf(stderr, "round %d of %d done\n", r + 1, c.rounds);
  }
  std::printf(
      "Block-map lookups/s (FindVersion past the block-map cache), median (min–max) of "
      "%d rounds; %llu blocks, %d snapshots, %llu lookups, block cache %llu MiB.\n\n",
      c.rounds, static_cast<unsigned long long>(c.blocks), c.snapshots,
      static_cast<unsigned long long>(c.lookups),
      static_cast<unsigned long long>(c.block_cache >> 20));
  std::printf(
      "The filters:\n\n| store | lookup | %s | %s | %s | no SST filter vs both | no "
      "memtable filter vs both |\n|---|---|---:|---:|---:|---|---|\n",
      kVariants[0].label.c_str(), kVariants[1].label.c_str(), kVariants[2].label.c_str());
  for (const std::string layout : {"l0", "compacted"}) {
    for (const std::string& kind : kKinds) {
      const std::string base = layout + ".";
      const auto& both = samples[base + "both." + kind];
      const auto& no_sst = samples[base + "no_sst." + kind];
      const auto& no_mem = samples[base + "no_memtable." + kind];
      std::printf("| %s (%s) | %s | %s | %s | %s | %s | %s |\n", layout.c_str(),
                  facts[layout].shape.c_str(), kind.c_str(), FullCell(both).c_str(),
                  FullCell(no_sst).c_str(), FullCell(no_mem).c_str(),
                  Ministat(both, no_sst).c_str(), Ministat(both, no_mem).c_str());
    }
  }
  std::printf(
      "\nThe bottom level's compression and block size, both filters:\n\n| store | bottom level | "
      "map "
      "bytes on disk (per origin block) | origin | snapshot | empty | origin vs the "
      "store's |\n|---|---|---:|---:|---:|---:|---|\n");
  for (const std::string shape : {"l0", "compacted"}) {
    for (const std::string sfx : {"", "_zstd", "_none", "_4k"}) {
      const std::string key = shape + sfx;
      const LayoutFacts& f = facts[key];
      std::printf(
          "| %s | %s | %llu (%.1f B) | %s | %s | %s | %s |\n", shape.c_str(), f.bottom.c_str(),
          static_cast<unsigned long long>(f.map_bytes),
          static_cast<double>(f.map_bytes) / static_cast<double>(c.blocks),
          FullCell(samples[key + ".both.origin"]).c_str(),
          FullCell(samples[key + ".both.snapshot"]).c_str(),
          FullCell(samples[key + ".both.empty"]).c_str(),
          sfx[0] == 0
              ? ""
              : Ministat(samples[shape + ".both.origin"], samples[key + ".both.origin"]).c_str());
    }
  }
  fs::remove_all(c.dir);
  return 0;
}

}  // namespace
}  // namespace thinfs::bench

int main(int argc, char** argv) { return thinfs::bench::Main(argc, argv); }
