#include "core/types.h"

#include <bit>

#include "core/check.h"

namespace thinfs {

const char* Geometry::Validate(uint64_t block_size) {
  if (block_size == 0) return "block size must not be zero";
  if (block_size % kMinBlockSize != 0) return "block size must be a multiple of 4 KiB";
  if (block_size > kMaxBlockSize) return "block size must be at most 1 GiB";
  return "";
}

Geometry::Geometry(uint64_t block_size, uint64_t data_blocks, bool force_generic)
    : block_size_(block_size), data_blocks_(data_blocks) {
  THINFS_CHECK(Validate(block_size)[0] == '\0');
  if (!force_generic && std::has_single_bit(block_size)) {
    shift_ = std::countr_zero(block_size);
    mask_ = block_size - 1;
  }
}

}  // namespace thinfs
