// The mount table parser (core/mountinfo.h) on a real mount: the e2e
// helpers (IsThinfsMounted, MountpointsUnder) and the CLI's lookup of a
// pool's mount (ThinfsMountOf, used by `thinfs snapshot`) find a mount whose
// mountpoint and pool paths hold characters that /proc/self/mountinfo
// escapes. Before the helpers decoded escapes, MountForeground never saw
// this mount come up and the test failed.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/mountinfo.h"
#include "tests/util/e2e_util.h"

namespace thinfs::testing {
namespace {

class MountInfoE2eTest : public E2eTest {};

TEST_F(MountInfoE2eTest, FindsAMountWithEscapedCharactersInItsPaths) {
  // Still inside dir_, which TearDown unmounts and removes.
  pool_ = dir_ + "/my pool\\040";
  mnt_ = dir_ + "/mnt with space,\ttab\nnewline\\backslash";
  ASSERT_EQ(mkdir(mnt_.c_str(), 0755), 0) << strerror(errno);
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");

  EXPECT_TRUE(IsThinfsMounted(mnt_));
  EXPECT_EQ(MountpointsUnder(dir_ + "/"), std::vector<std::string>{mnt_});
  EXPECT_EQ(ThinfsMountOf(pool_), std::optional<std::string>(mnt_));

  // The CLI path that uses the lookup works on it.
  CommandResult r = Thinfs({"create", pool_, "v", "--size", "1M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Thinfs({"snapshot", pool_, "v", "s"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  struct stat st {};
  EXPECT_EQ(stat(Vol("s").c_str(), &st), 0) << strerror(errno);

  EXPECT_EQ(Unmount(), "");
  EXPECT_FALSE(IsThinfsMounted(mnt_));
  EXPECT_TRUE(MountpointsUnder(dir_ + "/").empty());
  EXPECT_EQ(ThinfsMountOf(pool_), std::nullopt);
}

}  // namespace
}  // namespace thinfs::testing
