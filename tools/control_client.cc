#include "tools/control_client.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "meta/pool_paths.h"

namespace thinfs::tools {

namespace {

// Management commands walk block maps (list) and commit; give them time,
// but never hang forever on a wedged daemon.
constexpr int kReplyTimeoutSeconds = 300;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

Status WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "send");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads exactly `size` bytes; kIOError on a short read.
Status ReadExactly(int fd, size_t size, std::string* out) {
  out->resize(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::recv(fd, out->data() + done, size - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Status::IOError("no reply within " + std::to_string(kReplyTimeoutSeconds) + " s");
    }
    if (n < 0) return Status::FromErrno(errno, "recv");
    if (n == 0) return Status::IOError("the daemon closed the connection");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

std::optional<Result<AdminReply>> CallDaemon(const std::string& pool,
                                             const AdminRequest& request) {
  const std::string path = meta::PoolPaths::For(pool).control_socket;
  const std::string where = "control socket " + path;
  Result<std::string> frame = EncodeAdminRequest(request);
  if (!frame.ok()) return Result<AdminReply>(frame.status());

  Fd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) return Result<AdminReply>(Status::FromErrno(errno, "socket"));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // A path too long for sun_path is reached through the pool directory's
  // descriptor (/proc/self/fd/N/control.sock), as the daemon binds it.
  std::string target = path;
  std::optional<Fd> dir;
  if (target.size() >= sizeof addr.sun_path) {
    dir.emplace(::open(meta::PoolPaths::For(pool).root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (dir->get() < 0) {
      if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
      return Result<AdminReply>(Status::FromErrno(errno, "pool " + pool));
    }
    target = "/proc/self/fd/" + std::to_string(dir->get()) + "/control.sock";
  }
  std::memcpy(addr.sun_path, target.c_str(), target.size() + 1);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    // No daemon: the socket is absent, or stale (left by a killed daemon).
    if (err == ENOENT || err == ECONNREFUSED || err == ENOTDIR) return std::nullopt;
    return Result<AdminReply>(Status::FromErrno(err, "connect to the " + where));
  }
  timeval tv{};
  tv.tv_sec = kReplyTimeoutSeconds;
  (void)::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

  Status s = WriteAll(sock.get(), *frame);
  if (!s.ok()) return Result<AdminReply>(Status::IOError(where + ": " + s.message()));
  std::string header;
  s = ReadExactly(sock.get(), kAdminFrameHeader, &header);
  if (!s.ok()) return Result<AdminReply>(Status::IOError(where + ": " + s.message()));
  Result<size_t> body_len = DecodeAdminFrameHeader(header, kAdminMaxReplyFrame);
  if (!body_len.ok()) {
    return Result<AdminReply>(Status::IOError(where + ": " + body_len.status().message()));
  }
  std::string body;
  s = ReadExactly(sock.get(), *body_len, &body);
  if (!s.ok()) return Result<AdminReply>(Status::IOError(where + ": " + s.message()));
  Result<AdminReply> reply = DecodeAdminReply(header + body);
  if (!reply.ok()) {
    return Result<AdminReply>(
        Status::IOError(where + ": malformed reply: " + reply.status().message()));
  }
  return reply;
}

std::optional<Result<std::string>> DaemonMountpoint(const std::string& pool) {
  std::optional<Result<AdminReply>> where = CallDaemon(pool, AdminRequest{"mountpoint", {}});
  if (!where) return std::nullopt;
  if (!where->ok()) return Result<std::string>(where->status());
  if ((*where)->exit_code != kAdminOk) return Result<std::string>(Status::IOError((*where)->error));
  std::string mountpoint = (*where)->text;
  while (!mountpoint.empty() && mountpoint.back() == '\n') mountpoint.pop_back();
  return Result<std::string>(std::move(mountpoint));
}

}  // namespace thinfs::tools
