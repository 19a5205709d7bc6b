// Who may use a mount (issue 6): without -o allow_other only the mounter
// (here root) sees it; with allow_other other users see it, and the kernel
// enforces the devices' file modes (the mount always has
// default_permissions). Other users are played by a child that switches
// to nobody (65534); the test runs as root, like every e2e test.

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>

#include "tests/util/e2e_util.h"

namespace thinfs::testing {
namespace {

class AccessTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_EQ(geteuid(), 0u) << "this test runs as root (it switches to nobody)";
    // mkdtemp's 0700 would stop nobody before the mount does.
    ASSERT_EQ(chmod(dir_.c_str(), 0755), 0) << strerror(errno);
    FormatPool("16M");
  }

  // Runs `probe` as nobody in a child; returns the errno it reports (0 for
  // success), or -1 if the child could not switch users.
  static int AsNobody(const std::function<int()>& probe) {
    pid_t pid = fork();
    if (pid == 0) {
      if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(255);
      errno = 0;
      _exit(probe() < 0 ? (errno & 0x7f) : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) == 255) return -1;
    return WEXITSTATUS(status);
  }

  void MakeVolume(const std::string& name, mode_t mode) {
    int fd = open(Vol(name).c_str(), O_CREAT | O_WRONLY, mode);
    ASSERT_GE(fd, 0) << strerror(errno);
    ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
    close(fd);
    ASSERT_EQ(chmod(Vol(name).c_str(), mode), 0);
  }
};

TEST_F(AccessTest, WithoutAllowOtherOtherUsersSeeNothing) {
  ASSERT_EQ(MountForeground(), "");
  MakeVolume("public", 0644);
  struct stat st {};
  ASSERT_EQ(stat(Vol("public").c_str(), &st), 0);
  const std::string vol = Vol("public"), mnt = mnt_;
  EXPECT_EQ(AsNobody([&] { return stat(vol.c_str(), &st); }), EACCES);
  EXPECT_EQ(AsNobody([&] { return open(vol.c_str(), O_RDONLY); }), EACCES);
  EXPECT_EQ(AsNobody([&] { return stat(mnt.c_str(), &st); }), EACCES);
}

TEST_F(AccessTest, AllowOtherEnforcesFileModes) {
  ASSERT_EQ(MountForeground("allow_other"), "");
  MakeVolume("public", 0644);
  MakeVolume("private", 0600);
  const std::string pub = Vol("public"), priv = Vol("private"), fresh = Vol("new");
  struct stat st {};
  EXPECT_EQ(AsNobody([&] { return stat(pub.c_str(), &st); }), 0);
  EXPECT_EQ(AsNobody([&] { return open(pub.c_str(), O_RDONLY); }), 0);
  EXPECT_EQ(AsNobody([&] { return open(pub.c_str(), O_WRONLY); }), EACCES);
  EXPECT_EQ(AsNobody([&] { return open(priv.c_str(), O_RDONLY); }), EACCES);
  EXPECT_EQ(AsNobody([&] { return truncate(priv.c_str(), 0); }), EACCES);
  // The root directory is 0755 and root's: nobody creates, renames or
  // deletes nothing in it.
  EXPECT_EQ(AsNobody([&] { return open(fresh.c_str(), O_CREAT | O_WRONLY, 0666); }), EACCES);
  EXPECT_EQ(AsNobody([&] { return unlink(pub.c_str()); }), EACCES);
  EXPECT_EQ(AsNobody([&] { return rename(pub.c_str(), fresh.c_str()); }), EACCES);
  EXPECT_EQ(AsNobody([&] { return chmod(priv.c_str(), 0666); }), EPERM);
  // Root still can; the volumes are untouched.
  ASSERT_EQ(stat(Vol("private").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 1 << 20);
}

}  // namespace
}  // namespace thinfs::testing
