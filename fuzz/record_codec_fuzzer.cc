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

#include "fuzz/record_roundtrip.h"
#include "meta/format.h"
#include "meta/record_codec.h"

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
      if (d.ok()) fuzz::DeviceRoundTrips(key, value, *d);
      break;
    }
    case 2: {
      Result<MapValue> v = DecodeMapValue(key, value);
      if (v.ok()) fuzz::MapValueRoundTrips(key, *v);
      break;
    }
    case 3: {
      Result<std::pair<PoolBlock, uint32_t>> r = DecodeRefcountValue(key, value);
      if (r.ok()) fuzz::RefcountRoundTrips(key, value, *r);
      break;
    }
  }
  return 0;
}
