// libFuzzer target for the RocksDB record decoders past their checksums
// (meta/record_codec.h). record_codec_fuzzer feeds whole values, so almost
// every mutation dies at the checksum; here the input is a record body
// without its check, and the harness computes the check itself, from the
// layouts in meta/format.h (an implementation independent of the codec's),
// so that the decoders' structural validation (versions, lengths, reserved
// bytes, flags, varints, id/key agreement) is what gets fuzzed.
//
// Input: one selector byte (record kind), the key (fixed size per kind:
// superblock none, device 8, map 20, refcount 8; zero-padded when the
// input is short), then the body. Any body is rejected or decodes to a
// record that re-encodes to exactly the same value (map values: to the
// same meaning; see record_roundtrip.h).

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz/record_roundtrip.h"
#include "meta/format.h"
#include "meta/record_codec.h"

namespace {

using namespace thinfs;
using namespace thinfs::meta;

uint64_t Xxh64Of(std::string_view key, std::string_view body) {
  std::string all(key);
  all += body;
  return XXH64(all.data(), all.size(), 0);
}

uint32_t Xxh32Of(std::string_view key, std::string_view body) {
  std::string all(key);
  all += body;
  return XXH32(all.data(), all.size(), 0);
}

void AppendLe(std::string* dst, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) dst->push_back(static_cast<char>(v >> (8 * i)));
}

// The sealed value: body plus the check format.h specifies for the kind.
std::string Seal(int kind, std::string_view key, std::string_view body) {
  std::string value(body);
  switch (kind) {
    case 0:
    case 1:
      AppendLe(&value, Xxh64Of(key, body), 8);
      break;
    case 2:
      AppendLe(&value, Xxh32Of(key, body) & 0xffff, 2);
      break;
    default:
      AppendLe(&value, Xxh32Of(key, body), 4);
      break;
  }
  return value;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int kind = data[0] % 4;
  static constexpr size_t kKeySize[4] = {0, dbformat::kDeviceKeySize, dbformat::kMapKeySize,
                                         dbformat::kRefcountKeySize};
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string key(rest.substr(0, kKeySize[kind]));
  key.resize(kKeySize[kind], '\0');
  rest.remove_prefix(std::min(rest.size(), kKeySize[kind]));
  if (kind == 0) key = dbformat::kSuperblockKey;
  const std::string value = Seal(kind, key, rest);

  switch (kind) {
    case 0: {
      Result<Superblock> sb = DecodeSuperblockValue(value);
      if (sb.ok() && EncodeSuperblock(*sb) != value) std::abort();
      // A sealed value of the right size fails only on a field, never on
      // the checksum: the harness and the codec must agree on it.
      if (!sb.ok() && value.size() == sizeof(dbformat::SuperblockValueV1) &&
          sb.status().message().find("checksum") != std::string::npos) {
        std::abort();
      }
      break;
    }
    case 1: {
      Result<DeviceRecord> d = DecodeDeviceValue(key, value);
      if (d.ok()) {
        fuzz::DeviceRoundTrips(key, value, *d);
      } else if (d.status().message().find("checksum") != std::string::npos) {
        std::abort();
      }
      break;
    }
    case 2: {
      Result<MapValue> v = DecodeMapValue(key, value);
      if (v.ok()) {
        fuzz::MapValueRoundTrips(key, *v);
      } else if (v.status().message().find("check mismatch") != std::string::npos) {
        std::abort();
      }
      break;
    }
    case 3: {
      Result<std::pair<PoolBlock, uint32_t>> r = DecodeRefcountValue(key, value);
      if (r.ok()) {
        fuzz::RefcountRoundTrips(key, value, *r);
      } else if (r.status().message().find("check mismatch") != std::string::npos) {
        std::abort();
      }
      break;
    }
  }
  return 0;
}
