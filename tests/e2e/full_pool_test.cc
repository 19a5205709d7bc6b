// A full pool through a real mount (issue 6, "Full pool"): the low-water
// mark runs its command and logs, `thinfs grow` on a mounted pool shows in
// df, and a writer held by no_space=wait resumes after the grow.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "tests/tools/json_parser.h"
#include "tests/util/e2e_util.h"

namespace thinfs::testing {
namespace {

class FullPoolTest : public E2eTest {};

bool WaitForFile(const std::string& path, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  struct stat st {};
  while (std::chrono::steady_clock::now() < deadline) {
    if (stat(path.c_str(), &st) == 0 && st.st_size > 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST_F(FullPoolTest, LowWaterRunsTheCommandAndGrowUnblocksAWaitingWriter) {
  FormatPool("16M", "64K");  // 256 blocks; the mark is 128
  const std::string marker = dir_ + "/marker";
  const std::string script = dir_ + "/low_water.sh";
  {
    std::ofstream out(script);
    out << "#!/bin/sh\necho \"$1 $THINFS_POOL $THINFS_FREE_BLOCKS $THINFS_DATA_BLOCKS\" > "
        << marker << ".tmp && mv " << marker << ".tmp " << marker << "\n";
  }
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  ASSERT_EQ(MountForeground("low_water=50%,low_water_cmd=" + script + ",no_space=wait:20s"),
            "");
  CommandResult r = Thinfs({"create", pool_, "vol", "--size", "64M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // 6 MiB: above the mark, nothing happens.
  const std::string dd = "dd if=/dev/urandom of=" + ShellQuote(Vol("vol")) +
                         " bs=1M conv=notrunc,fsync status=none ";
  r = RunCommand(dd + "count=6");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  struct stat st {};
  EXPECT_NE(stat(marker.c_str(), &st), 0) << "the command ran above the mark";
  // 10 MiB in all: 96 of 256 blocks free, below 128.
  r = RunCommand(dd + "count=4 seek=6");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(WaitForFile(marker, std::chrono::seconds(10))) << Log();
  std::ifstream in(marker);
  std::string arg, env_pool;
  uint64_t free_blocks = 0, data_blocks = 0;
  in >> arg >> env_pool >> free_blocks >> data_blocks;
  EXPECT_EQ(arg, pool_);
  EXPECT_EQ(env_pool, pool_);
  EXPECT_LT(free_blocks, 128u);
  EXPECT_EQ(data_blocks, 256u);
  EXPECT_NE(Log().find("pool free space below the low-water mark"), std::string::npos) << Log();
  r = Thinfs({"status", pool_, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string error;
  std::optional<JsonValue> status = JsonParser::Parse(r.output, &error);
  ASSERT_TRUE(status.has_value()) << error << r.output;
  EXPECT_EQ((*status)["low_water_blocks"].AsUint(), 128u);
  EXPECT_TRUE((*status)["below_low_water"].boolean);

  // 10 more MiB do not fit in 16: the writer waits for space...
  std::atomic<bool> done{false};
  CommandResult writer;
  std::thread t([&] {
    writer = RunCommand(dd + "count=10 seek=10", std::chrono::seconds(60));
    done.store(true);
  });
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_FALSE(done.load()) << "the writer did not wait: " << writer.output;
  // ...until the pool grows under the mount.
  r = Thinfs({"grow", pool_, "--size", "64M"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  t.join();
  EXPECT_EQ(writer.exit_code, 0) << writer.output << Log();
  struct statvfs vfs {};
  ASSERT_EQ(statvfs(mnt_.c_str(), &vfs), 0);
  EXPECT_EQ(static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize, uint64_t{64} << 20);
  r = RunCommand("df -B1 --output=size " + ShellQuote(mnt_));
  EXPECT_NE(r.output.find(std::to_string(uint64_t{64} << 20)), std::string::npos) << r.output;
  EXPECT_EQ(Unmount(), "");
  // Nothing was lost: the pool checks clean at its new size.
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(FullPoolTest, BadFullPoolOptionsAreRefused) {
  FormatPool("16M");
  for (const char* o : {"low_water=0%", "low_water=100%", "low_water=lots", "no_space=wait",
                        "no_space=wait:0", "no_space=maybe", "low_water_cmd=relative.sh"}) {
    CommandResult r = Thinfs({"mount", pool_, mnt_, "-f", "-o", o});
    EXPECT_NE(r.exit_code, 0) << o << ": " << r.output;
    EXPECT_FALSE(IsThinfsMounted(mnt_)) << o;
  }
}

}  // namespace
}  // namespace thinfs::testing
