#include "meta/pool_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <system_error>
#include <thread>

#include "core/size.h"

namespace thinfs::meta {

namespace {

namespace stdfs = std::filesystem;

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

// lstat() that tells "absent" apart from failures.
Result<bool> Exists(const std::string& path, struct stat* st) {
  if (::lstat(path.c_str(), st) == 0) return true;
  if (errno == ENOENT) return false;
  return Status::FromErrno(errno, "stat " + path);
}

Result<bool> DirIsEmpty(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return Status::FromErrno(errno, "open directory " + path);
  bool empty = true;
  errno = 0;
  while (struct dirent* e = ::readdir(dir)) {
    std::string_view name = e->d_name;
    if (name != "." && name != "..") {
      empty = false;
      break;
    }
  }
  int err = errno;
  ::closedir(dir);
  if (err != 0) return Status::FromErrno(err, "read directory " + path);
  return empty;
}

Status FsyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  Status s;
  if (::fsync(fd) != 0) s = Status::FromErrno(errno, "fsync " + path);
  ::close(fd);
  return s;
}

Status RemoveAll(const std::string& path) {
  std::error_code ec;
  stdfs::remove_all(path, ec);
  if (ec) return Status::FromErrno(ec.value(), "remove " + path);
  return Status::Ok();
}

Status RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "remove " + path);
  }
  return Status::Ok();
}

const char* FileType(mode_t mode) {
  if (S_ISDIR(mode)) return "directory";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISSOCK(mode)) return "socket";
  return "special file";
}

Status RandomBytes(uint8_t* buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::getrandom(buf + done, len - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "getrandom");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads the PID the holder wrote into the lock file. The holder writes it
// just after flock() succeeds, so an empty file may only mean "not yet":
// retry briefly before giving up.
std::string HolderPid(int fd) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    char buf[32] = {};
    ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
      std::string pid;
      for (ssize_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) pid += buf[i];
      if (!pid.empty()) return pid;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return "";
}

// Removes, on failure, what FormatPool created. It owns the pool lock, so
// the removal happens before the lock is released.
class FormatUndo {
 public:
  explicit FormatUndo(const PoolPaths& paths) : paths_(paths) {}
  ~FormatUndo() {
    if (done_) return;
    // Best effort: the original error is what the caller reports.
    if (bitmap) (void)RemoveFile(paths_.bitmap);
    if (meta) (void)RemoveAll(paths_.meta);
    if (data) (void)RemoveFile(paths_.data);
    if (lock) (void)RemoveFile(paths_.lock);
    if (root) ::rmdir(paths_.root.c_str());
  }
  FormatUndo(const FormatUndo&) = delete;
  FormatUndo& operator=(const FormatUndo&) = delete;

  void Dismiss() { done_ = true; }

  bool root = false, lock = false, data = false, meta = false, bitmap = false;
  PoolLock held;  // destroyed after the destructor body has cleaned up

 private:
  const PoolPaths& paths_;
  bool done_ = false;
};

}  // namespace

bool LooksLikePool(const std::string& root) {
  PoolPaths p = PoolPaths::For(root);
  struct stat st;
  return ::lstat(p.meta.c_str(), &st) == 0 || ::lstat(p.bitmap.c_str(), &st) == 0;
}

// ------------------------------------------------------------------ PoolLock

Result<PoolLock> PoolLock::Acquire(const std::string& lock_path) {
  bool writable = true;
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 && (errno == EROFS || errno == EACCES)) {
    // A pool on read-only media can still be locked (flock needs no write
    // access); the PID just cannot be recorded.
    fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
    writable = false;
  }
  if (fd < 0) return Status::FromErrno(errno, "open lock file " + lock_path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (err == EWOULDBLOCK) {
      std::string dir = stdfs::path(lock_path).parent_path().string();
      std::string pid = HolderPid(fd);
      ::close(fd);
      return Status::Busy("pool " + dir + " is in use by " +
                          (pid.empty() ? "another process" : "process " + pid));
    }
    ::close(fd);
    return Status::FromErrno(err, "lock " + lock_path);
  }
  if (writable) {
    std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      Status s = Status::FromErrno(errno, "write PID to " + lock_path);
      ::close(fd);
      return s;
    }
  }
  PoolLock lock(fd, lock_path);
  lock.writable_ = writable;
  return lock;
}

PoolLock::~PoolLock() { Release(); }

PoolLock::PoolLock(PoolLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      writable_(other.writable_),
      path_(std::move(other.path_)) {}

PoolLock& PoolLock::operator=(PoolLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    writable_ = other.writable_;
    path_ = std::move(other.path_);
  }
  return *this;
}

void PoolLock::Release() {
  if (fd_ < 0) return;
  // Forget our PID while still holding the lock, so that a stale PID is
  // never shown for a free pool. Failure only leaves a stale hint.
  if (writable_) (void)::ftruncate(fd_, 0);
  ::close(fd_);  // drops the flock
  fd_ = -1;
}

// ---------------------------------------------------------------- FormatPool

Result<uint64_t> DataAreaBytes(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + path);
  if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  if (!S_ISBLK(st.st_mode)) {
    return Status::InvalidArgument(path + " is a " + FileType(st.st_mode) +
                                   ", not a block device or regular file");
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  uint64_t bytes = 0;
  int rc = ::ioctl(fd, BLKGETSIZE64, &bytes);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::FromErrno(err, "BLKGETSIZE64 " + path);
  return bytes;
}

Status FormatPool(const std::string& root, const FormatOptions& options) {
  const PoolPaths paths = PoolPaths::For(root);
  const uint64_t bs = options.block_size;

  // 1. Arguments. Nothing is touched until every check has passed.
  if (root.empty()) return Status::InvalidArgument("empty pool path");
  if (options.size == 0) return Status::InvalidArgument("size must not be zero");
  if (const char* why = Geometry::Validate(bs); why[0] != '\0') {
    return Status::InvalidArgument(std::string(why) + " (got " + std::to_string(bs) + ")");
  }
  const uint64_t data_blocks = options.size / bs;
  if (data_blocks == 0) {
    return Status::InvalidArgument("size " + FormatSize(options.size) +
                                   " is smaller than one block (" + FormatSize(bs) + ")");
  }
  const uint64_t data_bytes = data_blocks * bs;
  if (data_bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return Status::InvalidArgument("size " + FormatSize(options.size) + " is too large");
  }
  std::string data_target;
  if (!options.data_path.empty()) {
    Result<uint64_t> cap = DataAreaBytes(options.data_path);
    if (!cap.ok()) return cap.status().WithContext("--data");
    if (data_bytes > *cap) {
      return Status::InvalidArgument("size " + FormatSize(data_bytes) + " (" +
                                     std::to_string(data_bytes) + " bytes) exceeds the " +
                                     std::to_string(*cap) + " bytes of " + options.data_path);
    }
    std::error_code ec;
    data_target = stdfs::absolute(options.data_path, ec).lexically_normal().string();
    if (ec) return Status::FromErrno(ec.value(), "--data " + options.data_path);
    // Reformatting with --data pointing at the old pool/data would delete it.
    struct stat a, b;
    if (::stat(paths.data.c_str(), &a) == 0 && ::stat(data_target.c_str(), &b) == 0 &&
        a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
      return Status::InvalidArgument("--data " + options.data_path +
                                     " is the pool's own data file");
    }
  }

  // 2. What is at `root` now, and may it be (re)formatted?
  struct stat st;
  bool root_exists = false;
  if (::stat(paths.root.c_str(), &st) == 0) {
    root_exists = true;
  } else if (errno != ENOENT) {
    return Status::FromErrno(errno, "stat " + paths.root);
  }
  bool was_pool = false;
  if (root_exists) {
    if (!S_ISDIR(st.st_mode)) {
      return Status::InvalidArgument(paths.root + " exists and is not a directory");
    }
    was_pool = LooksLikePool(paths.root);
    if (was_pool && !options.force) {
      return Status::Exists(paths.root +
                            " is already a thinfs pool (use --force to reformat it)");
    }
    if (!was_pool) {
      THINFS_ASSIGN_OR_RETURN(bool empty, DirIsEmpty(paths.root));
      if (!empty && !options.force) {
        return Status::Exists(paths.root +
                              " is not empty and is not a thinfs pool (use --force to format "
                              "into it)");
      }
    }
    if (options.force) {
      THINFS_ASSIGN_OR_RETURN(bool has_data, Exists(paths.data, &st));
      if (has_data && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
        return Status::InvalidArgument(paths.data + " is a " + FileType(st.st_mode) +
                                       "; remove it by hand");
      }
    }
  }

  // 3. Claim the directory. A locked pool is never reformatted.
  FormatUndo undo(paths);
  if (!root_exists) {
    if (::mkdir(paths.root.c_str(), 0755) != 0) {
      return Status::FromErrno(errno, "create pool directory " + paths.root);
    }
    undo.root = true;
  }
  THINFS_ASSIGN_OR_RETURN(bool lock_existed, Exists(paths.lock, &st));
  Result<PoolLock> lock = PoolLock::Acquire(paths.lock);
  if (!lock.ok()) return lock.status();
  undo.lock = !lock_existed;
  undo.held = std::move(*lock);
  if (LooksLikePool(paths.root) != was_pool) {
    return Status::Busy(paths.root + " changed while it was being formatted; try again");
  }

  // 4. With --force: drop the old pool. The lock proves no daemon uses it.
  if (options.force && root_exists) {
    THINFS_RETURN_IF_ERROR(RemoveAll(paths.meta));
    THINFS_RETURN_IF_ERROR(RemoveFile(paths.bitmap));
    THINFS_RETURN_IF_ERROR(RemoveFile(paths.data));  // a file or a symlink, checked above
    THINFS_RETURN_IF_ERROR(RemoveFile(paths.control_socket));
  }

  // 5. The data area.
  if (data_target.empty()) {
    int fd = ::open(paths.data.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return Status::FromErrno(errno, "create " + paths.data);
    undo.data = true;
    // ftruncate allocates nothing: the data area starts fully sparse.
    Status s;
    if (::ftruncate(fd, static_cast<off_t>(data_bytes)) != 0) {
      s = Status::FromErrno(errno, "size " + paths.data + " to " + FormatSize(data_bytes));
    } else if (::fsync(fd) != 0) {
      s = Status::FromErrno(errno, "fsync " + paths.data);
    }
    ::close(fd);
    THINFS_RETURN_IF_ERROR(s);
  } else {
    if (::symlink(data_target.c_str(), paths.data.c_str()) != 0) {
      return Status::FromErrno(errno, "link " + paths.data + " to " + data_target);
    }
    undo.data = true;
  }

  // 6. The superblock, written with the store.
  Superblock sb;
  THINFS_RETURN_IF_ERROR(RandomBytes(sb.uuid, sizeof sb.uuid));
  sb.uuid[6] = static_cast<uint8_t>((sb.uuid[6] & 0x0f) | 0x40);  // RFC 4122 version 4
  sb.uuid[8] = static_cast<uint8_t>((sb.uuid[8] & 0x3f) | 0x80);  // variant 1
  sb.block_size = bs;
  sb.data_blocks = data_blocks;
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  sb.created_ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  sb.transaction_id = 0;
  sb.next_device_id = 1;
  undo.meta = true;
  {
    RocksDbOptions store_options;
    store_options.one_shot = true;  // format writes the superblock and closes
    Result<std::unique_ptr<RocksDbStore>> store =
        RocksDbStore::Create(paths.meta, sb, store_options);
    if (!store.ok()) return store.status().WithContext("create metadata store " + paths.meta);
  }

  // 7. The bitmap: every block free, cleanly closed at generation 0.
  undo.bitmap = true;
  {
    Result<std::unique_ptr<BitmapSpaceMap>> bitmap =
        BitmapSpaceMap::Create(paths.bitmap, data_blocks, bs);
    if (!bitmap.ok()) return bitmap.status().WithContext("create bitmap " + paths.bitmap);
    Status s = (*bitmap)->MarkClean(0);
    if (!s.ok()) return s.WithContext("bitmap " + paths.bitmap);
  }

  // 8. Make the new directory entries durable.
  THINFS_RETURN_IF_ERROR(FsyncPath(paths.root, O_RDONLY | O_DIRECTORY));
  undo.Dismiss();
  return Status::Ok();
}

// ------------------------------------------------------------- OpenPoolFiles

Status ValidateSuperblock(const Superblock& sb) {
  if (sb.magic != kSuperblockMagic) {
    return Status::Corruption("superblock magic: expected " + Hex(kSuperblockMagic) +
                              ", found " + Hex(sb.magic));
  }
  if (sb.format_version != kFormatVersion) {
    return Status::NotSupported("superblock format version " +
                                std::to_string(sb.format_version) + " (this thinfs reads " +
                                std::to_string(kFormatVersion) + ")");
  }
  if (sb.flags != 0) {
    return Status::NotSupported("superblock has unknown flags " + Hex(sb.flags));
  }
  if (const char* why = Geometry::Validate(sb.block_size); why[0] != '\0') {
    return Status::Corruption("superblock block size " + std::to_string(sb.block_size) + ": " +
                              why);
  }
  if (sb.data_blocks == 0) return Status::Corruption("superblock data_blocks is zero");
  if (sb.data_blocks > static_cast<uint64_t>(std::numeric_limits<off_t>::max()) / sb.block_size) {
    return Status::Corruption("superblock data_blocks " + std::to_string(sb.data_blocks) +
                              " overflows the data area size");
  }
  if (sb.next_device_id == 0) return Status::Corruption("superblock next_device_id is zero");
  return Status::Ok();
}

std::string DataPathOf(const PoolPaths& paths) {
  char buf[4096];
  ssize_t n = ::readlink(paths.data.c_str(), buf, sizeof buf);
  if (n > 0 && static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  return paths.data;
}

Status CheckBitmapGeneration(const BitmapSpaceMap& bitmap, const Superblock& sb,
                             const std::string& bitmap_path) {
  const uint64_t g = bitmap.generation(), t = sb.transaction_id;
  // A commit syncs the bitmap at t + 1 before the metadata reaches t + 1
  // (one that changed no bit skips the sync: g may lag, never lead).
  const uint64_t newest = bitmap.was_clean() ? t : t + 1;
  const std::string how = bitmap.was_clean() ? "closed cleanly" : "last synced";
  if (g > newest) {
    return Status::Corruption("bitmap " + bitmap_path + " was " + how + " at transaction " +
                              std::to_string(g) + " but the metadata store is at transaction " +
                              std::to_string(t) +
                              ": committed metadata is missing (a lost or damaged RocksDB WAL "
                              "or MANIFEST?)");
  }
  if (bitmap.was_clean() && g < t) {
    return Status::Corruption("bitmap " + bitmap_path + " was closed cleanly at transaction " +
                              std::to_string(g) + ", before the metadata store's transaction " +
                              std::to_string(t) + ": the bitmap is stale");
  }
  return Status::Ok();
}

Result<PoolFiles> OpenPoolFiles(const std::string& root, const OpenOptions& options) {
  PoolFiles f;
  f.paths = PoolPaths::For(root);
  struct stat st;
  if (::stat(f.paths.root.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::NotFound("pool " + f.paths.root + " does not exist");
    return Status::FromErrno(errno, "stat pool " + f.paths.root);
  }
  // Checked before locking: Acquire would create pool/lock in any directory.
  if (!S_ISDIR(st.st_mode) || !LooksLikePool(f.paths.root)) {
    return Status::NotFound(f.paths.root + " is not a thinfs pool (no meta/ or bitmap)");
  }

  THINFS_ASSIGN_OR_RETURN(f.lock, PoolLock::Acquire(f.paths.lock));

  RocksDbOptions ro;
  ro.block_cache_bytes = options.block_cache_bytes;
  ro.read_only = options.read_only;
  ro.one_shot = options.one_shot;
  Result<std::unique_ptr<RocksDbStore>> store = RocksDbStore::Open(f.paths.meta, ro);
  if (!store.ok()) return store.status().WithContext("metadata store " + f.paths.meta);
  f.store = std::move(*store);

  Result<Superblock> sb = f.store->ReadSuperblock();
  if (!sb.ok()) return sb.status().WithContext("superblock in " + f.paths.meta);
  f.superblock = *sb;
  THINFS_RETURN_IF_ERROR(ValidateSuperblock(f.superblock));
  const Geometry geometry(f.superblock.block_size, f.superblock.data_blocks);

  Result<uint64_t> have = DataAreaBytes(f.paths.data);
  if (!have.ok()) return have.status().WithContext("data area");
  if (*have < geometry.data_bytes()) {
    return Status::Corruption("data area " + f.paths.data + " holds " + std::to_string(*have) +
                              " bytes, the superblock needs " +
                              std::to_string(geometry.data_bytes()) + " (" +
                              std::to_string(geometry.data_blocks()) + " blocks of " +
                              FormatSize(geometry.block_size()) + ")");
  }
  Result<std::unique_ptr<FileBlockDevice>> data =
      FileBlockDevice::Open(f.paths.data, geometry, options.direct_io, options.read_only);
  if (!data.ok()) return data.status().WithContext("data area");
  f.data = std::move(*data);
  if (!options.reflink) f.data->DisableClones();
  if (options.mapped_reads) f.data->EnableMappedReads();
  f.data->EnableReadAround(options.read_around_bytes);
  // A --data target (pool/data a symlink) is the user's to size: grow
  // checks it is large enough instead of extending it.
  struct stat lst;
  if (::lstat(f.paths.data.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) f.data->set_fixed_size(true);

  Result<std::unique_ptr<BitmapSpaceMap>> bitmap = BitmapSpaceMap::Open(
      f.paths.bitmap, f.superblock.data_blocks, f.superblock.block_size, options.read_only);
  if (!bitmap.ok()) {
    Status s = bitmap.status();
    // A geometry mismatch is the superblock and the bitmap disagreeing: a
    // damaged pool, not a bad argument of the caller's.
    if (s.IsInvalidArgument()) s = Status::Corruption(s.message());
    return s.WithContext("bitmap " + f.paths.bitmap);
  }
  THINFS_RETURN_IF_ERROR(CheckBitmapGeneration(**bitmap, f.superblock, f.paths.bitmap));
  f.bitmap = std::move(*bitmap);
  return f;
}

std::string FormatUuid(const uint8_t (&uuid)[16]) {
  char buf[37];
  std::snprintf(buf, sizeof buf,
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", uuid[0],
                uuid[1], uuid[2], uuid[3], uuid[4], uuid[5], uuid[6], uuid[7], uuid[8], uuid[9],
                uuid[10], uuid[11], uuid[12], uuid[13], uuid[14], uuid[15]);
  return buf;
}

}  // namespace thinfs::meta
