#include "tests/util/pool_test_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/check.h"

namespace thinfs::testing {

namespace stdfs = std::filesystem;

TempDir::TempDir(const std::string& parent) {
  std::string tmpl = parent + "/thinfs-test-XXXXXX";
  THINFS_CHECK(::mkdtemp(tmpl.data()) != nullptr);
  path_ = tmpl;
}

TempDir::~TempDir() {
  // Tests may leave read-only modes behind; root ignores them anyway.
  std::error_code ec;
  stdfs::remove_all(path_, ec);
}

std::string TmpfsOrTmp() { return stdfs::is_directory("/dev/shm") ? "/dev/shm" : "/tmp"; }

std::map<std::string, std::string> TreeDigest(const std::string& root) {
  std::map<std::string, std::string> out;
  struct stat root_st;
  THINFS_CHECK(::stat(root.c_str(), &root_st) == 0);
  out["."] = "mtime " + std::to_string(root_st.st_mtim.tv_sec) + "." +
             std::to_string(root_st.st_mtim.tv_nsec);
  for (auto it = stdfs::recursive_directory_iterator(root); it != stdfs::end(it); ++it) {
    const std::string path = it->path().string();
    struct stat st;
    THINFS_CHECK(::lstat(path.c_str(), &st) == 0);
    std::ostringstream d;
    d << std::oct << st.st_mode << std::dec << " " << st.st_size;
    if (S_ISLNK(st.st_mode)) {
      d << " -> " << stdfs::read_symlink(it->path()).string();
    } else {
      d << " mtime " << st.st_mtim.tv_sec << "." << st.st_mtim.tv_nsec;
    }
    if (S_ISREG(st.st_mode)) {
      // Sparse data files may be large: only the data ranges are read. The
      // hash takes each 4 KiB page that holds a non-zero byte, with its
      // offset, so that a hole and written zeros hash alike. ext4 reports a
      // file's ranges from its page cache too: a fresh pool's bitmap is
      // one data range [0, 4128) while its zero tail page is cached, and
      // [0, 4096) once a cache drop or reclaim takes that page
      // (2026-12-07), with the same bytes. The bytes are what a test
      // compares.
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      THINFS_CHECK(fd >= 0);
      XXH64_state_t* h = XXH64_createState();
      XXH64_reset(h, 0);
      constexpr off_t kPage = 4096;
      std::string buf(1 << 20, '\0');  // read in 1 MiB pieces, hashed by page
      off_t next = 0;                  // the first page not yet hashed
      while (true) {
        const off_t data = ::lseek(fd, next, SEEK_DATA);
        if (data < 0) break;
        const off_t hole = ::lseek(fd, data, SEEK_HOLE);
        for (off_t p = std::max(next, data / kPage * kPage); p < hole;) {
          const ssize_t n = ::pread(fd, buf.data(), buf.size(), p);
          THINFS_CHECK(n > 0);
          for (ssize_t at = 0; at < n; at += kPage) {
            const char* page = buf.data() + at;
            const size_t len = static_cast<size_t>(std::min<ssize_t>(kPage, n - at));
            if (std::any_of(page, page + len, [](char c) { return c != 0; })) {
              const off_t offset = p + at;
              XXH64_update(h, &offset, sizeof offset);
              XXH64_update(h, page, len);
            }
          }
          p += n;
          next = (p + kPage - 1) / kPage * kPage;
        }
        if (next < hole) next = hole;
      }
      d << " xxh64 " << std::hex << XXH64_digest(h);
      XXH64_freeState(h);
      ::close(fd);
    }
    out[stdfs::relative(it->path(), root).string()] = d.str();
  }
  return out;
}

std::map<pid_t, std::string> ThreadNames(pid_t pid) {
  std::map<pid_t, std::string> names;
  std::error_code ec;
  for (const auto& task : stdfs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) {
      names[static_cast<pid_t>(std::stol(task.path().filename().string()))] = name;
    }
  }
  return names;
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  THINFS_CHECK(in.good());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFileOrDie(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  THINFS_CHECK(out.good());
  out << content;
  THINFS_CHECK(out.good());
}

void FlipByteOrDie(const std::string& path, uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  THINFS_CHECK(fd >= 0);
  unsigned char c = 0;
  THINFS_CHECK(::pread(fd, &c, 1, static_cast<off_t>(offset)) == 1);
  c ^= 0xff;
  THINFS_CHECK(::pwrite(fd, &c, 1, static_cast<off_t>(offset)) == 1);
  ::close(fd);
}

}  // namespace thinfs::testing
