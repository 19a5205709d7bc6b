// A scratch file in /var/tmp for tests of what the host's page cache holds
// of a file (core/folio_census.h, core/page_cache.h): written, evicted and
// looked at, removed after the test.

#ifndef THINFS_TESTS_UTIL_CACHE_FILE_FIXTURE_H_
#define THINFS_TESTS_UTIL_CACHE_FILE_FIXTURE_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace thinfs {

class CacheFileTest : public ::testing::Test {
 protected:
  // Creates the file, `size` bytes of hole. Call from SetUp.
  void CreateFile(uint64_t size) {
    fd_ = ::mkstemp(path_);
    ASSERT_GE(fd_, 0) << path_;
    ASSERT_EQ(::ftruncate(fd_, static_cast<off_t>(size)), 0);
  }
  void TearDown() override {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(path_);
    }
  }
  void WriteAt(uint64_t offset, uint64_t len) {
    std::vector<std::byte> buf(len, std::byte{0x5a});
    ASSERT_EQ(::pwrite(fd_, buf.data(), len, static_cast<off_t>(offset)),
              static_cast<ssize_t>(len));
  }
  // Writes the file's dirty pages back and drops its cached ones.
  void Evict() {
    ASSERT_EQ(::fdatasync(fd_), 0);
    ASSERT_EQ(::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED), 0);
  }

  char path_[64] = "/var/tmp/thinfs_cache_file_XXXXXX";
  int fd_ = -1;
};

}  // namespace thinfs

#endif  // THINFS_TESTS_UTIL_CACHE_FILE_FIXTURE_H_
