// The CLI's side of the mount daemon's control socket (POOL/control.sock,
// wire format in core/admin.h): one request, one reply per connection.
//
// Thread safety: reentrant.

#ifndef THINFS_TOOLS_CONTROL_CLIENT_H_
#define THINFS_TOOLS_CONTROL_CLIENT_H_

#include <optional>
#include <string>

#include "core/admin_wire.h"
#include "core/status.h"

namespace thinfs::tools {

// Sends `request` to the daemon serving the pool at `pool`. Returns
// std::nullopt when no daemon answers there (no control.sock, or a stale
// one nobody listens on): the caller then opens the pool itself. Otherwise
// the daemon's reply, or an error status naming the socket (permission
// denied, a reply that is malformed, too large or late).
std::optional<Result<AdminReply>> CallDaemon(const std::string& pool,
                                             const AdminRequest& request);

// Where the daemon serving `pool` has it mounted (its `mountpoint` command).
// std::nullopt when no daemon answers; an error status for a failed call
// or a daemon's error reply.
std::optional<Result<std::string>> DaemonMountpoint(const std::string& pool);

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_CONTROL_CLIENT_H_
