// MappingWalk: what each thin device reads, block by block, from a
// MetadataStore's committed block map, the way dm-thin shows it: a flat
// per-device map vblock -> data block.
//
// The engine stores versions (device, vblock, epoch) and resolves a read
// through the parent chain (core/pool.h). A walk resolves every block of a
// device at once: the device's newest own version at or below its epoch,
// else its parent's at the parent epoch (below the device's parent_limit),
// and so on up the chain; a tombstone reads zeros and hides what is older.
// Blocks shared between devices (snapshots, range clones) appear in the
// walk of each device that reads them, with the same data block.
//
// The walk reads only the committed store, not the engine's uncommitted
// overlay. For a consistent point-in-time view run it over a store nothing
// writes to: an offline pool, or a RocksDB checkpoint of a mounted one
// (RocksDbStore::CheckpointTo, the `checkpoint` control command). Used by
// `thinfs dump`; written to be reused by anything that needs per-device
// mappings (diff, send).
//
// Thread safety: a MappingWalk is immutable after Open(); ForEach() may run
// from several threads at once if the store allows concurrent reads (every
// MetadataStore does).

#ifndef THINFS_CORE_MAPPING_WALK_H_
#define THINFS_CORE_MAPPING_WALK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "core/metadata.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs {

// One block a device reads from the data area.
struct ResolvedMapping {
  VolumeBlock vblock;
  PoolBlock block;
  // The version it comes from: its owner (the device or an ancestor), its
  // epoch and flags (MapValue::kMaybeShared). Never a tombstone.
  VolumeId owner;
  Epoch epoch = 0;
  uint8_t flags = 0;

  bool operator==(const ResolvedMapping&) const = default;
};

class MappingWalk {
 public:
  // Reads the superblock and the device table of `store`. `store` must
  // outlive the walk. Returns the store's errors (kCorruption, kIOError).
  static Result<MappingWalk> Open(MetadataStore* store);

  // Listed by `thinfs list`, openable: not hidden, deleting or detached.
  static bool Visible(const DeviceRecord& d);

  const Superblock& superblock() const { return superblock_; }
  // Every device record, in id order (hidden ones included).
  const std::vector<DeviceRecord>& devices() const { return devices_; }
  // The visible ones, in id order.
  std::vector<const DeviceRecord*> VisibleDevices() const;

  // Calls `fn` for every block in [begin, end) of device `id` that reads
  // from the data area, in vblock order. Blocks at or beyond the device's
  // size are never reported. Stops at and returns the first error `fn`
  // returns. Returns kNotFound for an unknown device, kCorruption when a
  // parent is missing or the chain loops, and the store's iteration errors.
  Status ForEach(VolumeId id, uint64_t begin, uint64_t end,
                 const std::function<Status(const ResolvedMapping&)>& fn) const;
  Status ForEach(VolumeId id, const std::function<Status(const ResolvedMapping&)>& fn) const {
    return ForEach(id, 0, UINT64_MAX, fn);
  }

 private:
  MappingWalk(MetadataStore* store, Superblock sb, std::vector<DeviceRecord> devices);

  MetadataStore* store_;
  Superblock superblock_;
  std::vector<DeviceRecord> devices_;
  std::map<uint64_t, size_t> index_;  // device id -> devices_ index
};

}  // namespace thinfs

#endif  // THINFS_CORE_MAPPING_WALK_H_
