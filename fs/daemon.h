// Start-up plumbing of the mount daemon: mountpoint checks and the fork
// that lets `thinfs mount` return only once the mount is usable.
//
// Thread safety: Startup::Daemonize() forks and must run while the process
// is single-threaded (before the pool starts its threads). A Startup object
// is used by one thread at a time.

#ifndef THINFS_FS_DAEMON_H_
#define THINFS_FS_DAEMON_H_

#include <optional>
#include <string>

#include "core/status.h"

namespace thinfs::fs {

// OK when `path` is an existing, empty directory; else kNotFound,
// kInvalidArgument ("not a directory") or kNotEmpty, with the path in the
// message.
Status CheckMountpoint(const std::string& path);

// Reports the outcome of start-up to whoever ran `thinfs mount`.
class Startup {
 public:
  // No fork: reports go to stderr.
  static Startup Foreground();
  // Forks. The parent waits for the child's report, prints a failure to
  // stderr, and gets std::nullopt with *exit_code set (0 once the mount is
  // usable, 1 if start-up failed). The child gets the Startup to report
  // through; it runs in a new session with "/" as working directory and
  // logs to syslog from now on.
  static std::optional<Startup> Daemonize(int* exit_code);

  Startup(Startup&& other) noexcept;
  Startup& operator=(Startup&&) = delete;
  Startup(const Startup&) = delete;
  Startup& operator=(const Startup&) = delete;
  ~Startup();

  bool daemon() const { return detached_; }
  bool reported() const { return reported_; }

  // The mount is usable: the parent exits 0; a daemon detaches its stdio.
  void ReportReady();
  // Start-up failed: the parent prints `message` and exits 1.
  void ReportFailure(const std::string& message);

 private:
  explicit Startup(int fd) : fd_(fd), detached_(fd >= 0) {}

  int fd_ = -1;            // write end of the pipe to the parent, -1 if none
  bool detached_ = false;  // running as a daemon
  bool reported_ = false;
};

}  // namespace thinfs::fs

#endif  // THINFS_FS_DAEMON_H_
