#include "tools/daemon_checkpoint.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>

#include "core/admin.h"
#include "tools/control_client.h"

namespace thinfs::tools {

Result<std::unique_ptr<DaemonCheckpoint>> DaemonCheckpoint::Take(const meta::PoolPaths& paths,
                                                                 const std::string& prefix,
                                                                 bool* answered) {
  *answered = false;
  std::string tmpl = paths.root + "/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return Status::FromErrno(errno, "mkdtemp " + tmpl);
  // RocksDB creates the checkpoint directory itself; the daemon needs an
  // absolute path (its working directory is not ours).
  ::rmdir(tmpl.c_str());
  char abs[PATH_MAX];
  std::string dir = ::realpath(paths.root.c_str(), abs) != nullptr
                        ? std::string(abs) + tmpl.substr(tmpl.rfind('/'))
                        : tmpl;
  // Owns the directory from here on, whatever happens.
  std::unique_ptr<DaemonCheckpoint> cp(new DaemonCheckpoint(dir));
  AdminRequest request;
  request.command = "checkpoint";
  request.args = {{"dir", dir}};
  std::optional<Result<AdminReply>> call = CallDaemon(paths.root, request);
  if (!call) return std::unique_ptr<DaemonCheckpoint>();
  *answered = true;
  if (!call->ok()) return call->status();
  if ((*call)->exit_code != kAdminOk) return Status::IOError((*call)->error);
  return cp;
}

DaemonCheckpoint::~DaemonCheckpoint() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace thinfs::tools
