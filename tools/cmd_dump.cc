// Interchange with thin-provisioning-tools: dump, restore, metadata-size.
//
// dump reads an offline pool directly (under the pool lock) and a mounted
// one through a checkpoint the daemon writes (tools/daemon_checkpoint.h):
// either way a consistent point-in-time view of the committed metadata.
// The work is in meta/pool_dump.h and meta/pool_restore.h; docs/interop.md
// maps thinfs's notions onto thin_dump's XML.

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/size.h"
#include "meta/pool_dir.h"
#include "meta/pool_dump.h"
#include "meta/pool_restore.h"
#include "meta/rocksdb_store.h"
#include "tools/cli.h"
#include "tools/daemon_checkpoint.h"
#include "tools/pool_here.h"
#include "tools/progress.h"

namespace thinfs::tools {

namespace {

// Closes a FILE* opened by fopen (not stdout) and removes the file unless
// kept.
struct OutputFile {
  std::FILE* f = nullptr;
  std::string path;
  bool keep = false;
  ~OutputFile() {
    if (f == nullptr || f == stdout) return;
    std::fclose(f);
    if (!keep) ::unlink(path.c_str());
  }
  Status Open(const std::string& p) {
    path = p;
    f = std::fopen(p.c_str(), "w");
    return f != nullptr ? Status::Ok() : Status::FromErrno(errno, "create " + p);
  }
  Status Close() {
    if (f == nullptr || f == stdout) return Status::Ok();
    const int rc = std::fclose(f);
    f = nullptr;
    if (rc != 0) {
      ::unlink(path.c_str());
      return Status::FromErrno(errno, "close " + path);
    }
    keep = true;
    return Status::Ok();
  }
};

}  // namespace

int RunDump(const std::vector<std::string>& args) {
  CommandLine cl("dump", "POOL [--format xml|json] [-o FILE] [--table FILE]",
                 "Writes a pool's metadata: every visible device with the data blocks it\n"
                 "reads (through snapshots' parents, minus discarded blocks), one flat map\n"
                 "per device as dm-thin keeps them. The XML is thin_dump's format\n"
                 "(thin-provisioning-tools), so thin_restore can build dm-thin metadata from\n"
                 "it; blocks shared between devices appear in each device's map with the\n"
                 "same data block and time=\"0\" (copied on write). thin_dump has numeric\n"
                 "ids only: device names and sizes are in the JSON form and in the side\n"
                 "table written by --table (what 'thinfs restore --table' reads).\n\n"
                 "Works unmounted (opening the pool read-only) and mounted (the daemon\n"
                 "writes a consistent checkpoint of the committed metadata, which is dumped\n"
                 "and removed): a point-in-time view either way.");
  cl.Positional("POOL", "pool directory");
  cl.AddOptions()
      ("format,f", po::value<std::string>()->value_name("FORMAT")->default_value("xml"),
       "xml (thin_dump's) or json (with names, sizes, epochs, parents)")
      ("output,o", po::value<std::string>()->value_name("FILE"),
       "write to FILE instead of standard output")
      ("table", po::value<std::string>()->value_name("FILE"),
       "also write the device table (dev_id, size, name; tab-separated) to FILE");
  cl.SetEpilog(
      "Progress goes to stderr, only when it is a terminal.\n\n"
      "Examples:\n"
      "  thinfs dump /srv/pool -o pool.xml --table pool.devices\n"
      "  thinfs dump /srv/pool --format json | jq '.devices[].name'\n"
      "  thinfs dump /srv/pool -o pool.xml && thin_restore -i pool.xml -o /dev/vg0/tmeta\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  meta::DumpOptions options;
  const std::string& format = cl.Get<std::string>("format");
  if (format == "xml") {
    options.format = meta::DumpFormat::kXml;
  } else if (format == "json") {
    options.format = meta::DumpFormat::kJson;
  } else {
    return cl.Fail(kExitUsage, "--format must be xml or json, not '" + format + "'");
  }
  const meta::PoolPaths paths = meta::PoolPaths::For(cl.Arg(0));
  struct stat st;
  if (::stat(paths.root.c_str(), &st) != 0) {
    return cl.Fail(kExitFailure, "pool " + paths.root + " does not exist");
  }
  if (!S_ISDIR(st.st_mode) || !meta::LooksLikePool(paths.root)) {
    return cl.Fail(kExitFailure, paths.root + " is not a thinfs pool (no meta/ or bitmap)");
  }

  // Offline under the lock, or mounted through a checkpoint.
  Result<meta::PoolLock> lock = meta::PoolLock::Acquire(paths.lock);
  std::unique_ptr<DaemonCheckpoint> checkpoint;
  std::string store_dir = paths.meta;
  if (!lock.ok()) {
    if (lock.status().code() != Status::Code::kBusy) return cl.Fail(kExitFailure, lock.status().message());
    bool answered = false;
    Result<std::unique_ptr<DaemonCheckpoint>> cp = DaemonCheckpoint::Take(paths, ".dump-", &answered);
    if (!answered) return cl.Fail(kExitFailure, lock.status().message());
    if (!cp.ok()) return cl.Fail(kExitFailure, "checkpoint of the mounted pool: " + cp.status().message());
    checkpoint = std::move(*cp);
    store_dir = checkpoint->dir();
  }
  Result<std::unique_ptr<meta::RocksDbStore>> store = OpenStoreHere(store_dir, /*read_only=*/true);
  if (!store.ok()) {
    return cl.Fail(kExitFailure, "metadata store " + paths.meta + ": " + store.status().message());
  }
  if (Result<Superblock> sb = (*store)->ReadSuperblock(); !sb.ok()) {
    return cl.Fail(kExitFailure, "superblock: " + sb.status().message());
  } else if (Status v = meta::ValidateSuperblock(*sb); !v.ok()) {
    return cl.Fail(kExitFailure, "superblock: " + v.message());
  }

  OutputFile out;
  out.f = stdout;
  std::string what = "standard output";
  if (cl.Has("output")) {
    if (Status s = out.Open(cl.Get<std::string>("output")); !s.ok()) return cl.Fail(kExitFailure, s.message());
    what = out.path;
  }
  OutputFile table;
  if (cl.Has("table")) {
    if (Status s = table.Open(cl.Get<std::string>("table")); !s.ok()) return cl.Fail(kExitFailure, s.message());
    options.table = table.f;
  }
  ProgressLine progress("dump: ");
  options.progress = [&progress](const char* phase, uint64_t done, uint64_t total) {
    progress.Show(phase, done, total);
  };
  Result<meta::DumpStats> stats = meta::DumpPool(store->get(), out.f, what, options);
  if (!stats.ok()) return cl.Fail(kExitFailure, stats.status().message());
  if (Status s = out.Close(); !s.ok()) return cl.Fail(kExitFailure, s.message());
  if (Status s = table.Close(); !s.ok()) return cl.Fail(kExitFailure, s.message());
  return kExitOk;
}

int RunRestore(const std::vector<std::string>& args) {
  CommandLine cl("restore", "POOL --from FILE --data PATH [--table FILE]",
                 "Creates the pool POOL from thin_dump XML (written by 'thinfs dump' or by\n"
                 "thin_dump of a dm-thin pool's metadata) over an existing data area laid\n"
                 "out the dm-thin way: data block n at byte n * block size of PATH, a\n"
                 "regular file or a block device (e.g. an LVM thin pool's _tdata volume).\n"
                 "No data is copied or written. Each <device> becomes a device with the\n"
                 "same id, named from the --table file or thin<dev_id>, sized from the\n"
                 "table or to its highest mapped block. Blocks mapped by several devices\n"
                 "are shared: a write through any of them copies the block first.\n\n"
                 "Atomic: the input is validated completely (errors name FILE:LINE:COLUMN),\n"
                 "the pool is built in a temporary directory beside POOL and renamed into\n"
                 "place only when complete. POOL must not exist, or be an empty directory.");
  cl.Positional("POOL", "pool directory to create");
  cl.AddOptions()
      ("from,i", po::value<std::string>()->value_name("FILE"), "the XML to restore (required)")
      ("data", po::value<std::string>()->value_name("PATH"),
       "the data area: a block device or regular file holding nr_data_blocks blocks "
       "(required; POOL/data becomes a symlink to it)")
      ("table", po::value<std::string>()->value_name("FILE"),
       "device names and sizes, as written by 'thinfs dump --table'");
  cl.SetEpilog(
      "Progress goes to stderr, only when it is a terminal.\n\n"
      "Examples:\n"
      "  thinfs restore /srv/pool2 --from pool.xml --table pool.devices --data /srv/pool/data\n"
      "  thin_dump /dev/mapper/vg0-pool_tmeta > lvm.xml\n"
      "  thinfs restore /srv/lvmpool --from lvm.xml --data /dev/mapper/vg0-pool_tdata\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  if (!cl.Has("from")) return cl.Fail(kExitUsage, "--from is required (see 'thinfs restore --help')");
  if (!cl.Has("data")) return cl.Fail(kExitUsage, "--data is required (see 'thinfs restore --help')");
  meta::RestoreOptions options;
  options.xml_path = cl.Get<std::string>("from");
  options.data_path = cl.Get<std::string>("data");
  if (cl.Has("table")) options.table_path = cl.Get<std::string>("table");
  ProgressLine progress("restore: ");
  options.progress = [&progress](const char* phase, uint64_t done, uint64_t total) {
    progress.Show(phase, done, total);
  };
  Result<meta::RestoreStats> stats = meta::RestorePool(cl.Arg(0), options);
  if (!stats.ok()) return cl.Fail(kExitFailure, stats.status().message());
  std::cout << "restored " << cl.Arg(0) << ": " << stats->devices << " devices, "
            << stats->mapped_blocks << " mapped blocks, " << stats->used_blocks
            << " data blocks in use (" << stats->shared_blocks << " shared) of "
            << stats->data_blocks << " blocks of " << FormatSize(stats->block_size) << std::endl;
  return kExitOk;
}

namespace {

// Measured after compaction, LZ4 at every level: 10.7-14.5 B per block-map
// entry (docs/benchmarks.md, (c) and lever 63).
constexpr double kCompactedBytesPerBlock = 15;
// Before compaction, the worst case: each entry (20-byte key, up to 13-byte
// value) once in the write-ahead log and once in an uncompressed level-0
// table, each with RocksDB's per-record framing (~15 bytes).
constexpr double kUncompactedBytesPerBlock = 2 * (20 + 13 + 15);
// A device record (104 bytes + name + key and framing), rounded up.
constexpr uint64_t kBytesPerDevice = 512;
// RocksDB's fixed files (MANIFEST, two OPTIONS of 23 KiB, CURRENT, the
// info LOG: ~150 KiB on a fresh pool) and the bitmap header page, with
// room for the LOG to grow.
constexpr uint64_t kFixedBytes = uint64_t{1} << 20;

}  // namespace

int RunMetadataSize(const std::vector<std::string>& args) {
  CommandLine cl("metadata-size", "-s SIZE [-b SIZE] [-m N] [-u UNIT] [-n]",
                 "Estimates the metadata space of a pool (pool/meta/ and pool/bitmap) for a\n"
                 "geometry, like thin_metadata_size does for dm-thin, assuming every data\n"
                 "block is mapped. Prints the worst case (freshly written, before RocksDB\n"
                 "compacts: every mapping in the write-ahead log and an uncompressed\n"
                 "table, ~96 B per block) and the steady state after compaction (measured\n"
                 "10.7-14.5 B per block, counted as 15). thin_metadata_size gives ~32.5 B\n"
                 "per block for dm-thin's preallocated metadata device.");
  cl.AddOptions()
      ("pool-size,s", po::value<std::string>()->value_name("SIZE"),
       "data area size (required), e.g. 1T")
      ("block-size,b", po::value<std::string>()->value_name("SIZE")->default_value("64K"),
       "block size")
      ("max-thins,m", po::value<uint64_t>()->value_name("N")->default_value(1),
       "number of devices (volumes and snapshots)")
      ("unit,u", po::value<std::string>()->value_name("UNIT"),
       "print in this unit: b (bytes), s (512-byte sectors), k, m, g, t, p (binary); "
       "default: a readable size")
      ("numeric-only,n", po::bool_switch(), "print only the worst-case number");
  cl.SetEpilog(
      "Examples:\n"
      "  thinfs metadata-size -s 1T -b 64K -m 100\n"
      "  thinfs metadata-size -s 1T -b 64K -u b -n\n"
      "  thin_metadata_size -s 1t -b 64k -m 100 -u m     (dm-thin, for comparison)\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  if (!cl.Has("pool-size")) return cl.Fail(kExitUsage, "--pool-size is required");
  std::optional<uint64_t> pool_size = cl.SizeOption("pool-size");
  if (!pool_size) return kExitUsage;
  std::optional<uint64_t> block_size = cl.SizeOption("block-size");
  if (!block_size) return kExitUsage;
  if (const char* why = Geometry::Validate(*block_size); why[0] != '\0') {
    return cl.Fail(kExitUsage, std::string("--block-size: ") + why);
  }
  const uint64_t blocks = *pool_size / *block_size;
  if (blocks == 0) return cl.Fail(kExitUsage, "--pool-size is smaller than one block");
  const uint64_t thins = cl.Get<uint64_t>("max-thins");
  const uint64_t fixed = kFixedBytes + (blocks + 7) / 8 + thins * kBytesPerDevice;
  const auto estimate = [&](double per_block) {
    return fixed + static_cast<uint64_t>(std::ceil(per_block * static_cast<double>(blocks)));
  };
  const uint64_t worst = estimate(kUncompactedBytesPerBlock);
  const uint64_t compacted = estimate(kCompactedBytesPerBlock);

  auto show = [&](uint64_t bytes) -> std::string {
    if (!cl.Has("unit")) return FormatSize(bytes);
    const std::string& u = cl.Get<std::string>("unit");
    static const char kUnits[] = "kmgtp";
    uint64_t div = 1;
    if (u == "s") {
      div = 512;
    } else if (u.size() == 1 && std::string(kUnits).find(u[0]) != std::string::npos) {
      div = uint64_t{1} << (10 * (std::string(kUnits).find(u[0]) + 1));
    } else if (u != "b") {
      return "";
    }
    return std::to_string((bytes + div - 1) / div);  // rounded up: an estimate to provision
  };
  if (show(worst).empty()) {
    return cl.Fail(kExitUsage, "--unit must be one of b s k m g t p");
  }
  if (cl.Get<bool>("numeric-only")) {
    std::cout << show(worst) << std::endl;
    return kExitOk;
  }
  const std::string unit = cl.Has("unit") ? " " + cl.Get<std::string>("unit") : "";
  std::cout << show(worst) << unit << " estimated metadata size (worst case, uncompacted) for "
            << blocks << " blocks of " << FormatSize(*block_size) << " and " << thins
            << " devices\n"
            << show(compacted) << unit << " after compaction\n";
  return kExitOk;
}

}  // namespace thinfs::tools
