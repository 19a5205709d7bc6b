// FaultInjectionFs: a RocksDB file system for crash tests that can lose
// exactly the data a power failure would.
//
// It forwards to the default (POSIX) file system and tracks, per file
// written through it, how many bytes have been appended and how many of
// those were covered by the file's last Sync/Fsync. DropUnsyncedData()
// then truncates every such file to its synced length and deletes files
// that were created but never synced. SetFilesystemActive(false) makes
// every later write, sync, create, rename and delete fail with an I/O
// error, so that a store destroyed afterwards leaves nothing more on disk:
// the "crash".
//
// Not modelled: directory fsync (a file synced but whose directory entry
// was never fsynced survives), lost renames, torn sector writes, and
// files that existed before they were opened through this object (their
// old contents count as synced).
//
// No RocksDB type appears here: env() hands out a rocksdb::Env* as void*
// for RocksDbOptions::env_for_testing.
//
// Thread safety: all methods may be called concurrently with RocksDB's
// threads using env(); DropUnsyncedData() requires that no store using
// env() is open.

#ifndef THINFS_META_FAULT_INJECTION_ENV_H_
#define THINFS_META_FAULT_INJECTION_ENV_H_

#include <memory>

#include "core/status.h"

namespace thinfs::meta {

class FaultInjectionFs {
 public:
  static std::unique_ptr<FaultInjectionFs> Create();
  ~FaultInjectionFs();
  FaultInjectionFs(const FaultInjectionFs&) = delete;
  FaultInjectionFs& operator=(const FaultInjectionFs&) = delete;

  // The rocksdb::Env* to pass as RocksDbOptions::env_for_testing. Valid
  // while this object lives, which must be longer than any store using it.
  void* env();

  // While inactive, mutating file operations fail with IOError. Starts
  // active.
  void SetFilesystemActive(bool active);

  // Truncates each tracked file to its last synced length; deletes tracked
  // files never synced. REQUIRES: no store using env() is open.
  // Returns kIOError if a file cannot be truncated or deleted.
  Status DropUnsyncedData();

 private:
  struct Rep;
  explicit FaultInjectionFs(std::unique_ptr<Rep> rep);

  const std::unique_ptr<Rep> rep_;
};

}  // namespace thinfs::meta

#endif  // THINFS_META_FAULT_INJECTION_ENV_H_
