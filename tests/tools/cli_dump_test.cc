// thinfs dump / restore / metadata-size, offline, against Debian's
// thin-provisioning-tools (thin_restore, thin_check, thin_dump): our XML must
// restore into dm-thin metadata that thin_check finds clean and that
// thin_dump prints back identically; thinfs restore of our XML over the
// same data must give a pool that checks clean, dumps the same and reads
// the same bytes; bad input is refused with its position and changes
// nothing. (tests/e2e/dump_e2e_test.cc mounts: hand-written XML read back
// through FUSE, COW on restored shared blocks, dump while writing.)

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/pool.h"
#include "meta/pool_dir.h"
#include "tests/tools/json_parser.h"
#include "tests/util/cli_runner.h"
#include "tests/util/pool_test_util.h"

namespace thinfs {
namespace {

using testing::CliRun;
using testing::Describe;
using testing::JsonParser;
using testing::JsonValue;
using testing::ReadFileOrDie;
using testing::TempDir;
using testing::Thinfs;
using testing::TreeDigest;
using testing::WriteFileOrDie;

constexpr uint64_t kBs = 64 * 1024;

struct ShellResult {
  int exit_code;
  std::string output;
};

ShellResult Shell(const std::string& command) {
  std::string out;
  std::FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string Q(const std::string& s) { return "'" + s + "'"; }

// The pool through the engine, in this process (no mount needed).
class EnginePool {
 public:
  explicit EnginePool(const std::string& root) {
    Result<meta::PoolFiles> f = meta::OpenPoolFiles(root, meta::OpenOptions());
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return;
    files_ = std::move(*f);
    PoolOptions o;
    o.commit_interval = std::chrono::milliseconds(0);
    Result<std::unique_ptr<Pool>> p = Pool::Open(std::move(files_.data), std::move(files_.bitmap),
                                                 std::move(files_.store), o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (p.ok()) pool = std::move(*p);
  }
  ~EnginePool() { Close(); }
  EnginePool(const EnginePool&) = delete;
  EnginePool& operator=(const EnginePool&) = delete;

  void Close() {
    if (!pool) return;
    Status s = pool->Close();
    EXPECT_TRUE(s.ok()) << s.ToString();
    pool.reset();
    files_ = meta::PoolFiles();
  }
  void WriteBlock(const std::string& name, uint64_t block, uint8_t fill) {
    auto v = pool->OpenVolume(name);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    std::vector<std::byte> data(kBs, std::byte{fill});
    data[0] = std::byte{static_cast<uint8_t>(block)};
    ASSERT_TRUE((*v)->Write(block * kBs, data).ok());
  }
  // name -> contents of every visible device.
  std::map<std::string, std::vector<std::byte>> ReadAll() {
    std::map<std::string, std::vector<std::byte>> out;
    for (const DeviceInfo& d : pool->ListDevices()) {
      auto v = pool->OpenVolume(d.id);
      EXPECT_TRUE(v.ok());
      std::vector<std::byte> buf(d.size);
      EXPECT_TRUE((*v)->Read(0, buf).ok());
      out[d.name] = std::move(buf);
    }
    return out;
  }

  std::unique_ptr<Pool> pool;

 private:
  meta::PoolFiles files_;
};

// A pool with what a dm-thin dump must show: snapshots sharing blocks,
// copy-on-write, a discard hiding a parent's block, a range clone, and a
// deleted (hidden) origin whose blocks live on in its snapshot.
void BuildPool(const std::string& pool) {
  CliRun r = Thinfs({"format", pool, "--size", "64M", "--block-size", "64K"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EnginePool e(pool);
  ASSERT_TRUE(e.pool);
  Pool& p = *e.pool;
  ASSERT_TRUE(p.CreateDevice("a", 16 * kBs).ok());
  for (uint64_t b = 0; b < 10; ++b) e.WriteBlock("a", b, 0xa0);
  ASSERT_TRUE(p.CreateSnapshot("a", "a-snap").ok());
  e.WriteBlock("a", 2, 0xa1);
  e.WriteBlock("a", 3, 0xa1);
  {
    auto s = *p.OpenVolume("a-snap");
    ASSERT_TRUE(s->Discard(5 * kBs, kBs).ok());
  }
  Result<VolumeId> b = p.CreateDevice("b", 8 * kBs);
  ASSERT_TRUE(b.ok());
  e.WriteBlock("b", 7, 0xb0);
  ASSERT_TRUE(p.ShareRange(p.GetDevice("a")->id, 4 * kBs, *b, 0, 3 * kBs).ok());
  ASSERT_TRUE(p.CreateDevice("c", 32 * kBs).ok());
  e.WriteBlock("c", 20, 0xc0);
  e.WriteBlock("c", 21, 0xc0);
  ASSERT_TRUE(p.CreateSnapshot("c", "c-snap").ok());
  e.WriteBlock("c-snap", 21, 0xc1);
  ASSERT_TRUE(p.DeleteDevice("c").ok());  // hidden: c-snap reads through it
  ASSERT_TRUE(p.Commit().ok());
}

// thin_restore gives a fresh uuid field of its own; everything else must
// match.
std::string WithoutUuid(const std::string& xml) {
  return std::regex_replace(xml, std::regex("uuid=\"[^\"]*\""), "uuid=\"\"");
}

TEST(CliDumpTest, XmlRoundTripsThroughThinTools) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  ASSERT_NO_FATAL_FAILURE(BuildPool(pool));
  const std::string xml = tmp.Sub("pool.xml");
  CliRun r = Thinfs({"dump", pool, "-o", xml, "--table", tmp.Sub("pool.devices")});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::string ours = ReadFileOrDie(xml);
  // Shared blocks show in both devices with time 0; a-snap's discarded
  // block 5 is absent; the hidden origin is not dumped but c-snap keeps
  // its block 20.
  EXPECT_NE(ours.find("data_block_size=\"128\" nr_data_blocks=\"1024\""), std::string::npos)
      << ours;
  EXPECT_EQ(std::count(ours.begin(), ours.end(), '\n'), 21) << ours;
  EXPECT_NE(ours.find("  <device dev_id=\"2\" mapped_blocks=\"9\" transaction=\"0\" creation_time=\"0\" "
                      "snap_time=\"1\">\n"
                      "    <range_mapping origin_begin=\"0\" data_begin=\"0\" length=\"2\" time=\"0\"/>\n"
                      "    <range_mapping origin_begin=\"2\" data_begin=\"2\" length=\"2\" time=\"1\"/>\n"
                      "    <single_mapping origin_block=\"4\" data_block=\"4\" time=\"0\"/>\n"
                      "    <range_mapping origin_begin=\"6\" data_begin=\"6\" length=\"4\" time=\"0\"/>\n"
                      "  </device>\n"),
            std::string::npos)
      << "a-snap: shares 0-1 and 4-9 with a (time 0), keeps 2-3 alone, 5 discarded\n" << ours;
  const std::string table = ReadFileOrDie(tmp.Sub("pool.devices"));
  EXPECT_NE(table.find("\t1048576\ta\n"), std::string::npos) << table;
  EXPECT_NE(table.find("\tc-snap\n"), std::string::npos) << table;
  EXPECT_EQ(table.find("\tc\n"), std::string::npos) << "hidden origin listed:\n" << table;

  const std::string meta = tmp.Sub("tmeta.bin");
  ASSERT_EQ(Shell("truncate -s 16M " + Q(meta)).exit_code, 0);
  ShellResult s = Shell("thin_restore -i " + Q(xml) + " -o " + Q(meta));
  ASSERT_EQ(s.exit_code, 0) << s.output;
  s = Shell("thin_check " + Q(meta));
  EXPECT_EQ(s.exit_code, 0) << s.output;
  s = Shell("thin_dump " + Q(meta));
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(WithoutUuid(s.output), WithoutUuid(ours));

  // And back: thinfs restore over the same data, no copy.
  const std::string pool2 = tmp.Sub("pool2");
  r = Thinfs({"restore", pool2, "--from", xml, "--table", tmp.Sub("pool.devices"), "--data",
              pool + "/data"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("4 devices, 25 mapped blocks, 15 data blocks in use (8 shared)"), std::string::npos) << r.out;
  r = Thinfs({"check", pool2});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  r = Thinfs({"dump", pool2});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  // Same mappings; the transaction id is the new pool's.
  auto no_tx = [](const std::string& x) {
    return std::regex_replace(WithoutUuid(x), std::regex("<superblock([^>]*) transaction=\"[0-9]+\""),
                              "<superblock$1 transaction=\"\"");
  };
  EXPECT_EQ(no_tx(r.out), no_tx(ours));
  std::map<std::string, std::vector<std::byte>> before, after;
  {
    EnginePool e(pool);
    before = e.ReadAll();
  }
  {
    EnginePool e(pool2);
    after = e.ReadAll();
  }
  ASSERT_EQ(before.size(), 4u);
  EXPECT_TRUE(before == after) << "restored devices read differently";
}

TEST(CliDumpTest, JsonCarriesNamesSizesAndRuns) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  ASSERT_NO_FATAL_FAILURE(BuildPool(pool));
  CliRun r = Thinfs({"dump", pool, "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  std::string error;
  std::optional<JsonValue> v = JsonParser::Parse(r.out, &error);
  ASSERT_TRUE(v.has_value()) << error << "\n" << r.out;
  EXPECT_EQ((*v)["block_size"].AsUint(), kBs);
  const std::vector<JsonValue>& devs = (*v)["devices"].array;
  ASSERT_EQ(devs.size(), 4u);
  std::map<std::string, uint64_t> mapped;
  for (const JsonValue& d : devs) {
    uint64_t n = 0;
    for (const JsonValue& m : d["mappings"].array) n += m["length"].AsUint();
    EXPECT_EQ(n, d["mapped_blocks"].AsUint()) << d["name"].string;
    mapped[d["name"].string] = n;
  }
  // a: 10 blocks; a-snap: 10 minus the discarded one; b: its own block 7
  // and 3 shared from a; c-snap: 2 through the hidden origin.
  EXPECT_EQ(mapped, (std::map<std::string, uint64_t>{
                        {"a", 10}, {"a-snap", 9}, {"b", 4}, {"c-snap", 2}}));
  EXPECT_EQ(mapped.size(), 4u);
}

// Writes the data area for a restore: `blocks` blocks of 64 KiB.
std::string DataFile(const TempDir& tmp, uint64_t blocks) {
  const std::string data = tmp.Sub("data");
  EXPECT_EQ(Shell("truncate -s " + std::to_string(blocks * kBs) + " " + Q(data)).exit_code, 0);
  return data;
}

constexpr char kSb[] =
    "<superblock uuid=\"\" time=\"1\" transaction=\"1\" flags=\"0\" version=\"2\" "
    "data_block_size=\"128\" nr_data_blocks=\"16\">\n";
std::string Dev(uint64_t id, uint64_t mapped) {
  return "  <device dev_id=\"" + std::to_string(id) + "\" mapped_blocks=\"" +
         std::to_string(mapped) + "\" transaction=\"0\" creation_time=\"0\" snap_time=\"1\">\n";
}
std::string Single(uint64_t origin, uint64_t data) {
  return "    <single_mapping origin_block=\"" + std::to_string(origin) + "\" data_block=\"" +
         std::to_string(data) + "\" time=\"0\"/>\n";
}
const std::string kEndDev = "  </device>\n";
const std::string kEndSb = "</superblock>\n";

TEST(CliRestoreTest, BadInputIsRefusedWithItsPositionAndChangesNothing) {
  TempDir tmp;
  const std::string data = DataFile(tmp, 16);
  const std::string xml = tmp.Sub("in.xml");
  const std::string table = tmp.Sub("table");
  const std::string good = kSb + Dev(1, 1) + Single(0, 0) + kEndDev + kEndSb;
  struct Case {
    std::string xml;
    std::string table;  // "" for none
    std::string error;
  };
  const std::vector<Case> cases = {
      {std::string(kSb) + Dev(1, 1) + "    <single_mapping origin_bl", "",
       xml + ": 3:4: unclosed token"},
      {kSb + Dev(1, 1) + Single(0, 16) + kEndDev + kEndSb, "",
       xml + ": 3:4: data blocks 16..16 of device 1 lie beyond the data area (nr_data_blocks=16)"},
      {std::regex_replace(good, std::regex("data_block_size=\"128\""), "data_block_size=\"7\""), "",
       xml + ": 1:0: data_block_size 7 sectors (3584 bytes): "},
      {std::regex_replace(good, std::regex("nr_data_blocks=\"16\""), "nr_data_blocks=\"17\""), "",
       xml + ": 1:0: nr_data_blocks=17 blocks of 64 KiB do not fit in the 1048576 bytes of " + data +
           " (room for 16 blocks)"},
      {kSb + Dev(1, 1) + Single(0, 0) + kEndDev + Dev(1, 1) + Single(0, 1) + kEndDev + kEndSb, "",
       xml + ": 5:2: dev_id 1 appears twice"},
      {kSb + Dev(1, 2) + Single(0, 0) + Single(0, 1) + kEndDev + kEndSb, "",
       xml + ": 4:4: device 1 maps origin block 0 twice"},
      {kSb + Dev(1, 2) + Single(0, 3) + Single(1, 3) + kEndDev + kEndSb, "",
       xml + ": 4:4: device 1 maps data block 3 at two origin blocks (a data block mapped twice "
             "without sharing)"},
      {kSb + Dev(1, 2) + Single(0, 0) + kEndDev + kEndSb, "",
       xml + ": 4:2: device 1 says mapped_blocks=2 but its mappings cover 1 blocks"},
      {good, "9\t65536\tx\n", table + ": dev_id 9 (x) is not in the XML"},
      {good, "1\t65536\tbad/name\n", table + ":1: name 'bad/name'"},
      {good, "1\t65536\tx\n2\t65536\tx\n", table + ":2: name 'x' appears twice"},
      {good, "1\tbig\tx\n", table + ":1: size 'big' is not a decimal number"},
      {kSb + Dev(1, 1) + Single(3, 0) + kEndDev + kEndSb, "1\t65536\tx\n",
       table + ": device 1 has size 65536 but maps block 3 (needs 262144 bytes)"},
  };
  const std::string existing = tmp.Sub("existing");
  ASSERT_EQ(Thinfs({"format", existing, "--size", "1M"}).exit_code, 0);
  for (const Case& c : cases) {
    WriteFileOrDie(xml, c.xml);
    std::vector<std::string> extra;
    if (!c.table.empty()) {
      WriteFileOrDie(table, c.table);
      extra = {"--table", table};
    }
    const auto before = TreeDigest(tmp.path());
    std::vector<std::string> args = {"restore", tmp.Sub("new"), "--from", xml, "--data", data};
    args.insert(args.end(), extra.begin(), extra.end());
    CliRun r = Thinfs(args);
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    EXPECT_NE(r.err.find("thinfs restore: " + c.error), std::string::npos)
        << "want: " << c.error << "\n" << Describe(r);
    EXPECT_EQ(TreeDigest(tmp.path()), before) << "a refused restore left something behind";
  }
  // An existing pool (or any non-empty directory) is never overwritten.
  WriteFileOrDie(xml, good);
  const auto before = TreeDigest(existing);
  CliRun r = Thinfs({"restore", existing, "--from", xml, "--data", data});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("is already a thinfs pool"), std::string::npos) << Describe(r);
  EXPECT_EQ(TreeDigest(existing), before);
  // Missing options are usage errors.
  r = Thinfs({"restore", tmp.Sub("new"), "--data", data});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  r = Thinfs({"restore", tmp.Sub("new"), "--from", xml});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  // The good input restores, into an empty directory too.
  ASSERT_EQ(::mkdir(tmp.Sub("empty").c_str(), 0755), 0);
  r = Thinfs({"restore", tmp.Sub("empty"), "--from", xml, "--data", data});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(Thinfs({"check", tmp.Sub("empty")}).exit_code, 0);
  r = Thinfs({"list", tmp.Sub("empty")});
  EXPECT_NE(r.out.find("thin1"), std::string::npos) << Describe(r);
}

TEST(CliRestoreTest, DevIdZeroGetsAFreeId) {
  TempDir tmp;
  const std::string data = DataFile(tmp, 16);
  const std::string xml = tmp.Sub("in.xml");
  WriteFileOrDie(xml, kSb + Dev(0, 1) + Single(0, 0) + kEndDev + Dev(3, 1) + Single(0, 0) +
                          kEndDev + kEndSb);
  CliRun r = Thinfs({"restore", tmp.Sub("pool"), "--from", xml, "--data", data});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(Thinfs({"check", tmp.Sub("pool")}).exit_code, 0);
  r = Thinfs({"dump", tmp.Sub("pool"), "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  std::string error;
  std::optional<JsonValue> v = JsonParser::Parse(r.out, &error);
  ASSERT_TRUE(v.has_value()) << error;
  std::map<std::string, uint64_t> ids;
  for (const JsonValue& d : (*v)["devices"].array) ids[d["name"].string] = d["dev_id"].AsUint();
  EXPECT_EQ(ids, (std::map<std::string, uint64_t>{{"thin0", 4}, {"thin3", 3}}));
  EXPECT_EQ((*v)["shared_blocks"].AsUint(), 1u);
}

TEST(CliMetadataSizeTest, EstimateCoversAFilledPool) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  // 4 KiB blocks: the most metadata per byte of data.
  constexpr uint64_t kSmall = 4096, kBlocks = 8192;
  CliRun r = Thinfs({"format", pool, "--size", std::to_string(kSmall * kBlocks), "--block-size",
                     "4K"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  {
    EnginePool e(pool);
    ASSERT_TRUE(e.pool);
    ASSERT_TRUE(e.pool->CreateDevice("v", kSmall * kBlocks).ok());
    auto v = *e.pool->OpenVolume("v");
    std::vector<std::byte> buf(kSmall * 64, std::byte{0x5a});
    for (uint64_t b = 0; b < kBlocks; b += 64) {
      buf[0] = std::byte{static_cast<uint8_t>(b)};
      ASSERT_TRUE(v->Write(b * kSmall, buf).ok());
    }
    ASSERT_EQ(e.pool->Stats().free_blocks, 0u);
  }
  uint64_t measured = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(pool + "/meta")) {
    if (entry.is_regular_file()) measured += entry.file_size();
  }
  measured += std::filesystem::file_size(pool + "/bitmap");
  r = Thinfs({"metadata-size", "-s", std::to_string(kSmall * kBlocks), "-b", "4K", "-u", "b", "-n"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const uint64_t estimate = std::stoull(r.out);
  EXPECT_GE(estimate, measured) << "estimate " << estimate << " < measured " << measured;
  std::printf("metadata-size: %llu estimated, %llu measured for %llu mapped 4 KiB blocks\n",
              static_cast<unsigned long long>(estimate), static_cast<unsigned long long>(measured),
              static_cast<unsigned long long>(kBlocks));

  // Units and bad arguments.
  r = Thinfs({"metadata-size", "-s", "1T", "-b", "64K", "-m", "100"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("16777216 blocks of 64 KiB and 100 devices"), std::string::npos) << r.out;
  r = Thinfs({"metadata-size", "-s", "1T", "-u", "m", "-n"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const uint64_t mib = std::stoull(r.out);
  r = Thinfs({"metadata-size", "-s", "1T", "-u", "b", "-n"});
  EXPECT_EQ(mib, (std::stoull(r.out) + (1 << 20) - 1) >> 20);
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"metadata-size"},
        std::vector<std::string>{"metadata-size", "-s", "1T", "-b", "5K"},
        std::vector<std::string>{"metadata-size", "-s", "1T", "-u", "q"},
        std::vector<std::string>{"metadata-size", "-s", "1K"},
        std::vector<std::string>{"metadata-size", "-s", "1T", "--bogus"}}) {
    r = Thinfs(bad);
    EXPECT_EQ(r.exit_code, 1) << Describe(r);
    EXPECT_EQ(r.err.rfind("thinfs metadata-size: ", 0), 0u) << Describe(r);
  }
  r = Thinfs({"metadata-size", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--max-thins"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace thinfs
