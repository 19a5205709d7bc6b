// The thinfs send stream: a self-describing, checksummed serialisation of
// one device (full) or of what changed since a base snapshot (incremental).
// `thinfs send` writes it, `thinfs receive` reads it. docs/send-stream.md
// is the reference; in short, all integers little-endian:
//
//   header (96 bytes)
//     0  magic "THINFSST"             8
//     8  version (1)                  u32
//    12  flags (bit 0: incremental)   u32; other bits must be zero
//    16  block_size                   u64   the sender pool's block size
//    24  device_size                  u64   bytes, after the stream
//    32  source pool uuid             16
//    48  guid                         16    identity of the sent state
//    64  base guid                    16    incremental: the state it
//                                          applies to; else zero
//    80  base_size                    u64   incremental: the base's size
//    88  XXH64 of bytes 0..87, seed 0 u64
//   records, numbered from 0, each
//     0  type                         u32   1 DATA, 2 HOLE, 3 END
//     4  reserved (0)                 u32
//     8  record number                u64
//    16  offset                       u64   bytes, block aligned
//    24  length                       u64   bytes
//    32  payload                            DATA: `length` bytes;
//                                           END: 24 bytes (below)
//     .  XXH64 of bytes 0..end of payload, seeded with the header checksum
//                                     u64
//   END payload: records before END, DATA bytes, HOLE bytes (u64 each).
//
// DATA and HOLE records cover whole blocks (the last may end at
// device_size), lie inside the device, and come in increasing offset order
// without overlap. END is last; nothing may follow it.
//
// Thread safety: a reader or writer is used by one thread.

#ifndef THINFS_CORE_SEND_STREAM_H_
#define THINFS_CORE_SEND_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace thinfs {

inline constexpr char kStreamMagic[8] = {'T', 'H', 'I', 'N', 'F', 'S', 'S', 'T'};
inline constexpr uint32_t kStreamVersion = 1;
inline constexpr size_t kStreamHeaderBytes = 96;
inline constexpr size_t kStreamRecordHeaderBytes = 32;
inline constexpr size_t kStreamEndPayloadBytes = 24;
// The largest DATA record a reader accepts: this or one block, whichever is
// larger (writers emit at most kStreamWriterDataBytes or one block).
inline constexpr uint64_t kStreamMaxDataBytes = 16 << 20;
inline constexpr uint64_t kStreamWriterDataBytes = 1 << 20;

// A 128-bit identity of a device state (like a ZFS snapshot guid).
struct StreamGuid {
  uint8_t bytes[16] = {};
  bool zero() const;
  std::string Hex() const;  // 32 lowercase hex digits
  static bool FromHex(const std::string& hex, StreamGuid* out);
  bool operator==(const StreamGuid&) const = default;
};

struct StreamHeader {
  static constexpr uint32_t kIncremental = 1u << 0;
  uint32_t version = kStreamVersion;
  uint32_t flags = 0;
  uint64_t block_size = 0;
  uint64_t device_size = 0;
  uint8_t pool_uuid[16] = {};
  StreamGuid guid;
  StreamGuid base_guid;
  uint64_t base_size = 0;

  bool incremental() const { return flags & kIncremental; }
};

enum class StreamRecordType : uint32_t { kData = 1, kHole = 2, kEnd = 3 };
const char* StreamRecordTypeName(uint32_t type);

struct StreamRecord {
  StreamRecordType type = StreamRecordType::kEnd;
  uint64_t number = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::span<const std::byte> data;  // DATA: valid until the next ReadRecord
  // END: the totals it carries.
  uint64_t end_records = 0;
  uint64_t end_data_bytes = 0;
  uint64_t end_hole_bytes = 0;
};

// Reads up to buf.size() bytes; fewer only at the end of the input.
using StreamSource = std::function<Result<size_t>(std::span<std::byte> buf)>;
// Writes all of buf.
using StreamSink = std::function<Status(std::span<const std::byte> buf)>;

// Parses and verifies a stream. Every error is kCorruption (or the
// source's own error) whose message names the byte offset and, past the
// header, the record number and type: "stream byte 1234 (record 5, DATA):
// checksum mismatch".
class StreamReader {
 public:
  explicit StreamReader(StreamSource source);

  // Reads and verifies the header (magic, version, flags, geometry,
  // checksum). Call once, first.
  Result<StreamHeader> ReadHeader();
  // Reads and verifies the next record: checksum, number, type, bounds,
  // order; for END the totals, and that nothing follows it.
  Result<StreamRecord> ReadRecord();

  uint64_t position() const { return position_; }  // bytes consumed

 private:
  Status Fail(uint64_t at, const std::string& what) const;
  Result<bool> ReadExact(std::span<std::byte> buf);  // false: clean EOF at 0 bytes

  StreamSource source_;
  StreamHeader header_;
  uint64_t header_sum_ = 0;
  uint64_t position_ = 0;
  uint64_t next_number_ = 0;
  uint64_t next_offset_ = 0;
  uint64_t data_bytes_ = 0;
  uint64_t hole_bytes_ = 0;
  bool ended_ = false;
  std::string record_type_;  // for messages: "record 5, DATA"
  std::vector<std::byte> payload_;
};

// Writes a stream. REQUIRES: records in increasing offset order, as the
// reader checks.
class StreamWriter {
 public:
  StreamWriter(StreamSink sink, const StreamHeader& header);
  Status WriteHeader();
  Status Data(uint64_t offset, std::span<const std::byte> data);
  Status Hole(uint64_t offset, uint64_t length);
  Status End();

  uint64_t bytes_written() const { return bytes_; }
  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t hole_bytes() const { return hole_bytes_; }

 private:
  Status Record(StreamRecordType type, uint64_t offset, uint64_t length,
                std::span<const std::byte> payload);
  StreamSink sink_;
  StreamHeader header_;
  uint64_t header_sum_ = 0;
  uint64_t records_ = 0;
  uint64_t bytes_ = 0;
  uint64_t data_bytes_ = 0;
  uint64_t hole_bytes_ = 0;
};

// The encoded header (kStreamHeaderBytes) and its checksum.
std::vector<std::byte> EncodeStreamHeader(const StreamHeader& header, uint64_t* checksum);

}  // namespace thinfs

#endif  // THINFS_CORE_SEND_STREAM_H_
