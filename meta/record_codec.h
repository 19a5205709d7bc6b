// The RocksDB records' codecs (the layouts are in meta/format.h): keys and
// the superblock, device, map and refcount values, as pure functions on
// byte strings with no RocksDB type, so that they can be unit tested and
// fuzzed (fuzz/record_codec_fuzzer.cc) apart from the store.
//
// Every decoder validates size, checksum, version and reserved fields, and
// returns kCorruption (kNotSupported for a newer superblock format) with a
// message naming the record; it never reads outside its arguments.
//
// Thread safety: pure functions.

#ifndef THINFS_META_RECORD_CODEC_H_
#define THINFS_META_RECORD_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "core/metadata.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs::meta {

// Big-endian fixed-width reads; `p` must have 8 (4) readable bytes.
uint64_t GetBe64(const char* p);
uint32_t GetBe32(const char* p);

// Device and refcount keys: the id (block) as 8 big-endian bytes.
std::string Id64Key(uint64_t id);
// Map key: device, vblock (big-endian u64 each), then ~epoch (big-endian
// u32) so that newer epochs sort first.
std::string MapKey(VolumeId device, VolumeBlock vblock, Epoch epoch);

// Superblock value (key dbformat::kSuperblockKey).
std::string EncodeSuperblock(const Superblock& sb);
Result<Superblock> DecodeSuperblockValue(std::string_view value);

// Device value under Id64Key(d.id). kInvalidArgument for a name too long.
Result<std::string> EncodeDevice(const DeviceRecord& d);
Result<DeviceRecord> DecodeDeviceValue(std::string_view key, std::string_view value);

// Map value under `key` (a MapKey): varint block, flags, 16-bit check.
std::string EncodeMapValue(const std::string& key, const MapValue& v);
Result<MapValue> DecodeMapValue(std::string_view key, std::string_view value);

// Refcount value under Id64Key(block): count (>= 2) and a check.
std::string EncodeRefcount(const std::string& key, uint32_t count);
Result<std::pair<PoolBlock, uint32_t>> DecodeRefcountValue(std::string_view key,
                                                           std::string_view value);

}  // namespace thinfs::meta

#endif  // THINFS_META_RECORD_CODEC_H_
