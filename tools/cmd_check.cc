// thinfs check: verifies that the parts of a pool agree.
//
// Unlike OpenPoolFiles, which stops at the first problem, check opens the
// parts one at a time and keeps going wherever it still can, so that one
// run reports every problem it can see. Nothing is repaired yet: errors are
// reported and left (exit 4).

#include <sys/stat.h>

#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "core/size.h"
#include "meta/pool_dir.h"
#include "tools/cli.h"
#include "tools/json.h"

namespace thinfs::tools {

namespace {

// Stops listing (not counting) problems past this many of a kind.
constexpr size_t kMaxListed = 1000;

struct Report {
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  uint64_t error_count = 0;
  uint64_t warning_count = 0;
  uint64_t devices = 0;
  uint64_t mappings = 0;
  uint64_t referenced_blocks = 0;
  uint64_t refcount_entries = 0;
  uint64_t leaked_blocks = 0;

  void Error(std::string s) {
    if (error_count++ < kMaxListed) errors.push_back(std::move(s));
  }
  void Warning(std::string s) {
    if (warning_count++ < kMaxListed) warnings.push_back(std::move(s));
  }
};

// One bit per data block.
class BlockSet {
 public:
  explicit BlockSet(uint64_t blocks) : words_((blocks + 63) / 64) {}
  // Returns true when `b` was not yet in the set.
  bool Insert(uint64_t b) {
    uint64_t bit = uint64_t{1} << (b % 64);
    bool fresh = (words_[b / 64] & bit) == 0;
    words_[b / 64] |= bit;
    return fresh;
  }
  bool Contains(uint64_t b) const { return (words_[b / 64] >> (b % 64)) & 1; }

 private:
  std::vector<uint64_t> words_;
};

std::string Where(const MapEntry& e) {
  return "device " + std::to_string(e.device.value) + " block " + std::to_string(e.vblock.value) +
         " epoch " + std::to_string(e.epoch);
}

// Checks everything reachable once the store and superblock are readable.
void CheckOpenPool(const meta::PoolPaths& paths, const Superblock& sb, meta::RocksDbStore* store,
                   bool read_only, Report* r) {
  const uint64_t blocks = sb.data_blocks;
  const uint64_t need = sb.data_blocks * sb.block_size;

  Result<uint64_t> have = meta::DataAreaBytes(paths.data);
  if (!have.ok()) {
    r->Error("data area: " + have.status().message());
  } else if (*have < need) {
    r->Error("data area " + paths.data + " holds " + std::to_string(*have) +
             " bytes, the superblock needs " + std::to_string(need) + " (" +
             std::to_string(blocks) + " blocks of " + FormatSize(sb.block_size) + ")");
  }

  std::unique_ptr<meta::BitmapSpaceMap> bitmap;
  Result<std::unique_ptr<meta::BitmapSpaceMap>> opened =
      meta::BitmapSpaceMap::Open(paths.bitmap, blocks, sb.block_size, read_only);
  if (!opened.ok()) {
    r->Error("bitmap " + paths.bitmap + ": " + opened.status().ToString());
  } else {
    bitmap = std::move(*opened);
    if (bitmap->total_blocks() != blocks) {
      r->Error("bitmap " + paths.bitmap + " covers " + std::to_string(bitmap->total_blocks()) +
               " blocks, the superblock says " + std::to_string(blocks));
      bitmap.reset();
    } else if (!bitmap->was_clean()) {
      r->Warning("bitmap was not closed cleanly (generation " +
                 std::to_string(bitmap->generation()) +
                 "): it may count leaked blocks as used");
    }
  }

  std::set<uint64_t> device_ids;
  Result<std::vector<DeviceRecord>> devices = store->LoadDevices();
  if (!devices.ok()) {
    r->Error("device table: " + devices.status().ToString());
  } else {
    for (const DeviceRecord& d : *devices) device_ids.insert(d.id.value);
    for (const DeviceRecord& d : *devices) {
      ++r->devices;
      const std::string name = "device " + std::to_string(d.id.value);
      if (d.id.value == 0 || d.id.value >= sb.next_device_id) {
        r->Error(name + ": id outside [1, next_device_id " + std::to_string(sb.next_device_id) +
                 ")");
      }
      if (d.has_parent && device_ids.count(d.parent.value) == 0) {
        r->Error(name + ": parent device " + std::to_string(d.parent.value) + " does not exist");
      }
    }
  }

  BlockSet referenced(blocks);
  std::unique_ptr<MapIterator> it = store->NewMapIterator();
  for (it->Seek(VolumeId(0), VolumeBlock(0)); it->Valid(); it->Next()) {
    const MapEntry& e = it->entry();
    ++r->mappings;
    if (devices.ok() && device_ids.count(e.device.value) == 0) {
      r->Error("block map: " + Where(e) + " belongs to no device");
    }
    if (e.value.tombstone()) continue;
    const uint64_t b = e.value.block.value;
    if (b >= blocks) {
      r->Error("block map: " + Where(e) + " maps pool block " + std::to_string(b) +
               " beyond the data area (" + std::to_string(blocks) + " blocks)");
      continue;
    }
    if (referenced.Insert(b)) ++r->referenced_blocks;
    if (bitmap && !bitmap->IsAllocated(PoolBlock(b))) {
      r->Error("block map: " + Where(e) + " maps pool block " + std::to_string(b) +
               ", which the bitmap marks free");
    }
  }
  if (Status s = it->status(); !s.ok()) r->Error("block map: " + s.ToString());

  Result<std::vector<std::pair<PoolBlock, uint32_t>>> refs = store->ListRefcounts();
  if (!refs.ok()) {
    r->Error("refcounts: " + refs.status().ToString());
  } else {
    for (const auto& [block, count] : *refs) {
      ++r->refcount_entries;
      const std::string what = "refcount of pool block " + std::to_string(block.value);
      if (block.value >= blocks) {
        r->Error(what + ": beyond the data area (" + std::to_string(blocks) + " blocks)");
        continue;
      }
      if (count < 2) {
        r->Error(what + " is " + std::to_string(count) +
                 " (entries exist only for shared blocks, count >= 2)");
      }
      if (!referenced.Contains(block.value)) r->Warning(what + ": no mapping references it");
    }
  }

  if (bitmap) {
    // Allocated but unreferenced blocks are leaks (DESIGN.md invariant 6:
    // allowed after a crash, reclaimed later), not errors.
    const uint64_t used = bitmap->total_blocks() - bitmap->free_blocks();
    uint64_t used_and_referenced = 0;
    for (uint64_t b = 0; b < blocks; ++b) {
      if (referenced.Contains(b) && bitmap->IsAllocated(PoolBlock(b))) ++used_and_referenced;
    }
    if (used > used_and_referenced) {
      r->leaked_blocks = used - used_and_referenced;
      r->Warning(std::to_string(r->leaked_blocks) +
                 " blocks are allocated in the bitmap but mapped by nothing (leaked)");
    }
  }
}

}  // namespace

int RunCheck(const std::vector<std::string>& args) {
  CommandLine cl("check", "POOL [--json] [--read-only]",
                 "Verifies a pool: the superblock (magic, version, geometry), the bitmap\n"
                 "header and checksum, the data area size, and that every block the block\n"
                 "map references lies inside the data area and is allocated in the bitmap,\n"
                 "and that refcount entries point inside the data area. Each problem is\n"
                 "reported on its own line. Nothing is repaired yet.");
  cl.Positional("POOL", "pool directory");
  cl.AddOptions()
      ("json", po::bool_switch(),
       "print one JSON object: clean, errors, warnings and counts")
      ("read-only", po::bool_switch(), "open every part of the pool read-only");
  cl.SetEpilog(
      "Exit status (like fsck): 0 clean; 4 errors left uncorrected; 8 operational\n"
      "error (pool missing, locked or unreadable); 1 usage error.\n\n"
      "Example:\n"
      "  thinfs check /srv/pool --read-only\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  const bool json = cl.Get<bool>("json");
  const bool read_only = cl.Get<bool>("read-only");
  const meta::PoolPaths paths = meta::PoolPaths::For(cl.Arg(0));

  struct stat st;
  if (::stat(paths.root.c_str(), &st) != 0) {
    return cl.Fail(kCheckOperational, "pool " + paths.root + " does not exist");
  }
  if (!S_ISDIR(st.st_mode) || !meta::LooksLikePool(paths.root)) {
    return cl.Fail(kCheckOperational, paths.root + " is not a thinfs pool (no meta/ or bitmap)");
  }
  Result<meta::PoolLock> lock = meta::PoolLock::Acquire(paths.lock);
  if (!lock.ok()) return cl.Fail(kCheckOperational, lock.status().message());

  Report r;
  meta::RocksDbOptions store_options;
  store_options.read_only = read_only;
  Result<std::unique_ptr<meta::RocksDbStore>> store =
      meta::RocksDbStore::Open(paths.meta, store_options);
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
    } else {
      CheckOpenPool(paths, *sb, store->get(), read_only, &r);
    }
  }

  const bool clean = r.error_count == 0;
  if (json) {
    JsonWriter j;
    j.BeginObject().Key("pool").String(paths.root).Key("clean").Bool(clean);
    j.Key("errors").BeginArray();
    for (const std::string& e : r.errors) j.String(e);
    j.EndArray().Key("warnings").BeginArray();
    for (const std::string& w : r.warnings) j.String(w);
    j.EndArray()
        .Key("error_count").Uint(r.error_count)
        .Key("warning_count").Uint(r.warning_count)
        .Key("devices").Uint(r.devices)
        .Key("mappings").Uint(r.mappings)
        .Key("referenced_blocks").Uint(r.referenced_blocks)
        .Key("refcount_entries").Uint(r.refcount_entries)
        .Key("leaked_blocks").Uint(r.leaked_blocks)
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
    std::cout << paths.root << ": " << r.devices << " devices, " << r.mappings << " mappings, "
              << r.referenced_blocks << " referenced blocks, " << r.refcount_entries
              << " refcount entries: "
              << (clean ? "clean" : std::to_string(r.error_count) + " errors left uncorrected")
              << std::endl;
  }
  return clean ? kCheckClean : kCheckErrorsLeft;
}

}  // namespace thinfs::tools
