// recovery_bench: how long a mount waits for crash recovery (issue 6).
//
// Builds a pool on disk whose block map holds N mapped blocks (one device,
// vblock i -> pool block i; written straight into the metadata store and
// compacted into SST files, like a long-lived pool: no data is written),
// then leaves the bitmap dirty, as a killed daemon does. It then times what
// `thinfs mount` runs before it serves: OpenPoolFiles (RocksDB open, the
// superblock, the bitmap) and Pool::Open, whose recovery rebuilds the
// bitmap from the whole block map. The same open of the cleanly closed
// pool is timed for comparison. Wall and CPU time are both printed (on a
// loaded machine the wall time mostly measures the other processes). Prints one Markdown table; checks that the
// recovered pool has exactly N blocks in use (exit 1 otherwise), never a
// time.
//
//   recovery_bench [--blocks N] [--dir DIR] [--quick]
//     --blocks  mapped blocks (default 1000000; --quick: 20000)
//     --dir     where the pool is made (default /var/tmp), removed after

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/pool.h"
#include "meta/pool_dir.h"

namespace {

using namespace thinfs;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kBlockSize = 4096;

// CPU seconds of the whole process (RocksDB's threads included): on a
// shared machine the wall time mostly measures the other processes.
double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

struct Timing {
  double wall = 0, cpu = 0;
};

[[noreturn]] void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "recovery_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(2);
}

// Maps vblock i -> block i of device 1 for i < n, in batches.
void Populate(const std::string& root, uint64_t n) {
  Result<meta::PoolFiles> f = meta::OpenPoolFiles(root, meta::OpenOptions());
  if (!f.ok()) Die("open", f.status());
  Superblock sb = f->superblock;
  sb.next_device_id = 2;
  DeviceRecord d;
  d.id = VolumeId(1);
  d.name = "vol";
  d.size = n * kBlockSize;
  d.mode = 0100644;
  d.mapped_blocks = n;
  MetaBatch first;
  first.superblock = sb;
  first.put_devices.push_back(d);
  Status s = f->store->Commit(first, true);
  if (!s.ok()) Die("commit device", s);
  constexpr uint64_t kBatch = 50000;
  for (uint64_t start = 0; start < n; start += kBatch) {
    MetaBatch b;
    for (uint64_t i = start; i < n && i < start + kBatch; ++i) {
      b.put_mappings.push_back(MapEntry{VolumeId(1), VolumeBlock(i), 0, MapValue{PoolBlock(i), 0}});
    }
    s = f->store->Commit(b, false);
    if (!s.ok()) Die("commit mappings", s);
  }
  s = f->store->CompactForTesting();
  if (!s.ok()) Die("compact", s);
  // The bitmap as a cleanly closed pool would leave it.
  s = f->bitmap->MarkDirty();
  if (s.ok()) {
    for (uint64_t i = 0; i < n; ++i) f->bitmap->MarkUsed(PoolBlock(i));
    s = f->bitmap->MarkClean(sb.transaction_id);
  }
  if (!s.ok()) Die("bitmap", s);
}

// Opens the pool as the mount does and closes it cleanly; returns the
// time the open took and the blocks in use after it.
Timing TimedOpen(const std::string& root, uint64_t* used) {
  const auto t0 = Clock::now();
  const double c0 = CpuSeconds();
  Result<meta::PoolFiles> f = meta::OpenPoolFiles(root, meta::OpenOptions());
  if (!f.ok()) Die("open", f.status());
  PoolOptions o;
  o.commit_interval = std::chrono::milliseconds(0);
  o.background_gc = false;
  Result<std::unique_ptr<Pool>> pool =
      Pool::Open(std::move(f->data), std::move(f->bitmap), std::move(f->store), o);
  if (!pool.ok()) Die("Pool::Open", pool.status());
  const Timing t{std::chrono::duration<double>(Clock::now() - t0).count(), CpuSeconds() - c0};
  *used = (*pool)->Stats().used_blocks;
  Status s = (*pool)->Close();
  if (!s.ok()) Die("close", s);
  return t;
}

// Leaves the bitmap as a killed daemon does: marked dirty, never clean.
void Crash(const std::string& root) {
  Result<meta::PoolFiles> f = meta::OpenPoolFiles(root, meta::OpenOptions());
  if (!f.ok()) Die("open", f.status());
  Status s = f->bitmap->MarkDirty();
  if (!s.ok()) Die("mark dirty", s);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t blocks = 1000000;
  std::string dir = "/var/tmp";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--blocks" && i + 1 < argc) {
      blocks = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--quick") {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: recovery_bench [--blocks N] [--dir DIR] [--quick]\n");
      return 1;
    }
  }
  if (quick) blocks = 20000;
  const std::string root = dir + "/recovery_bench." + std::to_string(::getpid());
  meta::FormatOptions fo;
  fo.size = (blocks + blocks / 8 + 64) * kBlockSize;
  fo.block_size = kBlockSize;
  Status s = meta::FormatPool(root, fo);
  if (!s.ok()) Die("format", s);

  const auto t0 = Clock::now();
  Populate(root, blocks);
  const double build = std::chrono::duration<double>(Clock::now() - t0).count();

  uint64_t used_clean = 0, used_recovered = 0;
  const Timing clean = TimedOpen(root, &used_clean);
  Crash(root);
  const Timing recovered = TimedOpen(root, &used_recovered);
  std::filesystem::remove_all(root);

  std::printf("| mapped blocks | build (s) | open, clean: wall / CPU (s) | open + recovery: "
              "wall / CPU (s) |\n");
  std::printf("|---:|---:|---:|---:|\n");
  std::printf("| %llu | %.2f | %.3f / %.3f | %.3f / %.3f |\n",
              static_cast<unsigned long long>(blocks), build, clean.wall, clean.cpu,
              recovered.wall, recovered.cpu);
  if (used_clean != blocks || used_recovered != blocks) {
    std::fprintf(stderr, "recovery_bench: %llu / %llu blocks in use, expected %llu\n",
                 static_cast<unsigned long long>(used_clean),
                 static_cast<unsigned long long>(used_recovered),
                 static_cast<unsigned long long>(blocks));
    return 1;
  }
  return 0;
}
