#include "core/mem_space_map.h"

#include <string>

#include "core/check.h"

namespace thinfs {

MemSpaceMap::MemSpaceMap(uint64_t blocks)
    : blocks_(blocks), used_(blocks, false), durable_(blocks, false) {}

Result<PoolBlock> MemSpaceMap::Allocate() {
  MutexLock l(&mu_);
  return AllocateLocked();
}

Result<PoolBlock> MemSpaceMap::AllocateLocked() {
  if (used_count_ == blocks_) return Status::NoSpace("no free block");
  for (uint64_t i = 0; i < blocks_; ++i) {
    uint64_t b = (cursor_ + i) % blocks_;
    if (!used_[b]) {
      used_[b] = true;
      ++used_count_;
      cursor_ = b + 1;
      return PoolBlock(b);
    }
  }
  return Status::NoSpace("no free block");
}

Result<PoolBlock> MemSpaceMap::AllocateRun(uint64_t max, uint64_t* count) {
  THINFS_CHECK(max >= 1);
  MutexLock l(&mu_);
  THINFS_ASSIGN_OR_RETURN(PoolBlock first, AllocateLocked());
  uint64_t end = first.value + 1;
  while (end < blocks_ && end - first.value < max && !used_[end]) {
    used_[end] = true;
    ++used_count_;
    ++end;
  }
  if (end > first.value + 1) cursor_ = end;
  *count = end - first.value;
  return first;
}

void MemSpaceMap::Unallocate(PoolBlock first, uint64_t count) {
  MutexLock l(&mu_);
  THINFS_CHECK(count <= blocks_ && first.value <= blocks_ - count);
  for (uint64_t b = first.value; b < first.value + count; ++b) {
    THINFS_CHECK(used_[b]);
    for (PoolBlock p : pending_) THINFS_CHECK(p.value != b);  // queued by Free()
    used_[b] = false;
    --used_count_;
  }
  if (cursor_ == first.value + count) cursor_ = first.value;
}

void MemSpaceMap::Free(PoolBlock block) {
  MutexLock l(&mu_);
  THINFS_CHECK(block.value < blocks_ && used_[block.value]);
  pending_.push_back(block);
}

std::vector<PoolBlock> MemSpaceMap::TakePendingFrees() {
  MutexLock l(&mu_);
  std::vector<PoolBlock> out;
  out.swap(pending_);
  return out;
}

void MemSpaceMap::Release(const std::vector<PoolBlock>& blocks) {
  MutexLock l(&mu_);
  for (PoolBlock b : blocks) {
    THINFS_CHECK(used_[b.value]);
    used_[b.value] = false;
    --used_count_;
  }
}

Status MemSpaceMap::Sync(uint64_t /*generation*/) {
  MutexLock l(&mu_);
  if (fail_next_sync_) {
    fail_next_sync_ = false;
    return Status::IOError("injected bitmap sync failure");
  }
  durable_ = used_;
  return Status::Ok();
}

void MemSpaceMap::MarkUsed(PoolBlock block) {
  MutexLock l(&mu_);
  THINFS_CHECK(block.value < blocks_);
  if (!used_[block.value]) {
    used_[block.value] = true;
    ++used_count_;
  }
}

void MemSpaceMap::ClearAllForRebuild() {
  MutexLock l(&mu_);
  used_.assign(blocks_, false);
  used_count_ = 0;
  pending_.clear();
}

bool MemSpaceMap::was_clean() const {
  MutexLock l(&mu_);
  return clean_;
}

Status MemSpaceMap::MarkDirty() {
  MutexLock l(&mu_);
  durable_clean_ = false;
  return Status::Ok();
}

Status MemSpaceMap::MarkClean(uint64_t /*generation*/) {
  MutexLock l(&mu_);
  durable_ = used_;
  durable_clean_ = true;
  return Status::Ok();
}

bool MemSpaceMap::IsAllocated(PoolBlock block) const {
  MutexLock l(&mu_);
  return block.value < blocks_ && used_[block.value];
}

Status MemSpaceMap::Grow(uint64_t new_blocks) {
  MutexLock l(&mu_);
  if (new_blocks < blocks_) {
    return Status::InvalidArgument("space map cannot shrink from " + std::to_string(blocks_) +
                                   " to " + std::to_string(new_blocks) + " blocks");
  }
  // Growth is durable at once, like the bitmap's (its header is synced).
  used_.resize(new_blocks, false);
  durable_.resize(new_blocks, false);
  blocks_ = new_blocks;
  return Status::Ok();
}

uint64_t MemSpaceMap::total_blocks() const {
  MutexLock l(&mu_);
  return blocks_;
}

uint64_t MemSpaceMap::free_blocks() const {
  MutexLock l(&mu_);
  return blocks_ - used_count_;
}

void MemSpaceMap::DropUnsynced() {
  MutexLock l(&mu_);
  used_ = durable_;
  used_count_ = 0;
  for (bool b : used_) used_count_ += b ? 1 : 0;
  pending_.clear();
  clean_ = durable_clean_;
}

void MemSpaceMap::FailNextSync() {
  MutexLock l(&mu_);
  fail_next_sync_ = true;
}

}  // namespace thinfs
