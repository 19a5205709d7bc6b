// On-disk formats of a thinfs pool. Every byte that reaches the disk is
// described here, once. All integers are little-endian unless a section
// says otherwise (RocksDB keys are big-endian so that they sort).

#ifndef THINFS_META_FORMAT_H_
#define THINFS_META_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

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
//                       Written by every commit before its metadata
//                       (after an msync of the body when a bit changed);
//                       its write-back is started, not waited for, so after
//                       a crash it may lag the superblock's transaction id.
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
//
// pool/meta/ is a RocksDB database with four column families besides the
// unused "default". Keys are big-endian so that RocksDB's bytewise order is
// numeric order; values are little-endian. Every value carries a check over
// its key and payload, so a flipped byte, or a value stored under the wrong
// key, reads as kCorruption. (SST blocks additionally carry RocksDB's own
// per-block XXH3 checksum; the value checks also catch damage that happened
// before RocksDB saw the bytes.)
//
// CF "superblock": exactly one record.
//   key   = "superblock" (10 ASCII bytes, kSuperblockKey)
//   value = SuperblockValueV1 (96 bytes):
//     version u8 = 1 | reserved[7] = 0 | magic u64 = "THINFS1"
//     | format_version u32 | reserved u32 = 0 | uuid[16] | block_size u64
//     | data_blocks u64 | created_ns i64 | transaction_id u64
//     | next_device_id u64 | flags u64
//     | checksum u64 = XXH64(key || value bytes before checksum, seed 0)
//   A version byte other than 1, nonzero reserved bytes, a bad magic or a
//   checksum mismatch is kCorruption. format_version > kFormatVersion is
//   kNotSupported.
//
// CF "devices": one record per thin device.
//   key   = device id, u64 big-endian (8 bytes)
//   value = DeviceValueV1 (104 bytes) || name (name_len bytes, not
//           NUL-terminated) || checksum u64 = XXH64(key || all preceding
//           value bytes, seed 0)
//     DeviceValueV1: version u8 = 1 | has_parent u8 (0/1) | name_len u16
//     | epoch u32 | id u64 (must equal the key) | size u64 | parent u64
//     | parent_epoch u32 | flags u32 | mode u32 | uid u32 | gid u32
//     | reserved u32 = 0 | created_ns i64 | mtime_ns i64 | ctime_ns i64
//     | atime_ns i64 | mapped_blocks u64 | parent_limit u64
//
// CF "map": the versioned block map, one record per (device, vblock, epoch).
//   key   = device u64 BE | vblock u64 BE | ~epoch u32 BE   (20 bytes)
//     Inverting the epoch sorts the newest version of a block first: one
//     Seek to (device, vblock, ~max_epoch) lands on the newest version with
//     epoch <= max_epoch, or on the next block (detected by the prefix).
//     The first 16 bytes (device, vblock) are the prefix-extractor prefix;
//     the CF keeps a prefix Bloom filter (10 bits/prefix) and no whole-key
//     filter, because every lookup is a Seek, never a Get.
//   value = varint pool block (LEB128, 1..10 bytes; 0 for tombstones)
//           | flags u8 (MapValue::Flags; unknown bits are kCorruption)
//           | check u16 = low 16 bits of XXH32(key || varint || flags, 0)
//     3..13 bytes; a damaged value escapes detection with probability
//     2^-16 (a deliberate trade for ~5 bytes per mapped block).
//
// CF "refcounts": only blocks shared by two or more versions.
//   key   = pool block u64 big-endian (8 bytes)
//   value = count u32 | check u32 = XXH32(key || count bytes, seed 0)
//     A count below 2 is kCorruption: such entries are deleted, not stored.
//
// A commit is one WriteBatch across the column families; the superblock,
// when written, carries the new transaction id in the same batch.

namespace dbformat {

inline constexpr char kSuperblockCf[] = "superblock";
inline constexpr char kDevicesCf[] = "devices";
inline constexpr char kMapCf[] = "map";
inline constexpr char kRefcountsCf[] = "refcounts";
inline constexpr char kSuperblockKey[] = "superblock";

inline constexpr uint8_t kSuperblockValueVersion = 1;
inline constexpr uint8_t kDeviceValueVersion = 1;

inline constexpr size_t kDeviceKeySize = 8;
inline constexpr size_t kMapKeySize = 20;
inline constexpr size_t kMapPrefixSize = 16;
inline constexpr size_t kRefcountKeySize = 8;
inline constexpr size_t kRefcountValueSize = 8;
inline constexpr size_t kMapValueCheckSize = 2;
inline constexpr size_t kMaxVarint64Size = 10;

// Little-endian integers as byte arrays: alignment 1, so disk structs have
// no padding and no host-endianness dependence.
template <typename T>
struct LeInt {
  uint8_t b[sizeof(T)];
  T Get() const {
    using U = std::make_unsigned_t<T>;
    U v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<U>(U{b[i]} << (8 * i));
    return static_cast<T>(v);
  }
  void Set(T value) {
    auto v = static_cast<std::make_unsigned_t<T>>(value);
    for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  }
};
using Le16 = LeInt<uint16_t>;
using Le32 = LeInt<uint32_t>;
using Le64 = LeInt<uint64_t>;
using LeI64 = LeInt<int64_t>;

struct SuperblockValueV1 {
  uint8_t version;
  uint8_t reserved0[7];
  Le64 magic;
  Le32 format_version;
  Le32 reserved1;
  uint8_t uuid[16];
  Le64 block_size;
  Le64 data_blocks;
  LeI64 created_ns;
  Le64 transaction_id;
  Le64 next_device_id;
  Le64 flags;
  Le64 checksum;
};
static_assert(sizeof(SuperblockValueV1) == 96);
static_assert(alignof(SuperblockValueV1) == 1);

struct DeviceValueV1 {
  uint8_t version;
  uint8_t has_parent;
  Le16 name_len;
  Le32 epoch;
  Le64 id;
  Le64 size;
  Le64 parent;
  Le32 parent_epoch;
  Le32 flags;
  Le32 mode;
  Le32 uid;
  Le32 gid;
  Le32 reserved;
  LeI64 created_ns;
  LeI64 mtime_ns;
  LeI64 ctime_ns;
  LeI64 atime_ns;
  Le64 mapped_blocks;
  Le64 parent_limit;
};
static_assert(sizeof(DeviceValueV1) == 104);
static_assert(alignof(DeviceValueV1) == 1);
inline constexpr size_t kDeviceChecksumSize = 8;
inline constexpr size_t kMaxDeviceNameSize = 4096;

}  // namespace dbformat

}  // namespace thinfs::meta

#endif  // THINFS_META_FORMAT_H_
