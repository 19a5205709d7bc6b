// SpaceMap: which data blocks are in use.
//
// The commit protocol (core/transaction.h) drives it:
//   - Allocate() marks a block used at once (in memory, and in the mmapped
//     bitmap that the kernel may write back at any time: over-reporting is
//     allowed after a crash, under-reporting never is).
//   - Free() only *queues* a block. It stays allocated until the commit
//     that made the metadata change releasing it is durable.
//   - TakePendingFrees() is called by the committer while no metadata change
//     can be in flight; it returns the queued frees that belong to this
//     commit. Sync() then makes the allocation state durable (msync) before
//     the metadata commit, and Release() returns the blocks after it.
//
// Full is an outcome, not a failure: Allocate() returns kNoSpace.
//
// Thread safety: all methods may be called concurrently.

#ifndef THINFS_CORE_SPACE_MAP_H_
#define THINFS_CORE_SPACE_MAP_H_

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace thinfs {

class SpaceMap {
 public:
  virtual ~SpaceMap() = default;

  // Finds a free block, marks it used and returns it. Returns kNoSpace when
  // every block is used or pending free.
  virtual Result<PoolBlock> Allocate() = 0;

  // Takes the block Allocate() would return and the free blocks right after
  // it, up to `max` (≥ 1) in all and not past the end: one write request's
  // new blocks lie together in the data area (docs/benchmarks.md, lever
  // 38). Returns the first block and sets *count to how many were taken
  // (≥ 1). kNoSpace as Allocate().
  virtual Result<PoolBlock> AllocateRun(uint64_t max, uint64_t* count) = 0;

  // Gives back [first, first + count) at once, without a commit: blocks
  // taken by Allocate() or AllocateRun() that no metadata change ever
  // referenced (the unused tail of a run). A bit the bitmap's write-back
  // already carried to disk is over-reporting, which a crash may leave.
  // REQUIRES: every block allocated and none queued by Free().
  virtual void Unallocate(PoolBlock first, uint64_t count) = 0;

  // Queues `block` to be freed by the next commit.
  // REQUIRES: block is allocated and not already queued.
  virtual void Free(PoolBlock block) = 0;

  // Returns (and forgets) the blocks queued by Free() so far.
  virtual std::vector<PoolBlock> TakePendingFrees() = 0;

  // Returns `blocks` to the allocator. Called after the metadata commit that
  // released them is durable.
  virtual void Release(const std::vector<PoolBlock>& blocks) = 0;

  // Makes the allocation state durable (msync of the bitmap) and records
  // the given generation in its header. An implementation may skip the
  // bits when none changed since the last Sync. The generation need not be
  // durable on return (it may lag the metadata after a crash, never lead it
  // by more than the commit in flight). Returns kIOError on failure.
  virtual Status Sync(uint64_t generation) = 0;

  // Marks `block` used without allocating through the search (used by
  // check --repair and recovery when rebuilding from the block map).
  virtual void MarkUsed(PoolBlock block) = 0;

  // Clears every bit (before a rebuild from the block map).
  virtual void ClearAllForRebuild() = 0;

  // Whether the state was closed cleanly (MarkClean) before this open. When
  // not, the engine rebuilds the map from the block map.
  virtual bool was_clean() const = 0;
  // Records durably that the map is in use (and may lag the block map).
  virtual Status MarkDirty() = 0;
  // Records durably a clean close at `generation`.
  virtual Status MarkClean(uint64_t generation) = 0;

  // Adds blocks [total_blocks(), new_blocks), free, and makes the larger
  // size durable before they become allocatable. Returns kInvalidArgument
  // when new_blocks < total_blocks() (a map never shrinks), kReadOnly, or
  // kIOError / kNoSpace when the map cannot grow.
  virtual Status Grow(uint64_t new_blocks) = 0;

  virtual bool IsAllocated(PoolBlock block) const = 0;
  virtual uint64_t total_blocks() const = 0;
  // Blocks neither allocated nor pending free.
  virtual uint64_t free_blocks() const = 0;
};

}  // namespace thinfs

#endif  // THINFS_CORE_SPACE_MAP_H_
