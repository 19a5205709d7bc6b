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
//   value = DeviceValueV1 (88 bytes) || name (name_len bytes, not
//           NUL-terminated) || checksum u64 = XXH64(key || all preceding
//           value bytes, seed 0)
//     DeviceValueV1: version u8 = 1 | has_parent u8 (0/1) | name_len u16
//     | epoch u32 | id u64 (must equal the key) | size u64 | parent u64
//     | parent_epoch u32 | flags u32 | mode u32 | uid u32 | gid u32
//     | reserved u32 = 0 | created_ns i64 | mtime_ns i64 | ctime_ns i64
//     | atime_ns i64
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
};
static_assert(sizeof(DeviceValueV1) == 88);
static_assert(alignof(DeviceValueV1) == 1);
inline constexpr size_t kDeviceChecksumSize = 8;
inline constexpr size_t kMaxDeviceNameSize = 4096;

}  // namespace dbformat

}  // namespace thinfs::meta

#endif  // THINFS_META_FORMAT_H_
