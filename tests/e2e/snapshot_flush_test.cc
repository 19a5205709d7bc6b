// `thinfs snapshot` on a mounted pool holds every write completed before the
// command started, including what the kernel still caches for the origin:
// dirty pages of a shared mapping, and writes held by the writeback cache.
// The CLI fsyncs the origin through the mount before the daemon commits the
// snapshot; without that open/fsync/close the snapshot reads the older
// contents (the kernel writes dirty pages back only after seconds). Both
// tests fail when the CLI skips it (checked). The close alone would do here
// (FUSE writes an inode's dirty pages back on flush), the fsync is what
// the CLI promises.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tests/util/e2e_util.h"

namespace thinfs::testing {
namespace {

constexpr size_t kSize = 1 << 20;

class SnapshotFlushTest : public E2eTest {
 protected:
  std::vector<char> ReadFile(const std::string& name, size_t size) {
    std::vector<char> buf(size);
    int fd = open(Vol(name).c_str(), O_RDONLY);
    EXPECT_GE(fd, 0) << name << ": " << strerror(errno);
    if (fd < 0) return buf;
    EXPECT_EQ(pread(fd, buf.data(), size, 0), static_cast<ssize_t>(size)) << strerror(errno);
    close(fd);
    return buf;
  }

  void Snapshot(const std::string& source, const std::string& name) {
    CommandResult r = Thinfs({"snapshot", pool_, source, name});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
};

TEST_F(SnapshotFlushTest, DirtyPagesOfASharedMappingAreInTheSnapshot) {
  FormatPool("64M");
  // No periodic commit, and no msync: only the CLI's fsync moves the pages.
  ASSERT_EQ(MountForeground("commit_interval=0"), "");
  CommandResult r = Thinfs({"create", pool_, "v", "--size", "1M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int fd = open(Vol("v").c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << strerror(errno);
  void* map = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED) << strerror(errno);
  const std::vector<char> data = Pattern(41, 0, kSize);
  std::memcpy(map, data.data(), kSize);
  Snapshot("v", "s");
  EXPECT_EQ(ReadFile("s", kSize), data);
  munmap(map, kSize);
  close(fd);
}

TEST_F(SnapshotFlushTest, WritesInTheWritebackCacheAreInTheSnapshot) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground("commit_interval=0,writeback_cache=on"), "");
  CommandResult r = Thinfs({"create", pool_, "v", "--size", "1M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The descriptor stays open: close() would write the pages back itself.
  int fd = open(Vol("v").c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << strerror(errno);
  const std::vector<char> data = Pattern(42, 0, kSize);
  ASSERT_EQ(pwrite(fd, data.data(), kSize, 0), static_cast<ssize_t>(kSize)) << strerror(errno);
  Snapshot("v", "s");
  EXPECT_EQ(ReadFile("s", kSize), data);
  close(fd);
}

}  // namespace
}  // namespace thinfs::testing
