// The send stream codec: round trip, and every damaged, truncated or
// hostile stream is refused with the byte offset and record named.

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/send_stream.h"
#include "tests/util/engine_fixture.h"
#include "tests/util/pool_test_util.h"

namespace thinfs {
namespace {
namespace THINFS_TEST_FILE {  // unique per file in a unity build (tests/CMakeLists.txt)

using testing::Pattern;

constexpr uint64_t kBs = 4096;

StreamHeader Header(bool incremental) {
  StreamHeader h;
  h.block_size = kBs;
  h.device_size = 64 * kBs + 100;
  h.pool_uuid[0] = 7;
  h.guid.bytes[3] = 9;
  if (incremental) {
    h.flags = StreamHeader::kIncremental;
    h.base_guid.bytes[5] = 1;
    h.base_size = 32 * kBs;
  }
  return h;
}

// A writer appending to `out`.
StreamWriter WriterInto(std::vector<std::byte>* out, const StreamHeader& header) {
  return StreamWriter(
      [out](std::span<const std::byte> b) {
        out->insert(out->end(), b.begin(), b.end());
        return Status::Ok();
      },
      header);
}

// DATA at block 0 (2 blocks), HOLE at 4-6, DATA of the partial last block.
std::vector<std::byte> Sample(bool incremental = true) {
  std::vector<std::byte> out;
  StreamWriter w = WriterInto(&out, Header(incremental));
  EXPECT_OK(w.WriteHeader());
  EXPECT_OK(w.Data(0, Pattern(2 * kBs, 1)));
  EXPECT_OK(w.Hole(4 * kBs, 2 * kBs));
  EXPECT_OK(w.Data(64 * kBs, Pattern(100, 2)));
  EXPECT_OK(w.End());
  EXPECT_EQ(w.bytes_written(), out.size());
  return out;
}

StreamSource FromBytes(const std::vector<std::byte>& bytes, size_t chunk = 1000) {
  auto pos = std::make_shared<size_t>(0);
  return [&bytes, pos, chunk](std::span<std::byte> buf) -> Result<size_t> {
    size_t n = std::min({buf.size(), bytes.size() - *pos, chunk});
    if (n > 0) std::memcpy(buf.data(), bytes.data() + *pos, n);
    *pos += n;
    return n;
  };
}

// Reads the whole stream; returns the error, or OK with the records.
Status ReadAll(const std::vector<std::byte>& bytes, std::vector<StreamRecord>* records = nullptr) {
  StreamReader r(FromBytes(bytes));
  THINFS_RETURN_IF_ERROR(r.ReadHeader().status());
  while (true) {
    THINFS_ASSIGN_OR_RETURN(StreamRecord rec, r.ReadRecord());
    if (records != nullptr) records->push_back(rec);
    if (rec.type == StreamRecordType::kEnd) return Status::Ok();
  }
}

TEST(SendStreamTest, RoundTrip) {
  std::vector<std::byte> bytes = Sample();
  StreamReader r(FromBytes(bytes, 7));  // short reads
  auto h = r.ReadHeader();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->incremental());
  EXPECT_EQ(h->device_size, 64 * kBs + 100);
  EXPECT_EQ(h->base_size, 32 * kBs);
  EXPECT_EQ(h->guid, Header(true).guid);
  EXPECT_EQ(h->base_guid, Header(true).base_guid);
  auto a = r.ReadRecord();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->type, StreamRecordType::kData);
  EXPECT_EQ(a->offset, 0u);
  std::vector<std::byte> p = Pattern(2 * kBs, 1);
  EXPECT_TRUE(std::equal(a->data.begin(), a->data.end(), p.begin(), p.end()));
  auto b = r.ReadRecord();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->type, StreamRecordType::kHole);
  EXPECT_EQ(b->offset, 4 * kBs);
  EXPECT_EQ(b->length, 2 * kBs);
  auto c = r.ReadRecord();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->length, 100u);
  auto e = r.ReadRecord();
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->type, StreamRecordType::kEnd);
  EXPECT_EQ(e->end_records, 3u);
  EXPECT_EQ(e->end_data_bytes, 2 * kBs + 100);
  EXPECT_EQ(e->end_hole_bytes, 2 * kBs);
  EXPECT_EQ(r.position(), bytes.size());
}

TEST(SendStreamTest, EveryFlippedByteIsDetected) {
  const std::vector<std::byte> good = Sample();
  ASSERT_OK(ReadAll(good));
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<std::byte> bad = good;
    bad[i] ^= std::byte{0x20};
    Status s = ReadAll(bad);
    ASSERT_FALSE(s.ok()) << "flip at byte " << i << " not detected";
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_EQ(s.message().rfind("stream byte ", 0), 0u) << s.message();
  }
}

TEST(SendStreamTest, ErrorsNameTheRecordAndOffset) {
  const std::vector<std::byte> good = Sample();
  // Record 1 (HOLE) starts after the header and record 0 (32 + 8192 + 8).
  const size_t hole_at = kStreamHeaderBytes + kStreamRecordHeaderBytes + 2 * kBs + 8;
  std::vector<std::byte> bad = good;
  bad[hole_at + 20] ^= std::byte{1};  // its offset
  Status s = ReadAll(bad);
  EXPECT_EQ(s.message(), "stream byte " + std::to_string(hole_at + kStreamRecordHeaderBytes) +
                             " (record 1, HOLE): record checksum mismatch");
  bad = good;
  bad[kStreamHeaderBytes + 100] ^= std::byte{1};  // DATA payload
  s = ReadAll(bad);
  EXPECT_NE(s.message().find("(record 0, DATA): record checksum mismatch"), std::string::npos)
      << s.message();
  bad = good;
  bad[20] ^= std::byte{1};
  EXPECT_EQ(ReadAll(bad).message(), "stream byte 88: header checksum mismatch");
  bad = good;
  bad[0] = std::byte{'X'};
  EXPECT_EQ(ReadAll(bad).message(), "stream byte 0: not a thinfs send stream (bad magic)");
}

TEST(SendStreamTest, EveryTruncationIsDetected) {
  const std::vector<std::byte> good = Sample();
  for (size_t n = 0; n < good.size(); ++n) {
    std::vector<std::byte> cut(good.begin(), good.begin() + static_cast<long>(n));
    Status s = ReadAll(cut);
    ASSERT_FALSE(s.ok()) << "truncation at " << n << " not detected";
    EXPECT_NE(s.message().find("stream byte "), std::string::npos) << s.message();
    if (n > kStreamHeaderBytes) {
      EXPECT_NE(s.message().find("truncated"), std::string::npos) << n << ": " << s.message();
    }
  }
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  EXPECT_NE(ReadAll(longer).message().find("data after the END record"), std::string::npos);
}

// Streams a writer would never produce, each correctly checksummed: the
// reader refuses them for what they say.
TEST(SendStreamTest, HostileRecordsAreRefused) {
  struct Case {
    const char* name;
    std::function<void(StreamWriter*)> body;
    const char* error;
  };
  const Case cases[] = {
      {"unaligned", [](StreamWriter* w) { (void)w->Hole(100, kBs); }, "not block aligned"},
      {"past the end", [](StreamWriter* w) { (void)w->Hole(64 * kBs, 2 * kBs); },
       "out of the device"},
      {"overflowing", [](StreamWriter* w) { (void)w->Hole(kBs, UINT64_MAX - 10); },
       "out of the device"},
      {"out of order",
       [](StreamWriter* w) {
         (void)w->Hole(8 * kBs, kBs);
         (void)w->Hole(2 * kBs, kBs);
       },
       "precedes the previous record"},
      {"partial block inside",
       [](StreamWriter* w) { (void)w->Data(0, Pattern(100, 1)); },
       "not whole blocks"},
      {"empty hole", [](StreamWriter* w) { (void)w->Hole(0, 0); }, "out of the device"},
  };
  for (const Case& c : cases) {
    std::vector<std::byte> out;
    StreamWriter w = WriterInto(&out, Header(false));
    ASSERT_OK(w.WriteHeader());
    c.body(&w);
    ASSERT_OK(w.End());
    Status s = ReadAll(out);
    EXPECT_NE(s.message().find(c.error), std::string::npos) << c.name << ": " << s.message();
  }
}

TEST(SendStreamTest, BadHeadersAreRefused) {
  auto encode = [](StreamHeader h) { return EncodeStreamHeader(h, nullptr); };
  StreamHeader h = Header(false);
  h.block_size = 1000;
  EXPECT_NE(ReadAll(encode(h)).message().find("stream byte 16: block size"), std::string::npos);
  h = Header(false);
  h.version = 2;
  EXPECT_NE(ReadAll(encode(h)).message().find("version 2 is not supported"), std::string::npos);
  h = Header(false);
  h.flags = StreamHeader::kIncremental;  // without a base guid
  EXPECT_NE(ReadAll(encode(h)).message().find("base guid"), std::string::npos);
  EXPECT_EQ(ReadAll({}).message(), "stream byte 0: empty stream (no header)");
}

// The fuzzer's seed corpus (fuzz/corpus/send_stream/) stays in step with
// the format: streams written by `thinfs send` parse, the cut one fails.
TEST(SendStreamTest, SeedCorpusParses) {
  const std::string dir = std::string(THINFS_SOURCE_DIR) + "/fuzz/corpus/send_stream/";
  for (const char* name : {"full", "incremental_with_hole", "empty_device", "truncated"}) {
    std::string text = testing::ReadFileOrDie(dir + name);
    std::vector<std::byte> bytes(text.size());
    std::memcpy(bytes.data(), text.data(), text.size());
    std::vector<StreamRecord> records;
    Status s = ReadAll(bytes, &records);
    if (std::string(name) == "truncated") {
      EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();
    } else {
      EXPECT_OK(s);
      EXPECT_EQ(records.back().type, StreamRecordType::kEnd) << name;
    }
  }
}

TEST(SendStreamTest, GuidHex) {
  StreamGuid g;
  g.bytes[0] = 0xab;
  g.bytes[15] = 0x01;
  EXPECT_EQ(g.Hex(), "ab000000000000000000000000000001");
  StreamGuid back;
  ASSERT_TRUE(StreamGuid::FromHex(g.Hex(), &back));
  EXPECT_EQ(back, g);
  EXPECT_FALSE(StreamGuid::FromHex("xyz", &back));
}

}  // namespace THINFS_TEST_FILE
}  // namespace
}  // namespace thinfs
