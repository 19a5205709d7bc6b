// The pool directory (DESIGN.md "The pool on disk"):
//
//   pool/data          data area: a sparse regular file, or a symlink to the
//                      block device / file given to `format --data`
//   pool/meta/         RocksDB store (superblock, devices, block map, refcounts)
//   pool/bitmap        allocation bitmap (meta::BitmapSpaceMap)
//   pool/lock          flock()ed by the one process that owns the pool; holds
//                      the owner's PID in decimal
//   pool/control.sock  the daemon's control socket while mounted
//
// A directory "is a pool" when it holds meta/ or bitmap. FormatPool creates
// one; OpenPoolFiles opens every part of one under the lock, checking that
// the parts agree (geometry from the superblock).
//
// Thread safety: the functions are reentrant; a PoolLock or PoolFiles object
// must not be used from two threads at once without external locking.

#ifndef THINFS_META_POOL_DIR_H_
#define THINFS_META_POOL_DIR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/block_device.h"
#include "core/metadata.h"
#include "core/status.h"
#include "core/types.h"
#include "meta/bitmap_space_map.h"
#include "meta/pool_paths.h"
#include "meta/rocksdb_store.h"

namespace thinfs::meta {

// Returns true when `root` holds meta/ or bitmap (a pool, whole or not).
bool LooksLikePool(const std::string& root);

// Exclusive ownership of a pool: flock(LOCK_EX | LOCK_NB) on pool/lock, the
// holder's PID written into the file. Released on destruction (or when the
// process dies: the kernel drops the flock). Movable, not copyable.
class PoolLock {
 public:
  // Opens (creating it, mode 0644, if missing) and locks `lock_path`.
  // Returns kBusy "pool DIR is in use by process PID" when another open file
  // description holds the lock (the PID read from the file), or the errno
  // status of open/flock (kNotFound, kPermissionDenied, kReadOnly, ...).
  static Result<PoolLock> Acquire(const std::string& lock_path);

  PoolLock() = default;
  ~PoolLock();
  PoolLock(PoolLock&& other) noexcept;
  PoolLock& operator=(PoolLock&& other) noexcept;
  PoolLock(const PoolLock&) = delete;
  PoolLock& operator=(const PoolLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  PoolLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void Release();

  int fd_ = -1;
  bool writable_ = false;  // false: opened read-only, no PID recorded
  std::string path_;
};

struct FormatOptions {
  // Bytes of data area; rounded down to whole blocks. REQUIRES: >= block_size.
  uint64_t size = 0;
  uint64_t block_size = kDefaultBlockSize;
  // An existing block device or regular file to hold the data (pool/data
  // becomes a symlink to its absolute path); empty: a sparse pool/data.
  std::string data_path;
  // Reformat an existing (unlocked) pool, or format into a non-empty
  // directory that is not a pool.
  bool force = false;
};

// Creates a pool at `root` (the directory is created if missing; its parent
// must exist). Every argument is validated and every refusal decided before
// anything is written, so a refused call changes nothing on disk.
// Returns:
//   kInvalidArgument  zero size, size below one block, bad block size, a
//                     --data path that is neither a block device nor a
//                     regular file, a size larger than the --data target,
//                     `root` not a directory;
//   kExists           `root` is a pool, or a non-empty directory, and !force;
//   kBusy             the pool is locked by another process (even with force);
//   kPermissionDenied / kReadOnly / kNotFound / kIOError  from the file system.
// On failure after writing started, what this call created is removed.
// With force, the old meta/, bitmap and data (if a file or symlink named
// pool/data) are removed first; a --data target itself is never deleted.
Status FormatPool(const std::string& root, const FormatOptions& options);

struct OpenOptions {
  bool read_only = false;
  bool direct_io = false;
  // Copy-on-write copies may be reflinks where the data file's file system
  // can (FileBlockDevice::Copy); false: always read and written.
  bool reflink = true;
  // Reads of cached data copied out of a mapping of the data file
  // (FileBlockDevice::EnableMappedReads).
  bool mapped_reads = false;
  // Read-around window of a random read within one block
  // (FileBlockDevice::EnableReadAround); 0 off.
  uint64_t read_around_bytes = 64 << 10;
  size_t block_cache_bytes = 64 << 20;
  // RocksDbOptions::one_shot.
  bool one_shot = false;
};

// Every open part of a pool. Members are destroyed in reverse order, so the
// lock is released last.
struct PoolFiles {
  PoolPaths paths;
  PoolLock lock;
  Superblock superblock;
  std::unique_ptr<FileBlockDevice> data;
  std::unique_ptr<BitmapSpaceMap> bitmap;
  std::unique_ptr<RocksDbStore> store;
};

// Checks the superblock's own fields (magic, version, geometry).
// Returns kCorruption naming the field, expected and found values.
Status ValidateSuperblock(const Superblock& sb);

// The bitmap's generation against the superblock's transaction id. Every
// commit syncs the bitmap at the next transaction id before the metadata
// commit, and a clean close records the last one (Pool::Close, check
// --repair). So a bitmap ahead of the metadata (clean: by any; dirty, after
// a crash: by more than one) means committed metadata is missing, e.g. a
// lost or damaged RocksDB WAL replayed only up to the damage; a clean
// bitmap behind it is stale. Returns kCorruption saying which, naming
// `bitmap_path`.
Status CheckBitmapGeneration(const BitmapSpaceMap& bitmap, const Superblock& sb,
                             const std::string& bitmap_path);

// The capacity in bytes of `path` after following symlinks: st_size for a
// regular file, BLKGETSIZE64 for a block device. Returns kNotFound,
// kInvalidArgument for anything else, or the errno status.
Result<uint64_t> DataAreaBytes(const std::string& path);

// Opens the pool at `root`: takes the lock, opens the store, reads and
// validates the superblock, opens the data area (which must hold
// data_blocks * block_size bytes) and the bitmap with the superblock's
// geometry. Returns kNotFound (no such pool), kBusy (locked), kCorruption
// (a damaged or inconsistent part, named in the message), or the errno
// status of the failing step. Every message names the pool part.
// Where the data lives: the symlink target for `format --data`, else the
// pool's own file POOL/data.
std::string DataPathOf(const PoolPaths& paths);

Result<PoolFiles> OpenPoolFiles(const std::string& root, const OpenOptions& options);

// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string FormatUuid(const uint8_t (&uuid)[16]);

}  // namespace thinfs::meta

#endif  // THINFS_META_POOL_DIR_H_
