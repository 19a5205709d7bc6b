// The engine binary's RunWithoutDaemon (tools/device_here.h): the pool
// opened in this process.

#include "tools/device_here.h"

#include <unistd.h>

#include <memory>

#include "core/admin.h"
#include "meta/pool_dir.h"
#include "tools/pool_here.h"

namespace thinfs::tools {

AdminReply RunWithoutDaemon(const CommandLine&, const std::string& pool,
                            const AdminRequest& request, bool read_only) {
  Result<std::unique_ptr<OpenPool>> open = OpenPoolHere(pool, read_only);
  if (!open.ok()) return AdminReply::Error(kAdminFailure, open.status().message());
  OpenPool& here = **open;
  AdminContext ctx;
  ctx.pool_root = here.files.paths.root;
  ctx.data_path = meta::DataPathOf(here.files.paths);
  ctx.create_attrs.uid = ::geteuid();
  ctx.create_attrs.gid = ::getegid();
  AdminReply reply = RunAdmin(*here.pool, request, ctx);
  Status closed = here.Close();
  if (!closed.ok() && reply.exit_code == kAdminOk) {
    return AdminReply::Error(kAdminFailure, "closing pool " + pool + ": " + closed.message());
  }
  return reply;
}

}  // namespace thinfs::tools
