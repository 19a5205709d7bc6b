#include "fs/control.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/admin.h"
#include "fs/log.h"
#include "fs/mount.h"

namespace thinfs::fs {

namespace {

using Clock = std::chrono::steady_clock;

// sun_path holds 108 bytes; a longer pool path is reached through the pool
// directory's descriptor, which the kernel resolves like any path.
struct SocketAddress {
  sockaddr_un addr{};
  int dir_fd = -1;  // kept open while the address is in use

  SocketAddress() = default;
  SocketAddress(const SocketAddress&) = delete;
  SocketAddress& operator=(const SocketAddress&) = delete;
  ~SocketAddress() {
    if (dir_fd >= 0) ::close(dir_fd);
  }
};

Status MakeAddress(const std::string& pool_root, const std::string& path, SocketAddress* out) {
  out->addr.sun_family = AF_UNIX;
  std::string target = path;
  if (target.size() >= sizeof out->addr.sun_path) {
    out->dir_fd = ::open(pool_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (out->dir_fd < 0) return Status::FromErrno(errno, "open pool directory " + pool_root);
    target = "/proc/self/fd/" + std::to_string(out->dir_fd) + "/control.sock";
  }
  std::memcpy(out->addr.sun_path, target.c_str(), target.size() + 1);
  return Status::Ok();
}

// Reads exactly `size` bytes before `deadline`. kIOError "truncated" on
// EOF, "timed out" past the deadline.
Status ReadFull(int fd, size_t size, Clock::time_point deadline, std::string* out) {
  out->resize(size);
  size_t done = 0;
  while (done < size) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Status::IOError("timed out reading the request");
    pollfd p{fd, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Status::FromErrno(errno, "poll");
    if (rc == 0) continue;  // the deadline check above ends the loop
    ssize_t n = ::recv(fd, out->data() + done, size - done, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n < 0) return Status::FromErrno(errno, "recv");
    if (n == 0) return Status::IOError("truncated request");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

void SendAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the peer went away or stopped reading: nothing to do
    done += static_cast<size_t>(n);
  }
}

void SendError(int fd, int exit_code, const std::string& message) {
  SendAll(fd, EncodeAdminReply(AdminReply::Error(exit_code, message)));
}

}  // namespace

Result<std::unique_ptr<ControlServer>> ControlServer::Start(Pool* pool,
                                                           const ControlConfig& config) {
  struct stat st {};
  if (::lstat(config.socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::Exists(config.socket_path + " exists and is not a socket");
    }
    // Stale: we hold the pool lock, so its daemon is gone.
    if (::unlink(config.socket_path.c_str()) != 0) {
      return Status::FromErrno(errno, "remove stale " + config.socket_path);
    }
  } else if (errno != ENOENT) {
    return Status::FromErrno(errno, config.socket_path);
  }

  SocketAddress address;
  THINFS_RETURN_IF_ERROR(MakeAddress(config.pool_root, config.socket_path, &address));
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  // The socket file takes the socket inode's mode (less the umask) at bind:
  // set it first so that the file is never more open than 0600.
  if (::fchmod(fd, 0600) != 0 ||
      ::bind(fd, reinterpret_cast<const sockaddr*>(&address.addr), sizeof address.addr) != 0 ||
      ::chmod(config.socket_path.c_str(), 0600) != 0 || ::listen(fd, 16) != 0 ||
      ::stat(config.socket_path.c_str(), &st) != 0) {
    Status s = Status::FromErrno(errno, "control socket " + config.socket_path);
    ::close(fd);
    return s;
  }
  std::unique_ptr<ControlServer> server(new ControlServer(pool, config, fd, st.st_dev, st.st_ino));
  server->acceptor_ = std::thread(&ControlServer::AcceptLoop, server.get());
  THINFS_LOG_INFO("control socket %s ready", config.socket_path.c_str());
  return server;
}

ControlServer::ControlServer(Pool* pool, ControlConfig config, int listen_fd, dev_t dev,
                             ino_t ino)
    : pool_(pool),
      config_(std::move(config)),
      listen_fd_(listen_fd),
      socket_dev_(dev),
      socket_ino_(ino) {}

ControlServer::~ControlServer() { Stop(); }

void ControlServer::Stop() {
  {
    MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_.store(true);
  // Wakes accept() (Linux returns EINVAL on a shut-down listening socket).
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();

  std::list<Connection> running;
  {
    MutexLock l(&mu_);
    for (Connection& c : connections_) {
      if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);  // wakes a blocked read or send
    }
    running.splice(running.end(), connections_);
  }
  // Connection threads take mu_ only to close their descriptor.
  for (Connection& c : running) c.thread.join();

  ::close(listen_fd_);
  struct stat st {};
  if (::lstat(config_.socket_path.c_str(), &st) == 0 && st.st_dev == socket_dev_ &&
      st.st_ino == socket_ino_) {
    ::unlink(config_.socket_path.c_str());
  }
  THINFS_LOG_INFO("control socket %s closed", config_.socket_path.c_str());
}

size_t ControlServer::ReapLocked() {
  size_t running = 0;
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->done.load()) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++running;
      ++it;
    }
  }
  return running;
}

void ControlServer::AcceptLoop() {
  pthread_setname_np(pthread_self(), "thinfs-control");
  while (!stopping_.load()) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load()) break;
      int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      THINFS_LOG_WARNING("control socket: accept: %s", strerror(err));
      // Out of descriptors or memory: let connections finish, then retry.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    MutexLock l(&mu_);
    if (stopping_.load()) {
      ::close(fd);
      break;
    }
    if (ReapLocked() >= config_.max_connections) {
      // A full socket buffer must not stall the acceptor.
      std::string reply =
          EncodeAdminReply(AdminReply::Error(kAdminFailure, "daemon busy, try again"));
      (void)::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      continue;
    }
    Connection& c = connections_.emplace_back();
    c.fd = fd;
    c.thread = std::thread(&ControlServer::Serve, this, &c);
  }
}

void ControlServer::Serve(Connection* conn) {
  pthread_setname_np(pthread_self(), "thinfs-ctl-conn");
  const int fd = conn->fd;
  auto finish = [&] {
    {
      MutexLock l(&mu_);
      ::close(conn->fd);
      conn->fd = -1;
    }
    conn->done.store(true);
  };

  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    SendError(fd, kAdminFailure, std::string("SO_PEERCRED: ") + strerror(errno));
    finish();
    return;
  }
  if (cred.uid != 0 && cred.uid != config_.owner_uid) {
    THINFS_LOG_WARNING("control socket: refused uid %u (pid %d)", cred.uid,
                       static_cast<int>(cred.pid));
    SendError(fd, kAdminFailure,
              "permission denied: uid " + std::to_string(cred.uid) +
                  " is neither root nor the owner of pool " + config_.pool_root);
    finish();
    return;
  }
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(config_.read_timeout.count() / 1000 + 1);
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

  const Clock::time_point deadline = Clock::now() + config_.read_timeout;
  std::string header;
  Status s = ReadFull(fd, kAdminFrameHeader, deadline, &header);
  Result<size_t> body_len = s.ok() ? DecodeAdminFrameHeader(header, kAdminMaxRequestFrame)
                                   : Result<size_t>(s);
  std::string body;
  if (body_len.ok()) s = ReadFull(fd, *body_len, deadline, &body);
  if (!body_len.ok() || !s.ok()) {
    const Status& why = body_len.ok() ? s : body_len.status();
    THINFS_LOG_WARNING("control socket: uid %u: %s", cred.uid, why.message().c_str());
    SendError(fd, kAdminUsage, "bad request: " + why.message());
    finish();
    return;
  }
  Result<AdminRequest> request = DecodeAdminRequest(header + body);
  if (!request.ok()) {
    THINFS_LOG_WARNING("control socket: uid %u: malformed request: %s", cred.uid,
                       request.status().message().c_str());
    SendError(fd, kAdminUsage, "malformed request: " + request.status().message());
    finish();
    return;
  }

  AdminContext ctx;
  ctx.pool_root = config_.pool_root;
  ctx.data_path = config_.data_path;
  ctx.mountpoint = config_.mountpoint;
  ctx.create_attrs.uid = cred.uid;
  ctx.create_attrs.gid = cred.gid;
  Pool* pool = pool_;
  ctx.delete_device = [pool](const std::string& name) { return DeleteDeviceServed(pool, name); };
  ctx.resize_device = [pool](VolumeId id, uint64_t size) {
    return ResizeDeviceServed(pool, id, size);
  };
  ctx.entry_changed = [](const std::string& name) { NotifyEntryChanged(name); };
  ctx.inode_changed = [](VolumeId id) { NotifyInodeChanged(id); };
  ctx.fuse_transport = [] { return CurrentFuseTransport(); };
  if (cred.uid == 0 || cred.uid == config_.owner_uid) ctx.checkpoint = config_.checkpoint;
  AdminReply reply = RunAdmin(*pool_, *request, ctx);
  if (reply.exit_code == kAdminOk) {
    THINFS_LOG_INFO("control socket: uid %u: %s", cred.uid, request->command.c_str());
  } else {
    THINFS_LOG_INFO("control socket: uid %u: %s failed: %s", cred.uid, request->command.c_str(),
                    reply.error.c_str());
  }
  SendAll(fd, EncodeAdminReply(reply));
  finish();
}

}  // namespace thinfs::fs
