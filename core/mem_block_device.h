// MemBlockDevice: a BlockDevice in memory, for tests.
//
// Sparse: only written blocks take memory; never-written (or discarded)
// bytes read as zeros. SparseBlockImage is the unsynchronised store it is
// built on, shared with FaultInjectionBlockDevice.
//
// Thread safety: MemBlockDevice's methods may be called concurrently.
// SparseBlockImage is a value with no synchronisation of its own.

#ifndef THINFS_CORE_MEM_BLOCK_DEVICE_H_
#define THINFS_CORE_MEM_BLOCK_DEVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/block_device.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs {

// Block number -> block contents; absent blocks are all zeros.
class SparseBlockImage {
 public:
  explicit SparseBlockImage(uint64_t block_size) : block_size_(block_size) {}

  // REQUIRES: offset + buf.size() <= block_size.
  void Read(uint64_t block, uint64_t offset, std::span<std::byte> buf) const;
  void Write(uint64_t block, uint64_t offset, std::span<const std::byte> buf);
  // Forgets `count` blocks from `block`: they read as zeros again.
  void Discard(uint64_t block, uint64_t count);
  // Number of blocks holding data.
  size_t resident_blocks() const { return blocks_.size(); }

 private:
  uint64_t block_size_;
  std::unordered_map<uint64_t, std::vector<std::byte>> blocks_;
};

class MemBlockDevice final : public BlockDevice {
 public:
  explicit MemBlockDevice(const Geometry& geometry)
      : geometry_(geometry), data_blocks_(geometry.data_blocks()), image_(geometry.block_size()) {}
  MemBlockDevice(const MemBlockDevice&) = delete;
  MemBlockDevice& operator=(const MemBlockDevice&) = delete;

  // BlockDevice. Out-of-range block or byte ranges are bugs (THINFS_CHECK).
  // Always return OK: memory does not fail.
  Status Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf) override;
  Status Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf) override;
  // Nothing to make durable.
  Status Sync() override;
  // Drops the blocks: they read as zeros afterwards.
  Status Discard(PoolBlock block, uint64_t count) override;
  // Raises the addressable block count; never fails for a larger count.
  Status Grow(uint64_t new_data_blocks) override;
  const Geometry& geometry() const override { return geometry_; }

  // Number of blocks holding data (discarded and never-written ones don't).
  size_t resident_blocks() const;

 private:
  // Constant after construction.
  const Geometry geometry_;

  // Addressable blocks; atomic so that the range checks take no lock.
  std::atomic<uint64_t> data_blocks_;

  mutable Mutex mu_;
  SparseBlockImage image_ GUARDED_BY(mu_);
};

}  // namespace thinfs

#endif  // THINFS_CORE_MEM_BLOCK_DEVICE_H_
