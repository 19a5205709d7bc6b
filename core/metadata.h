// MetadataStore: the persistent half of the pool's metadata, as the engine
// sees it. meta::RocksDbStore implements it on RocksDB; MemMetadataStore
// (core/mem_metadata.h) in memory for tests.
//
// The store holds:
//   - the superblock (geometry, uuid, creation time, transaction id),
//   - the device table (DeviceRecord per thin device),
//   - the block map: versioned entries (device, vblock, epoch) -> MapValue,
//   - shared-block reference counts: PoolBlock -> count, present only for
//     blocks referenced by two or more versions (range sharing).
//
// The engine never writes piecemeal: it collects a MetaBatch and hands it
// to Commit(), which applies it atomically. With sync=true, Commit() is the
// durability point of the commit protocol (core/transaction.h). Reads see
// exactly the committed state.
//
// Thread safety: all methods may be called concurrently; Commit() calls
// are serialised by the caller.

#ifndef THINFS_CORE_METADATA_H_
#define THINFS_CORE_METADATA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace thinfs {

inline constexpr uint64_t kSuperblockMagic = 0x3153464e494854ULL;  // "THINFS1"
inline constexpr uint32_t kFormatVersion = 1;

struct Superblock {
  uint64_t magic = kSuperblockMagic;
  uint32_t format_version = kFormatVersion;
  uint8_t uuid[16] = {};
  uint64_t block_size = kDefaultBlockSize;
  uint64_t data_blocks = 0;
  int64_t created_ns = 0;        // CLOCK_REALTIME
  uint64_t transaction_id = 0;   // incremented by every commit
  uint64_t next_device_id = 1;   // ids are never reused
  uint64_t flags = 0;            // reserved, zero

  bool operator==(const Superblock&) const = default;
};

// A thin device (volume or snapshot).
struct DeviceRecord {
  enum Flags : uint32_t {
    // Deleted by the user but some descendant still reads through it: not
    // listed, not openable, collected when its last child goes.
    kHidden = 1u << 0,
    // Every version is garbage: the collector removes them, then the record.
    kDeleting = 1u << 1,
    // Some versions may have become unreachable (a child went away, the
    // device was hidden): the collector scans the device.
    kGcPending = 1u << 2,
    // Unlinked while open: no name, still usable by open handles; deleted
    // at the last close or, after a crash, at the next open.
    kDetached = 1u << 3,
  };

  VolumeId id;
  std::string name;        // empty for hidden/deleting devices' old names
  uint64_t size = 0;       // virtual size in bytes
  Epoch epoch = 0;         // current epoch; new versions are stamped with it
  bool has_parent = false;
  VolumeId parent;         // valid when has_parent
  Epoch parent_epoch = 0;  // reads fall through to parent at this epoch
  // Blocks at or beyond this never fall through to the parent (they read
  // zeros unless the device has its own version): how shrinking and
  // partial clones hide the parent's tail in O(1).
  uint64_t parent_limit = UINT64_MAX;
  uint32_t flags = 0;
  uint32_t mode = 0100644;
  uint32_t uid = 0;
  uint32_t gid = 0;
  int64_t created_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  int64_t atime_ns = 0;
  uint64_t mapped_blocks = 0;  // visible blocks backed by the data area

  bool operator==(const DeviceRecord&) const = default;
};

// What a block-map version says about a block.
struct MapValue {
  enum Flags : uint8_t {
    // The block reads as zeros at this version (hides older versions and the
    // parent). `block` is meaningless.
    kTombstone = 1u << 0,
    // The block may be referenced by other versions: consult the refcount
    // table before writing it in place.
    kMaybeShared = 1u << 1,
  };
  PoolBlock block;
  uint8_t flags = 0;

  bool tombstone() const { return flags & kTombstone; }
  bool operator==(const MapValue&) const = default;
};

struct Version {
  Epoch epoch = 0;
  MapValue value;
  bool operator==(const Version&) const = default;
};

// One block-map entry as iterated.
struct MapEntry {
  VolumeId device;
  VolumeBlock vblock;
  Epoch epoch = 0;
  MapValue value;
  bool operator==(const MapEntry&) const = default;
};

// Edits applied atomically by MetadataStore::Commit.
struct MetaBatch {
  std::optional<Superblock> superblock;
  std::vector<DeviceRecord> put_devices;
  std::vector<VolumeId> delete_devices;
  std::vector<MapEntry> put_mappings;
  struct MappingKey {
    VolumeId device;
    VolumeBlock vblock;
    Epoch epoch;
  };
  std::vector<MappingKey> delete_mappings;
  // count >= 2 puts, count <= 1 deletes the entry.
  std::vector<std::pair<PoolBlock, uint32_t>> refcounts;
  // Block-map records to delete by their stored key, as
  // DamagedMapRecord::raw_key gave it (check --repair: records whose key
  // does not decode). A store that cannot hold such records ignores them.
  std::vector<std::string> delete_raw_map_keys;

  bool empty() const {
    return !superblock && put_devices.empty() && delete_devices.empty() &&
           put_mappings.empty() && delete_mappings.empty() && refcounts.empty() &&
           delete_raw_map_keys.empty();
  }
};

// Iterates block-map entries in (device, vblock, newest epoch first) order.
class MapIterator {
 public:
  virtual ~MapIterator() = default;
  virtual bool Valid() const = 0;
  virtual const MapEntry& entry() const = 0;
  virtual void Next() = 0;
  // Positions at the first entry >= (device, vblock, newest epoch).
  virtual void Seek(VolumeId device, VolumeBlock vblock) = 0;
  // OK unless the iteration hit an error (kIOError/kCorruption).
  virtual Status status() const = 0;
};

// A block-map record that cannot be decoded, as
// MetadataStore::NewMapIteratorSkippingDamaged reports it.
struct DamagedMapRecord {
  std::string raw_key;       // the key as stored
  bool key_decoded = false;  // the key is well formed: device, vblock and
  VolumeId device;           // epoch are valid (only the value is damaged)
  VolumeBlock vblock;
  Epoch epoch = 0;
  Status why;                // kCorruption naming the record
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;

  // Returns kCorruption when the record is damaged.
  virtual Result<Superblock> ReadSuperblock() = 0;

  // Every device record, in id order.
  virtual Result<std::vector<DeviceRecord>> LoadDevices() = 0;

  // The newest version of (device, vblock) with epoch <= max_epoch, or
  // nullopt when there is none.
  virtual Result<std::optional<Version>> FindVersion(VolumeId device, VolumeBlock vblock,
                                                     Epoch max_epoch) = 0;

  // Every version of (device, vblock), newest first.
  virtual Result<std::vector<Version>> ListVersions(VolumeId device, VolumeBlock vblock) = 0;

  // The reference count of `block`: 0 or 1 when no entry exists (the caller
  // knows which), else the stored count.
  virtual Result<uint32_t> GetRefcount(PoolBlock block) = 0;

  // Every refcount entry (check, recovery).
  virtual Result<std::vector<std::pair<PoolBlock, uint32_t>>> ListRefcounts() = 0;

  // Iterator over the committed block map, positioned before the first
  // entry; call Seek() first.
  virtual std::unique_ptr<MapIterator> NewMapIterator() = 0;

  // For `thinfs check` only (the engine must stop at damage): like
  // NewMapIterator, but a record whose key or value cannot be decoded does
  // not end the iteration. Each is passed to `on_damaged` (during Seek or
  // Next) and skipped. Seek(VolumeId(0), VolumeBlock(0)) starts before
  // every record, malformed keys included. Failures below the records
  // (kIOError, or kCorruption the store's own checksums report) still end
  // the iteration through status(): nothing past them can be trusted.
  // The default suits stores that cannot hold undecodable records.
  virtual std::unique_ptr<MapIterator> NewMapIteratorSkippingDamaged(
      std::function<void(const DamagedMapRecord&)> on_damaged) {
    (void)on_damaged;
    return NewMapIterator();
  }

  // Applies `batch` atomically; with `sync`, durably (fsync of the log).
  // Returns kIOError; after a failure the store may refuse further commits.
  virtual Status Commit(const MetaBatch& batch, bool sync) = 0;

  // Approximate on-disk bytes of the block map after `compact` (if true,
  // the store compacts first).
  virtual Result<uint64_t> MapBytesOnDisk(bool compact) = 0;
};

}  // namespace thinfs

#endif  // THINFS_CORE_METADATA_H_
