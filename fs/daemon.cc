#include "fs/daemon.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "fs/log.h"

namespace thinfs::fs {
namespace {

// The child writes one of these, then (on failure) the message.
constexpr char kReadyByte = 'R';
constexpr char kFailureByte = 'F';

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[512];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "ended abnormally";
}

}  // namespace

Status CheckMountpoint(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound("mountpoint " + path + " does not exist");
    return Status::FromErrno(err, "mountpoint " + path);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("mountpoint " + path + " is not a directory");
  }
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return Status::FromErrno(errno, "mountpoint " + path);
  bool empty = true;
  errno = 0;
  while (dirent* e = readdir(dir)) {
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  int err = errno;
  closedir(dir);
  if (empty && err != 0) return Status::FromErrno(err, "reading mountpoint " + path);
  if (!empty) {
    return Status::NotEmpty("mountpoint " + path +
                            " is not empty (thinfs mounts only on an empty directory)");
  }
  return Status::Ok();
}

Startup Startup::Foreground() { return Startup(-1); }

std::optional<Startup> Startup::Daemonize(int* exit_code) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    fprintf(stderr, "thinfs: mount: pipe: %s\n", strerror(errno));
    *exit_code = 1;
    return std::nullopt;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "thinfs: mount: fork: %s\n", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    *exit_code = 1;
    return std::nullopt;
  }
  if (pid > 0) {
    // Parent: the child keeps the write end until it reports (or dies).
    close(fds[1]);
    std::string report = ReadAll(fds[0]);
    close(fds[0]);
    if (!report.empty() && report[0] == kReadyByte) {
      *exit_code = 0;
      return std::nullopt;
    }
    if (!report.empty() && report[0] == kFailureByte) {
      fprintf(stderr, "thinfs: mount: %s\n", report.substr(1).c_str());
      int status = 0;
      // The child exits right after reporting.
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      *exit_code = 1;
      return std::nullopt;
    }
    int status = 0;
    std::string how = "ended without a report";
    while (true) {
      pid_t r = waitpid(pid, &status, 0);
      if (r == pid) {
        how = DescribeWaitStatus(status);
        break;
      }
      if (r < 0 && errno != EINTR) break;
    }
    fprintf(stderr, "thinfs: mount: the daemon %s before the mount was ready%s\n", how.c_str(),
            " (see syslog, or run with -f)");
    *exit_code = 1;
    return std::nullopt;
  }
  // Child.
  close(fds[0]);
  if (setsid() < 0) THINFS_LOG_WARNING("setsid: %s", strerror(errno));
  if (chdir("/") != 0) THINFS_LOG_WARNING("chdir /: %s", strerror(errno));
  SetLogSink(LogSink::kSyslog);
  return Startup(fds[1]);
}

Startup::Startup(Startup&& other) noexcept
    : fd_(other.fd_), detached_(other.detached_), reported_(other.reported_) {
  other.fd_ = -1;
}

Startup::~Startup() {
  if (fd_ >= 0) close(fd_);
}

void Startup::ReportReady() {
  if (reported_) return;
  reported_ = true;
  if (fd_ < 0) return;
  if (!WriteAll(fd_, &kReadyByte, 1)) {
    THINFS_LOG_WARNING("cannot report readiness to the parent: %s", strerror(errno));
  }
  close(fd_);
  fd_ = -1;
  // A daemon keeps no terminal: stdio goes to /dev/null (logs go to syslog).
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    dup2(null_fd, STDIN_FILENO);
    dup2(null_fd, STDOUT_FILENO);
    dup2(null_fd, STDERR_FILENO);
    close(null_fd);
  }
}

void Startup::ReportFailure(const std::string& message) {
  if (reported_) {
    THINFS_LOG_ERROR("%s", message.c_str());
    return;
  }
  reported_ = true;
  if (fd_ < 0) {
    fprintf(stderr, "thinfs: mount: %s\n", message.c_str());
    return;
  }
  THINFS_LOG_ERROR("%s", message.c_str());
  std::string report = kFailureByte + message;
  if (!WriteAll(fd_, report.data(), report.size())) {
    THINFS_LOG_WARNING("cannot report the failure to the parent: %s", strerror(errno));
  }
  close(fd_);
  fd_ = -1;
}

}  // namespace thinfs::fs
