// What a device command (tools/cmd_dev.cc: create, snapshot, delete,
// resize, rename, list, grow) does when no mount daemon serves its pool.
//
// The CLI is two executables (docs/design.md, "The CLI's two binaries"),
// and each defines this function its own way:
//   - thinfs-engine (tools/device_here.cc) opens the pool itself, runs the
//     request with RunAdmin() and closes the pool;
//   - thinfs, the front (tools/front.cc), has no engine linked in: it runs
//     thinfs-engine with the same command line, which does the above. It
//     returns only when that binary cannot be run.
//
// Thread safety: single-threaded (the CLI's).

#ifndef THINFS_TOOLS_DEVICE_HERE_H_
#define THINFS_TOOLS_DEVICE_HERE_H_

#include <string>

#include "core/admin_wire.h"
#include "tools/cli.h"

namespace thinfs::tools {

// `cl` is the command's parsed command line (its name and arguments),
// `request` what it asks of the pool at `pool`; `read_only` opens the pool
// without changing it (list).
AdminReply RunWithoutDaemon(const CommandLine& cl, const std::string& pool,
                            const AdminRequest& request, bool read_only);

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_DEVICE_HERE_H_
