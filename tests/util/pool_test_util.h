// Test helpers for pool-directory and CLI tests: a private temp directory,
// a digest of a directory tree (to prove a refused operation changed
// nothing), and small file helpers.

#ifndef THINFS_TESTS_UTIL_POOL_TEST_UTIL_H_
#define THINFS_TESTS_UTIL_POOL_TEST_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace thinfs::testing {

// A byte of the bitmap header (meta/format.h) covered by its checksum but
// neither the magic nor the geometry (the low byte of `generation`):
// flipping it must be reported as a header checksum mismatch.
inline constexpr uint64_t kBitmapHeaderFlipOffsetForTesting = 32;

// mkdtemp("PARENT/thinfs-test-XXXXXX") (PARENT: /tmp unless given),
// removed recursively on destruction.
class TempDir {
 public:
  TempDir() : TempDir("/tmp") {}
  explicit TempDir(const std::string& parent);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Relative path -> "type mode size mtime xxh64(content)" (symlinks: target)
// for every entry under `root`, recursively.
std::map<std::string, std::string> TreeDigest(const std::string& root);

// "/dev/shm" when there is one, else "/tmp": for tests whose files should
// cost no disk I/O (a tmpfs's fsync and write-back are free).
std::string TmpfsOrTmp();

// The name (comm) of each thread of process `pid`, by thread id, from
// /proc/PID/task; a thread that ends while they are read is left out.
std::map<pid_t, std::string> ThreadNames(pid_t pid);

std::string ReadFileOrDie(const std::string& path);
void WriteFileOrDie(const std::string& path, const std::string& content);
// XORs the byte at `offset` of `path` with 0xff.
void FlipByteOrDie(const std::string& path, uint64_t offset);

}  // namespace thinfs::testing

#endif  // THINFS_TESTS_UTIL_POOL_TEST_UTIL_H_
