// libFuzzer target for the RocksDB record decoders (meta/record_codec.h).
// Input: one selector byte (record kind), one key length byte, the key,
// then the value. Any input is rejected or decodes to a record that
// re-encodes to exactly the same value (map values: to a value that
// decodes to the same mapping; see the comment there).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "meta/format.h"
#include "meta/record_codec.h"

namespace {

bool SameDevice(const thinfs::DeviceRecord& a, const thinfs::DeviceRecord& b) {
  return a.id.value == b.id.value && a.name == b.name && a.size == b.size && a.epoch == b.epoch &&
         a.has_parent == b.has_parent && a.parent.value == b.parent.value &&
         a.parent_epoch == b.parent_epoch && a.flags == b.flags && a.mode == b.mode &&
         a.uid == b.uid && a.gid == b.gid && a.created_ns == b.created_ns &&
         a.mtime_ns == b.mtime_ns && a.ctime_ns == b.ctime_ns && a.atime_ns == b.atime_ns &&
         a.mapped_blocks == b.mapped_blocks && a.parent_limit == b.parent_limit;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace thinfs;
  using namespace thinfs::meta;
  if (size < 2) return 0;
  const uint8_t kind = data[0] % 4;
  const size_t key_len = data[1];
  if (size - 2 < key_len) return 0;
  const std::string key(reinterpret_cast<const char*>(data) + 2, key_len);
  const std::string value(reinterpret_cast<const char*>(data) + 2 + key_len, size - 2 - key_len);
  switch (kind) {
    case 0: {
      Result<Superblock> sb = DecodeSuperblockValue(value);
      if (sb.ok() && EncodeSuperblock(*sb) != value) std::abort();
      break;
    }
    case 1: {
      Result<DeviceRecord> d = DecodeDeviceValue(key, value);
      if (d.ok()) {
        if (Id64Key(d->id.value) != key) std::abort();
        Result<std::string> again = EncodeDevice(*d);
        if (!again.ok() || *again != value) std::abort();
        Result<DeviceRecord> d2 = DecodeDeviceValue(key, *again);
        if (!d2.ok() || !SameDevice(*d, *d2)) std::abort();
      }
      break;
    }
    case 2: {
      Result<MapValue> v = DecodeMapValue(key, value);
      if (v.ok()) {
        // The encoder writes block 0 for a tombstone and the shortest
        // varint, while the decoder accepts any block under a tombstone and
        // overlong varints (the 16-bit check covers them): the round trip is
        // on the meaning, not the bytes.
        std::string again = EncodeMapValue(key, *v);
        Result<MapValue> v2 = DecodeMapValue(key, again);
        if (!v2.ok() || v2->flags != v->flags ||
            (!v->tombstone() && v2->block.value != v->block.value)) {
          std::abort();
        }
      }
      break;
    }
    case 3: {
      Result<std::pair<PoolBlock, uint32_t>> r = DecodeRefcountValue(key, value);
      if (r.ok()) {
        if (Id64Key(r->first.value) != key) std::abort();
        if (EncodeRefcount(key, r->second) != value) std::abort();
      }
      break;
    }
  }
  return 0;
}
