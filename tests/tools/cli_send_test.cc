// thinfs diff, send and receive through the built binary: full and
// incremental round trips (bytes and holes compared), and every refused
// stream (damaged at each record kind, truncated, wrong base, modified
// base, other block size, existing name) leaves the target pool unchanged
// and clean.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/pool.h"
#include "core/send_stream.h"
#include "meta/pool_dir.h"
#include "tests/tools/json_parser.h"
#include "tests/util/cli_runner.h"
#include "tests/util/engine_fixture.h"
#include "tests/util/pool_test_util.h"

namespace thinfs::testing {
namespace {

constexpr uint64_t kBs = 4096;

void FormatOrDie(const std::string& pool, const std::string& block_size = "4K") {
  CliRun r = Thinfs({"format", pool, "--size", "32M", "--block-size", block_size});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
}

// Runs `fn` on the pool opened in this process, then closes it.
void WithPool(const std::string& dir, const std::function<void(Pool&)>& fn) {
  auto files = meta::OpenPoolFiles(dir, {});
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  PoolOptions o;
  o.commit_interval = std::chrono::milliseconds(0);
  auto pool = Pool::Open(std::move(files->data), std::move(files->bitmap),
                         std::move(files->store), o);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  fn(**pool);
  ASSERT_OK((*pool)->Close());
}

// A device's bytes and the set of its mapped blocks.
struct Image {
  std::vector<std::byte> bytes;
  std::vector<uint64_t> mapped;
  bool operator==(const Image&) const = default;
};

Image ImageOf(Pool& pool, const std::string& name) {
  Image img;
  auto v = pool.OpenVolume(name);
  EXPECT_TRUE(v.ok()) << name << ": " << v.status().ToString();
  if (!v.ok()) return img;
  img.bytes.resize((*v)->size());
  auto n = (*v)->Read(0, img.bytes);
  EXPECT_TRUE(n.ok());
  auto info = pool.GetDevice(name);
  for (uint64_t b = 0; b * kBs < info->size; ++b) {
    auto m = pool.MappedBlockForTesting(info->id, b);
    EXPECT_TRUE(m.ok());
    if (*m) img.mapped.push_back(b);
  }
  return img;
}

Image ImageIn(const std::string& dir, const std::string& name) {
  Image img;
  WithPool(dir, [&](Pool& p) { img = ImageOf(p, name); });
  return img;
}

void Write(Pool& pool, const std::string& name, uint64_t block, uint64_t blocks, uint32_t seed) {
  auto v = pool.OpenVolume(name);
  ASSERT_TRUE(v.ok());
  ASSERT_OK((*v)->Write(block * kBs, Pattern(blocks * kBs, seed)));
}

// Record start offsets and types of a stream file.
std::vector<std::pair<uint64_t, StreamRecordType>> RecordsOf(const std::string& path) {
  std::string bytes = ReadFileOrDie(path);
  size_t pos = 0;
  StreamReader r([&](std::span<std::byte> buf) -> Result<size_t> {
    size_t n = std::min(buf.size(), bytes.size() - pos);
    std::memcpy(buf.data(), bytes.data() + pos, n);
    pos += n;
    return n;
  });
  std::vector<std::pair<uint64_t, StreamRecordType>> out;
  EXPECT_TRUE(r.ReadHeader().ok());
  while (true) {
    uint64_t at = r.position();
    auto rec = r.ReadRecord();
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    if (!rec.ok()) break;
    out.emplace_back(at, rec->type);
    if (rec->type == StreamRecordType::kEnd) break;
  }
  return out;
}

// What must not change when a receive is refused.
std::string ListOf(const std::string& pool) {
  CliRun r = Thinfs({"list", pool, "--json"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  return r.out;
}

void ExpectClean(const std::string& pool) {
  CliRun r = Thinfs({"check", pool});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
}

class CliSendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = tmp_.Sub("a");
    b_ = tmp_.Sub("b");
    FormatOrDie(a_);
    FormatOrDie(b_);
    // vol: 200 blocks and a partial one; data in 0-19, 50-59 and the last
    // block; everything else a hole.
    WithPool(a_, [](Pool& p) {
      ASSERT_TRUE(p.CreateDevice("vol", 200 * kBs + 1000).ok());
      Write(p, "vol", 0, 20, 1);
      Write(p, "vol", 50, 10, 2);
      auto v = p.OpenVolume("vol");
      ASSERT_OK((*v)->Write(200 * kBs, Pattern(1000, 3)));
      ASSERT_TRUE(p.CreateSnapshot("vol", "s1").ok());
      // s2: overwrite 5-6, punch 50-51, add 120, grow by 10 blocks.
      Write(p, "vol", 5, 2, 4);
      ASSERT_OK((*v)->Discard(50 * kBs, 2 * kBs));
      Write(p, "vol", 120, 1, 5);
      ASSERT_OK(p.ResizeDevice("vol", 210 * kBs));
      Write(p, "vol", 205, 1, 6);
      ASSERT_TRUE(p.CreateSnapshot("vol", "s2").ok());
    });
  }

  CliRun Send(const std::vector<std::string>& extra, const std::string& out) {
    std::vector<std::string> args = {"send", a_};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("-o");
    args.push_back(out);
    return Thinfs(args);
  }

  TempDir tmp_;
  std::string a_, b_;
};

TEST_F(CliSendTest, FullThenIncrementalRoundTrip) {
  const std::string f1 = tmp_.Sub("s1.stream"), f2 = tmp_.Sub("s2.stream");
  CliRun r = Send({"s1"}, f1);
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(r.out.empty());
  r = Thinfs({"receive", b_, "s1", "-i", f1});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const Image a1 = ImageIn(a_, "s1");
  EXPECT_EQ(a1.mapped.size(), 31u);
  EXPECT_EQ(ImageIn(b_, "s1"), a1) << "bytes or holes differ after the full receive";
  // The full stream carries the mapped data only, not the holes.
  struct stat st {};
  ASSERT_EQ(::stat(f1.c_str(), &st), 0);
  EXPECT_LT(static_cast<uint64_t>(st.st_size), 32 * kBs);
  EXPECT_GE(static_cast<uint64_t>(st.st_size), 30 * kBs + 1000);

  r = Send({"s2", "--from", "s1"}, f2);
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  ASSERT_EQ(::stat(f2.c_str(), &st), 0);
  // Changed: blocks 5-6, 120, 205 as DATA, 50-51 as a HOLE record.
  EXPECT_LT(static_cast<uint64_t>(st.st_size), 5 * kBs);
  EXPECT_GE(static_cast<uint64_t>(st.st_size), 4 * kBs);
  auto records = RecordsOf(f2);
  ASSERT_EQ(records.size(), 5u);
  EXPECT_EQ(records[1].second, StreamRecordType::kHole);
  r = Thinfs({"receive", b_, "s2", "-i", f2});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ImageIn(b_, "s2"), ImageIn(a_, "s2"));
  EXPECT_EQ(ImageIn(b_, "s1"), a1) << "the base is untouched";
  ExpectClean(b_);

  // Chained: s3 from s2, received onto the received s2.
  WithPool(a_, [](Pool& p) {
    Write(p, "vol", 150, 3, 7);
    ASSERT_TRUE(p.CreateSnapshot("vol", "s3").ok());
  });
  const std::string f3 = tmp_.Sub("s3.stream");
  ASSERT_EQ(Send({"s3", "--from", "s2"}, f3).exit_code, 0);
  r = Thinfs({"receive", b_, "s3", "-i", f3});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ImageIn(b_, "s3"), ImageIn(a_, "s3"));

  // The received s2 can itself be the source of an incremental for a third
  // pool: identities travel with the data, as ZFS guids do.
  const std::string c = tmp_.Sub("c");
  FormatOrDie(c);
  ASSERT_EQ(Thinfs({"receive", c, "s1", "-i", f1}).exit_code, 0);
  const std::string f2b = tmp_.Sub("s2-from-b.stream");
  r = Thinfs({"send", b_, "s2", "--from", "s1", "-o", f2b});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  r = Thinfs({"receive", c, "s2", "-i", f2b});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ImageIn(c, "s2"), ImageIn(a_, "s2"));
}

TEST_F(CliSendTest, PipeThroughAShell) {
  const std::string cmd = std::string(THINFS_BINARY) + " send " + a_ + " s2 | " + THINFS_BINARY +
                          " receive " + b_ + " copy";
  ASSERT_EQ(std::system(cmd.c_str()), 0);  // NOLINT(concurrency-mt-unsafe)
  EXPECT_EQ(ImageIn(b_, "copy"), ImageIn(a_, "s2"));
}

TEST_F(CliSendTest, ExistingNameNeedsForce) {
  const std::string f1 = tmp_.Sub("s1.stream");
  ASSERT_EQ(Send({"s1"}, f1).exit_code, 0);
  ASSERT_EQ(Thinfs({"receive", b_, "x", "-i", f1}).exit_code, 0);
  const std::string before = ListOf(b_);
  CliRun r = Thinfs({"receive", b_, "x", "-i", f1});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("device 'x' exists (use --force"), std::string::npos) << r.err;
  EXPECT_EQ(ListOf(b_), before);
  r = Thinfs({"receive", b_, "x", "-i", f1, "--force"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ImageIn(b_, "x"), ImageIn(a_, "s1"));
}

TEST_F(CliSendTest, DamagedStreamsAreRefusedAndChangeNothing) {
  const std::string f1 = tmp_.Sub("s1.stream"), f2 = tmp_.Sub("s2.stream");
  ASSERT_EQ(Send({"s1"}, f1).exit_code, 0);
  ASSERT_EQ(Thinfs({"receive", b_, "s1", "-i", f1}).exit_code, 0);
  ASSERT_EQ(Send({"s2", "--from", "s1"}, f2).exit_code, 0);
  const std::string good = ReadFileOrDie(f2);
  const auto records = RecordsOf(f2);
  const std::string before = ListOf(b_);

  struct Damage {
    std::string what;
    uint64_t byte;       // flipped
    std::string error;   // expected in the message
  };
  std::vector<Damage> damages = {{"header", 40, "stream byte 88: header checksum mismatch"}};
  const char* names[] = {"", "DATA", "HOLE", "END"};
  for (size_t i = 0; i < records.size(); ++i) {
    const auto [at, type] = records[i];
    // A byte of the record's offset field: the checksum catches it.
    damages.push_back({std::string("record ") + names[static_cast<int>(type)], at + 17,
                       "(record " + std::to_string(i) + ", " + names[static_cast<int>(type)] +
                           "): record checksum mismatch"});
  }
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    std::string bad = good;
    bad[d.byte] = static_cast<char>(bad[d.byte] ^ 0x40);
    const std::string path = tmp_.Sub("bad.stream");
    WriteFileOrDie(path, bad);
    CliRun r = Thinfs({"receive", b_, "s2", "-i", path});
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    EXPECT_NE(r.err.find(d.error), std::string::npos) << r.err;
    EXPECT_EQ(ListOf(b_), before) << "a refused receive left a device behind";
  }
  // Truncated anywhere after the header, also right before END.
  for (uint64_t cut : {uint64_t{kStreamHeaderBytes} + 10, records.back().first,
                       uint64_t{good.size()} - 1}) {
    const std::string path = tmp_.Sub("cut.stream");
    WriteFileOrDie(path, good.substr(0, cut));
    CliRun r = Thinfs({"receive", b_, "s2", "-i", path});
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
    EXPECT_EQ(ListOf(b_), before);
  }
  ExpectClean(b_);
  // The intact stream still applies.
  EXPECT_EQ(Thinfs({"receive", b_, "s2", "-i", f2}).exit_code, 0);
  EXPECT_EQ(ImageIn(b_, "s2"), ImageIn(a_, "s2"));
}

TEST_F(CliSendTest, WrongOrModifiedBaseIsRefused) {
  const std::string f1 = tmp_.Sub("s1.stream"), f2 = tmp_.Sub("s2.stream");
  ASSERT_EQ(Send({"s1"}, f1).exit_code, 0);
  ASSERT_EQ(Send({"s2", "--from", "s1"}, f2).exit_code, 0);

  // No base at all: b has never received s1.
  std::string before = ListOf(b_);
  CliRun r = Thinfs({"receive", b_, "s2", "-i", f2});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("no device with the stream's base guid"), std::string::npos) << r.err;
  EXPECT_EQ(ListOf(b_), before);

  // A base with the same name but other content does not count.
  WithPool(b_, [](Pool& p) { ASSERT_TRUE(p.CreateDevice("s1", 201 * kBs).ok()); });
  r = Thinfs({"receive", b_, "s2", "-i", f2});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("no device with the stream's base guid"), std::string::npos) << r.err;

  // The received base, written to since: refused, nothing created.
  ASSERT_EQ(Thinfs({"receive", b_, "base", "-i", f1}).exit_code, 0);
  WithPool(b_, [](Pool& p) { Write(p, "base", 3, 1, 99); });
  before = ListOf(b_);
  r = Thinfs({"receive", b_, "s2", "-i", f2});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("device 'base', was modified since it was received"), std::string::npos)
      << r.err;
  EXPECT_EQ(ListOf(b_), before);

  // On the sending side too: a base written after the full send yields a
  // stream for a different base.
  WithPool(a_, [](Pool& p) { Write(p, "s1", 3, 1, 98); });
  const std::string c = tmp_.Sub("c");
  FormatOrDie(c);
  ASSERT_EQ(Thinfs({"receive", c, "s1", "-i", f1}).exit_code, 0);
  const std::string f2x = tmp_.Sub("s2x.stream");
  ASSERT_EQ(Send({"s2", "--from", "s1"}, f2x).exit_code, 0);
  r = Thinfs({"receive", c, "s2", "-i", f2x});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("base guid"), std::string::npos) << r.err;
  ExpectClean(c);
}

TEST_F(CliSendTest, OtherBlockSizeIsRefused) {
  const std::string f1 = tmp_.Sub("s1.stream");
  ASSERT_EQ(Send({"s1"}, f1).exit_code, 0);
  const std::string big = tmp_.Sub("big");
  FormatOrDie(big, "64K");
  const std::string before = ListOf(big);
  CliRun r = Thinfs({"receive", big, "s1", "-i", f1});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("stream block size 4 KiB differs from the pool's 64 KiB"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(ListOf(big), before);
}

TEST_F(CliSendTest, DiffFormats) {
  CliRun r = Thinfs({"diff", a_, "s1", "s2"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("different"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("left_only"), std::string::npos) << r.out;
  // 5-6 different, 50-51 left only, 120 and 205 right only; the partial
  // last block 200 of s1 is the same data block in the grown s2.
  r = Thinfs({"diff", a_, "s1", "s2", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  JsonValue v = ParseJson(r.out);
  ASSERT_EQ(v.type, JsonValue::Type::kObject) << r.out;
  EXPECT_EQ(v["differ_bytes"].AsUint(), 6 * kBs) << r.out;
  ASSERT_EQ(v["ranges"].array.size(), 4u) << r.out;
  EXPECT_EQ(v["ranges"].array[0]["kind"].string, "different");
  EXPECT_EQ(v["ranges"].array[0]["offset"].AsUint(), 5 * kBs);
  EXPECT_EQ(v["ranges"].array[0]["length"].AsUint(), 2 * kBs);
  r = Thinfs({"diff", a_, "s1", "s2", "--format", "xml", "--same"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("<same begin=\"0\" length=\"5\"/>"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<different begin=\"5\" length=\"2\"/>"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<left_only begin=\"50\" length=\"2\"/>"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<right_only begin=\"120\" length=\"1\"/>"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("data_block_size=\"8\""), std::string::npos) << r.out;

  r = Thinfs({"diff", a_, "s1", "nope"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("no device 'nope'"), std::string::npos);
  r = Thinfs({"diff", a_, "s1", "s2", "--format", "yaml"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
}

TEST_F(CliSendTest, SendRefusesATerminalAndMissingDevices) {
  CliRun r = Thinfs({"send", a_, "nope", "-o", tmp_.Sub("x")});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("no device 'nope'"), std::string::npos) << r.err;
  r = Thinfs({"send", a_, "s2", "--from", "nope", "-o", tmp_.Sub("x")});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("--from: no device 'nope'"), std::string::npos) << r.err;
  EXPECT_NE(::access(tmp_.Sub("x").c_str(), F_OK), 0) << "no stream file left behind";
  r = Thinfs({"receive", b_, "bad/name", "-i", tmp_.Sub("x")});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  r = Thinfs({"receive", b_, "s1", "-i", tmp_.Sub("missing")});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
}

}  // namespace
}  // namespace thinfs::testing
