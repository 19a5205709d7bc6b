// A pool whose data file lives on a file system that can reflink (btrfs on a
// loop device here): copy-on-write copies share the old block's data
// instead of reading and writing it (FileBlockDevice::Copy, FICLONERANGE).
// Checks the copies are right — 4 KiB and unaligned writes into a snapshot,
// with the copy owed to the commit and made at once (`deferred_copy=0`),
// read back before and after a remount, the origin untouched, `thinfs
// check` clean — and that they really were shared: the data file must hold
// extents FIEMAP reports shared. Without the reflink (plain copies) that
// last assertion fails (checked by disabling the clone in Copy). With
// `-o reflink=off` the same writes must leave nothing shared.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/util/e2e_util.h"

namespace thinfs::testing {
namespace {

constexpr size_t kVolume = 8 << 20;

// How many of the file's extents FIEMAP flags as shared with another file
// or another range of this one; -1 if FIEMAP fails.
int SharedExtents(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  int shared = 0;
  uint64_t start = 0;
  constexpr unsigned kBatch = 256;
  std::vector<char> buf(sizeof(fiemap) + kBatch * sizeof(fiemap_extent));
  for (;;) {
    std::memset(buf.data(), 0, buf.size());
    auto* fm = reinterpret_cast<fiemap*>(buf.data());
    fm->fm_start = start;
    fm->fm_length = FIEMAP_MAX_OFFSET - start;
    fm->fm_flags = FIEMAP_FLAG_SYNC;
    fm->fm_extent_count = kBatch;
    if (ioctl(fd, FS_IOC_FIEMAP, fm) != 0) {
      close(fd);
      return -1;
    }
    if (fm->fm_mapped_extents == 0) break;
    bool last = false;
    for (unsigned i = 0; i < fm->fm_mapped_extents; ++i) {
      const fiemap_extent& e = fm->fm_extents[i];
      if (e.fe_flags & FIEMAP_EXTENT_SHARED) ++shared;
      if (e.fe_flags & FIEMAP_EXTENT_LAST) last = true;
      start = e.fe_logical + e.fe_length;
    }
    if (last) break;
  }
  close(fd);
  return shared;
}

struct Case {
  const char* name;
  const char* options;
  bool shares;  // copies must be reflinks
};

class ReflinkHostTest : public E2eTest, public ::testing::WithParamInterface<Case> {
 protected:
  // btrfs on a loop device over a sparse file under dir_; the pool goes
  // there. TearDown unmounts it and detaches the loop device.
  void MakeReflinkHost() {
    RequireLoopDevices();
    if (HasFatalFailure() || IsSkipped()) return;
    const std::string image = dir_ + "/btrfs.img";
    const std::string host = dir_ + "/host";
    ASSERT_EQ(mkdir(host.c_str(), 0755), 0) << strerror(errno);
    CommandResult r = RunCommand("truncate -s 256M " + ShellQuote(image) +
                                 " && mkfs.btrfs -q -f " + ShellQuote(image));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string loop = AttachLoop(image, /*direct_io=*/false);
    ASSERT_FALSE(loop.empty());
    r = RunCommand("mount -t btrfs " + ShellQuote(loop) + " " + ShellQuote(host));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    pool_ = host + "/pool";
  }

  std::vector<char> ReadAll(const std::string& name) {
    std::vector<char> buf(kVolume);
    int fd = open(Vol(name).c_str(), O_RDONLY);
    EXPECT_GE(fd, 0) << name << ": " << strerror(errno);
    if (fd < 0) return buf;
    EXPECT_EQ(pread(fd, buf.data(), buf.size(), 0), static_cast<ssize_t>(buf.size()))
        << strerror(errno);
    close(fd);
    return buf;
  }
};

TEST_P(ReflinkHostTest, CopyOnWriteSharesTheOldBlockAndReadsRight) {
  MakeReflinkHost();
  if (HasFatalFailure() || IsSkipped()) return;
  FormatPool("64M", "64K");
  const std::string options = std::string("commit_interval=0,") + GetParam().options;
  ASSERT_EQ(MountForeground(options), "");
  CommandResult r = Thinfs({"create", pool_, "v", "--size", std::to_string(kVolume)});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<char> origin = Pattern(7, 0, kVolume);
  {
    int fd = open(Vol("v").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0) << strerror(errno);
    ASSERT_EQ(pwrite(fd, origin.data(), origin.size(), 0), static_cast<ssize_t>(origin.size()));
    ASSERT_EQ(fsync(fd), 0) << strerror(errno);
    close(fd);
  }
  const int shared_before = SharedExtents(pool_ + "/data");
  ASSERT_EQ(shared_before, 0) << "nothing is shared before a copy-on-write";
  r = Thinfs({"snapshot", pool_, "v", "s"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // 4 KiB writes at 4 KiB boundaries (whole sectors), and unaligned ones
  // whose edges copy parts of a sector; a few blocks are written twice.
  std::vector<char> model = origin;
  std::mt19937_64 rng(11);
  int fd = open(Vol("s").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << strerror(errno);
  for (int i = 0; i < 120; ++i) {
    const bool aligned = i % 3 != 0;
    const uint64_t len = aligned ? 4096 : 1 + rng() % 9000;
    uint64_t off = rng() % (kVolume - len);
    if (aligned) off &= ~uint64_t{4095};
    const std::vector<char> data = Pattern(100 + i, off, len);
    ASSERT_EQ(pwrite(fd, data.data(), len, static_cast<off_t>(off)), static_cast<ssize_t>(len))
        << strerror(errno);
    std::memcpy(model.data() + off, data.data(), len);
  }
  // Before the commit: owed copies read through the merge.
  EXPECT_TRUE(ReadAll("s") == model) << "snapshot wrong before the commit";
  ASSERT_EQ(fsync(fd), 0) << strerror(errno);  // commits: owed copies made
  close(fd);
  EXPECT_TRUE(ReadAll("s") == model) << "snapshot wrong after the commit";
  EXPECT_TRUE(ReadAll("v") == origin) << "origin changed";
  if (GetParam().shares) {
    EXPECT_GT(SharedExtents(pool_ + "/data"), 0) << "no copy was a reflink";
  } else {
    EXPECT_EQ(SharedExtents(pool_ + "/data"), 0) << "reflink=off, yet extents are shared";
  }

  // After a restart the data comes from the committed blocks only.
  ASSERT_EQ(Unmount(), "");
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(MountForeground(GetParam().options), "");
  EXPECT_TRUE(ReadAll("s") == model) << "snapshot wrong after a remount";
  EXPECT_TRUE(ReadAll("v") == origin) << "origin wrong after a remount";
  ASSERT_EQ(Unmount(), "");
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ReflinkHostTest,
    ::testing::Values(Case{"CopiesOwedToTheCommit", "deferred_copy=256M", true},
                      Case{"CopiedAtOnce", "deferred_copy=0", true},
                      Case{"ReflinkOff", "reflink=off", false}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace thinfs::testing
