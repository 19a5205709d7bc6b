// DaemonCheckpoint: a consistent point-in-time copy of a mounted pool's
// committed metadata, for commands that read a mounted pool offline-style
// (check --read-only, dump). The daemon writes a RocksDB checkpoint (the
// `checkpoint` control command: hard links, cheap) into a fresh directory
// inside the pool directory; the copy is removed when the object goes.
//
// Thread safety: single-threaded.

#ifndef THINFS_TOOLS_DAEMON_CHECKPOINT_H_
#define THINFS_TOOLS_DAEMON_CHECKPOINT_H_

#include <memory>
#include <string>

#include "core/status.h"
#include "meta/pool_dir.h"

namespace thinfs::tools {

class DaemonCheckpoint {
 public:
  // Asks the daemon serving `paths` for a checkpoint into a new directory
  // POOL/<prefix>XXXXXX (e.g. ".check-"). Sets *answered to
  // false (and returns null) when no daemon answers on the control socket.
  // Returns the daemon's error, or the errno status of mkdtemp.
  static Result<std::unique_ptr<DaemonCheckpoint>> Take(const meta::PoolPaths& paths,
                                                        const std::string& prefix,
                                                        bool* answered);
  ~DaemonCheckpoint();
  DaemonCheckpoint(const DaemonCheckpoint&) = delete;
  DaemonCheckpoint& operator=(const DaemonCheckpoint&) = delete;

  // The RocksDB directory of the copy (opens with RocksDbStore::Open).
  const std::string& dir() const { return dir_; }

 private:
  explicit DaemonCheckpoint(std::string dir) : dir_(std::move(dir)) {}
  const std::string dir_;
};

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_DAEMON_CHECKPOINT_H_
