// engine_bench: the thin-provisioning engine measured without FUSE, on real
// pools (meta::FormatPool + meta::OpenPoolFiles + Pool::Open) in a temp
// directory. Issue 3 "Measure and report" and the engine half of issue 5:
//
//   a. Pool::CreateSnapshot time (it commits) with the origin 1 GiB vs
//      4 GiB fully mapped, the origin written in sequential and in random
//      block order (fragmented). Goal: 4G/1G <= 1.2.
//   b. Origin reads (1 MiB sequential, 4 KiB random) with 0 vs 100
//      snapshots, for a static origin and for one rewritten between
//      snapshots (1% of its blocks after each, so it carries COW versions).
//      Every origin lives in the same pool and the data set sits in the page
//      cache (written, then read once, before timing): this measures the
//      engine (block-map lookups), not the disk. Also the block-map lookups
//      alone (past the block-map cache, no data read), and how the host's
//      page cache holds each origin's blocks (folios per block, from
//      /proc/kpageflags: what a cached pread pays for besides the map).
//      Goal: ratio >= 0.95.
//   c. On-disk metadata bytes per mapped block after compaction, against
//      thin_metadata_size (thin-provisioning-tools) for 1 TiB at 64 KiB.
//      Goal: <= 32 B/block.
//   d. Volume::Read/Write throughput: 4 KiB random reads and writes (in
//      place, on a fully mapped volume) and 1 MiB sequential writes (to a
//      fresh volume: provisioning), 1 and 4 threads, at 64 KiB blocks with
//      the shift/mask path, the same pool geometry with the division path
//      forced (PoolOptions::force_generic_geometry_for_testing), and at
//      192 KiB blocks (always divides).
//
// Variants are interleaved round by round (their order rotates each round)
// and every figure is the median of the rounds with its min-max; ratios are
// medians of the per-round ratios. Pools run with commit_interval 0 and no
// background GC so that no background work lands inside a timed region;
// commits happen (untimed) between timed regions, except in (a) where the
// commit is what CreateSnapshot does.
//
// Usage: engine_bench [--quick] [--rounds N] [--dir DIR] [--json FILE]
//                     [--markdown FILE] [--only abcd] [--seq-passes N]
//                     [--rand-reads N]
// Prints a Markdown section; --json writes the raw samples. --quick uses
// small sizes and 2 rounds (CI: exits non-zero unless every cell of every
// table has a value; it never judges a timing).

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench_stats.h"
#include "core/folio_census.h"
#include "core/pool.h"
#include "core/size.h"
#include "meta/pool_dir.h"
#include "meta/rocksdb_store.h"

namespace thinfs::bench {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * 1024;
constexpr uint64_t kGiB = kMiB * 1024;

[[noreturn]] void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "engine_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(2);
}
void Must(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what, s);
}
template <typename T>
T Must(Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what, r.status());
  return std::move(r).value();
}

// CPU seconds of the calling thread (engine work on that thread, syscalls
// included) and of the whole process (all threads, RocksDB's included).
// Unlike wall time they barely move when other processes take the CPUs.
double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
double ThreadCpu() { return CpuSeconds(CLOCK_THREAD_CPUTIME_ID); }
double ProcessCpu() { return CpuSeconds(CLOCK_PROCESS_CPUTIME_ID); }

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string SizeName(uint64_t bytes) {
  char buf[32];
  if (bytes % kGiB == 0) {
    std::snprintf(buf, sizeof buf, "%llu GiB", static_cast<unsigned long long>(bytes / kGiB));
  } else if (bytes % kMiB == 0) {
    std::snprintf(buf, sizeof buf, "%llu MiB", static_cast<unsigned long long>(bytes / kMiB));
  } else {
    std::snprintf(buf, sizeof buf, "%llu KiB", static_cast<unsigned long long>(bytes / kKiB));
  }
  return buf;
}

// ---- Statistics -------------------------------------------------------------

// Per-round ratios a[i] / b[i].
std::vector<double> Ratios(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) r.push_back(a[i] / b[i]);
  return r;
}

// Every sample, by key, for the JSON output and the completeness check.
struct Results {
  std::map<std::string, std::vector<double>> samples;
  std::map<std::string, std::string> units;
  std::map<std::string, double> scalars;
  std::vector<std::string> missing;  // cells that came out empty

  std::vector<double>& Add(const std::string& key, const std::string& unit) {
    units[key] = unit;
    return samples[key];
  }
  const std::vector<double>& Get(const std::string& key) {
    auto it = samples.find(key);
    if (it == samples.end() || it->second.empty()) {
      missing.push_back(key);
      static const std::vector<double> kEmpty;
      return kEmpty;
    }
    return it->second;
  }
};

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// ---- A real pool in a temp directory ----------------------------------------

class BenchPool {
 public:
  // `open` as meta::OpenPoolFiles takes it (mapped_reads, block cache).
  BenchPool(const std::string& root, uint64_t size, uint64_t block_size, bool force_generic,
            const meta::OpenOptions& open)
      : root_(root) {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
    meta::FormatOptions fo;
    fo.size = size;
    fo.block_size = block_size;
    Must(meta::FormatPool(root_, fo), "format " + root_);
    files_ = Must(meta::OpenPoolFiles(root_, open), "open " + root_);
    PoolOptions po;
    po.commit_interval = std::chrono::milliseconds(0);
    po.background_gc = false;
    po.force_generic_geometry_for_testing = force_generic;
    pool_ = Must(Pool::Open(std::move(files_.data), std::move(files_.bitmap),
                            std::move(files_.store), po),
                 "Pool::Open " + root_);
    store_ = dynamic_cast<meta::RocksDbStore*>(pool_->store());
    if (store_ == nullptr) Die("store", Status::IOError("not a RocksDbStore"));
  }
  ~BenchPool() {
    if (pool_) {
      Status s = pool_->Close();
      if (!s.ok()) std::fprintf(stderr, "close %s: %s\n", root_.c_str(), s.ToString().c_str());
      pool_.reset();
    }
    files_ = meta::PoolFiles{};  // releases the lock
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  BenchPool(const BenchPool&) = delete;
  BenchPool& operator=(const BenchPool&) = delete;

  Pool& pool() { return *pool_; }
  meta::RocksDbStore& store() { return *store_; }
  const std::string& root() const { return root_; }

  std::shared_ptr<Volume> Create(const std::string& name, uint64_t size) {
    VolumeId id = Must(pool_->CreateDevice(name, size), "create " + name);
    return Must(pool_->OpenVolume(id), "open " + name);
  }

  // Sum of the SST files of every column family (after CompactForTesting)
  // plus the bitmap file.
  uint64_t AllMetadataBytes() {
    Must(store_->CompactForTesting(), "compact");
    uint64_t bytes = 0;
    for (const auto& e : std::filesystem::directory_iterator(root_ + "/meta")) {
      if (e.path().extension() == ".sst") bytes += e.file_size();
    }
    return bytes + std::filesystem::file_size(root_ + "/bitmap");
  }

  uint64_t MapEntries() {
    auto it = store_->NewMapIterator();
    it->Seek(VolumeId(0), VolumeBlock(0));
    uint64_t n = 0;
    for (; it->Valid(); it->Next()) ++n;
    Must(it->status(), "map iterator");
    return n;
  }

 private:
  std::string root_;
  meta::PoolFiles files_;
  std::unique_ptr<Pool> pool_;
  meta::RocksDbStore* store_ = nullptr;
};

// A buffer of non-zero bytes (zero detection would unmap zeros), varied by
// `seed` so that no two writes carry the same block.
std::vector<std::byte> Pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> b(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = rng() | 1;
    std::memcpy(b.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return b;
}

// Writes the whole volume: 1 MiB writes front to back, or one write per
// block in random block order (a fragmented mapping: neighbouring virtual
// blocks land on unrelated data blocks and keys arrive out of order).
void Fill(Volume& v, uint64_t size, uint64_t block_size, bool random_order, uint64_t seed) {
  if (!random_order) {
    std::vector<std::byte> buf = Pattern(kMiB, seed);
    for (uint64_t off = 0; off < size; off += kMiB) {
      buf[0] = static_cast<std::byte>(off >> 20 | 1);
      Must(v.Write(off, std::span(buf).first(std::min<uint64_t>(kMiB, size - off))), "fill");
    }
    return;
  }
  std::vector<uint64_t> blocks(size / block_size);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<std::byte> buf = Pattern(block_size, seed);
  for (uint64_t b : blocks) {
    buf[0] = static_cast<std::byte>(b | 1);
    Must(v.Write(b * block_size, buf), "fill random");
  }
}

// Runs `per_thread(t)` on `threads` threads released together; returns the
// wall time in seconds from release to the last join.
double RunThreads(int threads, const std::function<void(int)>& per_thread) {
  std::latch ready(threads);
  std::latch go(1);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      ready.count_down();
      go.wait();
      per_thread(t);
    });
  }
  ready.wait();
  double t0 = Now();
  go.count_down();
  for (auto& t : ts) t.join();
  return Now() - t0;
}

struct Config {
  bool quick = false;
  int rounds = 11;
  std::string dir = "/var/tmp";
  std::string json_path;
  std::string markdown_path;
  std::string only = "abcd";
  // (a)
  uint64_t snap_small = 1 * kGiB;
  uint64_t snap_large = 4 * kGiB;
  // (b)
  uint64_t read_origin = 256 * kMiB;
  int read_snapshots = 100;
  uint64_t rand_reads = 30000;
  int seq_passes = 1;
  bool recache = false;
  bool mapped_reads = false;  // every pool: meta::OpenOptions::mapped_reads
  // Every pool's RocksDB block cache (meta::OpenOptions::block_cache_bytes,
  // mount option cache_size=): smaller than the block map, lookups read
  // its blocks from the files.
  size_t block_cache_bytes = meta::OpenOptions{}.block_cache_bytes;
  // Every pool's read-around window (meta::OpenOptions::read_around_bytes,
  // mount option read_around=; lever 44).
  uint64_t read_around_bytes = meta::OpenOptions{}.read_around_bytes;

  meta::OpenOptions Open() const {
    meta::OpenOptions oo;
    oo.mapped_reads = mapped_reads;
    oo.block_cache_bytes = block_cache_bytes;
    oo.read_around_bytes = read_around_bytes;
    return oo;
  }
  // (d)
  uint64_t io_volume = 512 * kMiB;
  uint64_t io_ops = 40000;
  uint64_t seq_write = 256 * kMiB;
};

// ---- (a) snapshot creation vs origin size -----------------------------------

struct MetaRow {
  std::string name;
  uint64_t used_blocks = 0;
  uint64_t map_entries = 0;
  uint64_t map_bytes = 0;
  uint64_t all_bytes = 0;
};

void MeasureMetadata(BenchPool& bp, const std::string& name, std::vector<MetaRow>* rows) {
  Must(bp.pool().Commit(), "commit");
  MetaRow r;
  r.name = name;
  r.map_bytes = Must(bp.store().MapBytesOnDisk(true), "map bytes");
  r.all_bytes = bp.AllMetadataBytes();
  r.map_entries = bp.MapEntries();
  r.used_blocks = bp.pool().Stats().used_blocks;
  rows->push_back(r);
}

void SnapshotBench(const Config& c, Results* res, std::vector<MetaRow>* meta_rows) {
  const uint64_t bs = 64 * kKiB;
  for (bool random_order : {false, true}) {
    const std::string order = random_order ? "random" : "sequential";
    std::fprintf(stderr, "(a) filling %s and %s origins, %s order...\n",
                 SizeName(c.snap_small).c_str(), SizeName(c.snap_large).c_str(), order.c_str());
    std::vector<std::unique_ptr<BenchPool>> pools;
    std::vector<std::shared_ptr<Volume>> vols;
    for (uint64_t size : {c.snap_small, c.snap_large}) {
      pools.push_back(std::make_unique<BenchPool>(
          c.dir + "/engine_bench_snap_" + std::to_string(size >> 20) + "m", size, bs, false,
          c.Open()));
      vols.push_back(pools.back()->Create("origin", size));
      Fill(*vols.back(), size, bs, random_order, 7);
      Must(pools.back()->pool().Commit(), "commit");
    }
    for (size_t i = 0; i < pools.size(); ++i) {
      uint64_t size = i == 0 ? c.snap_small : c.snap_large;
      MeasureMetadata(*pools[i], "1 volume, " + SizeName(size) + ", " + order + " writes",
                      meta_rows);
      // One untimed snapshot first: the first commit after the fill and
      // compaction is not what is measured.
      Must(pools[i]->pool().CreateSnapshot("origin", "warm").status(), "snapshot");
    }
    auto& small = res->Add("a." + order + ".small_ms", "ms");
    auto& large = res->Add("a." + order + ".large_ms", "ms");
    auto& small_cpu = res->Add("a." + order + ".small_cpu_ms", "ms");
    auto& large_cpu = res->Add("a." + order + ".large_cpu_ms", "ms");
    // A snapshot is one commit (~ one fsync): cheap enough for 3x the rounds.
    for (int r = 0; r < 3 * c.rounds; ++r) {
      for (int k = 0; k < 2; ++k) {
        size_t i = (r + k) % 2;  // alternate which origin goes first
        double c0 = ThreadCpu();
        double t0 = Now();
        Must(pools[i]->pool().CreateSnapshot("origin", "s" + std::to_string(r)).status(),
             "snapshot");
        double ms = (Now() - t0) * 1e3;
        double cpu_ms = (ThreadCpu() - c0) * 1e3;
        (i == 0 ? small : large).push_back(ms);
        (i == 0 ? small_cpu : large_cpu).push_back(cpu_ms);
      }
    }
  }
}

// ---- page-cache folios behind a volume's blocks --------------------------

// How the host's page cache holds the pages of the data file that device
// `id`'s mapped blocks read from: the folios a read of each block touches
// (core/folio_census.h). Which folios the kernel chose depends on how the
// pages entered the cache (a 64 KiB write, a 4 KiB write, readahead), not
// on the block map. Pages not cached are counted apart and not faulted in.
struct BlockFolios {
  uint64_t blocks = 0;    // mapped blocks looked at
  uint64_t folios = 0;       // folios touched by a read of each, summed
  uint64_t folio_pages = 0;  // their sizes in 4 KiB pages, summed
  uint64_t uncached = 0;     // pages not in the page cache
  double per_block() const { return blocks == 0 ? 0 : static_cast<double>(folios) / blocks; }
  double mean_kib() const { return folios == 0 ? 0 : 4.0 * folio_pages / folios; }
};

// Nullopt (and why, on stderr) where the kernel does not tell.
std::optional<BlockFolios> CountFolios(BenchPool& bp, VolumeId id, uint64_t vblocks) {
  const uint64_t bs = bp.pool().geometry().block_size();
  const std::string data = bp.root() + "/data";
  const int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "(b) folio census: open %s: %s\n", data.c_str(), std::strerror(errno));
    return std::nullopt;
  }
  BlockFolios c;
  for (uint64_t vb = 0; vb < vblocks; ++vb) {
    std::optional<PoolBlock> pb = Must(bp.pool().MappedBlockForTesting(id, vb), "map");
    if (!pb) continue;
    Result<FolioCensus> fc = CensusFolios(fd, pb->value * bs, bs);
    if (!fc.ok()) {
      std::fprintf(stderr, "(b) folio census: %s\n", fc.status().ToString().c_str());
      ::close(fd);
      return std::nullopt;
    }
    ++c.blocks;
    c.folios += fc->folios;
    c.folio_pages += fc->folio_pages;
    c.uncached += fc->uncached;
  }
  ::close(fd);
  return c;
}

// ---- (b) origin reads with 0 vs N snapshots ---------------------------------

// Drops the pool's data file from the host's page cache (its pages are clean
// after a commit), so that the next reads cache it in pages the kernel
// chooses afresh.
void EvictData(BenchPool& bp) {
  const std::string data = bp.root() + "/data";
  const int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fdatasync(fd) != 0 || ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) {
    std::fprintf(stderr, "engine_bench: evicting %s: %s\n", data.c_str(), std::strerror(errno));
    std::exit(1);
  }
  ::close(fd);
}

// The origins of (b), in the order they are created and reported.
constexpr const char* kReadOrigins[] = {"static0", "staticN",  "churn0",
                                        "churnN",  "control0", "shuffled0"};

void ReadsBench(const Config& c, Results* res, std::vector<MetaRow>* meta_rows) {
  const uint64_t bs = 64 * kKiB;
  const uint64_t o = c.read_origin;
  const uint64_t blocks = o / bs;
  const uint64_t churn = std::max<uint64_t>(1, blocks / 100);
  // Six origins + the COW copies of the churned one, with slack.
  const uint64_t pool_size = 6 * o + 2 * churn * bs * c.read_snapshots + 64 * bs;
  BenchPool bp(c.dir + "/engine_bench_reads", pool_size, bs, false, c.Open());
  // static0/staticN: never rewritten; churn0/churnN: 1% of blocks rewritten
  // (4 KiB at the block start, same blocks in both) after every snapshot of
  // churnN, so churnN's blocks carry up to N+1 versions. control0 is an A/A
  // control: a second origin without snapshots, created after the others,
  // so that static0 vs control0 shows what device id and data placement
  // alone do. shuffled0, a layout control: no snapshots either, each block
  // written whole but in random block order, so that its blocks lie
  // scattered over the data file as a churned origin's COW'd ones do, each
  // in one folio: static0 vs shuffled0 is what that scatter alone costs.
  const std::vector<std::string> names(std::begin(kReadOrigins), std::end(kReadOrigins));
  std::map<std::string, std::shared_ptr<Volume>> vols;
  // A volume never written, created first so that its keys would sort
  // before every origin's: looked up in random block order, every lookup
  // misses in the middle of the map, as reads of a sparse volume's holes
  // do. (The snapshots' own keys sort after every origin's.)
  const VolumeId holes_id = bp.Create("holes0", o)->id();
  std::fprintf(stderr, "(b) filling %zu origins of %s, %d snapshots...\n", names.size(),
               SizeName(o).c_str(), c.read_snapshots);
  for (size_t i = 0; i < names.size(); ++i) {
    vols[names[i]] = bp.Create(names[i], o);
    Fill(*vols[names[i]], o, bs, /*random_order=*/names[i] == "shuffled0", 100 + i);
  }
  Must(bp.pool().Commit(), "commit");
  std::mt19937_64 rng(11);
  std::vector<std::byte> small = Pattern(4 * kKiB, 5);
  for (int s = 0; s < c.read_snapshots; ++s) {
    for (const char* origin : {"staticN", "churnN"}) {
      Must(bp.pool().CreateSnapshot(origin, std::string(origin) + "-snap" + std::to_string(s))
               .status(),
           "snapshot");
    }
    for (uint64_t k = 0; k < churn; ++k) {
      uint64_t b = rng() % blocks;
      small[0] = static_cast<std::byte>(s | 1);
      Must(vols["churn0"]->Write(b * bs, small), "churn");
      Must(vols["churnN"]->Write(b * bs, small), "churn");
    }
  }
  Must(bp.pool().Commit(), "commit");
  // A settled store: without this, the compactions the churn set off run
  // under the timed loops, and uncached lookups vary 0.7-1.2x between
  // rounds for reasons other than the map's contents.
  Must(bp.store().CompactForTesting(), "compact");

  std::vector<std::byte> big(kMiB);
  auto seq_pass = [&](Volume& v) {
    for (uint64_t off = 0; off < o; off += kMiB) {
      size_t n = Must(v.Read(off, big), "read");
      if (n == 0) Die("read", Status::IOError("short read"));
    }
  };
  // Warm every origin (and the block map) before timing.
  for (const auto& n : names) seq_pass(*vols[n]);
  // How the host caches each origin's data (see CountFolios).
  for (const auto& n : names) {
    if (std::optional<BlockFolios> fc = CountFolios(bp, vols[n]->id(), blocks)) {
      res->scalars["b." + n + ".folios_per_block"] = fc->per_block();
      res->scalars["b." + n + ".folio_kib"] = fc->mean_kib();
      res->scalars["b." + n + ".uncached_pages"] = static_cast<double>(fc->uncached);
    }
  }

  std::vector<uint64_t> offsets(c.rand_reads);
  for (auto& off : offsets) off = (rng() % (o / (4 * kKiB))) * 4 * kKiB;
  std::vector<std::byte> buf4k(4 * kKiB);
  // The block map alone: every block of device `id` resolved through the
  // overlay and the store, past the block-map cache, no data read. What a
  // read pays on a cache miss. Four passes: one pass of a 256 MiB origin
  // takes under 10 ms. Recorded as b.<key>.resolve_*.
  // With `order`, the blocks in that order, and unmapped ones expected.
  auto time_resolves = [&](const std::string& key, VolumeId id,
                           const std::vector<uint64_t>* order = nullptr) {
    constexpr int kResolvePasses = 4;
    double c0 = ThreadCpu();
    double t0 = Now();
    for (int p = 0; p < kResolvePasses; ++p) {
      for (uint64_t i = 0; i < blocks; ++i) {
        const uint64_t b = order != nullptr ? (*order)[i] : i;
        if (!Must(bp.pool().MappedBlockForTesting(id, b), "resolve") && order == nullptr) {
          Die("resolve", Status::IOError("unmapped block"));
        }
      }
    }
    double secs = Now() - t0;
    double cpu = ThreadCpu() - c0;
    const auto lookups = static_cast<double>(blocks * kResolvePasses);
    res->Add("b." + key + ".resolve_per_s", "lookups/s").push_back(lookups / secs);
    res->Add("b." + key + ".resolve_cpu", "lookups/CPU-s").push_back(lookups / cpu);
  };
  // A snapshot never written: each lookup misses the snapshot's own
  // versions, then finds its origin's (DESIGN.md, "Read D, block b"). The
  // miss is what the block map's prefix Bloom filter answers without
  // reading a data block (docs/benchmarks.md, lever 43).
  const VolumeId snapshot_id = Must(bp.pool().GetDevice("staticN-snap0"), "snapshot").id;
  std::vector<uint64_t> shuffled(blocks);
  for (uint64_t b = 0; b < blocks; ++b) shuffled[b] = b;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (int r = 0; r < c.rounds; ++r) {
    if (c.recache) {
      EvictData(bp);
      for (size_t k = 0; k < names.size(); ++k) seq_pass(*vols[names[(r + k) % names.size()]]);
    }
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string& n = names[(r + k) % names.size()];
      Volume& v = *vols[n];
      double c0 = ThreadCpu();
      double t0 = Now();
      for (int p = 0; p < c.seq_passes; ++p) seq_pass(v);
      double secs = Now() - t0;
      double cpu = ThreadCpu() - c0;
      const double mib = static_cast<double>(o * c.seq_passes) / kMiB;
      res->Add("b." + n + ".seqread_mibs", "MiB/s").push_back(mib / secs);
      res->Add("b." + n + ".seqread_cpu", "MiB/CPU-s").push_back(mib / cpu);
      c0 = ThreadCpu();
      t0 = Now();
      for (uint64_t off : offsets) {
        if (Must(v.Read(off, buf4k), "read") != buf4k.size()) {
          Die("read", Status::IOError("short read"));
        }
      }
      secs = Now() - t0;
      cpu = ThreadCpu() - c0;
      res->Add("b." + n + ".randread_iops", "IOPS")
          .push_back(static_cast<double>(offsets.size()) / secs);
      res->Add("b." + n + ".randread_cpu", "reads/CPU-s")
          .push_back(static_cast<double>(offsets.size()) / cpu);
      // The part invariant 1 is about.
      time_resolves(n, v.id());
    }
    time_resolves("snapshot", snapshot_id);
    time_resolves("holes", holes_id, &shuffled);
  }
  MeasureMetadata(bp,
                  "5 volumes of " + SizeName(o) + ", 2 of them with " +
                      std::to_string(c.read_snapshots) + " snapshots, one rewritten 1%/snapshot",
                  meta_rows);
}

// ---- (d) engine throughput, shift/mask vs division ---------------------------

struct GeoVariant {
  std::string key;
  std::string label;
  uint64_t block_size;
  bool force_generic;
};

void ThroughputBench(const Config& c, Results* res) {
  const std::vector<GeoVariant> variants = {
      {"64k_fast", "64 KiB shift/mask", 64 * kKiB, false},
      {"64k_generic", "64 KiB division (forced)", 64 * kKiB, true},
      {"192k", "192 KiB (division)", 192 * kKiB, false},
  };
  std::vector<std::unique_ptr<BenchPool>> pools;
  std::vector<std::shared_ptr<Volume>> vols;
  for (const auto& g : variants) {
    // Room for the volume, a sequential-write volume and slack, whole blocks.
    uint64_t size = (c.io_volume + c.seq_write) / g.block_size * g.block_size + 64 * g.block_size;
    std::fprintf(stderr, "(d) filling %s volume, %s...\n", SizeName(c.io_volume).c_str(),
                 g.label.c_str());
    pools.push_back(
        std::make_unique<BenchPool>(c.dir + "/engine_bench_io_" + g.key, size, g.block_size,
                                    g.force_generic, c.Open()));
    vols.push_back(pools.back()->Create("v", c.io_volume));
    Fill(*vols.back(), c.io_volume, g.block_size, false, 3);
    Must(pools.back()->pool().Commit(), "commit");
    std::vector<std::byte> buf(kMiB);  // warm
    for (uint64_t off = 0; off < c.io_volume; off += kMiB) {
      Must(vols.back()->Read(off, buf).status(), "warm");
    }
  }
  const uint64_t pages = c.io_volume / (4 * kKiB);
  int seq_id = 0;
  for (int r = 0; r < c.rounds; ++r) {
    for (int threads : {1, 4}) {
      for (size_t k = 0; k < variants.size(); ++k) {
        size_t i = (r + k) % variants.size();
        const GeoVariant& g = variants[i];
        BenchPool& bp = *pools[i];
        Volume& v = *vols[i];
        const std::string sfx = "." + g.key + ".t" + std::to_string(threads);
        // Offsets are drawn before the clock starts.
        std::vector<std::vector<uint64_t>> offs(threads);
        std::mt19937_64 rng(1000 + r);
        for (auto& o : offs) {
          o.resize(c.io_ops / threads);
          for (auto& x : o) x = (rng() % pages) * 4 * kKiB;
        }
        const double ops = static_cast<double>(offs[0].size() * threads);
        double c0 = ProcessCpu();
        double secs = RunThreads(threads, [&](int t) {
          std::vector<std::byte> b(4 * kKiB);
          for (uint64_t off : offs[t]) Must(v.Read(off, b).status(), "randread");
        });
        res->Add("d.randread" + sfx, "IOPS").push_back(ops / secs);
        res->Add("d.randread_cpu" + sfx, "ops/CPU-s").push_back(ops / (ProcessCpu() - c0));
        c0 = ProcessCpu();
        secs = RunThreads(threads, [&](int t) {
          std::vector<std::byte> b = Pattern(4 * kKiB, 50 + t);
          for (uint64_t off : offs[t]) Must(v.Write(off, b), "randwrite");
        });
        res->Add("d.randwrite" + sfx, "IOPS").push_back(ops / secs);
        res->Add("d.randwrite_cpu" + sfx, "ops/CPU-s").push_back(ops / (ProcessCpu() - c0));
        Must(bp.pool().Commit(), "commit");

        // Sequential 1 MiB writes into a fresh volume (provisioning); each
        // thread writes its own contiguous part.
        std::string name = "w" + std::to_string(seq_id++);
        std::shared_ptr<Volume> w = bp.Create(name, c.seq_write);
        const uint64_t part = c.seq_write / threads;
        c0 = ProcessCpu();
        secs = RunThreads(threads, [&](int t) {
          std::vector<std::byte> b = Pattern(kMiB, 70 + t);
          for (uint64_t off = t * part; off < (t + 1) * part; off += kMiB) {
            b[0] = static_cast<std::byte>(off >> 20 | 1);
            Must(w->Write(off, std::span(b).first(std::min<uint64_t>(kMiB, (t + 1) * part - off))),
                 "seqwrite");
          }
        });
        const double mib = static_cast<double>(part * threads) / kMiB;
        res->Add("d.seqwrite" + sfx, "MiB/s").push_back(mib / secs);
        res->Add("d.seqwrite_cpu" + sfx, "MiB/CPU-s").push_back(mib / (ProcessCpu() - c0));
        w.reset();
        Must(bp.pool().DeleteDevice(name), "delete");
        Must(bp.pool().RunGcForTesting(), "gc");
      }
    }
  }
}

// ---- thin_metadata_size --------------------------------------------------------

// Bytes thin_metadata_size estimates, or -1 when it is not installed.
double ThinMetadataSize(const std::string& args) {
  std::string cmd = "thin_metadata_size " + args + " -u b -n 2>/dev/null";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return -1;
  char buf[128] = {0};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  int rc = ::pclose(f);
  if (rc != 0 || n == 0) return -1;
  return std::strtod(buf, nullptr);
}

// ---- Report -------------------------------------------------------------------

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string Verdict(const std::vector<double>& ratios, double goal, bool at_most) {
  if (ratios.empty()) return "n/a";
  double m = Median(ratios);
  return (at_most ? m <= goal : m >= goal) ? "met" : "**not met**";
}

void Report(const Config& c, const std::string& cmdline, Results* res,
            const std::vector<MetaRow>& meta_rows, std::ostream& out) {
  out << "## Engine benchmark (no FUSE)\n\n";
  out << "```\n" << cmdline << "\n```\n\n";
  out << c.rounds << " rounds, variants interleaved (order rotated every round); "
      << "each cell is the median (min–max) of the rounds, ratios are medians of "
      << "the per-round ratios (min–max). Real pools (FormatPool + OpenPoolFiles + Pool::Open) "
      << "in `" << c.dir << "`, commit_interval 0, no background GC"
      << (c.mapped_reads ? ", mapped_reads on (reads of cached data copied out of a mapping "
                           "of the data file)"
                         : "")
      << ", RocksDB block cache " << SizeName(c.block_cache_bytes) << ", read-around "
      << (c.read_around_bytes == 0 ? std::string("off") : SizeName(c.read_around_bytes))
      << ".\n\n";

  if (c.only.find('a') != std::string::npos) {
    out << "### (a) Snapshot creation vs origin size (64 KiB blocks)\n\n"
        << "Time of `Pool::CreateSnapshot` (including its commit: fdatasync of the data file, "
           "msync of the bitmap, a synced RocksDB batch), origin fully mapped and committed "
           "before. Goal: " << SizeName(c.snap_large) << "/" << SizeName(c.snap_small)
        << " ≤ 1.2.\n\n"
        << " Wall time is mostly the commit's syncs; *CPU* is the calling thread's CPU "
           "time (the engine's own work), which other load on the machine barely moves. "
        << 3 * c.rounds << " snapshots of each origin, alternating.\n\n"
        << "| origin written in | time | " << SizeName(c.snap_small) << " (ms) | "
        << SizeName(c.snap_large) << " (ms) | ratio large/small | goal ≤ 1.2 |\n"
        << "|---|---|---:|---:|---:|---|\n";
    for (const char* order : {"sequential", "random"}) {
      for (const char* kind : {"_ms", "_cpu_ms"}) {
        const auto& s = res->Get(std::string("a.") + order + ".small" + kind);
        const auto& l = res->Get(std::string("a.") + order + ".large" + kind);
        auto r = Ratios(l, s);
        out << "| " << order << " block order | "
            << (std::string(kind) == "_ms" ? "wall" : "CPU") << " | " << Cell(s, 3) << " | "
            << Cell(l, 3) << " | " << Cell(r, 2) << " | " << Verdict(r, 1.2, true) << " |\n";
      }
    }
    out << "\n";
  }

  if (c.only.find('b') != std::string::npos) {
    out << "### (b) Origin reads with 0 vs " << c.read_snapshots << " snapshots\n\n"
        << "Six " << SizeName(c.read_origin) << " origins in one pool (64 KiB blocks), "
        << "single thread, `Volume::Read` straight on the engine. *static*: snapshots taken "
           "with no writes between them; *churned*: after every snapshot 1% of the origin's "
           "blocks get a 4 KiB rewrite (COW: the origin then holds several versions of those "
           "blocks); its 0-snapshot twin gets the same rewrites in place; two controls "
           "without snapshots, one written like *static* (A/A), one in random block order "
           "(layout: what scattered blocks cost by themselves). The data set fits "
           "in RAM and is read once before timing, so this measures the engine (block-map "
           "lookups + pread from the page cache), not the disk. Sequential: "
        << c.seq_passes << " passes of 1 MiB reads; random: " << c.rand_reads
        << " 4 KiB reads at fixed random offsets; block-map lookup: every block of the "
           "origin resolved past the block-map cache (overlay + RocksDB), no data read, "
           "what a read pays on a cache miss. Goal: ratio ≥ 0.95.\n\n"
        << "| origin | workload | 0 snapshots | " << c.read_snapshots
        << " snapshots (control: 0) | ratio | goal ≥ 0.95 |\n|---|---|---:|---:|---:|---|\n";
    // Each row group: its label, the origin measured against, the origin
    // measured, and whether the goal applies (the controls are not judged).
    struct Group {
      const char* label;
      const char* base;
      const char* other;
      const char* unjudged;  // what a control's row says instead, or null
    };
    const Group groups[] = {
        {"static", "static0", "staticN", nullptr},
        {"churned", "churn0", "churnN", nullptr},
        {"A/A control: static vs a 2nd origin, both without snapshots", "static0", "control0",
         "(noise floor)"},
        {"layout control: static vs an origin without snapshots written in random block "
         "order (its blocks scattered over the data file, one folio each)",
         "static0", "shuffled0", "(what scatter alone costs)"},
    };
    for (const Group& g : groups) {
      for (const char* wl : {"seqread_mibs", "seqread_cpu", "randread_iops", "randread_cpu",
                             "resolve_per_s", "resolve_cpu"}) {
        const auto& z = res->Get(std::string("b.") + g.base + "." + wl);
        const auto& n = res->Get(std::string("b.") + g.other + "." + wl);
        auto r = Ratios(n, z);
        const std::string w = wl;
        const char* label = w == "seqread_mibs"    ? "1 MiB seq read (MiB/s)"
                            : w == "seqread_cpu"   ? "1 MiB seq read (MiB per CPU-s)"
                            : w == "randread_iops" ? "4 KiB random read (IOPS)"
                            : w == "randread_cpu"  ? "4 KiB random read (reads per CPU-s)"
                            : w == "resolve_per_s" ? "block-map lookup, uncached (lookups/s)"
                                                   : "block-map lookup, uncached (per CPU-s)";
        out << "| " << g.label << " | " << label << " | " << Cell(z, 0) << " | " << Cell(n, 0)
            << " | " << Cell(r, 3) << " | "
            << (g.unjudged != nullptr ? g.unjudged : Verdict(r, 0.95, false)) << " |\n";
      }
    }
    {
      const auto& per_s = res->Get("b.snapshot.resolve_per_s");
      const auto& per_cpu = res->Get("b.snapshot.resolve_cpu");
      out << "\nBlock-map lookups past the cache of a snapshot never written (staticN-snap0: "
             "each misses the snapshot's own versions, then finds staticN's): "
          << Cell(per_s, 0) << " lookups/s, " << Cell(per_cpu, 0) << " per CPU-s.\n";
      out << "\nThe same for a volume never written (holes0), in random block order: "
          << Cell(res->Get("b.holes.resolve_per_s"), 0) << " lookups/s, "
          << Cell(res->Get("b.holes.resolve_cpu"), 0) << " per CPU-s.\n";
    }
    // One sentence per census scalar: "<what>: static0 1.00, ..., shuffled0 1.00."
    auto per_origin = [&](const char* what, const std::string& key, const char* format) {
      out << what;
      for (size_t i = 0; i < std::size(kReadOrigins); ++i) {
        const std::string n = kReadOrigins[i];
        auto it = res->scalars.find("b." + n + "." + key);
        char cell[32] = "n/a";
        if (it != res->scalars.end()) std::snprintf(cell, sizeof cell, format, it->second);
        out << " " << n << " " << cell << (i + 1 == std::size(kReadOrigins) ? ".\n" : ",");
      }
    };
    per_origin("\nHost page-cache folios a read of one block copies, per origin, after the warm "
               "pass (`/proc/kpageflags`; 1.00 = every 64 KiB block in one folio; a cached read "
               "pays per folio):",
               "folios_per_block", "%.2f");
    per_origin("\nMean size of those folios, per origin (KiB; 64 = one folio per block, larger "
               "folios hold several of the data file's blocks, and a read of a run of them "
               "copies fewer folios per byte):",
               "folio_kib", "%.0f");
    out << "\n";
  }

  if (!meta_rows.empty()) {
    double tms = ThinMetadataSize("-b 64k -s 1t -m 1");
    double tms100 = ThinMetadataSize("-b 64k -s 1t -m 101");
    const double tb_blocks = static_cast<double>(uint64_t{1} << 40) / (64 * kKiB);
    res->scalars["c.thin_metadata_size_1t_64k_m1_bytes"] = tms;
    res->scalars["c.thin_metadata_size_1t_64k_m101_bytes"] = tms100;
    out << "### (c) On-disk metadata per mapped block, after compaction\n\n"
        << "*map*: `RocksDbStore::MapBytesOnDisk(true)` (SST files of the block-map column "
           "family after a full compaction); *all*: SST files of every column family after "
           "a full compaction plus the bitmap file. Per block = bytes / data blocks in use. "
           "Reference: `thin_metadata_size -b 64k -s 1t -m 1 -u b -n` = "
        << (tms < 0 ? std::string("n/a (not installed)")
                    : Fmt("%.0f", tms) + " B = " + Fmt("%.2f", tms / tb_blocks) + " B/block")
        << (tms100 < 0 ? std::string("")
                       : "; with `-m 101`: " + Fmt("%.2f", tms100 / tb_blocks) + " B/block")
        << ". Goal ≤ 32 B/block.\n\n"
        << "| pool | blocks in use | map entries | map bytes | map B/block | map B/entry | "
           "all B/block | goal ≤ 32 |\n|---|---:|---:|---:|---:|---:|---:|---|\n";
    for (const MetaRow& m : meta_rows) {
      double per = static_cast<double>(m.map_bytes) / static_cast<double>(m.used_blocks);
      double all = static_cast<double>(m.all_bytes) / static_cast<double>(m.used_blocks);
      res->scalars["c." + m.name + ".map_bytes_per_block"] = per;
      res->scalars["c." + m.name + ".all_bytes_per_block"] = all;
      res->scalars["c." + m.name + ".map_entries"] = static_cast<double>(m.map_entries);
      res->scalars["c." + m.name + ".used_blocks"] = static_cast<double>(m.used_blocks);
      if (m.used_blocks == 0 || m.map_bytes == 0) res->missing.push_back("c." + m.name);
      out << "| " << m.name << " | " << m.used_blocks << " | " << m.map_entries << " | "
          << m.map_bytes << " | " << Fmt("%.2f", per) << " | "
          << Fmt("%.2f", static_cast<double>(m.map_bytes) / static_cast<double>(m.map_entries))
          << " | " << Fmt("%.2f", all) << " | " << (all <= 32 ? "met" : "**not met**")
          << " |\n";
    }
    out << "\n";
  }

  if (c.only.find('d') != std::string::npos) {
    out << "### (d) Engine throughput without FUSE: shift/mask vs division\n\n"
        << "`Volume::Read`/`Write` from 1 or 4 threads on one volume. 4 KiB random: "
        << c.io_ops << " ops over a fully mapped " << SizeName(c.io_volume)
        << " volume (writes overwrite in place; data in the page cache, no commit inside the "
           "timed region). 1 MiB sequential write: "
        << SizeName(c.seq_write)
        << " into a fresh volume (provisioning + block-map inserts, not synced; each thread "
           "its own contiguous part). *per CPU-s* divides by the process's CPU time instead of "
           "wall time (robust to other load; includes RocksDB's threads). *fast/div* is the 64 KiB shift/mask pool over the same "
           "geometry with the division path forced; 192 KiB always divides.\n\n"
        << "| workload | threads | 64 KiB shift/mask | 64 KiB division (forced) | fast/div | "
           "192 KiB | 192K/64K fast |\n|---|---:|---:|---:|---:|---:|---:|\n";
    for (const char* wl : {"randread", "randread_cpu", "randwrite", "randwrite_cpu", "seqwrite",
                           "seqwrite_cpu"}) {
      for (int t : {1, 4}) {
        std::string sfx = ".t" + std::to_string(t);
        const auto& f = res->Get(std::string("d.") + wl + ".64k_fast" + sfx);
        const auto& g = res->Get(std::string("d.") + wl + ".64k_generic" + sfx);
        const auto& h = res->Get(std::string("d.") + wl + ".192k" + sfx);
        const std::string w = wl;
        const bool cpu = w.find("_cpu") != std::string::npos;
        const bool seq = w.rfind("seqwrite", 0) == 0;
        std::string unit = seq ? (cpu ? "MiB per CPU-s" : "MiB/s") : (cpu ? "ops per CPU-s" : "IOPS");
        std::string label = seq                           ? "1 MiB seq write"
                            : w.rfind("randread", 0) == 0 ? "4 KiB rand read"
                                                          : "4 KiB rand write";
        out << "| " << label << " (" << unit << ") | " << t << " | " << Cell(f, 0) << " | "
            << Cell(g, 0) << " | " << Cell(Ratios(f, g), 3) << " | " << Cell(h, 0) << " | "
            << Cell(Ratios(h, f), 3) << " |\n";
      }
    }
    out << "\n";
  }
}

void WriteJson(const Config& c, const std::string& cmdline, const Results& res,
               const std::string& path) {
  std::ofstream f(path);
  f << "{\n  \"command\": \"" << JsonEscape(cmdline) << "\",\n  \"rounds\": " << c.rounds
    << ",\n  \"quick\": " << (c.quick ? "true" : "false") << ",\n  \"samples\": {";
  bool first = true;
  for (const auto& [k, v] : res.samples) {
    f << (first ? "\n" : ",\n") << "    \"" << JsonEscape(k) << "\": {\"unit\": \""
      << res.units.at(k) << "\", \"median\": " << Median(v) << ", \"min\": " << Min(v)
      << ", \"max\": " << Max(v) << ", \"values\": [";
    for (size_t i = 0; i < v.size(); ++i) f << (i ? ", " : "") << v[i];
    f << "]}";
    first = false;
  }
  f << "\n  },\n  \"scalars\": {";
  first = true;
  for (const auto& [k, v] : res.scalars) {
    f << (first ? "\n" : ",\n") << "    \"" << JsonEscape(k) << "\": " << v;
    first = false;
  }
  f << "\n  }\n}\n";
}

int Main(int argc, char** argv) {
  Config c;
  std::string cmdline;
  for (int i = 0; i < argc; ++i) cmdline += (i ? " " : "") + std::string(argv[i]);
  bool rounds_set = false;
  bool rand_reads_set = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "engine_bench: %s needs a value\n", a.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    // The option's SIZE value into *out; false (said why) if it is no size.
    auto size_value = [&](auto* out) {
      Result<uint64_t> bytes = ParseSize(next());
      if (!bytes.ok()) {
        std::fprintf(stderr, "engine_bench: %s: %s\n", a.c_str(), bytes.status().ToString().c_str());
        return false;
      }
      *out = *bytes;
      return true;
    };
    if (a == "--quick") {
      c.quick = true;
    } else if (a == "--rounds") {
      c.rounds = std::atoi(next().c_str());
      rounds_set = true;
    } else if (a == "--dir") {
      c.dir = next();
    } else if (a == "--json") {
      c.json_path = next();
    } else if (a == "--markdown") {
      c.markdown_path = next();
    } else if (a == "--only") {
      c.only = next();
    } else if (a == "--recache") {
      c.recache = true;
    } else if (a == "--mapped-reads") {
      c.mapped_reads = true;
    } else if (a == "--block-cache") {
      if (!size_value(&c.block_cache_bytes)) return 1;
    } else if (a == "--read-around") {
      if (!size_value(&c.read_around_bytes)) return 1;
    } else if (a == "--seq-passes") {
      c.seq_passes = std::atoi(next().c_str());
    } else if (a == "--rand-reads") {
      c.rand_reads = std::strtoull(next().c_str(), nullptr, 10);
      rand_reads_set = true;
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: engine_bench [--quick] [--rounds N] [--dir DIR] [--json FILE]\n"
          "                    [--markdown FILE] [--only abcd] [--seq-passes N]\n"
          "                    [--rand-reads N] [--recache] [--mapped-reads]\n"
          "                    [--block-cache SIZE] [--read-around SIZE]\n"
          "  --seq-passes N  (b): 1 MiB sequential passes over each origin per round\n"
          "                  (default 1)\n"
          "  --rand-reads N  (b): 4 KiB random reads of each origin per round\n"
          "                  (default 30000, --quick 2000)\n"
          "  --recache       (b): before every round drop the pool's data file from\n"
          "                  the page cache and read every origin back in, so that\n"
          "                  each round caches it in pages the kernel picks afresh\n"
          "                  (by default the pages the writes filled are kept)\n"
          "  --mapped-reads  open every pool with mapped_reads (reads of cached data\n"
          "                  copied out of a mapping of the data file, lever 35)\n"
          "  --block-cache SIZE  every pool's RocksDB block cache (default 64M, as\n"
          "                  the mount's cache_size=); smaller than the block map,\n"
          "                  uncached lookups read its blocks from the files\n"
          "  --read-around SIZE  every pool's read-around window (default 64K, as\n"
          "                  the mount's read_around=; 0 off, lever 44)\n");
      return 0;
    } else {
      std::fprintf(stderr, "engine_bench: unknown argument '%s'\n", a.c_str());
      return 1;
    }
  }
  if (c.seq_passes < 1 || c.rand_reads < 1) {
    std::fprintf(stderr, "engine_bench: --seq-passes and --rand-reads must be at least 1\n");
    return 1;
  }
  if (c.quick) {
    if (!rounds_set) c.rounds = 2;
    c.snap_small = 16 * kMiB;
    c.snap_large = 64 * kMiB;
    c.read_origin = 16 * kMiB;
    c.read_snapshots = 10;
    if (!rand_reads_set) c.rand_reads = 2000;
    c.io_volume = 16 * kMiB;
    c.io_ops = 4000;
    c.seq_write = 8 * kMiB;
  }
  if (c.rounds < 1) {
    std::fprintf(stderr, "engine_bench: --rounds must be >= 1\n");
    return 1;
  }

  Results res;
  std::vector<MetaRow> meta_rows;
  if (c.only.find('a') != std::string::npos || c.only.find('c') != std::string::npos) {
    SnapshotBench(c, &res, &meta_rows);
  }
  if (c.only.find('b') != std::string::npos || c.only.find('c') != std::string::npos) {
    ReadsBench(c, &res, &meta_rows);
  }
  if (c.only.find('d') != std::string::npos) ThroughputBench(c, &res);

  std::ostringstream md;
  Report(c, cmdline, &res, meta_rows, md);
  std::fputs(md.str().c_str(), stdout);
  if (!c.markdown_path.empty()) std::ofstream(c.markdown_path) << md.str();
  if (!c.json_path.empty()) WriteJson(c, cmdline, res, c.json_path);
  if (!res.missing.empty()) {
    for (const auto& m : res.missing) std::fprintf(stderr, "engine_bench: no value for %s\n", m.c_str());
    return 3;
  }
  return 0;
}

}  // namespace
}  // namespace thinfs::bench

int main(int argc, char** argv) { return thinfs::bench::Main(argc, argv); }
