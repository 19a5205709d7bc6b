#include "core/send_stream.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "core/types.h"

namespace thinfs {

namespace {

void PutU32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void PutU64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint32_t GetU32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t GetU64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

constexpr size_t kHeaderSummed = kStreamHeaderBytes - 8;

}  // namespace

bool StreamGuid::zero() const {
  return std::all_of(std::begin(bytes), std::end(bytes), [](uint8_t b) { return b == 0; });
}

std::string StreamGuid::Hex() const {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

bool StreamGuid::FromHex(const std::string& hex, StreamGuid* out) {
  if (hex.size() != 32) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < 16; ++i) {
    int hi = nibble(hex[2 * i]);
    int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

const char* StreamRecordTypeName(uint32_t type) {
  switch (type) {
    case static_cast<uint32_t>(StreamRecordType::kData):
      return "DATA";
    case static_cast<uint32_t>(StreamRecordType::kHole):
      return "HOLE";
    case static_cast<uint32_t>(StreamRecordType::kEnd):
      return "END";
    default:
      return "unknown type";
  }
}

std::vector<std::byte> EncodeStreamHeader(const StreamHeader& h, uint64_t* checksum) {
  std::vector<std::byte> out(kStreamHeaderBytes);
  std::byte* p = out.data();
  std::memcpy(p, kStreamMagic, 8);
  PutU32(p + 8, h.version);
  PutU32(p + 12, h.flags);
  PutU64(p + 16, h.block_size);
  PutU64(p + 24, h.device_size);
  std::memcpy(p + 32, h.pool_uuid, 16);
  std::memcpy(p + 48, h.guid.bytes, 16);
  std::memcpy(p + 64, h.base_guid.bytes, 16);
  PutU64(p + 80, h.base_size);
  uint64_t sum = XXH64(p, kHeaderSummed, 0);
  PutU64(p + kHeaderSummed, sum);
  if (checksum != nullptr) *checksum = sum;
  return out;
}

// ---- Reader ------------------------------------------------------------------

StreamReader::StreamReader(StreamSource source) : source_(std::move(source)) {}

Status StreamReader::Fail(uint64_t at, const std::string& what) const {
  std::string where = "stream byte " + std::to_string(at);
  if (!record_type_.empty()) where += " (" + record_type_ + ")";
  return Status::Corruption(where + ": " + what);
}

Result<bool> StreamReader::ReadExact(std::span<std::byte> buf) {
  size_t done = 0;
  while (done < buf.size()) {
    THINFS_ASSIGN_OR_RETURN(size_t n, source_(buf.subspan(done)));
    if (n == 0) break;
    done += n;
  }
  position_ += done;
  if (done == buf.size()) return true;
  if (done == 0) return false;
  return Fail(position_, "truncated: " + std::to_string(buf.size() - done) +
                             " more bytes expected");
}

Result<StreamHeader> StreamReader::ReadHeader() {
  std::byte raw[kStreamHeaderBytes];
  THINFS_ASSIGN_OR_RETURN(bool got, ReadExact(raw));
  if (!got) return Fail(0, "empty stream (no header)");
  if (std::memcmp(raw, kStreamMagic, 8) != 0) {
    return Fail(0, "not a thinfs send stream (bad magic)");
  }
  StreamHeader h;
  h.version = GetU32(raw + 8);
  h.flags = GetU32(raw + 12);
  h.block_size = GetU64(raw + 16);
  h.device_size = GetU64(raw + 24);
  std::memcpy(h.pool_uuid, raw + 32, 16);
  std::memcpy(h.guid.bytes, raw + 48, 16);
  std::memcpy(h.base_guid.bytes, raw + 64, 16);
  h.base_size = GetU64(raw + 80);
  const uint64_t sum = GetU64(raw + kHeaderSummed);
  if (XXH64(raw, kHeaderSummed, 0) != sum) return Fail(kHeaderSummed, "header checksum mismatch");
  if (h.version != kStreamVersion) {
    return Fail(8, "stream version " + std::to_string(h.version) + " is not supported (this thinfs reads version " +
                       std::to_string(kStreamVersion) + ")");
  }
  if ((h.flags & ~StreamHeader::kIncremental) != 0) return Fail(12, "unknown header flags");
  if (const char* why = Geometry::Validate(h.block_size); *why != '\0') {
    return Fail(16, std::string("block size: ") + why);
  }
  if (h.device_size > static_cast<uint64_t>(INT64_MAX)) return Fail(24, "device size too large");
  if (h.guid.zero()) return Fail(48, "zero stream guid");
  if (h.incremental() == h.base_guid.zero()) {
    return Fail(64, "base guid does not match the incremental flag");
  }
  header_ = h;
  header_sum_ = sum;
  return h;
}

Result<StreamRecord> StreamReader::ReadRecord() {
  const uint64_t start = position_;
  record_type_ = "record " + std::to_string(next_number_);
  if (ended_) return Fail(start, "read past END");
  std::byte raw[kStreamRecordHeaderBytes];
  THINFS_ASSIGN_OR_RETURN(bool got, ReadExact(raw));
  if (!got) return Fail(start, "truncated: stream ends before its END record");
  StreamRecord r;
  const uint32_t type = GetU32(raw);
  record_type_ += std::string(", ") + StreamRecordTypeName(type);
  r.number = GetU64(raw + 8);
  r.offset = GetU64(raw + 16);
  r.length = GetU64(raw + 24);
  if (type < 1 || type > 3) return Fail(start, "unknown record type " + std::to_string(type));
  if (GetU32(raw + 4) != 0) return Fail(start + 4, "reserved field is not zero");
  r.type = static_cast<StreamRecordType>(type);

  // Size the payload before reading it: a hostile length must not make us
  // allocate or wait for gigabytes.
  uint64_t payload = 0;
  if (r.type == StreamRecordType::kData) {
    const uint64_t max = std::max(kStreamMaxDataBytes, header_.block_size);
    if (r.length == 0 || r.length > max) {
      return Fail(start + 24, "DATA length " + std::to_string(r.length) + " out of range (1.." +
                                  std::to_string(max) + ")");
    }
    payload = r.length;
  } else if (r.type == StreamRecordType::kEnd) {
    payload = kStreamEndPayloadBytes;
  }
  // Grown as bytes arrive, so that a truncated stream claiming a huge
  // record costs no more memory than it delivered.
  payload_.clear();
  const uint64_t want = payload + 8;
  while (payload_.size() < want) {
    const size_t have = payload_.size();
    const size_t step = static_cast<size_t>(std::min<uint64_t>(want - have, 1 << 20));
    payload_.resize(have + step);
    THINFS_ASSIGN_OR_RETURN(bool got_payload,
                            ReadExact(std::span<std::byte>(payload_).subspan(have)));
    if (!got_payload) return Fail(position_, "truncated: record has no payload or checksum");
  }
  XXH64_state_t* state = XXH64_createState();
  if (state == nullptr) return Status::IOError("out of memory");
  XXH64_reset(state, header_sum_);
  XXH64_update(state, raw, sizeof raw);
  XXH64_update(state, payload_.data(), payload);
  const uint64_t sum = XXH64_digest(state);
  XXH64_freeState(state);
  if (sum != GetU64(payload_.data() + payload)) {
    return Fail(start + kStreamRecordHeaderBytes + payload, "record checksum mismatch");
  }
  if (r.number != next_number_) {
    return Fail(start + 8, "record number " + std::to_string(r.number) + ", expected " +
                               std::to_string(next_number_));
  }

  const uint64_t bs = header_.block_size;
  const uint64_t size = header_.device_size;
  if (r.type == StreamRecordType::kEnd) {
    if (r.offset != 0 || r.length != 0) return Fail(start + 16, "END carries an offset or length");
    r.end_records = GetU64(payload_.data());
    r.end_data_bytes = GetU64(payload_.data() + 8);
    r.end_hole_bytes = GetU64(payload_.data() + 16);
    if (r.end_records != next_number_ || r.end_data_bytes != data_bytes_ ||
        r.end_hole_bytes != hole_bytes_) {
      return Fail(start + kStreamRecordHeaderBytes,
                  "END totals (" + std::to_string(r.end_records) + " records, " +
                      std::to_string(r.end_data_bytes) + " data bytes, " +
                      std::to_string(r.end_hole_bytes) + " hole bytes) do not match the stream (" +
                      std::to_string(next_number_) + ", " + std::to_string(data_bytes_) + ", " +
                      std::to_string(hole_bytes_) + ")");
    }
    ended_ = true;
    std::byte extra[1];
    THINFS_ASSIGN_OR_RETURN(size_t n, source_(extra));
    if (n != 0) return Fail(position_, "data after the END record");
  } else {
    if (r.offset % bs != 0) return Fail(start + 16, "offset " + std::to_string(r.offset) + " is not block aligned");
    if (r.offset < next_offset_) {
      return Fail(start + 16, "offset " + std::to_string(r.offset) +
                                  " overlaps or precedes the previous record (which ends at " +
                                  std::to_string(next_offset_) + ")");
    }
    if (r.length == 0 || r.offset > size || r.length > size - r.offset) {
      return Fail(start + 16, "range [" + std::to_string(r.offset) + ", +" +
                                  std::to_string(r.length) + ") out of the device (" +
                                  std::to_string(size) + " bytes)");
    }
    if (r.length % bs != 0 && r.offset + r.length != size) {
      return Fail(start + 24, "length " + std::to_string(r.length) +
                                  " is not whole blocks and does not end the device");
    }
    next_offset_ = r.offset + r.length;
    if (r.type == StreamRecordType::kData) {
      data_bytes_ += r.length;
      r.data = std::span<const std::byte>(payload_.data(), payload);
    } else {
      hole_bytes_ += r.length;
    }
  }
  next_number_++;
  record_type_.clear();
  return r;
}

// ---- Writer ------------------------------------------------------------------

StreamWriter::StreamWriter(StreamSink sink, const StreamHeader& header)
    : sink_(std::move(sink)), header_(header) {}

Status StreamWriter::WriteHeader() {
  std::vector<std::byte> h = EncodeStreamHeader(header_, &header_sum_);
  THINFS_RETURN_IF_ERROR(sink_(h));
  bytes_ += h.size();
  return Status::Ok();
}

Status StreamWriter::Record(StreamRecordType type, uint64_t offset, uint64_t length,
                            std::span<const std::byte> payload) {
  std::byte raw[kStreamRecordHeaderBytes];
  PutU32(raw, static_cast<uint32_t>(type));
  PutU32(raw + 4, 0);
  PutU64(raw + 8, records_);
  PutU64(raw + 16, offset);
  PutU64(raw + 24, length);
  XXH64_state_t* state = XXH64_createState();
  if (state == nullptr) return Status::IOError("out of memory");
  XXH64_reset(state, header_sum_);
  XXH64_update(state, raw, sizeof raw);
  XXH64_update(state, payload.data(), payload.size());
  std::byte sum[8];
  PutU64(sum, XXH64_digest(state));
  XXH64_freeState(state);
  THINFS_RETURN_IF_ERROR(sink_(raw));
  if (!payload.empty()) THINFS_RETURN_IF_ERROR(sink_(payload));
  THINFS_RETURN_IF_ERROR(sink_(sum));
  bytes_ += sizeof raw + payload.size() + sizeof sum;
  records_++;
  return Status::Ok();
}

Status StreamWriter::Data(uint64_t offset, std::span<const std::byte> data) {
  data_bytes_ += data.size();
  return Record(StreamRecordType::kData, offset, data.size(), data);
}

Status StreamWriter::Hole(uint64_t offset, uint64_t length) {
  hole_bytes_ += length;
  return Record(StreamRecordType::kHole, offset, length, {});
}

Status StreamWriter::End() {
  std::byte totals[kStreamEndPayloadBytes];
  PutU64(totals, records_);
  PutU64(totals + 8, data_bytes_);
  PutU64(totals + 16, hole_bytes_);
  return Record(StreamRecordType::kEnd, 0, 0, totals);
}

}  // namespace thinfs
