// A pool opened by the CLI process itself, when no mount daemon serves it:
// its files under the pool lock and the engine on them, committing every
// change at once (nothing else writes here). Used by the device commands
// (cmd_dev.cc) and by diff, send and receive (cmd_send.cc).
//
// Thread safety: single-threaded.

#ifndef THINFS_TOOLS_POOL_HERE_H_
#define THINFS_TOOLS_POOL_HERE_H_

#include <memory>
#include <string>

#include "core/pool.h"
#include "core/status.h"
#include "meta/pool_dir.h"

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

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_POOL_HERE_H_
