// thinfs check: verifies that the parts of a pool agree, and with --repair
// fixes what can be fixed (meta/pool_check.h does the work).
//
// Unlike OpenPoolFiles, which stops at the first problem, check opens the
// parts one at a time and keeps going wherever it still can, so that one
// run reports every problem it can see. With --repair, a bitmap that cannot
// be opened (damaged header or checksum) is set aside as bitmap.damaged and
// rebuilt from the block map.

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "core/admin.h"
#include "core/size.h"
#include "meta/pool_check.h"
#include "meta/pool_dir.h"
#include "tools/cli.h"
#include "tools/daemon_checkpoint.h"
#include "tools/json.h"
#include "tools/pool_here.h"
#include "tools/progress.h"

namespace thinfs::tools {

namespace {

// Stops listing (not counting) problems past this many of a kind.
constexpr size_t kMaxListed = 1000;

// What the CLI finds itself (files) plus what CheckPool reports.
struct Report {
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  std::vector<std::string> changes;
  std::vector<meta::CheckFinding> findings;
  uint64_t error_count = 0;
  uint64_t warning_count = 0;
  uint64_t errors_corrected = 0;
  uint64_t errors_left = 0;
  meta::CheckReport pool;  // counters

  void Error(std::string s) {
    ++errors_left;
    if (error_count++ < kMaxListed) errors.push_back(std::move(s));
  }
  void Corrected(std::string s, std::string change) {
    ++errors_corrected;
    if (error_count++ < kMaxListed) errors.push_back(std::move(s));
    changes.push_back(std::move(change));
  }
  void Warning(std::string s) {
    if (warning_count++ < kMaxListed) warnings.push_back(std::move(s));
  }
};

// Opens the bitmap; with `repair`, replaces one that cannot be opened by
// a fresh one (rebuilt by CheckPool). Returns null when unusable.
std::unique_ptr<meta::BitmapSpaceMap> OpenBitmap(const meta::PoolPaths& paths,
                                                 const Superblock& sb, bool read_only,
                                                 bool repair, Report* r) {
  Result<std::unique_ptr<meta::BitmapSpaceMap>> opened =
      meta::BitmapSpaceMap::Open(paths.bitmap, sb.data_blocks, sb.block_size, read_only);
  if (opened.ok() && (*opened)->total_blocks() != sb.data_blocks) {
    opened = Status::Corruption("covers " + std::to_string((*opened)->total_blocks()) +
                                " blocks, the superblock says " +
                                std::to_string(sb.data_blocks));
  }
  if (opened.ok()) {
    if (Status s = meta::CheckBitmapGeneration(**opened, sb, paths.bitmap); !s.ok()) opened = s;
  }
  if (opened.ok()) return std::move(*opened);
  const std::string what = "bitmap " + paths.bitmap + ": " + opened.status().ToString();
  if (!repair || opened.status().code() == Status::Code::kNotSupported) {
    r->Error(what);
    return nullptr;
  }
  const std::string aside = paths.bitmap + ".damaged";
  std::error_code ec;
  std::filesystem::rename(paths.bitmap, aside, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    r->Error(what + " (cannot set it aside: " + ec.message() + ")");
    return nullptr;
  }
  Result<std::unique_ptr<meta::BitmapSpaceMap>> fresh =
      meta::BitmapSpaceMap::Create(paths.bitmap, sb.data_blocks, sb.block_size);
  Status full = fresh.ok() ? (*fresh)->MarkDirty() : fresh.status();
  if (full.ok()) {
    // Every block in use until CheckPool rebuilds the map from the block
    // map: if it cannot (an unreadable map record), the new bitmap must not
    // hand out blocks the map still names. Dirty, so the mount recovers
    // (rebuilds) it, or refuses while the map stays unreadable.
    for (uint64_t b = 0; b < sb.data_blocks; ++b) (*fresh)->MarkUsed(PoolBlock(b));
    full = (*fresh)->Sync(sb.transaction_id);
  }
  if (!full.ok()) {
    r->Error(what + " (cannot create a new one: " + full.ToString() + ")");
    return nullptr;
  }
  r->Corrected(what, "replaced the bitmap by one rebuilt from the block map" +
                         std::string(ec ? "" : " (the damaged one is kept as " + aside + ")"));
  return std::move(*fresh);
}

// Checks everything reachable once the store and superblock are readable.
Status CheckOpenPool(const meta::PoolPaths& paths, const Superblock& sb, meta::RocksDbStore* store,
                     bool read_only, bool repair, Report* r) {
  const uint64_t need = sb.data_blocks * sb.block_size;
  Result<uint64_t> have = meta::DataAreaBytes(paths.data);
  if (!have.ok()) {
    r->Error("data area: " + have.status().message());
  } else if (*have < need) {
    r->Error("data area " + paths.data + " holds " + std::to_string(*have) +
             " bytes, the superblock needs " + std::to_string(need) + " (" +
             std::to_string(sb.data_blocks) + " blocks of " + FormatSize(sb.block_size) + ")");
  }
  std::unique_ptr<meta::BitmapSpaceMap> bitmap = OpenBitmap(paths, sb, read_only, repair, r);

  ProgressLine progress("checking ");
  meta::CheckOptions options;
  options.repair = repair;
  options.max_listed = kMaxListed;
  options.progress = [&progress](const char* phase, uint64_t done, uint64_t total) {
    progress.Show(phase, done, total);
  };
  THINFS_ASSIGN_OR_RETURN(meta::CheckReport c, meta::CheckPool(store, bitmap.get(), options));
  for (meta::CheckFinding& f : c.findings) {
    if (f.severity == meta::CheckFinding::Severity::kError) {
      if (r->error_count++ < kMaxListed) r->errors.push_back(f.message);
    } else if (r->warning_count++ < kMaxListed) {
      r->warnings.push_back(f.message);
    }
  }
  r->errors_corrected += c.errors_corrected;
  r->errors_left += c.errors_left;
  r->changes.insert(r->changes.end(), c.changes.begin(), c.changes.end());
  r->findings = std::move(c.findings);
  r->pool = std::move(c);
  return Status::Ok();
}

// `check --read-only` of a mounted pool: the daemon writes a consistent
// checkpoint of the committed metadata inside the pool directory (hard
// links: cheap), which is checked here and removed. The bitmap is in use
// by the daemon and is not checked. Sets *answered to false when no daemon
// answers on the control socket.
Status CheckMountedPool(const meta::PoolPaths& paths, Report* r, bool* answered) {
  THINFS_ASSIGN_OR_RETURN(std::unique_ptr<DaemonCheckpoint> checkpoint,
                          DaemonCheckpoint::Take(paths, ".check-", answered));
  if (!*answered) return Status::Ok();
  const std::string& dir = checkpoint->dir();
  THINFS_ASSIGN_OR_RETURN(std::unique_ptr<meta::RocksDbStore> store,
                          OpenStoreHere(dir, /*read_only=*/true));
  ProgressLine progress("checking ");
  meta::CheckOptions options;
  options.max_listed = kMaxListed;
  options.progress = [&progress](const char* phase, uint64_t done, uint64_t total) {
    progress.Show(phase, done, total);
  };
  THINFS_ASSIGN_OR_RETURN(meta::CheckReport c, meta::CheckPool(store.get(), nullptr, options));
  for (meta::CheckFinding& f : c.findings) {
    if (f.severity == meta::CheckFinding::Severity::kError) {
      if (r->error_count++ < kMaxListed) r->errors.push_back(f.message);
    } else if (r->warning_count++ < kMaxListed) {
      r->warnings.push_back(f.message);
    }
  }
  r->Warning("the pool is mounted: checked a checkpoint of its committed metadata; the "
             "bitmap, in use by the daemon, was not checked");
  r->errors_left += c.errors_left;
  r->findings = std::move(c.findings);
  r->pool = std::move(c);
  return Status::Ok();
}

void FindingJson(JsonWriter& j, const meta::CheckFinding& f) {
  j.BeginObject()
      .Key("severity")
      .String(f.severity == meta::CheckFinding::Severity::kError ? "error" : "warning")
      .Key("kind")
      .String(f.kind)
      .Key("message")
      .String(f.message);
  if (f.device) j.Key("device").Uint(*f.device);
  if (f.vblock) j.Key("vblock").Uint(*f.vblock);
  if (f.epoch) j.Key("epoch").Uint(*f.epoch);
  if (f.block) j.Key("block").Uint(*f.block);
  if (!f.repair.empty()) j.Key("repair").String(f.repair);
  j.EndObject();
}

}  // namespace

int RunCheck(const std::vector<std::string>& args) {
  CommandLine cl("check", "POOL [--repair] [--json] [--read-only]",
                 "Verifies a pool like thin_check: the superblock (magic, version, geometry),\n"
                 "the bitmap header, checksum and generation (a bitmap ahead of the\n"
                 "metadata means lost commits), the data area size, the device table\n"
                 "(parents exist, ancestry acyclic, parent epochs, names unique), and the\n"
                 "whole block map: every referenced block inside the data area and\n"
                 "allocated in the bitmap, reference counts exact, no block named by two\n"
                 "versions unless counted as shared, and each live device's mapped-block\n"
                 "count (st_blocks of its file) equal to the blocks it reads from the data\n"
                 "area. Blocks allocated but unreferenced are leaks: warnings, reclaimed\n"
                 "by --repair. Each problem is reported on its own line with the device,\n"
                 "vblock, epoch and pool block involved.\n\n"
                 "With --repair (pool not mounted), like thin_repair: rebuilds the bitmap\n"
                 "from the block map (reclaiming leaks; a damaged bitmap is kept as\n"
                 "bitmap.damaged), drops versions no device can read, turns mappings\n"
                 "outside the data area into holes, turns map records that cannot be\n"
                 "decoded into holes (their data is lost, as with thin_repair; each was\n"
                 "reported, and the rest of the map was checked past it), sets reference\n"
                 "counts and mapped-block counts to the exact values (as the map is left:\n"
                 "a hole no longer counts), reports every change and checks again. A\n"
                 "damaged superblock, device record or RocksDB file is reported and left.");
  cl.Positional("POOL", "pool directory");
  cl.AddOptions()
      ("repair", po::bool_switch(), "fix what can be fixed, reporting each change")
      ("json", po::bool_switch(),
       "print one JSON object: clean, errors, warnings, findings, changes and counts")
      ("read-only", po::bool_switch(), "open every part of the pool read-only");
  cl.SetEpilog(
      "Exit status (like fsck): 0 clean (leaks are only warnings); 1 errors were\n"
      "corrected (--repair) and none are left; 4 errors left uncorrected;\n"
      "8 operational error (pool missing, locked or unreadable). A usage error\n"
      "also exits 1 and prints a message on stderr.\n"
      "Progress goes to stderr, only when it is a terminal.\n\n"
      "Examples:\n"
      "  thinfs check /srv/pool --read-only\n"
      "  thinfs check /srv/pool --repair\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  const bool json = cl.Get<bool>("json");
  const bool read_only = cl.Get<bool>("read-only");
  const bool repair = cl.Get<bool>("repair");
  if (repair && read_only) return cl.Fail(kExitUsage, "--repair and --read-only exclude each other");
  const meta::PoolPaths paths = meta::PoolPaths::For(cl.Arg(0));

  struct stat st;
  if (::stat(paths.root.c_str(), &st) != 0) {
    return cl.Fail(kCheckOperational, "pool " + paths.root + " does not exist");
  }
  if (!S_ISDIR(st.st_mode) || !meta::LooksLikePool(paths.root)) {
    return cl.Fail(kCheckOperational, paths.root + " is not a thinfs pool (no meta/ or bitmap)");
  }
  // The lock also proves the pool is not mounted (the daemon holds it).
  Result<meta::PoolLock> lock = meta::PoolLock::Acquire(paths.lock);
  Report r;
  if (!lock.ok()) {
    bool answered = false;
    if (read_only && lock.status().code() == Status::Code::kBusy) {
      if (Status s = CheckMountedPool(paths, &r, &answered); !s.ok()) {
        return cl.Fail(kCheckOperational, "check of the mounted pool: " + s.ToString());
      }
    }
    if (!answered) {
      return cl.Fail(kCheckOperational,
                     lock.status().message() +
                         (read_only ? "" : " (while mounted, use --read-only)"));
    }
  }
  if (lock.ok()) {
    Result<std::unique_ptr<meta::RocksDbStore>> store = OpenStoreHere(paths.meta, read_only);
    if (!store.ok()) {
      // A damaged store is a finding; anything else stops the check.
      if (!store.status().IsCorruption() && !store.status().IsNotFound()) {
        return cl.Fail(kCheckOperational, "metadata store " + paths.meta + ": " +
                                              store.status().message());
      }
      r.Error("metadata store " + paths.meta + ": " + store.status().ToString());
    } else {
      Result<Superblock> sb = (*store)->ReadSuperblock();
      Status valid = sb.ok() ? meta::ValidateSuperblock(*sb) : sb.status();
      if (valid.code() == Status::Code::kNotSupported) {
        return cl.Fail(kCheckOperational, valid.message());
      }
      if (!valid.ok()) {
        r.Error("superblock: " + valid.ToString());
      } else if (Status s = CheckOpenPool(paths, *sb, store->get(), read_only, repair, &r);
                 !s.ok()) {
        return cl.Fail(kCheckOperational, (repair ? "repair: " : "check: ") + s.ToString());
      }
    }

  }

  const bool clean = r.errors_left == 0;
  const meta::CheckReport& c = r.pool;
  if (json) {
    JsonWriter j;
    j.BeginObject().Key("pool").String(paths.root).Key("clean").Bool(clean);
    j.Key("repair").Bool(repair);
    j.Key("errors").BeginArray();
    for (const std::string& e : r.errors) j.String(e);
    j.EndArray().Key("warnings").BeginArray();
    for (const std::string& w : r.warnings) j.String(w);
    j.EndArray().Key("findings").BeginArray();
    for (const meta::CheckFinding& f : r.findings) FindingJson(j, f);
    j.EndArray().Key("changes").BeginArray();
    for (const std::string& ch : r.changes) j.String(ch);
    j.EndArray().Key("remaining").BeginArray();
    for (const meta::CheckFinding& f : c.remaining) FindingJson(j, f);
    j.EndArray()
        .Key("error_count").Uint(r.error_count)
        .Key("warning_count").Uint(r.warning_count)
        .Key("errors_corrected").Uint(r.errors_corrected)
        .Key("errors_left").Uint(r.errors_left)
        .Key("devices").Uint(c.devices)
        .Key("mappings").Uint(c.mappings)
        .Key("undecodable_mappings").Uint(c.undecodable_mappings)
        .Key("referenced_blocks").Uint(c.referenced_blocks)
        .Key("shared_blocks").Uint(c.shared_blocks)
        .Key("refcount_entries").Uint(c.refcount_entries)
        .Key("leaked_blocks").Uint(c.leaked_blocks)
        .Key("reclaimed_blocks").Uint(c.reclaimed_blocks)
        .EndObject();
    std::cout << j.str() << std::endl;
  } else {
    for (const std::string& e : r.errors) std::cout << "error: " << e << "\n";
    if (r.error_count > r.errors.size()) {
      std::cout << "error: ... and " << r.error_count - r.errors.size() << " more\n";
    }
    for (const std::string& w : r.warnings) std::cout << "warning: " << w << "\n";
    if (r.warning_count > r.warnings.size()) {
      std::cout << "warning: ... and " << r.warning_count - r.warnings.size() << " more\n";
    }
    for (const std::string& ch : r.changes) std::cout << "repaired: " << ch << "\n";
    for (const meta::CheckFinding& f : c.remaining) std::cout << "left: " << f.message << "\n";
    std::string verdict;
    if (!clean) {
      verdict = std::to_string(r.errors_left) + " errors left uncorrected";
      if (r.errors_corrected > 0) verdict += ", " + std::to_string(r.errors_corrected) + " corrected";
    } else if (r.errors_corrected > 0) {
      verdict = std::to_string(r.errors_corrected) + " errors corrected, now clean";
    } else {
      verdict = "clean";
    }
    std::cout << paths.root << ": " << c.devices << " devices, " << c.mappings << " mappings"
              << (c.undecodable_mappings == 0
                      ? ""
                      : " (and " + std::to_string(c.undecodable_mappings) + " undecodable)")
              << ", " << c.referenced_blocks << " referenced blocks, " << c.refcount_entries
              << " refcount entries: " << verdict << std::endl;
  }
  if (!clean) return kCheckErrorsLeft;
  return r.errors_corrected > 0 ? kCheckErrorsCorrected : kCheckClean;
}

}  // namespace thinfs::tools
