// Resolved mappings of devices, read from the committed block map with one
// ordered iterator per level of a device's parent chain, and the merge of
// two such walks into the ranges where two devices differ (thinfs diff,
// send --from, list).
//
// A device D reads block b from its newest own version at or below its
// epoch; failing that from its parent at parent_epoch (below parent_limit),
// and so on up the chain (core/pool.h). ResolvedWalk does the same for all
// blocks at once: it keeps a MapIterator per chain level, all advancing in
// vblock order, and at each vblock takes the answer of the nearest level.
// Cost: O(entries of the devices in the chain), no per-block point lookup.
//
// The walk sees the store's committed state only: callers commit first (or
// read a checkpoint). Thread safety: a walk is used by one thread; any
// number of walks may run concurrently over one store.

#ifndef THINFS_CORE_RESOLVED_WALK_H_
#define THINFS_CORE_RESOLVED_WALK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/metadata.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs {

// One block a device reads from the data area.
struct ResolvedBlock {
  uint64_t vblock = 0;
  VolumeId owner;  // device whose version answers
  Epoch epoch = 0;
  PoolBlock block;
  uint8_t flags = 0;  // MapValue flags of the answering version
};

class ResolvedWalk {
 public:
  // Walks device `id` of `devices` (all records, hidden ones included, as
  // MetadataStore::LoadDevices returns them) over blocks [0, BlocksFor(size)).
  // kNotFound when `id` is not a record, kCorruption for a broken chain.
  static Result<std::unique_ptr<ResolvedWalk>> Create(MetadataStore* store,
                                                      const std::vector<DeviceRecord>& devices,
                                                      VolumeId id, uint64_t block_size);
  // The same over iterators from `new_iterator` (e.g. over a copy of the
  // map in memory, core/usage_scan.cc) and a prebuilt index of the
  // records (IndexDevices), for callers that walk many devices.
  using IteratorFactory = std::function<std::unique_ptr<MapIterator>()>;
  using DeviceIndex = std::unordered_map<uint64_t, const DeviceRecord*>;
  static DeviceIndex IndexDevices(const std::vector<DeviceRecord>& devices);
  static Result<std::unique_ptr<ResolvedWalk>> Create(const IteratorFactory& new_iterator,
                                                      const DeviceIndex& devices, VolumeId id,
                                                      uint64_t block_size);
  ~ResolvedWalk();
  ResolvedWalk(const ResolvedWalk&) = delete;
  ResolvedWalk& operator=(const ResolvedWalk&) = delete;

  // The next mapped block in increasing vblock order (tombstones and
  // unmapped blocks are skipped), or nullopt at the end. kIOError /
  // kCorruption from the store.
  Result<std::optional<ResolvedBlock>> Next();

 private:
  struct Level;
  ResolvedWalk() = default;
  Status Settle(Level* level);
  std::vector<Level> levels_;
};

// How a range compares between a left and a right device (thin_delta).
enum class DiffKind : uint8_t {
  kSame,       // both read the same data block
  kDifferent,  // both mapped, to different data blocks
  kLeftOnly,   // mapped on the left only (the right reads zeros)
  kRightOnly,  // mapped on the right only
};

const char* DiffKindName(DiffKind kind);

struct DiffRange {
  uint64_t begin = 0;  // first block
  uint64_t end = 0;    // one past the last block
  DiffKind kind = DiffKind::kSame;
};

// Calls `emit` for the maximal ranges of one kind, in block order, where at
// least one side is mapped (blocks unmapped on both sides are skipped). With
// `include_same` false, kSame ranges are not reported. A non-OK status from
// `emit` stops the walk and is returned.
Status DiffWalks(ResolvedWalk* left, ResolvedWalk* right, bool include_same,
                 const std::function<Status(const DiffRange&)>& emit);

}  // namespace thinfs

#endif  // THINFS_CORE_RESOLVED_WALK_H_
