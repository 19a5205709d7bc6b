// The CLI's two binaries (docs/design.md, "The CLI's two binaries"): the
// front, thinfs, serves the device commands of a mounted pool itself and
// runs thinfs-engine for everything else. A copy of the front alone in a
// directory without the engine shows which is which: what it serves works,
// what it would hand on fails saying the engine is missing.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/tools/json_parser.h"
#include "tests/util/e2e_util.h"
#include "tests/util/pool_test_util.h"

namespace thinfs::testing {
namespace {

class FrontTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    lonely_ = dir_ + "/bin/thinfs";
    std::filesystem::create_directories(dir_ + "/bin");
    std::filesystem::copy_file(ThinfsBinary(), lonely_);
  }

  // The front, copied where no thinfs-engine is: `lonely ARGS...`.
  CommandResult Lonely(const std::vector<std::string>& args) {
    std::string cmd = ShellQuote(lonely_);
    for (const std::string& a : args) cmd += " " + ShellQuote(a);
    return RunCommand(cmd + " 2>&1", std::chrono::seconds(60));
  }

  static bool SaysEngineMissing(const CommandResult& r) {
    return r.output.find("cannot find thinfs-engine") != std::string::npos;
  }

  std::string lonely_;
};

TEST_F(FrontTest, ServesTheDeviceCommandsOfAMountedPoolWithoutTheEngine) {
  FormatPool("256M");
  ASSERT_EQ(MountForeground(), "");

  CommandResult r = Lonely({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("thinfs ", 0), 0u) << r.output;

  r = Lonely({"create", pool_, "vol", "--size", "4M", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ParseJson(r.output)["size"].AsUint(), 4u << 20);
  struct stat st {};
  EXPECT_EQ(stat(Vol("vol").c_str(), &st), 0);

  // The snapshot holds what was written through the mount before it.
  const std::vector<char> data = Pattern(3, 0, 65536 + 512);
  {
    FILE* f = fopen(Vol("vol").c_str(), "r+");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(fwrite(data.data(), 1, data.size(), f), data.size());
    fclose(f);
  }
  r = Lonely({"snapshot", pool_, "vol", "snap"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadFileOrDie(Vol("snap")).substr(0, data.size()),
            std::string(data.begin(), data.end()));

  r = Lonely({"resize", pool_, "snap", "--size", "8M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lonely({"rename", pool_, "snap", "snap2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lonely({"grow", pool_, "--size", "320M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lonely({"list", pool_, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  JsonValue list = ParseJson(r.output);
  ASSERT_EQ(list.array.size(), 2u) << r.output;
  bool found = false;
  for (const JsonValue& d : list.array) {
    if (d["name"].string != "snap2") continue;
    found = true;
    EXPECT_EQ(d["size"].AsUint(), 8u << 20);
  }
  EXPECT_TRUE(found) << r.output;
  r = Lonely({"delete", pool_, "snap2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(stat(Vol("snap2").c_str(), &st), 0);

  // A command's own usage errors come from the front too.
  r = Lonely({"snapshot", pool_, "vol"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("missing NAME"), std::string::npos) << r.output;

  // What needs the engine says it is missing, and fails.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"status", pool_}, {"--help"}, {"help", "list"}}) {
    r = Lonely(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.output;
    EXPECT_TRUE(SaysEngineMissing(r)) << args[0] << ": " << r.output;
  }
  ASSERT_EQ(Unmount(), "");
}

TEST_F(FrontTest, AnUnmountedPoolsDeviceCommandsRunInTheEngine) {
  FormatPool("256M");
  // The front, next to the engine: the command runs there, output and
  // exit status as the engine gives them.
  CommandResult r = Thinfs({"create", pool_, "vol", "--size", "4M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Thinfs({"snapshot", pool_, "vol", "vol"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("exists"), std::string::npos) << r.output;
  r = Thinfs({"list", pool_});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("vol"), std::string::npos) << r.output;

  // Alone, it cannot open the pool, and says so; nothing changed.
  r = Lonely({"snapshot", pool_, "vol", "snap"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(SaysEngineMissing(r)) << r.output;
  EXPECT_NE(r.output.find("thinfs snapshot:"), std::string::npos) << r.output;
  r = Thinfs({"list", pool_, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ParseJson(r.output).array.size(), 1u) << r.output;
}

}  // namespace
}  // namespace thinfs::testing
