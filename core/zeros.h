// Zero detection: whether a buffer holds only zero bytes.
//
// A whole-block write of zeros unmaps the block instead of provisioning it
// (PoolOptions::zero_detection), so every whole-block write is checked.
// Most blocks that are not zeros show it in their first bytes; a block of
// zeros is read to its end, and that is what has to be fast: mkfs, dd from
// /dev/zero and image copies write whole runs of them.
//
// Thread safety: a pure function.

#ifndef THINFS_CORE_ZEROS_H_
#define THINFS_CORE_ZEROS_H_

#include <cstddef>
#include <span>

namespace thinfs {

// True if every byte of `buf` is zero (also for an empty buf). Any length
// and alignment.
bool IsAllZero(std::span<const std::byte> buf);

}  // namespace thinfs

#endif  // THINFS_CORE_ZEROS_H_
