// The CLI's side of the mount daemon's control socket (POOL/control.sock,
// wire format in core/admin.h): one request, one reply per connection.
//
// Thread safety: reentrant.

#ifndef THINFS_TOOLS_CONTROL_CLIENT_H_
#define THINFS_TOOLS_CONTROL_CLIENT_H_

#include <memory>
#include <optional>
#include <string>

#include "core/admin.h"
#include "core/status.h"

namespace thinfs::tools {

// Sends `request` to the daemon serving the pool at `pool`. Returns
// std::nullopt when no daemon answers there (no control.sock, or a stale
// one nobody listens on): the caller then opens the pool itself. Otherwise
// the daemon's reply, or an error status naming the socket (permission
// denied, a reply that is malformed, too large or late).
std::optional<Result<AdminReply>> CallDaemon(const std::string& pool,
                                             const AdminRequest& request);

// A consistent copy of a mounted pool's committed metadata: the daemon
// commits, then writes a RocksDB checkpoint (hard links: cheap) into
// POOL/.PREFIX-XXXXXX, which the destructor removes. Open it with
// meta::RocksDbStore::Open(dir(), read_only).
class MountedMetadataCheckpoint {
 public:
  // std::nullopt when no daemon answers on POOL/control.sock; else the
  // checkpoint or the error (daemon refused, mkdtemp failed).
  static std::optional<Result<std::unique_ptr<MountedMetadataCheckpoint>>> Take(
      const std::string& pool_root, const std::string& prefix);
  ~MountedMetadataCheckpoint();
  MountedMetadataCheckpoint(const MountedMetadataCheckpoint&) = delete;
  MountedMetadataCheckpoint& operator=(const MountedMetadataCheckpoint&) = delete;

  const std::string& dir() const { return dir_; }

 private:
  explicit MountedMetadataCheckpoint(std::string dir) : dir_(std::move(dir)) {}
  const std::string dir_;
};

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_CONTROL_CLIENT_H_
