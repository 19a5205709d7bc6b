// A pool opened by the CLI process itself, when no mount daemon serves it:
// its files under the pool lock and the engine on them, committing every
// change at once (nothing else writes here). Used by the device commands
// (cmd_dev.cc) and by diff, send and receive (cmd_send.cc). Also the CLI's
// other opens of a pool's files or of a metadata store (status, format,
// check, dump), all one-shot.
//
// Thread safety: single-threaded.

#ifndef THINFS_TOOLS_POOL_HERE_H_
#define THINFS_TOOLS_POOL_HERE_H_

#include <memory>
#include <string>

#include "core/pool.h"
#include "core/status.h"
#include "meta/pool_dir.h"
#include "meta/rocksdb_store.h"

namespace thinfs::tools {

// Members are destroyed in reverse order: the engine before the files that
// hold the lock.
struct OpenPool {
  meta::PoolFiles files;  // data, bitmap and store moved into `pool`
  std::unique_ptr<Pool> pool;
  Superblock sb;

  ~OpenPool() {
    if (pool) (void)pool->Close();
  }
  // Closes the engine (commits) and returns its status; the lock stays.
  Status Close() {
    Status s = pool ? pool->Close() : Status::Ok();
    pool.reset();
    return s;
  }
};

// Opens the pool at `dir`. Returns meta::OpenPoolFiles' error as is (kBusy
// when the pool is locked, e.g. mounted), or "cannot open pool DIR: ..."
// when the engine refuses it.
Result<std::unique_ptr<OpenPool>> OpenPoolHere(const std::string& dir, bool read_only);

// Every store the CLI opens serves one command and closes, so each is
// opened one-shot (RocksDbOptions::one_shot: none of what only the mount
// daemon's long-lived store gains from; docs/benchmarks.md, lever 59).
// OpenPoolFilesHere is meta::OpenPoolFiles so; OpenStoreHere opens the
// metadata store in `dir` (a pool's meta/ or a daemon's checkpoint) so.
Result<meta::PoolFiles> OpenPoolFilesHere(const std::string& dir, bool read_only);
Result<std::unique_ptr<meta::RocksDbStore>> OpenStoreHere(const std::string& dir, bool read_only);

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_POOL_HERE_H_
