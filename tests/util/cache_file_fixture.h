// Tests of what the host's page cache holds of a file (core/folio_census.h,
// core/page_cache.h, FileBlockDevice's prefetching): Residency, a second
// opinion by mincore(2), and CacheFileTest, a scratch file in /var/tmp
// written, evicted and looked at, removed after the test.

#ifndef THINFS_TESTS_UTIL_CACHE_FILE_FIXTURE_H_
#define THINFS_TESTS_UTIL_CACHE_FILE_FIXTURE_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

namespace thinfs {

// Which of a file's pages the page cache holds, by mincore(2) of a mapping.
class Residency {
 public:
  Residency(int fd, size_t bytes) : bytes_(bytes) {
    addr_ = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    EXPECT_NE(addr_, MAP_FAILED) << std::strerror(errno);
  }
  ~Residency() {
    if (addr_ != MAP_FAILED) ::munmap(addr_, bytes_);
  }
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;
  // Resident pages among bytes [from, from + len), page-aligned.
  size_t Resident(size_t from, size_t len) const {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> vec(len / page);
    if (::mincore(static_cast<char*>(addr_) + from, len, vec.data()) != 0) return SIZE_MAX;
    return static_cast<size_t>(std::count_if(vec.begin(), vec.end(),
                                             [](unsigned char c) { return (c & 1) != 0; }));
  }
  // The same once every page of the range is resident, or after 5 s:
  // WILLNEED starts reads that complete soon after.
  size_t WaitResident(size_t from, size_t len) const {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    for (int i = 0; i < 500 && Resident(from, len) != len / page; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Resident(from, len);
  }

 private:
  size_t bytes_;
  void* addr_ = MAP_FAILED;
};

// A buffer aligned as O_DIRECT wants (4 KiB), for reads past the cache.
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t n)
      : p_(static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))), n_(n) {}
  ~AlignedBytes() { std::free(p_); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  // Empty when the allocation failed.
  std::span<std::byte> span() const { return p_ == nullptr ? std::span<std::byte>() : std::span(p_, n_); }

 private:
  std::byte* p_;
  size_t n_;
};

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
  // A file of `size` bytes of 0x5a, written back and out of the cache.
  void CreateWrittenUncached(uint64_t size) {
    CreateFile(size);
    WriteAt(0, size);
    Evict();
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
