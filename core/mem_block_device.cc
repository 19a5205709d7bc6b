#include "core/mem_block_device.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace thinfs {

void SparseBlockImage::Read(uint64_t block, uint64_t offset, std::span<std::byte> buf) const {
  THINFS_CHECK(offset <= block_size_ && buf.size() <= block_size_ - offset);
  auto it = blocks_.find(block);
  if (it == blocks_.end()) {
    std::fill(buf.begin(), buf.end(), std::byte{0});
    return;
  }
  std::memcpy(buf.data(), it->second.data() + offset, buf.size());
}

void SparseBlockImage::Write(uint64_t block, uint64_t offset, std::span<const std::byte> buf) {
  THINFS_CHECK(offset <= block_size_ && buf.size() <= block_size_ - offset);
  if (buf.empty()) return;
  std::vector<std::byte>& data = blocks_[block];
  if (data.empty()) data.resize(block_size_);
  std::memcpy(data.data() + offset, buf.data(), buf.size());
}

void SparseBlockImage::Discard(uint64_t block, uint64_t count) {
  // Erasing one key per block would be O(count) for huge ranges of holes;
  // a sweep over the resident blocks is bounded by what was written.
  if (count > blocks_.size()) {
    std::erase_if(blocks_,
                  [&](const auto& kv) { return kv.first >= block && kv.first - block < count; });
    return;
  }
  for (uint64_t i = 0; i < count; ++i) blocks_.erase(block + i);
}

Status MemBlockDevice::Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf) {
  THINFS_CHECK(block.value < data_blocks_.load(std::memory_order_acquire));
  MutexLock l(&mu_);
  image_.Read(block.value, offset, buf);
  return Status::Ok();
}

Status MemBlockDevice::Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf) {
  THINFS_CHECK(block.value < data_blocks_.load(std::memory_order_acquire));
  MutexLock l(&mu_);
  image_.Write(block.value, offset, buf);
  return Status::Ok();
}

Status MemBlockDevice::Sync() { return Status::Ok(); }

Status MemBlockDevice::Discard(PoolBlock block, uint64_t count) {
  THINFS_CHECK(block.value <= data_blocks_.load(std::memory_order_acquire) &&
               count <= data_blocks_.load(std::memory_order_acquire) - block.value);
  MutexLock l(&mu_);
  image_.Discard(block.value, count);
  return Status::Ok();
}

size_t MemBlockDevice::resident_blocks() const {
  MutexLock l(&mu_);
  return image_.resident_blocks();
}

Status MemBlockDevice::Grow(uint64_t new_data_blocks) {
  if (new_data_blocks < data_blocks_.load(std::memory_order_acquire)) {
    return Status::InvalidArgument("the data area cannot shrink");
  }
  data_blocks_.store(new_data_blocks, std::memory_order_release);
  return Status::Ok();
}

}  // namespace thinfs
