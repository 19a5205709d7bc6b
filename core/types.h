// Block vocabulary: strong ids for the two address spaces, epochs, and the
// pool geometry with its power-of-two fast path.
//
// VolumeId names a thin device, VolumeBlock is a block number inside a
// device's virtual address space, PoolBlock a block number in the shared
// data area. They wrap uint64_t so that the two address spaces never mix
// silently.
//
// Thread safety: values; Geometry is immutable after construction.

#ifndef THINFS_CORE_TYPES_H_
#define THINFS_CORE_TYPES_H_

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace thinfs {

template <typename Tag>
struct StrongId {
  uint64_t value = 0;

  constexpr StrongId() = default;
  constexpr explicit StrongId(uint64_t v) : value(v) {}
  constexpr auto operator<=>(const StrongId&) const = default;
};

struct VolumeIdTag {};
struct VolumeBlockTag {};
struct PoolBlockTag {};

using VolumeId = StrongId<VolumeIdTag>;
using VolumeBlock = StrongId<VolumeBlockTag>;
using PoolBlock = StrongId<PoolBlockTag>;

// A device's epoch: incremented each time it is snapshotted. Versions of a
// block are stamped with the epoch they were written in (dm-thin's "time").
using Epoch = uint32_t;

inline constexpr uint64_t kMinBlockSize = 4096;
inline constexpr uint64_t kMaxBlockSize = uint64_t{1} << 30;
inline constexpr uint64_t kDefaultBlockSize = 64 * 1024;

// Block size, data area size and the byte <-> block arithmetic.
//
// Power-of-two block sizes use shifts and masks; others divide. Both are
// kept (DESIGN.md) and the benchmark in bench/ shows what the fast path
// buys. `force_generic` forces the division path for a power-of-two size
// so that the two can be compared on the same pool.
class Geometry {
 public:
  Geometry() = default;
  // REQUIRES: Validate(block_size) is empty.
  Geometry(uint64_t block_size, uint64_t data_blocks, bool force_generic = false);

  // Returns "" when `block_size` is a legal block size, else the reason.
  static const char* Validate(uint64_t block_size);

  uint64_t block_size() const { return block_size_; }
  uint64_t data_blocks() const { return data_blocks_; }
  uint64_t data_bytes() const { return data_blocks_ * block_size_; }
  bool fast_path() const { return shift_ >= 0; }

  uint64_t BlockOf(uint64_t byte_offset) const {
    return shift_ >= 0 ? byte_offset >> shift_ : byte_offset / block_size_;
  }
  uint64_t OffsetInBlock(uint64_t byte_offset) const {
    return shift_ >= 0 ? byte_offset & mask_ : byte_offset % block_size_;
  }
  uint64_t BytesOf(uint64_t blocks) const {
    return shift_ >= 0 ? blocks << shift_ : blocks * block_size_;
  }
  // Number of blocks needed to hold `bytes` bytes (rounds up).
  uint64_t BlocksFor(uint64_t bytes) const {
    return BlockOf(bytes) + (OffsetInBlock(bytes) != 0 ? 1 : 0);
  }

 private:
  uint64_t block_size_ = kDefaultBlockSize;
  uint64_t data_blocks_ = 0;
  int shift_ = -1;
  uint64_t mask_ = 0;
};

}  // namespace thinfs

template <typename Tag>
struct std::hash<thinfs::StrongId<Tag>> {
  size_t operator()(const thinfs::StrongId<Tag>& id) const noexcept {
    return std::hash<uint64_t>()(id.value);
  }
};

#endif  // THINFS_CORE_TYPES_H_
