// The mount daemon's control socket: POOL/control.sock, through which the
// CLI's management commands (create, snapshot, delete, resize, rename,
// list, status) reach the pool the daemon owns while mounted.
//
// An AF_UNIX stream socket, mode 0600, serving one request and one reply
// per connection in the wire format of core/admin.h; the commands run
// through RunAdmin(), exactly as when the CLI opens the pool itself.
// Changes are shown in the mount at once (NotifyEntryChanged /
// NotifyInodeChanged), and delete and resize go through the FUSE server
// (DeleteDeviceServed / ResizeDeviceServed), so a device open in the mount
// keeps working after it is deleted, until its last close.
//
// Defences: only root and the pool directory's owner are served (checked
// with SO_PEERCRED; others get an error reply); a request larger than
// kAdminMaxRequestFrame, malformed or truncated gets an error reply and the
// connection is closed; a connection that sends nothing for `read_timeout`
// is dropped; at most `max_connections` are served at once.
//
// Thread safety: Start/Stop are called by one thread; connections are
// served on threads of their own.

#ifndef THINFS_FS_CONTROL_H_
#define THINFS_FS_CONTROL_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "core/mutex.h"
#include "core/pool.h"
#include "core/status.h"

namespace thinfs::fs {

struct ControlConfig {
  std::string pool_root;    // absolute
  std::string socket_path;  // POOL/control.sock
  std::string mountpoint;   // absolute
  std::string data_path;    // shown by status
  uid_t owner_uid = 0;      // the pool directory's owner
  std::chrono::milliseconds read_timeout{5000};
  size_t max_connections = 16;
  // Writes a consistent copy of the committed metadata (see AdminContext).
  std::function<Status(const std::string& dir)> checkpoint;
};

class ControlServer {
 public:
  // Replaces a stale socket left by a dead daemon (the caller holds the
  // pool lock, so no live daemon owns it), binds and listens, and starts
  // accepting. Returns kExists when socket_path is something other than a
  // socket, or the errno status of socket/bind/listen.
  static Result<std::unique_ptr<ControlServer>> Start(Pool* pool, const ControlConfig& config);

  // Stop()s.
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Stops accepting, waits for the connections being served (waking those
  // blocked on a read), removes the socket. Idempotent.
  void Stop();

 private:
  struct Connection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};  // set by the connection's thread as it ends
  };

  ControlServer(Pool* pool, ControlConfig config, int listen_fd, dev_t dev, ino_t ino);
  void AcceptLoop();
  void Serve(Connection* conn);
  // Joins finished connection threads; returns how many are still running.
  size_t ReapLocked() REQUIRES(mu_);

  // Constant after construction.
  Pool* const pool_;
  const ControlConfig config_;
  const int listen_fd_;
  const dev_t socket_dev_;  // identify our socket file, to remove only it
  const ino_t socket_ino_;

  // Own synchronization.
  std::atomic<bool> stopping_{false};  // read by the accept loop after wake-ups
  std::thread acceptor_;

  Mutex mu_;
  std::list<Connection> connections_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
};

}  // namespace thinfs::fs

#endif  // THINFS_FS_CONTROL_H_
