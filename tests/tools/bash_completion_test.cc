// packaging/thinfs.bash-completion, sourced into bash: the mountpoints
// offered for `thinfs umount` come out of /proc/self/mounts decoded (the
// kernel octal-escapes space, tab, newline and backslash), and a mountpoint
// holding a blank is offered as one candidate.

#include <gtest/gtest.h>

#include <string>

#include "tests/util/cli_runner.h"
#include "tests/util/pool_test_util.h"

namespace thinfs {
namespace {

using testing::CliRun;
using testing::Describe;
using testing::RunProgram;
using testing::TempDir;

const std::string kScript = std::string(THINFS_SOURCE_DIR) + "/packaging/thinfs.bash-completion";

// Runs `body` in bash after sourcing the completion script; `arg` is $2.
CliRun Bash(const std::string& body, const std::string& arg = "") {
  return RunProgram("/bin/bash",
                    {"-c", "source \"$1\" || exit 99\n" + body, "bash", kScript, arg});
}

TEST(BashCompletionTest, MountpointsAreDecodedFromTheMountsTable) {
  TempDir tmp;
  const std::string mounts = tmp.Sub("mounts");
  // As the kernel writes them: \040 space, \011 tab, \012 newline, \134
  // backslash. The last path holds a backslash followed by "040", which
  // must stay that, not become a space.
  testing::WriteFileOrDie(mounts,
                          "thinfs:/srv/p /mnt/my\\040vols fuse.thinfs rw,nosuid 0 0\n"
                          "/dev/sda1 /mnt/not\\040thinfs ext4 rw 0 0\n"
                          "thinfs:/srv/q /mnt/t\\011ab\\012nl fuse.thinfs rw 0 0\n"
                          "thinfs:/srv/r /mnt/back\\134slash\\134040 fuse.thinfs rw 0 0\n"
                          "thinfs:/srv/s /mnt/plain fuse.thinfs rw 0 0\n");
  // Each NUL-terminated path on a line of its own, bracketed.
  CliRun r = Bash(
      "_thinfs_mountpoints \"$2\" | while IFS= read -r -d '' m; do printf '[%s]\\n' \"$m\"; done",
      mounts);
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out,
            "[/mnt/my vols]\n"
            "[/mnt/t\tab\nnl]\n"
            "[/mnt/back\\slash\\040]\n"
            "[/mnt/plain]\n");
  EXPECT_EQ(r.err, "");
}

TEST(BashCompletionTest, AMissingMountsTableGivesNoMountpointsQuietly) {
  CliRun r = Bash("_thinfs_mountpoints /nonexistent/mounts | od -c");
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "0000000\n");
  EXPECT_EQ(r.err, "");
}

// `thinfs umount <TAB>` over mountpoints with blanks: each is one candidate,
// matched by prefix without word splitting.
TEST(BashCompletionTest, UmountOffersAMountpointWithABlankAsOneCandidate) {
  const std::string complete =
      "_thinfs_mountpoints() { printf '%s\\0' '/mnt/my vols' '/mnt/my other' /srv/x; }\n"
      "complete_word() {\n"
      "  COMP_WORDS=(thinfs umount \"$1\"); COMP_CWORD=2\n"
      "  COMP_LINE=\"thinfs umount $1\"; COMP_POINT=${#COMP_LINE}\n"
      "  _thinfs thinfs \"$1\" umount\n"
      "  printf '[%s]' \"${COMPREPLY[@]}\"; echo\n"
      "}\n";
  CliRun r = Bash(complete +
                  "complete_word /mnt/\n"
                  "complete_word /mnt/my\n"
                  "complete_word /s\n");
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out,
            "[/mnt/my vols][/mnt/my other]\n"
            "[/mnt/my vols][/mnt/my other]\n"
            "[/srv/x]\n");
}

}  // namespace
}  // namespace thinfs
