// Round-trip checks shared by the record fuzzers (record_codec_fuzzer.cc,
// record_sealed_fuzzer.cc): a value that decodes must re-encode to the same
// bytes (map values: to the same meaning). Each aborts on a mismatch.

#ifndef THINFS_FUZZ_RECORD_ROUNDTRIP_H_
#define THINFS_FUZZ_RECORD_ROUNDTRIP_H_

#include <cstdlib>
#include <string>

#include "meta/record_codec.h"

namespace thinfs::fuzz {

inline bool SameDevice(const DeviceRecord& a, const DeviceRecord& b) {
  return a.id.value == b.id.value && a.name == b.name && a.size == b.size && a.epoch == b.epoch &&
         a.has_parent == b.has_parent && a.parent.value == b.parent.value &&
         a.parent_epoch == b.parent_epoch && a.flags == b.flags && a.mode == b.mode &&
         a.uid == b.uid && a.gid == b.gid && a.created_ns == b.created_ns &&
         a.mtime_ns == b.mtime_ns && a.ctime_ns == b.ctime_ns && a.atime_ns == b.atime_ns &&
         a.mapped_blocks == b.mapped_blocks && a.parent_limit == b.parent_limit;
}

// `d` was decoded from `value` under `key`.
inline void DeviceRoundTrips(const std::string& key, const std::string& value,
                             const DeviceRecord& d) {
  if (meta::Id64Key(d.id.value) != key) std::abort();
  Result<std::string> again = meta::EncodeDevice(d);
  if (!again.ok() || *again != value) std::abort();
  Result<DeviceRecord> d2 = meta::DecodeDeviceValue(key, *again);
  if (!d2.ok() || !SameDevice(d, *d2)) std::abort();
}

// The encoder writes block 0 for a tombstone and the shortest varint,
// while the decoder accepts any block under a tombstone and overlong
// varints (the 16-bit check covers them): the round trip is on the
// meaning, not the bytes.
inline void MapValueRoundTrips(const std::string& key, const MapValue& v) {
  std::string again = meta::EncodeMapValue(key, v);
  Result<MapValue> v2 = meta::DecodeMapValue(key, again);
  if (!v2.ok() || v2->flags != v.flags || (!v.tombstone() && v2->block.value != v.block.value)) {
    std::abort();
  }
}

inline void RefcountRoundTrips(const std::string& key, const std::string& value,
                               const std::pair<PoolBlock, uint32_t>& r) {
  if (meta::Id64Key(r.first.value) != key || r.second < 2) std::abort();
  if (meta::EncodeRefcount(key, r.second) != value) std::abort();
}

}  // namespace thinfs::fuzz

#endif  // THINFS_FUZZ_RECORD_ROUNDTRIP_H_
