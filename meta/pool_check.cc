#include "meta/pool_check.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "core/pool.h"
#include "core/resolved_walk.h"
#include "core/vector_map_iterator.h"
#include "meta/pool_dir.h"

namespace thinfs::meta {

namespace {

// Finding kinds (stable identifiers, part of the --json output):
//   superblock-invalid, superblock-unreadable, space-map-geometry,
//   device-table-unreadable, device-id-out-of-range, device-unknown-flags,
//   device-parent-missing, device-parent-epoch, device-reads-deleting-parent,
//   device-ancestry-cycle, device-bad-name, device-duplicate-name,
//   device-flags-inconsistent (warning), hidden-device-without-children
//   (warning), device-deleting (warning),
//   block-map-unreadable, mapping-undecodable, mapping-without-device,
//   mapping-future-epoch, mapping-outside-data-area, block-not-allocated,
//   refcount-table-unreadable, refcount-outside-data-area, refcount-stale,
//   refcount-wrong, block-double-mapped, shared-version-not-flagged,
//   device-mapped-blocks-wrong, leaked-blocks (warning),
//   space-map-unclean (warning).

using Severity = CheckFinding::Severity;

constexpr uint32_t kKnownDeviceFlags = DeviceRecord::kHidden | DeviceRecord::kDeleting |
                                       DeviceRecord::kGcPending | DeviceRecord::kDetached;
constexpr uint64_t kProgressEvery = 1 << 16;
// Versions named in one double-mapping finding.
constexpr size_t kMaxLocations = 4;
// Leaked block numbers named in the leak warning.
constexpr size_t kMaxLeaksNamed = 16;

std::string Str(uint64_t v) { return std::to_string(v); }

std::string Where(VolumeId device, VolumeBlock vblock, Epoch epoch) {
  return "device " + Str(device.value) + " vblock " + Str(vblock.value) + " epoch " + Str(epoch);
}

std::string Where(const MapEntry& e) { return Where(e.device, e.vblock, e.epoch); }

std::string HexBytes(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (char c : bytes) {
    s += digits[static_cast<uint8_t>(c) >> 4];
    s += digits[static_cast<uint8_t>(c) & 15];
  }
  return s;
}

CheckFinding AtEntry(Severity sev, const char* kind, const MapEntry& e, std::string message) {
  CheckFinding f;
  f.severity = sev;
  f.kind = kind;
  f.message = std::move(message);
  f.device = e.device.value;
  f.vblock = e.vblock.value;
  f.epoch = e.epoch;
  if (!e.value.tombstone()) f.block = e.value.block.value;
  return f;
}

CheckFinding AtDevice(Severity sev, const char* kind, uint64_t device, std::string message) {
  CheckFinding f;
  f.severity = sev;
  f.kind = kind;
  f.message = std::move(message);
  f.device = device;
  return f;
}

CheckFinding AtBlock(Severity sev, const char* kind, uint64_t block, std::string message) {
  CheckFinding f;
  f.severity = sev;
  f.kind = kind;
  f.message = std::move(message);
  f.block = block;
  return f;
}

CheckFinding Plain(Severity sev, const char* kind, std::string message) {
  CheckFinding f;
  f.severity = sev;
  f.kind = kind;
  f.message = std::move(message);
  return f;
}

bool Visible(const DeviceRecord& d) {
  return (d.flags & (DeviceRecord::kHidden | DeviceRecord::kDeleting | DeviceRecord::kDetached)) ==
         0;
}

std::string DeviceName(const DeviceRecord& d) {
  std::string s = "device " + Str(d.id.value);
  if (!d.name.empty()) s += " '" + d.name + "'";
  return s;
}

// Block-map key order: device, vblock ascending, epoch descending.
using MapKeyTuple = std::tuple<uint64_t, uint64_t, uint64_t>;
MapKeyTuple KeyOf(VolumeId device, VolumeBlock vblock, Epoch epoch) {
  return {device.value, vblock.value, ~uint64_t{epoch}};
}
MapKeyTuple KeyOf(const MapEntry& e) { return KeyOf(e.device, e.vblock, e.epoch); }

// What repair does to a version: replaces its value (a tombstone) or, when
// nullopt, deletes it.
using MapPatches = std::map<MapKeyTuple, std::pair<MapEntry, std::optional<MapValue>>>;

// The block map as it reads once repair has applied `patches`: a store
// iterator that skips undecodable records, merged with the patches (which
// also bring back, as tombstones, the undecodable records repair rewrites).
// Lets the mapped-block counts be checked against the map repair leaves.
class PatchedMapIterator final : public MapIterator {
 public:
  PatchedMapIterator(std::unique_ptr<MapIterator> base, const MapPatches* patches)
      : base_(std::move(base)), patches_(patches), patch_(patches->end()) {}

  bool Valid() const override { return valid_; }
  const MapEntry& entry() const override { return entry_; }
  void Next() override {
    if (!valid_) return;
    if (from_base_) base_->Next();
    if (from_patch_) ++patch_;
    Settle();
  }
  void Seek(VolumeId device, VolumeBlock vblock) override {
    base_->Seek(device, vblock);
    patch_ = patches_->lower_bound(KeyOf(device, vblock, std::numeric_limits<Epoch>::max()));
    Settle();
  }
  Status status() const override { return base_->status(); }

 private:
  // Positions at the smaller of the two heads; a patch overrides the base
  // record under the same key, and a deleting patch hides it.
  void Settle() {
    while (true) {
      const bool base = base_->Valid();
      const bool patch = patch_ != patches_->end();
      valid_ = base || patch;
      if (!valid_) return;
      const MapKeyTuple base_key = base ? KeyOf(base_->entry()) : MapKeyTuple();
      from_base_ = base && (!patch || base_key <= patch_->first);
      from_patch_ = patch && (!base || patch_->first <= base_key);
      if (!from_patch_) {
        entry_ = base_->entry();
        return;
      }
      const auto& [at, value] = patch_->second;
      if (value) {
        entry_ = at;
        entry_.value = *value;
        return;
      }
      if (from_base_) base_->Next();
      ++patch_;
    }
  }

  std::unique_ptr<MapIterator> base_;
  const MapPatches* const patches_;
  MapPatches::const_iterator patch_;
  bool valid_ = false;
  bool from_base_ = false;
  bool from_patch_ = false;
  MapEntry entry_;
};

class Checker {
 public:
  Checker(MetadataStore* store, SpaceMap* space, const CheckOptions& options, bool repair,
          CheckReport* report)
      : store_(store), space_(space), options_(options), repair_(repair), r_(report) {}

  // Runs the verification; with repair_, also collects and applies fixes.
  Status Run() {
    Result<Superblock> sb = store_->ReadSuperblock();
    if (!sb.ok()) {
      if (!sb.status().IsCorruption()) return sb.status();
      Add(Plain(Severity::kError, "superblock-unreadable", "superblock: " + sb.status().ToString()));
      return Status::Ok();
    }
    sb_ = *sb;
    if (Status v = ValidateSuperblock(sb_); !v.ok()) {
      Add(Plain(Severity::kError, "superblock-invalid", "superblock: " + v.ToString()));
      return Status::Ok();
    }
    blocks_ = sb_.data_blocks;
    if (space_ != nullptr && space_->total_blocks() != blocks_) {
      Add(Plain(Severity::kError, "space-map-geometry",
                "space map covers " + Str(space_->total_blocks()) +
                    " blocks, the superblock says " + Str(blocks_)));
      space_ = nullptr;
    }
    THINFS_RETURN_IF_ERROR(CheckDevices());
    refs_.assign(blocks_, 0);
    THINFS_RETURN_IF_ERROR(ScanMap());
    THINFS_RETURN_IF_ERROR(CheckRefcounts());
    THINFS_RETURN_IF_ERROR(CheckMappedCounts());
    CheckSpaceMap();
    if (repair_) THINFS_RETURN_IF_ERROR(Apply());
    return Status::Ok();
  }

 private:
  void Add(CheckFinding f) {
    if (f.severity == Severity::kError) {
      ++r_->error_count;
      if (repair_ && !f.repair.empty()) ++r_->errors_corrected;
      if (r_->error_count > options_.max_listed) return;
    } else {
      ++r_->warning_count;
      if (r_->warning_count > options_.max_listed) return;
    }
    r_->findings.push_back(std::move(f));
  }

  // `repair` describes the fix when repairing; returns it for the finding.
  std::string Fix(std::string what) {
    if (!repair_) return "";
    if (r_->changes.size() < options_.max_listed) r_->changes.push_back(what);
    return what;
  }

  void Progress(const char* phase, uint64_t done, uint64_t total) {
    if (options_.progress) options_.progress(phase, done, total);
  }

  // ---- Device table ------------------------------------------------------
  Status CheckDevices() {
    Result<std::vector<DeviceRecord>> recs = store_->LoadDevices();
    if (!recs.ok()) {
      if (!recs.status().IsCorruption()) return recs.status();
      Add(Plain(Severity::kError, "device-table-unreadable",
                "device table: " + recs.status().ToString()));
      return Status::Ok();
    }
    devices_ok_ = true;
    for (const DeviceRecord& d : *recs) devices_[d.id.value] = d;
    r_->devices = devices_.size();
    uint64_t max_id = 0;
    std::map<std::string, uint64_t> names;
    for (const auto& [id, d] : devices_) {
      const std::string who = DeviceName(d);
      max_id = std::max(max_id, id);
      if (id == 0 || id >= sb_.next_device_id) {
        CheckFinding f = AtDevice(Severity::kError, "device-id-out-of-range", id,
                                  who + ": id outside [1, next_device_id " +
                                      Str(sb_.next_device_id) + ")");
        if (id != 0) {
          f.repair = Fix("raised the superblock's next_device_id past device " + Str(id));
          if (!f.repair.empty()) fix_next_device_id_ = true;
        }
        Add(std::move(f));
      }
      if (d.flags & ~kKnownDeviceFlags) {
        Add(AtDevice(Severity::kError, "device-unknown-flags", id,
                     who + ": unknown flags 0x" + Hex(d.flags & ~kKnownDeviceFlags)));
      }
      if (d.has_parent) {
        auto p = devices_.find(d.parent.value);
        if (p == devices_.end()) {
          bad_chain_.insert(id);
          Add(AtDevice(Severity::kError, "device-parent-missing", id,
                       who + ": parent device " + Str(d.parent.value) + " does not exist"));
        } else {
          if (d.parent_epoch >= p->second.epoch) {
            bad_chain_.insert(id);
            Add(AtDevice(Severity::kError, "device-parent-epoch", id,
                         who + ": reads parent " + Str(d.parent.value) + " at epoch " +
                             Str(d.parent_epoch) + ", not below the parent's epoch " +
                             Str(p->second.epoch)));
          }
          if ((p->second.flags & DeviceRecord::kDeleting) &&
              !(d.flags & DeviceRecord::kDeleting)) {
            bad_chain_.insert(id);
            Add(AtDevice(Severity::kError, "device-reads-deleting-parent", id,
                         who + ": reads through parent " + Str(d.parent.value) +
                             ", which is being deleted"));
          }
        }
        // A cycle through this device: walking up returns to it.
        uint64_t steps = 0;
        for (auto a = devices_.find(d.parent.value); a != devices_.end() && a->second.has_parent;
             a = devices_.find(a->second.parent.value)) {
          if (a->first == id) {
            bad_chain_.insert(id);
            Add(AtDevice(Severity::kError, "device-ancestry-cycle", id,
                         who + ": its ancestry loops back to itself"));
            break;
          }
          if (++steps > devices_.size()) break;  // a cycle above, reported there
        }
      }
      if (Visible(d)) {
        if (Status v = Pool::ValidateName(d.name); !v.ok()) {
          Add(AtDevice(Severity::kError, "device-bad-name", id, who + ": " + v.message()));
        } else if (auto [it, fresh] = names.emplace(d.name, id); !fresh) {
          Add(AtDevice(Severity::kError, "device-duplicate-name", id,
                       who + ": name also used by device " + Str(it->second)));
        }
      }
      if ((d.flags & DeviceRecord::kDetached) &&
          (d.flags & (DeviceRecord::kHidden | DeviceRecord::kDeleting))) {
        Add(AtDevice(Severity::kWarning, "device-flags-inconsistent", id,
                     who + ": detached and deleted at once"));
      }
      if ((d.flags & DeviceRecord::kHidden) && !(d.flags & DeviceRecord::kDeleting)) {
        bool has_child = false;
        for (const auto& [cid, c] : devices_) {
          if (c.has_parent && c.parent.value == id && !(c.flags & DeviceRecord::kDeleting)) {
            has_child = true;
            break;
          }
        }
        if (!has_child) {
          CheckFinding f = AtDevice(Severity::kWarning, "hidden-device-without-children", id,
                                    who + ": deleted and hidden, but no device reads through it "
                                          "(its blocks are never collected)");
          f.repair = Fix("marked device " + Str(id) + " for collection");
          if (!f.repair.empty()) {
            DeviceRecord nd = d;
            nd.flags |= DeviceRecord::kDeleting;
            nd.flags &= ~DeviceRecord::kGcPending;
            fix_.put_devices.push_back(nd);
          }
          Add(std::move(f));
        }
      }
    }
    if (fix_next_device_id_) next_device_id_ = max_id + 1;
    return Status::Ok();
  }

  static std::string Hex(uint64_t v) {
    static const char* digits = "0123456789abcdef";
    std::string s;
    do {
      s.insert(s.begin(), digits[v & 15]);
      v >>= 4;
    } while (v != 0);
    return s;
  }

  // ---- Block map -----------------------------------------------------------
  // What happens to an entry: kept (counted), dropped or replaced.
  enum class Fate { kKeep, kDrop, kTombstone };

  // Classifies `e`, reporting problems (first pass only: `report`).
  Fate Classify(const MapEntry& e, bool report) {
    const DeviceRecord* dev = nullptr;
    if (devices_ok_) {
      auto d = devices_.find(e.device.value);
      if (d == devices_.end()) {
        if (report) {
          CheckFinding f = AtEntry(Severity::kError, "mapping-without-device", e,
                                   "block map: " + Where(e) + " belongs to no device");
          f.repair = Fix("dropped the version " + Where(e) + " of a missing device");
          Add(std::move(f));
        }
        return repair_ ? Fate::kDrop : Fate::kKeep;
      }
      dev = &d->second;
      if (e.epoch > dev->epoch) {
        if (report) {
          CheckFinding f = AtEntry(Severity::kError, "mapping-future-epoch", e,
                                   "block map: " + Where(e) + " is newer than the device's epoch " +
                                       Str(dev->epoch));
          f.repair = Fix("dropped the unreachable version " + Where(e));
          Add(std::move(f));
        }
        return repair_ ? Fate::kDrop : Fate::kKeep;
      }
    }
    if (e.value.tombstone()) return Fate::kKeep;
    if (e.value.block.value >= blocks_) {
      if (report) {
        CheckFinding f = AtEntry(Severity::kError, "mapping-outside-data-area", e,
                                 "block map: " + Where(e) + " maps pool block " +
                                     Str(e.value.block.value) + " beyond the data area (" +
                                     Str(blocks_) + " blocks)");
        f.repair = Fix("replaced the version " + Where(e) + " -> block " +
                       Str(e.value.block.value) + " (outside the data area) by a tombstone: "
                       "the block reads zeros");
        Add(std::move(f));
      }
      return repair_ ? Fate::kTombstone : Fate::kDrop;
    }
    return Fate::kKeep;
  }

  // A record the store cannot decode: its block is unknown, so nothing it
  // named is counted. Repair makes that true: a well-formed key gets a
  // tombstone (the block reads zeros at that version, as thin_repair loses
  // an unreadable mapping; an older version must not show through), a
  // malformed key, which no device can address, is deleted.
  void Undecodable(const DamagedMapRecord& d) {
    ++r_->undecodable_mappings;
    if (repair_) mappings_changed_ = true;
    if (!d.key_decoded) {
      CheckFinding f = Plain(Severity::kError, "mapping-undecodable",
                             "block map: record with key " + HexBytes(d.raw_key) +
                                 " cannot be decoded: " + d.why.ToString());
      f.repair = Fix("deleted the block-map record with the malformed key " +
                     HexBytes(d.raw_key));
      if (!f.repair.empty()) fix_.delete_raw_map_keys.push_back(d.raw_key);
      Add(std::move(f));
      return;
    }
    const MapEntry hole{d.device, d.vblock, d.epoch, MapValue{PoolBlock(), MapValue::kTombstone}};
    CheckFinding f = AtEntry(Severity::kError, "mapping-undecodable", hole,
                             "block map: " + Where(hole) + " cannot be decoded: " +
                                 d.why.ToString());
    if (Classify(hole, /*report=*/false) == Fate::kDrop) {
      // No one could read it anyway (missing device, future epoch).
      f.repair = Fix("dropped the undecodable version " + Where(hole) +
                     ", which no device can read");
      if (!f.repair.empty()) fix_.delete_mappings.push_back({d.device, d.vblock, d.epoch});
      Patch(hole, std::nullopt);
    } else {
      f.repair = Fix("replaced the undecodable version " + Where(hole) +
                     " by a tombstone: the block reads zeros there (its data is lost)");
      if (!f.repair.empty()) fix_.put_mappings.push_back(hole);
      Patch(hole, hole.value);
    }
    Add(std::move(f));
  }

  // Blocks and counts may be off because undecodable records were skipped.
  std::string SkippedNote() const {
    if (r_->undecodable_mappings == 0) return "";
    return " (" + Str(r_->undecodable_mappings) +
           " undecodable block-map records were skipped and may name blocks too)";
  }

  Status ScanMap() {
    std::map<uint64_t, uint64_t> deleting_versions;
    std::unique_ptr<MapIterator> it = store_->NewMapIteratorSkippingDamaged(
        [this](const DamagedMapRecord& d) { Undecodable(d); });
    uint64_t n = 0;
    for (it->Seek(VolumeId(0), VolumeBlock(0)); it->Valid(); it->Next()) {
      const MapEntry& e = it->entry();
      ++r_->mappings;
      if (++n % kProgressEvery == 0) Progress("block map", n, 0);
      Fate fate = Classify(e, /*report=*/true);
      if (fate == Fate::kDrop || fate == Fate::kTombstone) {
        // Without repair, kDrop means outside the data area too: the
        // counts assume the tombstone repair would put there.
        if (fate == Fate::kTombstone || !repair_) {
          Patch(e, MapValue{PoolBlock(), MapValue::kTombstone});
        } else {
          Patch(e, std::nullopt);
        }
        if (repair_) {
          if (fate == Fate::kDrop) {
            fix_.delete_mappings.push_back({e.device, e.vblock, e.epoch});
          } else {
            fix_.put_mappings.push_back(
                MapEntry{e.device, e.vblock, e.epoch, MapValue{PoolBlock(), MapValue::kTombstone}});
          }
          mappings_changed_ = true;
        }
        continue;
      }
      auto d = devices_.find(e.device.value);
      if (d != devices_.end() && (d->second.flags & DeviceRecord::kDeleting)) {
        deleting_versions[e.device.value]++;
      }
      if (e.value.tombstone()) continue;
      const uint64_t b = e.value.block.value;
      if (refs_[b] == 0) ++r_->referenced_blocks;
      if (refs_[b] == 1) ++r_->shared_blocks;
      if (refs_[b] < std::numeric_limits<uint32_t>::max()) refs_[b]++;
      if (space_ != nullptr && !space_->IsAllocated(PoolBlock(b))) {
        CheckFinding f = AtEntry(Severity::kError, "block-not-allocated", e,
                                 "block map: " + Where(e) + " maps pool block " + Str(b) +
                                     ", which the space map marks free");
        f.repair = Fix("marked pool block " + Str(b) + " allocated (space map rebuilt)");
        Add(std::move(f));
        rebuild_ = true;
      }
    }
    if (Status s = it->status(); !s.ok()) {
      // RocksDB itself failed (an SST block checksum): the records past the
      // bad block cannot be reached, so the counts stay unknown.
      if (!s.IsCorruption()) return s;
      Add(Plain(Severity::kError, "block-map-unreadable", "block map: " + s.ToString()));
      map_complete_ = false;
    }
    for (const auto& [id, count] : deleting_versions) {
      Add(AtDevice(Severity::kWarning, "device-deleting", id,
                   "device " + Str(id) + " is being deleted: " + Str(count) +
                       " versions await the collector"));
    }
    return Status::Ok();
  }

  // ---- Reference counts ----------------------------------------------------
  Status CheckRefcounts() {
    Result<std::vector<std::pair<PoolBlock, uint32_t>>> stored = store_->ListRefcounts();
    if (!stored.ok()) {
      if (!stored.status().IsCorruption()) return stored.status();
      Add(Plain(Severity::kError, "refcount-table-unreadable",
                "refcounts: " + stored.status().ToString()));
      return Status::Ok();
    }
    std::unordered_map<uint64_t, uint32_t> have;
    for (const auto& [block, count] : *stored) {
      ++r_->refcount_entries;
      const uint64_t b = block.value;
      const std::string what = "refcount of pool block " + Str(b);
      if (b >= blocks_) {
        CheckFinding f = AtBlock(Severity::kError, "refcount-outside-data-area", b,
                                 what + ": beyond the data area (" + Str(blocks_) + " blocks)");
        f.repair = Fix("dropped the " + what + " (outside the data area)");
        if (!f.repair.empty()) fix_.refcounts.emplace_back(block, 0);
        Add(std::move(f));
        continue;
      }
      have[b] = count;
      if (!map_complete_) continue;  // the true counts are unknown
      if (refs_[b] < 2) {
        CheckFinding f = AtBlock(Severity::kError, "refcount-stale", b,
                                 what + " is " + Str(count) + " but " + Str(refs_[b]) +
                                     " version(s) name the block (entries exist only for "
                                     "blocks named by two or more)" + SkippedNote());
        f.repair = Fix("dropped the " + what + " (was " + Str(count) + ", " + Str(refs_[b]) +
                       " reference(s))");
        if (!f.repair.empty()) fix_.refcounts.emplace_back(block, 0);
        Add(std::move(f));
      } else if (count != refs_[b]) {
        CheckFinding f = AtBlock(Severity::kError, "refcount-wrong", b,
                                 what + " is " + Str(count) + " but " + Str(refs_[b]) +
                                     " versions name the block" + SkippedNote());
        f.repair = Fix("set the " + what + " from " + Str(count) + " to " + Str(refs_[b]));
        if (!f.repair.empty()) fix_.refcounts.emplace_back(block, refs_[b]);
        Add(std::move(f));
      }
    }
    if (!map_complete_ || r_->shared_blocks == 0) return Status::Ok();

    // Second pass over the versions of shared blocks: where the uncounted
    // ones are, and whether in-place writes are fenced off.
    std::map<uint64_t, std::vector<std::string>> uncounted;
    for (uint64_t b = 0; b < blocks_; ++b) {
      if (refs_[b] >= 2 && !have.count(b)) uncounted[b];
    }
    // Skips the undecodable records again (reported by ScanMap).
    std::unique_ptr<MapIterator> it =
        store_->NewMapIteratorSkippingDamaged([](const DamagedMapRecord&) {});
    for (it->Seek(VolumeId(0), VolumeBlock(0)); it->Valid(); it->Next()) {
      const MapEntry& e = it->entry();
      if (Classify(e, /*report=*/false) != Fate::kKeep || e.value.tombstone()) continue;
      const uint64_t b = e.value.block.value;
      if (refs_[b] < 2) continue;
      auto u = uncounted.find(b);
      if (u != uncounted.end() && u->second.size() < kMaxLocations) u->second.push_back(Where(e));
      auto d = devices_.find(e.device.value);
      if (d != devices_.end() && e.epoch == d->second.epoch &&
          !(d->second.flags & DeviceRecord::kDeleting) &&
          !(e.value.flags & MapValue::kMaybeShared)) {
        CheckFinding f = AtEntry(Severity::kError, "shared-version-not-flagged", e,
                                 "block map: " + Where(e) + " maps pool block " + Str(b) +
                                     ", which " + Str(refs_[b]) +
                                     " versions name, without the maybe-shared flag (a write "
                                     "would change the block in place for all of them)");
        f.repair = Fix("flagged the version " + Where(e) + " maybe-shared");
        if (!f.repair.empty()) {
          MapEntry flagged = e;
          flagged.value.flags |= MapValue::kMaybeShared;
          fix_.put_mappings.push_back(flagged);
        }
        Add(std::move(f));
      }
    }
    if (Status s = it->status(); !s.ok()) return s;  // read fine the first time
    for (const auto& [b, where] : uncounted) {
      std::string list;
      for (const std::string& w : where) list += (list.empty() ? "" : "; ") + w;
      if (refs_[b] > where.size()) list += "; ...";
      CheckFinding f = AtBlock(Severity::kError, "block-double-mapped", b,
                               "pool block " + Str(b) + " is named by " + Str(refs_[b]) +
                                   " versions (" + list +
                                   ") but has no refcount entry: a write through one would "
                                   "change or free it under the others");
      f.repair = Fix("set the refcount of pool block " + Str(b) + " to " + Str(refs_[b]) +
                     " (the versions now share it copy-on-write)");
      if (!f.repair.empty()) fix_.refcounts.emplace_back(PoolBlock(b), refs_[b]);
      Add(std::move(f));
    }
    return Status::Ok();
  }

  // ---- Mapped-block counts -------------------------------------------------
  // Each live device's mapped_blocks (st_blocks of its file) must equal the
  // blocks it reads from the data area: its [0, size) resolved through its
  // own versions and its parent chain, as the engine counts on every write,
  // discard, resize and clone (older versions a snapshot reads are counted
  // for the snapshot, not for their owner, who reads newer ones). Counted over the map
  // as repair leaves it (PatchedMapIterator), so a version repair turns
  // into a tombstone no longer counts. Hidden and deleting devices are not
  // counted (the collector drops their versions without recounting; no one
  // reads them), nor devices whose chain the checks above found broken (what
  // they read is undefined until that is fixed by hand).
  Status CheckMappedCounts() {
    if (!devices_ok_ || !map_complete_) return Status::Ok();
    ResolvedWalk::DeviceIndex index;
    for (const auto& [id, d] : devices_) index[id] = &d;
    const ResolvedWalk::IteratorFactory patched = [this] {
      return std::make_unique<PatchedMapIterator>(
          store_->NewMapIteratorSkippingDamaged([](const DamagedMapRecord&) {}), &patches_);
    };
    // Every device walks its whole chain: N snapshots of an origin read the
    // origin's entries N times. From a copy in memory (as thinfs list) a
    // step costs nanoseconds, through RocksDB iterators about 0.4 us.
    std::vector<MapEntry> copy;
    ResolvedWalk::IteratorFactory new_iterator = patched;
    if (r_->mappings + patches_.size() <= options_.max_map_entries_in_memory) {
      copy.reserve(r_->mappings + patches_.size());
      std::unique_ptr<MapIterator> it = patched();
      for (it->Seek(VolumeId(0), VolumeBlock(0)); it->Valid(); it->Next()) {
        copy.push_back(it->entry());
      }
      THINFS_RETURN_IF_ERROR(it->status());
      new_iterator = [&copy] { return std::make_unique<VectorMapIterator>(&copy); };
    }
    uint64_t n = 0;
    for (const auto& [id, d] : devices_) {
      Progress("mapped counts", n++, devices_.size());
      if ((d.flags & (DeviceRecord::kHidden | DeviceRecord::kDeleting)) || ChainBroken(d)) {
        continue;
      }
      Result<std::unique_ptr<ResolvedWalk>> walk =
          ResolvedWalk::Create(new_iterator, index, d.id, sb_.block_size);
      if (!walk.ok()) {
        if (walk.status().IsCorruption()) continue;  // a broken chain, reported above
        return walk.status();
      }
      uint64_t mapped = 0;
      while (true) {
        THINFS_ASSIGN_OR_RETURN(std::optional<ResolvedBlock> b, (*walk)->Next());
        if (!b) break;
        ++mapped;
      }
      if (mapped == d.mapped_blocks) continue;
      const char* note = r_->undecodable_mappings == 0
                             ? ""
                             : " (undecodable block-map records counted as the tombstones "
                               "repair makes them)";
      CheckFinding f = AtDevice(Severity::kError, "device-mapped-blocks-wrong", id,
                                DeviceName(d) + ": mapped_blocks is " + Str(d.mapped_blocks) +
                                    " but it reads " + Str(mapped) +
                                    " blocks from the data area" + note);
      f.repair = Fix("set the mapped_blocks of " + DeviceName(d) + " from " +
                     Str(d.mapped_blocks) + " to " + Str(mapped));
      if (!f.repair.empty()) {
        DeviceRecord fixed = d;
        fixed.mapped_blocks = mapped;
        fix_.put_devices.push_back(fixed);
      }
      Add(std::move(f));
    }
    return Status::Ok();
  }

  // Whether d or an ancestor has a parent problem reported above.
  bool ChainBroken(const DeviceRecord& d) const {
    const DeviceRecord* at = &d;
    for (size_t steps = 0; steps <= devices_.size(); ++steps) {
      if (bad_chain_.count(at->id.value)) return true;
      if (!at->has_parent) return false;
      auto p = devices_.find(at->parent.value);
      if (p == devices_.end()) return true;
      at = &p->second;
    }
    return true;  // a cycle
  }

  void Patch(const MapEntry& e, std::optional<MapValue> value) {
    patches_[KeyOf(e)] = {e, value};
  }

  // ---- Space map -----------------------------------------------------------
  void CheckSpaceMap() {
    if (space_ == nullptr || !map_complete_) return;
    if (!space_->was_clean()) {
      Add(Plain(Severity::kWarning, "space-map-unclean",
                "space map was not closed cleanly: it may count leaked blocks as used"));
      if (repair_) rebuild_ = true;
    }
    std::string named;
    size_t n_named = 0;
    for (uint64_t b = 0; b < blocks_; ++b) {
      if (b % (kProgressEvery * 16) == 0) Progress("space map", b, blocks_);
      if (refs_[b] == 0 && space_->IsAllocated(PoolBlock(b))) {
        ++r_->leaked_blocks;
        if (n_named++ < kMaxLeaksNamed) named += (named.empty() ? "" : " ") + Str(b);
      }
    }
    if (r_->leaked_blocks == 0) return;
    if (r_->leaked_blocks > kMaxLeaksNamed) named += " ...";
    CheckFinding f = Plain(Severity::kWarning, "leaked-blocks",
                           Str(r_->leaked_blocks) +
                               " blocks are allocated in the space map but named by no version "
                               "(leaked, reclaimable): " + named + SkippedNote());
    f.repair = Fix("reclaimed " + Str(r_->leaked_blocks) + " leaked blocks (space map rebuilt)");
    if (repair_) {
      rebuild_ = true;
      r_->reclaimed_blocks = r_->leaked_blocks;
    }
    Add(std::move(f));
  }

  // ---- Repair --------------------------------------------------------------
  Status Apply() {
    uint64_t tid = sb_.transaction_id;
    if (!fix_.empty() || fix_next_device_id_) {
      Superblock sb = sb_;
      sb.transaction_id++;
      if (fix_next_device_id_) sb.next_device_id = std::max(sb.next_device_id, next_device_id_);
      fix_.superblock = sb;
      THINFS_RETURN_IF_ERROR(store_->Commit(fix_, /*sync=*/true));
      tid = sb.transaction_id;
    }
    if (space_ == nullptr) return Status::Ok();
    if (!map_complete_ || !(rebuild_ || mappings_changed_)) {
      if (tid == sb_.transaction_id) return Status::Ok();
      // Nothing to rebuild, but the bitmap's generation must follow the
      // repair's commit (a clean bitmap behind the metadata reads as stale).
      THINFS_RETURN_IF_ERROR(space_->MarkDirty());
      THINFS_RETURN_IF_ERROR(space_->Sync(tid));
      return space_->MarkClean(tid);
    }
    // Rebuild from the repaired block map: exactly the named blocks.
    THINFS_RETURN_IF_ERROR(space_->MarkDirty());
    space_->ClearAllForRebuild();
    std::unique_ptr<MapIterator> it = store_->NewMapIterator();
    uint64_t n = 0;
    for (it->Seek(VolumeId(0), VolumeBlock(0)); it->Valid(); it->Next()) {
      const MapEntry& e = it->entry();
      if (++n % kProgressEvery == 0) Progress("rebuild space map", n, r_->mappings);
      if (e.value.tombstone() || e.value.block.value >= blocks_) continue;
      space_->MarkUsed(e.value.block);
    }
    THINFS_RETURN_IF_ERROR(it->status());
    THINFS_RETURN_IF_ERROR(space_->Sync(tid));
    return space_->MarkClean(tid);
  }

  MetadataStore* const store_;
  SpaceMap* space_;
  const CheckOptions& options_;
  const bool repair_;
  CheckReport* const r_;

  Superblock sb_;
  uint64_t blocks_ = 0;
  bool devices_ok_ = false;
  std::map<uint64_t, DeviceRecord> devices_;
  // Devices with a parent problem (missing, future epoch, deleting, cycle).
  std::set<uint64_t> bad_chain_;
  // The block-map changes repair makes (or would make), by key.
  MapPatches patches_;
  bool map_complete_ = true;
  // Versions naming each data block (saturating), after repair's drops.
  std::vector<uint32_t> refs_;

  MetaBatch fix_;
  bool fix_next_device_id_ = false;
  uint64_t next_device_id_ = 0;
  bool mappings_changed_ = false;
  bool rebuild_ = false;
};

}  // namespace

Result<CheckReport> CheckPool(MetadataStore* store, SpaceMap* space, const CheckOptions& options) {
  CheckReport report;
  {
    Checker c(store, space, options, options.repair, &report);
    THINFS_RETURN_IF_ERROR(c.Run());
  }
  if (!options.repair) {
    report.errors_left = report.error_count;
    return report;
  }
  CheckReport again;
  CheckOptions verify = options;
  verify.repair = false;
  Checker c(store, space, verify, /*repair=*/false, &again);
  THINFS_RETURN_IF_ERROR(c.Run());
  report.errors_left = again.error_count;
  for (CheckFinding& f : again.findings) {
    if (f.severity == Severity::kError) report.remaining.push_back(std::move(f));
  }
  return report;
}

}  // namespace thinfs::meta
