// thinfs restore and dump through a real mount: a hand-written thin_dump
// XML with several devices and shared mappings, restored over a data file,
// must read back exactly the expected bytes through FUSE; writing to a
// restored shared block copies it (the other device and the original data
// block keep the old bytes); and dump works while the pool is mounted and
// written to (a checkpoint: each dump is a consistent state that
// thin_restore/thin_check accept).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/e2e_util.h"

namespace thinfs::testing {
namespace {

constexpr uint64_t kBs = 64 * 1024;
constexpr uint64_t kDataBlocks = 64;

class DumpE2eTest : public E2eTest {};

std::vector<char> ReadFile(const std::string& path) {
  std::vector<char> out;
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path << ": " << std::strerror(errno);
  if (fd < 0) return out;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  ::close(fd);
  return out;
}

void PwriteOrFail(const std::string& path, const std::vector<char>& data, uint64_t off) {
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  ASSERT_EQ(::pwrite(fd, data.data(), data.size(), static_cast<off_t>(off)),
            static_cast<ssize_t>(data.size()));
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

TEST_F(DumpE2eTest, HandWrittenXmlRestoresAndReadsBackThroughTheMount) {
  // The data area: block n holds Pattern(n).
  const std::string data = dir_ + "/data";
  {
    int fd = ::open(data.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    for (uint64_t b = 0; b < kDataBlocks; ++b) {
      std::vector<char> block = Pattern(b, 0, kBs);
      ASSERT_EQ(::pwrite(fd, block.data(), kBs, static_cast<off_t>(b * kBs)),
                static_cast<ssize_t>(kBs));
    }
    ::close(fd);
  }
  // alpha (1): 0-3 -> 0-3, 10 -> 20; beta (2): 0-1 -> 0-1 (shared with
  // alpha), 2 -> 30; dev 5 (no table entry: thin5): 0 -> 20 (shared).
  const std::string xml = dir_ + "/in.xml";
  const std::string table = dir_ + "/in.devices";
  {
    std::FILE* f = std::fopen(xml.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(
        "<superblock uuid=\"\" time=\"1\" transaction=\"5\" flags=\"0\" version=\"2\" "
        "data_block_size=\"128\" nr_data_blocks=\"64\">\n"
        "  <device dev_id=\"1\" mapped_blocks=\"5\" transaction=\"0\" creation_time=\"0\" "
        "snap_time=\"1\">\n"
        "    <range_mapping origin_begin=\"0\" data_begin=\"0\" length=\"4\" time=\"0\"/>\n"
        "    <single_mapping origin_block=\"10\" data_block=\"20\" time=\"0\"/>\n"
        "  </device>\n"
        "  <device dev_id=\"2\" mapped_blocks=\"3\" transaction=\"0\" creation_time=\"0\" "
        "snap_time=\"1\">\n"
        "    <range_mapping origin_begin=\"0\" data_begin=\"0\" length=\"2\" time=\"0\"/>\n"
        "    <single_mapping origin_block=\"2\" data_block=\"30\" time=\"1\"/>\n"
        "  </device>\n"
        "  <device dev_id=\"5\" mapped_blocks=\"1\" transaction=\"0\" creation_time=\"0\" "
        "snap_time=\"1\">\n"
        "    <single_mapping origin_block=\"0\" data_block=\"20\" time=\"0\"/>\n"
        "  </device>\n"
        "</superblock>\n",
        f);
    std::fclose(f);
    f = std::fopen(table.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("# names\n1\t1048576\talpha\n2\t524288\tbeta\n", f);
    std::fclose(f);
  }
  CommandResult r =
      Thinfs({"restore", pool_, "--from", xml, "--data", data, "--table", table});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3 devices, 9 mapped blocks, 6 data blocks in use (3 shared)"),
            std::string::npos)
      << r.output;
  r = Thinfs({"check", pool_});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  ASSERT_EQ(MountForeground(), "");
  auto expected = [&](uint64_t size, std::vector<std::pair<uint64_t, uint64_t>> maps) {
    std::vector<char> out(size, 0);
    for (auto [origin, block] : maps) {
      std::vector<char> b = Pattern(block, 0, kBs);
      std::memcpy(out.data() + origin * kBs, b.data(), kBs);
    }
    return out;
  };
  const std::vector<char> alpha = expected(1 << 20, {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {10, 20}});
  const std::vector<char> beta = expected(512 << 10, {{0, 0}, {1, 1}, {2, 30}});
  const std::vector<char> thin5 = expected(kBs, {{0, 20}});
  EXPECT_TRUE(ReadFile(Vol("alpha")) == alpha);
  EXPECT_TRUE(ReadFile(Vol("beta")) == beta);
  EXPECT_TRUE(ReadFile(Vol("thin5")) == thin5);

  // A write to block 0 of alpha, shared with beta, copies it: beta and the
  // data file's block 0 keep the old bytes.
  const std::vector<char> fresh(kBs, 'x');
  ASSERT_NO_FATAL_FAILURE(PwriteOrFail(Vol("alpha"), fresh, 0));
  std::vector<char> alpha2 = alpha;
  std::memcpy(alpha2.data(), fresh.data(), kBs);
  EXPECT_TRUE(ReadFile(Vol("alpha")) == alpha2);
  EXPECT_TRUE(ReadFile(Vol("beta")) == beta);
  // beta's own block 30 (unshared) is written in place.
  ASSERT_NO_FATAL_FAILURE(PwriteOrFail(Vol("beta"), fresh, 2 * kBs));
  ASSERT_EQ(Unmount(), "");
  {
    std::vector<char> all = ReadFile(data);
    ASSERT_EQ(all.size(), kDataBlocks * kBs);
    EXPECT_TRUE(std::equal(all.begin(), all.begin() + kBs, Pattern(0, 0, kBs).begin()))
        << "block 0 was written in place although shared";
    EXPECT_TRUE(std::equal(all.begin() + 30 * kBs, all.begin() + 31 * kBs, fresh.begin()))
        << "beta's unshared block 30 was not written in place";
  }
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // The dump now shows block 0 of beta unshared (time 1), alpha's copy
  // elsewhere.
  r = Thinfs({"dump", pool_});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("<single_mapping origin_block=\"0\" data_block=\"0\" time=\"1\"/>"),
            std::string::npos)
      << r.output;
}

TEST_F(DumpE2eTest, DumpWhileMountedAndWritingIsConsistent) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");
  ASSERT_EQ(Thinfs({"create", pool_, "vol", "--size", "8M"}).exit_code, 0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0};
  std::thread writer([&] {
    int fd = ::open(Vol("vol").c_str(), O_WRONLY);
    if (fd < 0) return;
    uint64_t i = 0;
    while (!stop.load()) {
      std::vector<char> b = Pattern(i, 0, kBs);
      const off_t off = static_cast<off_t>((i * 7 % 128) * kBs);
      if (::pwrite(fd, b.data(), kBs, off) != static_cast<ssize_t>(kBs)) break;
      if (i % 16 == 0) ::fsync(fd);
      ++i;
      writes.store(i);
    }
    ::close(fd);
  });
  for (int round = 0; round < 3; ++round) {
    if (round == 1) {
      ASSERT_EQ(Thinfs({"snapshot", pool_, "vol", "snap"}).exit_code, 0);
    }
    const std::string xml = dir_ + "/dump" + std::to_string(round) + ".xml";
    CommandResult r = Thinfs({"dump", pool_, "-o", xml});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string meta = dir_ + "/tmeta" + std::to_string(round);
    ASSERT_EQ(RunCommand("truncate -s 16M " + ShellQuote(meta)).exit_code, 0);
    r = RunCommand("thin_restore -i " + ShellQuote(xml) + " -o " + ShellQuote(meta) +
                   " && thin_check " + ShellQuote(meta));
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  stop.store(true);
  writer.join();
  EXPECT_GT(writes.load(), 0u);
  CommandResult r = Thinfs({"dump", pool_, "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"name\": \"snap\""), std::string::npos) << r.output;
  // No checkpoint left behind.
  CommandResult ls = RunCommand("ls -A " + ShellQuote(pool_));
  EXPECT_EQ(ls.output.find(".dump-"), std::string::npos) << ls.output;
  ASSERT_EQ(Unmount(), "");
  // Offline, the final state dumps and checks clean too.
  r = Thinfs({"dump", pool_, "-o", dir_ + "/final.xml"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace thinfs::testing
