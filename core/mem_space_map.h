// MemSpaceMap: an in-memory SpaceMap for engine tests, with power-loss
// simulation: the "durable" image is what the last Sync() (or MarkClean)
// wrote; DropUnsynced() reverts to it, like a crash losing unsynced pages.
//
// Unlike the mmapped bitmap, nothing reaches the durable image on its own,
// so tests see the worst case the commit protocol allows.
//
// Thread safety: all methods may be called concurrently.

#ifndef THINFS_CORE_MEM_SPACE_MAP_H_
#define THINFS_CORE_MEM_SPACE_MAP_H_

#include <vector>

#include "core/mutex.h"
#include "core/space_map.h"

namespace thinfs {

class MemSpaceMap final : public SpaceMap {
 public:
  explicit MemSpaceMap(uint64_t blocks);

  Result<PoolBlock> Allocate() override;
  Result<PoolBlock> AllocateRun(uint64_t max, uint64_t* count) override;
  void Unallocate(PoolBlock first, uint64_t count) override;
  void Free(PoolBlock block) override;
  std::vector<PoolBlock> TakePendingFrees() override;
  void Release(const std::vector<PoolBlock>& blocks) override;
  Status Sync(uint64_t generation) override;
  void MarkUsed(PoolBlock block) override;
  void ClearAllForRebuild() override;
  bool was_clean() const override;
  Status MarkDirty() override;
  Status MarkClean(uint64_t generation) override;
  bool IsAllocated(PoolBlock block) const override;
  Status Grow(uint64_t new_blocks) override;
  uint64_t total_blocks() const override;
  uint64_t free_blocks() const override;

  // Simulates power loss and a fresh open: the in-memory state becomes the
  // durable image; pending frees are forgotten; was_clean() tells whether
  // the durable image was marked clean.
  void DropUnsynced();
  // Makes the next Sync() fail with kIOError.
  void FailNextSync();

 private:
  Result<PoolBlock> AllocateLocked() REQUIRES(mu_);

  mutable Mutex mu_;
  uint64_t blocks_ GUARDED_BY(mu_);
  std::vector<bool> used_ GUARDED_BY(mu_);
  std::vector<bool> durable_ GUARDED_BY(mu_);
  std::vector<PoolBlock> pending_ GUARDED_BY(mu_);
  uint64_t used_count_ GUARDED_BY(mu_) = 0;
  uint64_t cursor_ GUARDED_BY(mu_) = 0;
  bool clean_ GUARDED_BY(mu_) = true;          // as found at "open"
  bool durable_clean_ GUARDED_BY(mu_) = true;  // the durable flag
  bool fail_next_sync_ GUARDED_BY(mu_) = false;
};

}  // namespace thinfs

#endif  // THINFS_CORE_MEM_SPACE_MAP_H_
