// Runs the built thinfs binary and checks exit codes, stdout and stderr.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "meta/pool_dir.h"
#include "tests/tools/json_parser.h"
#include "tests/util/cli_runner.h"
#include "tests/util/pool_test_util.h"

namespace thinfs {
namespace {

using testing::FlipByteOrDie;
using testing::JsonParser;
using testing::JsonValue;
using testing::ParseJson;
using testing::ReadFileOrDie;
using testing::TempDir;
using testing::TreeDigest;
using testing::WriteFileOrDie;

using testing::CliRun;
using testing::Describe;
using testing::Thinfs;

// A failure reports exactly one line on stderr, "thinfs CMD: ...".
void ExpectOneLineError(const CliRun& r, const std::string& prefix, const std::string& needle) {
  EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << Describe(r);
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.back(), '\n') << Describe(r);
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << Describe(r);
  EXPECT_NE(r.err.find(needle), std::string::npos) << "want '" << needle << "'\n" << Describe(r);
}

void FormatOrDie(const std::string& pool, const std::string& size = "16M") {
  CliRun r = Thinfs({"format", pool, "--size", size});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
}

struct CommandSpec {
  const char* name;
  std::vector<const char*> options;  // every option --help must list
};
const CommandSpec kCommands[] = {
    {"format", {"--size", "--block-size", "--data", "--force", "--json", "--help"}},
    {"status", {"--json", "--help"}},
    {"check", {"--repair", "--json", "--read-only", "--help"}},
    {"create", {"--size", "--json", "--help", "Example"}},
    {"snapshot", {"--json", "--help", "Example", "fsync"}},
    {"delete", {"--json", "--help", "Example"}},
    {"resize", {"--size", "--json", "--help", "Example"}},
    {"rename", {"--json", "--help", "Example"}},
    {"list", {"--json", "--help", "Example", "exclusive_blocks"}},
    {"grow", {"--size", "--json", "--help", "Example", "Shrinking is refused"}},
    {"dump", {"--format", "--output", "--table", "--help", "Example"}},
    {"restore", {"--from", "--data", "--table", "--help", "Example"}},
    {"diff", {"--format", "--same", "--help", "Example", "thin_delta"}},
    {"send", {"--from", "--output", "--verbose", "--help", "Example"}},
    {"receive", {"--input", "--force", "--verbose", "--help", "Example", "atomic"}},
};

// The device commands, each with valid arguments after POOL.
struct DeviceCommand {
  const char* name;
  std::vector<std::string> args;
};
const DeviceCommand kDeviceCommands[] = {
    {"create", {"vol", "--size", "1M"}}, {"snapshot", {"vol", "snap"}},
    {"delete", {"vol"}},                 {"resize", {"vol", "--size", "2M"}},
    {"rename", {"vol", "other"}},        {"list", {}},
    {"grow", {"--size", "64M"}},
};

// The byte of the bitmap header to damage: inside the checksummed header,
// outside the magic.
constexpr uint64_t kBitmapHeaderByte = testing::kBitmapHeaderFlipOffsetForTesting;

// ----------------------------------------------------------- global options

TEST(CliTest, Version) {
  CliRun r = Thinfs({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("thinfs ", 0), 0u) << r.out;
  EXPECT_TRUE(r.out.size() > 7 && std::isdigit(static_cast<unsigned char>(r.out[7]))) << r.out;
  EXPECT_TRUE(r.err.empty());
}

TEST(CliTest, HelpListsEveryCommand) {
  for (const char* flag : {"--help", "-h", "help"}) {
    CliRun r = Thinfs({flag});
    EXPECT_EQ(r.exit_code, 0) << flag;
    for (const CommandSpec& c : kCommands) {
      EXPECT_NE(r.out.find(std::string("  ") + c.name + " "), std::string::npos)
          << c.name << "\n" << r.out;
    }
    EXPECT_NE(r.out.find("Exit status"), std::string::npos);
  }
}

TEST(CliTest, NoArgumentsIsAUsageError) {
  CliRun r = Thinfs({});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("usage: thinfs"), std::string::npos);
}

TEST(CliTest, UnknownCommandOrOption) {
  CliRun r = Thinfs({"frobnicate"});
  EXPECT_EQ(r.exit_code, 1);
  ExpectOneLineError(r, "thinfs: ", "unknown command 'frobnicate'");
  r = Thinfs({"--frobnicate"});
  EXPECT_EQ(r.exit_code, 1);
  ExpectOneLineError(r, "thinfs: ", "'--frobnicate'");
  r = Thinfs({"help", "frobnicate"});
  EXPECT_EQ(r.exit_code, 1);
  ExpectOneLineError(r, "thinfs: ", "unknown command 'frobnicate'");
}

// ------------------------------------------- the same checks for every command

TEST(CliTest, EveryCommandHasHelp) {
  for (const CommandSpec& c : kCommands) {
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{c.name, "--help"}, std::vector<std::string>{"help", c.name},
          std::vector<std::string>{c.name, "-h"}}) {
      CliRun r = Thinfs(args);
      EXPECT_EQ(r.exit_code, 0) << c.name << "\n" << Describe(r);
      EXPECT_EQ(r.out.rfind(std::string("usage: thinfs ") + c.name + " POOL", 0), 0u) << r.out;
      for (const char* option : c.options) {
        EXPECT_NE(r.out.find(option), std::string::npos) << c.name << " lacks " << option;
      }
      EXPECT_NE(r.out.find("Exit status"), std::string::npos) << r.out;
      EXPECT_TRUE(r.err.empty()) << r.err;
    }
  }
}

TEST(CliTest, EveryCommandRejectsABadOption) {
  TempDir tmp;
  for (const CommandSpec& c : kCommands) {
    CliRun r = Thinfs({c.name, tmp.Sub("pool"), "--no-such-option"});
    EXPECT_EQ(r.exit_code, 1) << Describe(r);
    ExpectOneLineError(r, std::string("thinfs ") + c.name + ": ", "--no-such-option");
    EXPECT_FALSE(testing::TreeDigest(tmp.path()).count("pool")) << "nothing created";
  }
}

TEST(CliTest, EveryCommandNeedsAPool) {
  for (const CommandSpec& c : kCommands) {
    CliRun r = Thinfs({c.name});
    EXPECT_EQ(r.exit_code, 1) << Describe(r);
    ExpectOneLineError(r, std::string("thinfs ") + c.name + ": ", "missing POOL argument");
  }
}

TEST(CliTest, EveryCommandOnAMissingPool) {
  TempDir tmp;
  const std::string pool = tmp.Sub("absent");

  CliRun r = Thinfs({"status", pool});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs status: ", "pool " + pool + " does not exist");

  r = Thinfs({"check", pool});
  EXPECT_EQ(r.exit_code, 8) << Describe(r);
  ExpectOneLineError(r, "thinfs check: ", "pool " + pool + " does not exist");

  // format of a missing pool needs its parent.
  r = Thinfs({"format", tmp.Sub("no/such/parent"), "--size", "1M"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs format: ", "create pool directory " + tmp.Sub("no/such/parent"));

  // A directory that is not a pool is "missing" too, and stays untouched.
  r = Thinfs({"status", tmp.path()});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs status: ", "is not a thinfs pool");
  r = Thinfs({"check", tmp.path()});
  EXPECT_EQ(r.exit_code, 8) << Describe(r);
  ExpectOneLineError(r, "thinfs check: ", "is not a thinfs pool");
  EXPECT_EQ(TreeDigest(tmp.path()).size(), 1u) << "nothing created";
}

TEST(CliTest, EveryCommandOnACorruptedBitmap) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool);
  FlipByteOrDie(pool + "/bitmap", kBitmapHeaderByte);

  CliRun r = Thinfs({"status", pool});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs status: ", "bitmap " + pool + "/bitmap");
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;

  for (const char* ro : {"--read-only", ""}) {
    std::vector<std::string> args = {"check", pool};
    if (*ro) args.push_back(ro);
    r = Thinfs(args);
    EXPECT_EQ(r.exit_code, 4) << Describe(r);
    EXPECT_NE(r.out.find("error: bitmap " + pool + "/bitmap"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("checksum"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("errors left uncorrected"), std::string::npos) << r.out;
  }

  r = Thinfs({"check", pool, "--json", "--read-only"});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  JsonValue v = ParseJson(r.out);
  ASSERT_EQ(v.type, JsonValue::Type::kObject);
  EXPECT_FALSE(v["clean"].boolean);
  ASSERT_EQ(v["errors"].array.size(), 1u) << r.out;
  EXPECT_NE(v["errors"].array[0].string.find("checksum"), std::string::npos);

  // format refuses the damaged pool unless forced, then repairs it by
  // starting over.
  const auto before = TreeDigest(pool);
  r = Thinfs({"format", pool, "--size", "16M"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs format: ", "already a thinfs pool");
  EXPECT_EQ(TreeDigest(pool), before);
  r = Thinfs({"format", pool, "--size", "16M", "--force"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(Thinfs({"check", pool}).exit_code, 0);
}

// ------------------------------------------------------------------- format

TEST(CliFormatTest, PrintsASummary) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  CliRun r = Thinfs({"format", pool, "--size", "10M", "--block-size", "12k"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("formatted pool " + pool), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("block size:  12 KiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("blocks:      853"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("uuid:"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(CliFormatTest, JsonSummary) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  CliRun r = Thinfs({"format", pool, "--size", "1G", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  JsonValue v = ParseJson(r.out);
  EXPECT_EQ(v["pool"].string, pool);
  EXPECT_EQ(v["data_path"].string, pool + "/data");
  EXPECT_EQ(v["data_bytes"].AsUint(), uint64_t{1} << 30);
  EXPECT_EQ(v["block_size"].AsUint(), 65536u);
  EXPECT_EQ(v["data_blocks"].AsUint(), 16384u);
  EXPECT_EQ(v["uuid"].string.size(), 36u);
}

TEST(CliFormatTest, BadSizesAreUsageErrors) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  struct Case {
    std::vector<std::string> args;
    const char* needle;
  };
  const Case cases[] = {
      {{"--size", "0"}, "size must not be zero"},
      {{"--size", "12abc"}, "--size: invalid size '12abc': unknown suffix 'abc'"},
      {{"--size", "lots"}, "--size: invalid size 'lots'"},
      {{"--size", "1.5G"}, "fractional"},
      {{"--size=-1G"}, "negative size"},
      {{"--size", "99999999999999999999"}, "does not fit in 64 bits"},
      {{"--size", "16K"}, "smaller than one block"},
      {{"--size", "1G", "--block-size", "5000"}, "multiple of 4 KiB (got 5000)"},
      {{"--size", "4G", "--block-size", "2G"}, "at most 1 GiB"},
      {{"--size", "1G", "--block-size", "0"}, "block size must not be zero"},
      {{}, "--size is required"},
      {{"--size"}, "--size"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"format", pool};
    args.insert(args.end(), c.args.begin(), c.args.end());
    CliRun r = Thinfs(args);
    EXPECT_EQ(r.exit_code, 1) << Describe(r);
    ExpectOneLineError(r, "thinfs format: ", c.needle);
    struct stat st;
    EXPECT_NE(::stat(pool.c_str(), &st), 0) << "nothing may be created";
  }
}

TEST(CliFormatTest, ExistingPoolIsRefusedUnchanged) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool);
  const auto before = TreeDigest(pool);
  CliRun r = Thinfs({"format", pool, "--size", "32M"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs format: ", pool + " is already a thinfs pool (use --force");
  EXPECT_EQ(TreeDigest(pool), before);
}

TEST(CliFormatTest, NonPoolDirectoryIsRefusedUnchanged) {
  TempDir tmp;
  WriteFileOrDie(tmp.Sub("notes.txt"), "mine");
  const auto before = TreeDigest(tmp.path());
  CliRun r = Thinfs({"format", tmp.path(), "--size", "1M"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs format: ", "is not empty and is not a thinfs pool");
  EXPECT_EQ(TreeDigest(tmp.path()), before);
}

TEST(CliFormatTest, UnwritableDirectory) {
  // Not even root may create directories in /proc.
  CliRun r = Thinfs({"format", "/proc/thinfs-cli-test", "--size", "1M"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs format: ", "create pool directory /proc/thinfs-cli-test");
  // A path below a regular file cannot be created either.
  TempDir tmp;
  WriteFileOrDie(tmp.Sub("file"), "");
  r = Thinfs({"format", tmp.Sub("file/pool"), "--size", "1M"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs format: ", "Not a directory");
}

// TreeDigest, which the refusal tests compare, sees every change of a
// file's bytes, and none of how the file system lays them out: a hole
// and written zeros are alike (ext4 reports a fresh bitmap's zero tail as
// data while it is cached and as a hole after a cache drop).
TEST(TreeDigestTest, ContentChangesShowAndLayoutDoesNot) {
  TempDir tmp;
  const std::string path = tmp.Sub("f");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  auto put = [&](off_t at, const std::string& bytes) {
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), at), static_cast<ssize_t>(bytes.size()));
    ASSERT_EQ(::fsync(fd), 0);
  };
  // The content's part of the file's entry (its mtime changes with any
  // write).
  auto hash = [&] {
    const std::string entry = TreeDigest(tmp.path()).at("f");
    return entry.substr(entry.find("xxh64 "));
  };
  put(8192, "abc");
  const std::string base = hash();
  put(65536, std::string(8192, '\0'));  // zeros where a hole was
  EXPECT_EQ(hash(), base) << "written zeros read as a change";
  put(100, "x");
  EXPECT_NE(hash(), base) << "a byte written into a hole";
  put(100, std::string(1, '\0'));
  EXPECT_EQ(hash(), base) << "the byte zeroed again";
  put(8192, std::string(3, '\0'));
  put(12288, "abc");
  EXPECT_NE(hash(), base) << "the same bytes at another offset";
  ::close(fd);
}

TEST(CliFormatTest, LockedPoolIsNeverReformatted) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool);
  Result<meta::PoolLock> lock = meta::PoolLock::Acquire(pool + "/lock");
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  const auto before = TreeDigest(pool);
  const std::string holder = "in use by process " + std::to_string(::getpid());

  CliRun r = Thinfs({"format", pool, "--size", "32M", "--force"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs format: ", holder);
  EXPECT_EQ(TreeDigest(pool), before);

  r = Thinfs({"status", pool});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs status: ", holder);
  r = Thinfs({"check", pool});
  EXPECT_EQ(r.exit_code, 8) << Describe(r);
  ExpectOneLineError(r, "thinfs check: ", holder);
  EXPECT_EQ(TreeDigest(pool), before);
}

TEST(CliFormatTest, DataOnAnExistingFile) {
  TempDir tmp;
  const std::string backing = tmp.Sub("backing.img");
  WriteFileOrDie(backing, "");
  ASSERT_EQ(::truncate(backing.c_str(), 8 << 20), 0);
  const std::string pool = tmp.Sub("pool");
  CliRun r = Thinfs({"format", pool, "--size", "16M", "--data", backing});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  ExpectOneLineError(r, "thinfs format: ", "exceeds the 8388608 bytes of " + backing);
  r = Thinfs({"format", pool, "--size", "8M", "--data", backing, "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ParseJson(r.out)["data_path"].string, backing);
  r = Thinfs({"status", pool, "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ParseJson(r.out)["data_path"].string, backing);
}

// Not a benchmark: proves a big sparse pool is cheap, and prints the figures.
TEST(CliFormatTest, OneTebibyteSparsePool) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  auto start = std::chrono::steady_clock::now();
  CliRun r = Thinfs({"format", pool, "--size", "1T", "--block-size", "64K"});
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << Describe(r);

  uint64_t allocated = 0, apparent = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(pool)) {
    struct stat st;
    ASSERT_EQ(::lstat(entry.path().c_str(), &st), 0);
    allocated += static_cast<uint64_t>(st.st_blocks) * 512;
    apparent += static_cast<uint64_t>(st.st_size);
  }
  std::printf("format 1 TiB / 64 KiB blocks: %.3f s wall, du %.2f MiB, apparent %.2f GiB\n",
              secs, static_cast<double>(allocated) / (1 << 20),
              static_cast<double>(apparent) / (1 << 30));
  EXPECT_GE(apparent, uint64_t{1} << 40);
  // The 16 Mi-block bitmap is 2 MiB; RocksDB adds a little.
  EXPECT_LT(allocated, uint64_t{32} << 20);

  r = Thinfs({"status", pool, "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ParseJson(r.out)["data_blocks"].AsUint(), uint64_t{1} << 24);
}

// ------------------------------------------------------------------- status

TEST(CliStatusTest, JsonHasTheKeys) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool, "64M");
  CliRun r = Thinfs({"status", pool, "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  JsonValue v = ParseJson(r.out);
  ASSERT_EQ(v.type, JsonValue::Type::kObject) << r.out;
  for (const char* key : {"pool", "uuid", "created", "created_ns", "data_path", "data_bytes",
                          "block_size", "data_blocks", "used_blocks", "free_blocks", "devices",
                          "transaction_id", "bitmap_clean"}) {
    EXPECT_TRUE(v.Has(key)) << key << " missing: " << r.out;
  }
  EXPECT_EQ(v["block_size"].AsUint(), 65536u);
  EXPECT_EQ(v["data_blocks"].AsUint(), 1024u);
  EXPECT_EQ(v["free_blocks"].AsUint(), 1024u);
  EXPECT_EQ(v["used_blocks"].AsUint(), 0u);
  EXPECT_EQ(v["devices"].AsUint(), 0u);
  EXPECT_EQ(v["transaction_id"].AsUint(), 0u);
  EXPECT_TRUE(v["bitmap_clean"].boolean);
  EXPECT_EQ(v["data_path"].string, pool + "/data");
  EXPECT_EQ(v["created"].string.size(), 20u) << v["created"].string;
}

TEST(CliStatusTest, Text) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool, "64M");
  CliRun r = Thinfs({"status", pool});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("block size:      64 KiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("data size:       64 MiB (1024 blocks)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("used:            0 blocks (0 B, 0.00%)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("devices:         0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bitmap:          clean"), std::string::npos) << r.out;
}

// -------------------------------------------------------------------- check

TEST(CliCheckTest, FreshPoolIsClean) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool);
  CliRun r = Thinfs({"check", pool});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find(": clean"), std::string::npos) << r.out;
  r = Thinfs({"check", pool, "--json", "--read-only"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  JsonValue v = ParseJson(r.out);
  EXPECT_TRUE(v["clean"].boolean);
  EXPECT_TRUE(v["errors"].array.empty());
  EXPECT_TRUE(v["warnings"].array.empty()) << r.out;
  EXPECT_EQ(v["mappings"].AsUint(), 0u);
}

TEST(CliCheckTest, ReadOnlyCheckWritesNothing) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool);
  // The lock file records (then forgets) the checker's PID; everything
  // else must be left byte for byte.
  auto before = TreeDigest(pool);
  before.erase("lock");
  before.erase(".");
  CliRun r = Thinfs({"check", pool, "--read-only"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  auto after = TreeDigest(pool);
  after.erase("lock");
  after.erase(".");
  EXPECT_EQ(after, before);
}

TEST(CliCheckTest, TruncatedDataArea) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool, "16M");
  ASSERT_EQ(::truncate((pool + "/data").c_str(), 1 << 20), 0);
  CliRun r = Thinfs({"check", pool});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  EXPECT_NE(r.out.find("error: data area " + pool + "/data holds 1048576 bytes"),
            std::string::npos)
      << r.out;
  r = Thinfs({"status", pool});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs status: ", "holds 1048576 bytes");
}

TEST(CliCheckTest, MissingMetadataStore) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool);
  std::filesystem::remove_all(pool + "/meta");
  CliRun r = Thinfs({"check", pool});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  EXPECT_NE(r.out.find("error: metadata store " + pool + "/meta"), std::string::npos) << r.out;
}

// ------------------------------------------------------------ device commands

CliRun RunDeviceCommand(const DeviceCommand& c, const std::string& pool) {
  std::vector<std::string> args = {c.name, pool};
  args.insert(args.end(), c.args.begin(), c.args.end());
  return Thinfs(args);
}

TEST(CliDeviceTest, EveryDeviceCommandOnAMissingPool) {
  TempDir tmp;
  const std::string pool = tmp.Sub("absent");
  for (const DeviceCommand& c : kDeviceCommands) {
    CliRun r = RunDeviceCommand(c, pool);
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    ExpectOneLineError(r, std::string("thinfs ") + c.name + ": ",
                       "pool " + pool + " does not exist");
    r = RunDeviceCommand(c, tmp.path());
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    ExpectOneLineError(r, std::string("thinfs ") + c.name + ": ", "is not a thinfs pool");
  }
  EXPECT_EQ(TreeDigest(tmp.path()).size(), 1u) << "nothing created";
}

TEST(CliDeviceTest, EveryDeviceCommandOnACorruptedBitmap) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool);
  ASSERT_EQ(Thinfs({"create", pool, "vol", "--size", "1M"}).exit_code, 0);
  FlipByteOrDie(pool + "/bitmap", kBitmapHeaderByte);
  const std::string bitmap_before = ReadFileOrDie(pool + "/bitmap");
  for (const DeviceCommand& c : kDeviceCommands) {
    CliRun r = RunDeviceCommand(c, pool);
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    ExpectOneLineError(r, std::string("thinfs ") + c.name + ": ", "bitmap " + pool + "/bitmap");
    EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
    EXPECT_EQ(ReadFileOrDie(pool + "/bitmap"), bitmap_before) << c.name << " wrote the bitmap";
  }
}

TEST(CliDeviceTest, JsonRoundTrip) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool, "64M");
  CliRun r = Thinfs({"create", pool, "vm1", "--size", "10M", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  JsonValue v = ParseJson(r.out);
  EXPECT_EQ(v["name"].string, "vm1");
  EXPECT_EQ(v["size"].AsUint(), 10u << 20);
  EXPECT_EQ(v["mapped_blocks"].AsUint(), 0u);
  EXPECT_EQ(v["parent"].type, JsonValue::Type::kNull);
  EXPECT_TRUE(r.err.empty()) << r.err;

  r = Thinfs({"snapshot", pool, "vm1", "vm1-snap", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  v = ParseJson(r.out);
  EXPECT_EQ(v["name"].string, "vm1-snap");
  EXPECT_EQ(v["parent"].string, "vm1");
  EXPECT_EQ(v["size"].AsUint(), 10u << 20);

  r = Thinfs({"resize", pool, "vm1", "--size", "1G", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ParseJson(r.out)["size"].AsUint(), 1u << 30);

  r = Thinfs({"rename", pool, "vm1-snap", "vm1.old", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ParseJson(r.out)["name"].string, "vm1.old");

  r = Thinfs({"list", pool, "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  v = ParseJson(r.out);
  ASSERT_EQ(v.type, JsonValue::Type::kArray) << r.out;
  ASSERT_EQ(v.array.size(), 2u) << r.out;
  for (const JsonValue& d : v.array) {
    for (const char* key : {"name", "size", "mapped_blocks", "exclusive_blocks", "shared_blocks",
                            "parent", "created"}) {
      EXPECT_TRUE(d.Has(key)) << key << ": " << r.out;
    }
    EXPECT_EQ(d["created"].string.size(), 20u) << d["created"].string;
  }
  EXPECT_EQ(v.array[0]["name"].string, "vm1");
  EXPECT_EQ(v.array[0]["size"].AsUint(), 1u << 30);
  EXPECT_EQ(v.array[1]["name"].string, "vm1.old");
  EXPECT_EQ(v.array[1]["parent"].string, "vm1");

  r = Thinfs({"list", pool});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("vm1.old"), std::string::npos) << r.out;

  r = Thinfs({"delete", pool, "vm1.old", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(ParseJson(r.out)["deleted"].boolean);
  r = Thinfs({"list", pool, "--json"});
  EXPECT_EQ(ParseJson(r.out).array.size(), 1u) << r.out;
  r = Thinfs({"status", pool, "--json"});
  EXPECT_EQ(ParseJson(r.out)["devices"].AsUint(), 1u) << r.out;
  EXPECT_EQ(Thinfs({"check", pool}).exit_code, 0);
}

TEST(CliDeviceTest, BadInputsChangeNothing) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool, "64M");
  ASSERT_EQ(Thinfs({"create", pool, "a", "--size", "1M"}).exit_code, 0);
  ASSERT_EQ(Thinfs({"create", pool, "b", "--size", "1M"}).exit_code, 0);
  const std::string before = Thinfs({"list", pool, "--json"}).out;
  ASSERT_FALSE(before.empty());
  struct Case {
    std::vector<std::string> args;  // after the command name and POOL
    const char* command;
    int exit_code;
    const char* needle;
  };
  const Case cases[] = {
      {{"a", "--size", "1M"}, "create", 2, "device 'a' already exists"},
      {{".a", "--size", "1M"}, "create", 1, "must not start with '.'"},
      {{"a/b", "--size", "1M"}, "create", 1, "a/b"},
      {{std::string(129, 'x'), "--size", "1M"}, "create", 1, "name"},
      {{"c"}, "create", 1, "--size is required"},
      {{"c", "--size", "12abc"}, "create", 1, "--size: invalid size '12abc'"},
      {{"c", "--size=-1M"}, "create", 1, "negative size"},
      {{"nope", "s"}, "snapshot", 2, "no device named 'nope'"},
      {{"a", "b"}, "snapshot", 2, "device 'b' already exists"},
      {{"a", ".s"}, "snapshot", 1, "must not start with '.'"},
      {{"a"}, "snapshot", 1, "missing NAME argument"},
      {{"nope"}, "delete", 2, "no device named 'nope'"},
      {{"nope", "--size", "1M"}, "resize", 2, "no device named 'nope'"},
      {{"a", "--size=-1"}, "resize", 1, "negative size"},
      {{"a", "--size", "lots"}, "resize", 1, "invalid size 'lots'"},
      {{"a", "--size", "9223372036854775808"}, "resize", 1, "largest device"},
      {{"a"}, "resize", 1, "--size is required"},
      {{"nope", "z"}, "rename", 2, "no device named 'nope'"},
      {{"a", "b"}, "rename", 2, "device 'b' already exists"},
      {{"a", ".b"}, "rename", 1, "must not start with '.'"},
      {{"extra"}, "list", 1, "unexpected argument 'extra'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {c.command, pool};
    args.insert(args.end(), c.args.begin(), c.args.end());
    CliRun r = Thinfs(args);
    EXPECT_EQ(r.exit_code, c.exit_code) << Describe(r);
    ExpectOneLineError(r, std::string("thinfs ") + c.command + ": ", c.needle);
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(Thinfs({"list", pool, "--json"}).out, before) << c.command << " changed the pool";
  }
  EXPECT_EQ(Thinfs({"check", pool}).exit_code, 0);
}

TEST(CliDeviceTest, StaleControlSocketIsIgnored) {
  // A daemon killed with -9 leaves control.sock behind with nobody
  // listening: the commands open the pool directly.
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool);
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = pool + "/control.sock";
  ASSERT_LT(path.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::close(fd);  // bound, never listened: connect() is refused
  CliRun r = Thinfs({"create", pool, "v", "--size", "1M"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  r = Thinfs({"status", pool, "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ParseJson(r.out)["devices"].AsUint(), 1u);
  EXPECT_FALSE(ParseJson(r.out)["mounted"].boolean);
}

}  // namespace
// ------------------------------------------------------------------- grow

TEST(CliGrowTest, GrowsASparsePoolAndStatusShowsIt) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool, "16M");
  CliRun r = Thinfs({"create", pool, "vol", "--size", "1G"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  r = Thinfs({"grow", pool, "--size", "64M", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  JsonValue g = ParseJson(r.out);
  EXPECT_EQ(g["data_bytes"].AsUint(), uint64_t{64} << 20);
  r = Thinfs({"status", pool, "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  JsonValue st = ParseJson(r.out);
  EXPECT_EQ(st["data_bytes"].AsUint(), uint64_t{64} << 20);
  EXPECT_EQ(st["free_blocks"].AsUint(), st["data_blocks"].AsUint());
  EXPECT_EQ(st["low_water_blocks"].AsUint(), 0u);
  struct stat s;
  ASSERT_EQ(::stat((pool + "/data").c_str(), &s), 0);
  EXPECT_EQ(s.st_size, 64 << 20);
  // The pool still checks clean and the device is still there.
  r = Thinfs({"check", pool});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  r = Thinfs({"list", pool});
  EXPECT_NE(r.out.find("vol"), std::string::npos) << Describe(r);
  r = Thinfs({"grow", pool, "--size", "80M"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("grew pool from 64 MiB to 80 MiB"), std::string::npos) << Describe(r);
}

TEST(CliGrowTest, ShrinkIsRefusedUnchanged) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool, "32M");
  CliRun r = Thinfs({"grow", pool, "--size", "16M"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  ExpectOneLineError(r, "thinfs grow: ", "shrinking a pool is not supported");
  r = Thinfs({"status", pool, "--json"});
  EXPECT_EQ(ParseJson(r.out)["data_bytes"].AsUint(), uint64_t{32} << 20);
}

TEST(CliGrowTest, MissingSizeOrBadSizeIsAUsageError) {
  TempDir tmp;
  const std::string pool = tmp.Sub("pool");
  FormatOrDie(pool);
  CliRun r = Thinfs({"grow", pool});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  ExpectOneLineError(r, "thinfs grow: ", "--size is required");
  r = Thinfs({"grow", pool, "--size", "lots"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  r = Thinfs({"grow", pool, "--size", "64M", "--bogus"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  r = Thinfs({"grow", tmp.Sub("nowhere"), "--size", "64M"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs grow: ", "does not exist");
}

TEST(CliGrowTest, TooSmallDataFileIsRefusedThenGrowsOnceEnlarged) {
  TempDir tmp;
  const std::string backing = tmp.Sub("backing.img");
  WriteFileOrDie(backing, "");
  ASSERT_EQ(::truncate(backing.c_str(), 8 << 20), 0);
  const std::string pool = tmp.Sub("pool");
  CliRun r = Thinfs({"format", pool, "--size", "8M", "--data", backing});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  r = Thinfs({"grow", pool, "--size", "16M"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  ExpectOneLineError(r, "thinfs grow: ", "enlarge it first");
  // The user's file was not extended behind their back, the pool not grown.
  struct stat s;
  ASSERT_EQ(::stat(backing.c_str(), &s), 0);
  EXPECT_EQ(s.st_size, 8 << 20);
  r = Thinfs({"status", pool, "--json"});
  EXPECT_EQ(ParseJson(r.out)["data_bytes"].AsUint(), uint64_t{8} << 20);
  ASSERT_EQ(::truncate(backing.c_str(), 16 << 20), 0);
  r = Thinfs({"grow", pool, "--size", "16M"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  r = Thinfs({"status", pool, "--json"});
  EXPECT_EQ(ParseJson(r.out)["data_bytes"].AsUint(), uint64_t{16} << 20);
}

}  // namespace thinfs
