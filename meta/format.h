// On-disk formats of a thinfs pool. Every byte that reaches the disk is
// described here, once. All integers are little-endian unless a section
// says otherwise (RocksDB keys are big-endian so that they sort).

#ifndef THINFS_META_FORMAT_H_
#define THINFS_META_FORMAT_H_

#include <cstdint>

namespace thinfs::meta {

// ===================== Bitmap file (pool/bitmap) =====================
// (section owned by meta/bitmap_space_map)
//
// The allocation bitmap, 1 bit per data block, mmapped MAP_SHARED by
// meta::BitmapSpaceMap.
//
// Layout:
//   [0, 4096)        header page: a BitmapHeaderDisk at offset 0, then
//                    zeros up to 4096 (reserved; must be zero in version 1
//                    and covered by the header checksum).
//   [4096, 4096 + 8 * ceil(nr_blocks / 64))
//                    body: 64-bit little-endian words. Bit j of word i
//                    (value (word >> j) & 1) is data block 64 * i + j; 1 means
//                    used or waiting for its free to commit, 0 means free.
//                    Equivalently, bit b of body byte k is block 8 * k + b.
//                    Padding bits past nr_blocks in the last word are 0 and
//                    never mean anything.
//   The file may be longer than that (an interrupted grow extends the file
//   before it rewrites the header); the extra bytes are ignored. A shorter
//   file is corrupt.
//
// Header fields (all integers little-endian, offsets in bytes):
//   0  magic            kBitmapMagic, the bytes "THINBMP1".
//   8  format_version   kBitmapFormatVersion (1). Another version is refused.
//   12 incompat_flags   Features a reader must understand to use the file.
//                       None are defined in version 1; any set bit outside
//                       kBitmapIncompatSupported makes Open refuse the file.
//   16 block_size       Data block size in bytes; must equal the superblock's.
//   24 nr_blocks        Data blocks covered; must equal the superblock's.
//   32 generation       Metadata commit generation whose allocation state
//                       was last made durable (Sync) or at clean shutdown.
//   40 clean            1 after a clean shutdown, 0 while a writer has the
//                       pool open. Any other value is corrupt.
//   44 reserved         Zero.
//   48 body_checksum    XXH64 (seed 0) over the body bytes (exactly
//                       8 * ceil(nr_blocks / 64) of them). Meaningful only
//                       when clean == 1; a dirty body changes under the
//                       writer's feet, so it is not checked then.
//   56 header_checksum  XXH64 (seed 0) over the whole 4096-byte header page
//                       with this field set to zero.
//
// Crash semantics: bits are set in the mapping before a block is used and
// cleared only after the metadata commit that freed it is durable, so the
// body may over-report after a crash, never under-report (DESIGN.md
// invariant 6).

inline constexpr uint64_t kBitmapMagic = 0x31504d424e494854ULL;  // "THINBMP1" on disk
inline constexpr uint32_t kBitmapFormatVersion = 1;
inline constexpr uint32_t kBitmapIncompatSupported = 0;
inline constexpr uint64_t kBitmapHeaderSize = 4096;
inline constexpr uint64_t kBitmapChecksumSeed = 0;

// Disk image of the bitmap header. Fields hold little-endian values: encode
// and decode through meta/bitmap_space_map.cc, never use them directly.
struct BitmapHeaderDisk {
  uint64_t magic;
  uint32_t format_version;
  uint32_t incompat_flags;
  uint64_t block_size;
  uint64_t nr_blocks;
  uint64_t generation;
  uint32_t clean;
  uint32_t reserved;
  uint64_t body_checksum;
  uint64_t header_checksum;
};
static_assert(sizeof(BitmapHeaderDisk) == 64);
// Field offsets are asserted in meta/bitmap_space_map.cc.
static_assert(sizeof(BitmapHeaderDisk) <= kBitmapHeaderSize);

// Bytes of body for `nr_blocks` blocks: whole 64-bit words.
inline constexpr uint64_t BitmapBodyBytes(uint64_t nr_blocks) { return (nr_blocks + 63) / 64 * 8; }


// ======================== RocksDB (pool/meta/) ========================
// (section owned by meta/rocksdb_store)

}  // namespace thinfs::meta

#endif  // THINFS_META_FORMAT_H_
