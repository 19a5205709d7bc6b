#include "meta/record_codec.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "meta/format.h"

namespace thinfs::meta {

using dbformat::DeviceValueV1;
using dbformat::SuperblockValueV1;

// ---- keys ----


static void PutBe64(std::string* dst, uint64_t v) {
  for (int i = 7; i >= 0; --i) dst->push_back(static_cast<char>(v >> (8 * i)));
}
static void PutBe32(std::string* dst, uint32_t v) {
  for (int i = 3; i >= 0; --i) dst->push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t GetBe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint32_t GetBe32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string Id64Key(uint64_t id) {
  std::string k;
  PutBe64(&k, id);
  return k;
}

std::string MapKey(VolumeId device, VolumeBlock vblock, Epoch epoch) {
  std::string k;
  k.reserve(dbformat::kMapKeySize);
  PutBe64(&k, device.value);
  PutBe64(&k, vblock.value);
  PutBe32(&k, ~epoch);
  return k;
}

static std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

static std::string DescribeMapKey(std::string_view key) {
  if (key.size() != dbformat::kMapKeySize) {
    return "map key of " + std::to_string(key.size()) + " bytes";
  }
  return "map entry (device " + std::to_string(GetBe64(key.data())) + ", vblock " +
         std::to_string(GetBe64(key.data() + 8)) + ", epoch " +
         std::to_string(~GetBe32(key.data() + 16)) + ")";
}

// ---- superblock ----

static uint64_t Checksum64(std::string_view key, const char* data, size_t n) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, key.data(), key.size());
  XXH64_update(st, data, n);
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

std::string EncodeSuperblock(const Superblock& sb) {
  SuperblockValueV1 v;
  std::memset(&v, 0, sizeof v);
  v.version = dbformat::kSuperblockValueVersion;
  v.magic.Set(sb.magic);
  v.format_version.Set(sb.format_version);
  std::memcpy(v.uuid, sb.uuid, sizeof v.uuid);
  v.block_size.Set(sb.block_size);
  v.data_blocks.Set(sb.data_blocks);
  v.created_ns.Set(sb.created_ns);
  v.transaction_id.Set(sb.transaction_id);
  v.next_device_id.Set(sb.next_device_id);
  v.flags.Set(sb.flags);
  v.checksum.Set(Checksum64(dbformat::kSuperblockKey, reinterpret_cast<const char*>(&v),
                            offsetof(SuperblockValueV1, checksum)));
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

Result<Superblock> DecodeSuperblockValue(std::string_view value) {
  const std::string what = "superblock record";
  if (value.size() != sizeof(SuperblockValueV1)) {
    return Status::Corruption(what + ": size " + std::to_string(value.size()) + ", expected " +
                              std::to_string(sizeof(SuperblockValueV1)));
  }
  SuperblockValueV1 v;
  std::memcpy(&v, value.data(), sizeof v);
  uint64_t want = Checksum64(dbformat::kSuperblockKey, value.data(),
                             offsetof(SuperblockValueV1, checksum));
  if (v.checksum.Get() != want) {
    return Status::Corruption(what + ": checksum mismatch (stored " + Hex(v.checksum.Get()) +
                              ", computed " + Hex(want) + ")");
  }
  if (v.version != dbformat::kSuperblockValueVersion) {
    return Status::Corruption(what + ": unknown value version " + std::to_string(v.version));
  }
  if (std::any_of(std::begin(v.reserved0), std::end(v.reserved0), [](uint8_t b) { return b != 0; }) ||
      v.reserved1.Get() != 0) {
    return Status::Corruption(what + ": reserved bytes are not zero");
  }
  if (v.magic.Get() != kSuperblockMagic) {
    return Status::Corruption(what + ": bad magic " + Hex(v.magic.Get()));
  }
  if (v.format_version.Get() > kFormatVersion) {
    return Status::NotSupported(what + ": format version " +
                                std::to_string(v.format_version.Get()) + " is newer than " +
                                std::to_string(kFormatVersion));
  }
  Superblock sb;
  sb.magic = v.magic.Get();
  sb.format_version = v.format_version.Get();
  std::memcpy(sb.uuid, v.uuid, sizeof sb.uuid);
  sb.block_size = v.block_size.Get();
  sb.data_blocks = v.data_blocks.Get();
  sb.created_ns = v.created_ns.Get();
  sb.transaction_id = v.transaction_id.Get();
  sb.next_device_id = v.next_device_id.Get();
  sb.flags = v.flags.Get();
  return sb;
}

// ---- devices ----

Result<std::string> EncodeDevice(const DeviceRecord& d) {
  if (d.name.size() > dbformat::kMaxDeviceNameSize) {
    return Status::InvalidArgument("device " + std::to_string(d.id.value) + ": name of " +
                                   std::to_string(d.name.size()) + " bytes is too long");
  }
  DeviceValueV1 v;
  std::memset(&v, 0, sizeof v);
  v.version = dbformat::kDeviceValueVersion;
  v.has_parent = d.has_parent ? 1 : 0;
  v.name_len.Set(static_cast<uint16_t>(d.name.size()));
  v.epoch.Set(d.epoch);
  v.id.Set(d.id.value);
  v.size.Set(d.size);
  v.parent.Set(d.parent.value);
  v.parent_epoch.Set(d.parent_epoch);
  v.flags.Set(d.flags);
  v.mode.Set(d.mode);
  v.uid.Set(d.uid);
  v.gid.Set(d.gid);
  v.created_ns.Set(d.created_ns);
  v.mtime_ns.Set(d.mtime_ns);
  v.ctime_ns.Set(d.ctime_ns);
  v.atime_ns.Set(d.atime_ns);
  v.mapped_blocks.Set(d.mapped_blocks);
  v.parent_limit.Set(d.parent_limit);
  std::string out(reinterpret_cast<const char*>(&v), sizeof v);
  out += d.name;
  dbformat::Le64 sum;
  sum.Set(Checksum64(Id64Key(d.id.value), out.data(), out.size()));
  out.append(reinterpret_cast<const char*>(sum.b), sizeof sum.b);
  return out;
}

Result<DeviceRecord> DecodeDeviceValue(std::string_view key, std::string_view value) {
  if (key.size() != dbformat::kDeviceKeySize) {
    return Status::Corruption("device key of " + std::to_string(key.size()) + " bytes");
  }
  const uint64_t key_id = GetBe64(key.data());
  const std::string what = "device record " + std::to_string(key_id);
  constexpr size_t kFixed = sizeof(DeviceValueV1) + dbformat::kDeviceChecksumSize;
  if (value.size() < kFixed) {
    return Status::Corruption(what + ": value of " + std::to_string(value.size()) +
                              " bytes is too short");
  }
  DeviceValueV1 v;
  std::memcpy(&v, value.data(), sizeof v);
  const size_t body = value.size() - dbformat::kDeviceChecksumSize;
  dbformat::Le64 stored;
  std::memcpy(stored.b, value.data() + body, sizeof stored.b);
  const uint64_t want = Checksum64(key, value.data(), body);
  if (stored.Get() != want) {
    return Status::Corruption(what + ": checksum mismatch (stored " + Hex(stored.Get()) +
                              ", computed " + Hex(want) + ")");
  }
  if (v.version != dbformat::kDeviceValueVersion) {
    return Status::Corruption(what + ": unknown value version " + std::to_string(v.version));
  }
  if (sizeof v + v.name_len.Get() != body) {
    return Status::Corruption(what + ": name length " + std::to_string(v.name_len.Get()) +
                              " disagrees with value size " + std::to_string(value.size()));
  }
  if (v.id.Get() != key_id || v.has_parent > 1 || v.reserved.Get() != 0) {
    return Status::Corruption(what + ": inconsistent fields (id " + std::to_string(v.id.Get()) +
                              ")");
  }
  DeviceRecord d;
  d.id = VolumeId(key_id);
  d.name.assign(value.data() + sizeof v, v.name_len.Get());
  d.size = v.size.Get();
  d.epoch = v.epoch.Get();
  d.has_parent = v.has_parent != 0;
  d.parent = VolumeId(v.parent.Get());
  d.parent_epoch = v.parent_epoch.Get();
  d.flags = v.flags.Get();
  d.mode = v.mode.Get();
  d.uid = v.uid.Get();
  d.gid = v.gid.Get();
  d.created_ns = v.created_ns.Get();
  d.mtime_ns = v.mtime_ns.Get();
  d.ctime_ns = v.ctime_ns.Get();
  d.atime_ns = v.atime_ns.Get();
  d.mapped_blocks = v.mapped_blocks.Get();
  d.parent_limit = v.parent_limit.Get();
  return d;
}

// ---- map values ----

static uint16_t MapCheck(std::string_view key, const char* payload, size_t n) {
  char buf[dbformat::kMapKeySize + dbformat::kMaxVarint64Size + 1];
  const size_t k = std::min(key.size(), dbformat::kMapKeySize);
  std::memcpy(buf, key.data(), k);
  std::memcpy(buf + k, payload, n);
  return static_cast<uint16_t>(XXH32(buf, k + n, 0) & 0xffff);
}

std::string EncodeMapValue(const std::string& key, const MapValue& v) {
  char buf[dbformat::kMaxVarint64Size + 1 + dbformat::kMapValueCheckSize];
  size_t n = 0;
  uint64_t block = v.tombstone() ? 0 : v.block.value;
  while (block >= 0x80) {
    buf[n++] = static_cast<char>(block | 0x80);
    block >>= 7;
  }
  buf[n++] = static_cast<char>(block);
  buf[n++] = static_cast<char>(v.flags);
  const uint16_t check = MapCheck(key, buf, n);
  buf[n++] = static_cast<char>(check & 0xff);
  buf[n++] = static_cast<char>(check >> 8);
  return std::string(buf, n);
}

constexpr uint8_t kKnownMapFlags = MapValue::kTombstone | MapValue::kMaybeShared;

Result<MapValue> DecodeMapValue(std::string_view key, std::string_view value) {
  if (key.size() != dbformat::kMapKeySize) {
    return Status::Corruption(DescribeMapKey(key));
  }
  const char* p = value.data();
  const size_t size = value.size();
  uint64_t block = 0;
  size_t n = 0;
  bool done = false;
  for (int shift = 0; n < size && n < dbformat::kMaxVarint64Size; shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(p[n++]);
    block |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      done = true;
      break;
    }
  }
  if (!done || n + 1 + dbformat::kMapValueCheckSize != size) {
    return Status::Corruption(DescribeMapKey(key) + ": malformed value of " +
                              std::to_string(size) + " bytes");
  }
  const uint8_t flags = static_cast<uint8_t>(p[n]);
  const uint16_t stored = static_cast<uint16_t>(static_cast<uint8_t>(p[n + 1]) |
                                                (static_cast<uint8_t>(p[n + 2]) << 8));
  const uint16_t want = MapCheck(key, p, n + 1);
  if (stored != want) {
    return Status::Corruption(DescribeMapKey(key) + ": check mismatch (stored " + Hex(stored) +
                              ", computed " + Hex(want) + ")");
  }
  if (flags & ~kKnownMapFlags) {
    return Status::Corruption(DescribeMapKey(key) + ": unknown flags " + Hex(flags));
  }
  MapValue v;
  v.block = PoolBlock(block);
  v.flags = flags;
  return v;
}

// ---- refcounts ----

std::string EncodeRefcount(const std::string& key, uint32_t count) {
  dbformat::Le32 c;
  c.Set(count);
  char buf[dbformat::kRefcountKeySize + 4];
  std::memcpy(buf, key.data(), dbformat::kRefcountKeySize);
  std::memcpy(buf + dbformat::kRefcountKeySize, c.b, 4);
  dbformat::Le32 check;
  check.Set(XXH32(buf, sizeof buf, 0));
  std::string out(reinterpret_cast<const char*>(c.b), 4);
  out.append(reinterpret_cast<const char*>(check.b), 4);
  return out;
}

Result<std::pair<PoolBlock, uint32_t>> DecodeRefcountValue(std::string_view key,
                                                            std::string_view value) {
  if (key.size() != dbformat::kRefcountKeySize) {
    return Status::Corruption("refcount key of " + std::to_string(key.size()) + " bytes");
  }
  const uint64_t block = GetBe64(key.data());
  const std::string what = "refcount of pool block " + std::to_string(block);
  if (value.size() != dbformat::kRefcountValueSize) {
    return Status::Corruption(what + ": value of " + std::to_string(value.size()) + " bytes");
  }
  char buf[dbformat::kRefcountKeySize + 4];
  std::memcpy(buf, key.data(), dbformat::kRefcountKeySize);
  std::memcpy(buf + dbformat::kRefcountKeySize, value.data(), 4);
  dbformat::Le32 count, check;
  std::memcpy(count.b, value.data(), 4);
  std::memcpy(check.b, value.data() + 4, 4);
  const uint32_t want = XXH32(buf, sizeof buf, 0);
  if (check.Get() != want) {
    return Status::Corruption(what + ": check mismatch (stored " + Hex(check.Get()) +
                              ", computed " + Hex(want) + ")");
  }
  if (count.Get() < 2) {
    return Status::Corruption(what + ": stored count " + std::to_string(count.Get()) + " < 2");
  }
  return std::make_pair(PoolBlock(block), count.Get());
}

}  // namespace thinfs::meta
