#include "tests/util/e2e_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/mountinfo.h"

namespace thinfs::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> CmdlineOf(const std::string& pid_dir) {
  std::string raw = ReadFile(pid_dir + "/cmdline");
  std::vector<std::string> argv;
  size_t start = 0;
  while (start < raw.size()) {
    size_t nul = raw.find('\0', start);
    if (nul == std::string::npos) nul = raw.size();
    argv.push_back(raw.substr(start, nul - start));
    start = nul + 1;
  }
  return argv;
}

bool ProcessAlive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  // A zombie is dead for our purposes.
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

// Reaps our foreground child if it has exited; returns its wait status.
bool ReapChild(pid_t pid, int* status) {
  pid_t r = waitpid(pid, status, WNOHANG);
  return r == pid;
}

}  // namespace

CommandResult RunCommand(const std::string& command, std::chrono::seconds timeout) {
  std::string full = "timeout -k 5 " + std::to_string(timeout.count()) + " /bin/sh -c " +
                     ShellQuote(command) + " 2>&1 </dev/null";
  CommandResult result;
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) {
    result.output = std::string("popen: ") + strerror(errno);
    return result;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) result.output.append(buf, n);
  int status = pclose(p);
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  return result;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  out += "'";
  return out;
}

bool InCi() {
  const char* ci = getenv("CI");
  return ci != nullptr && ci[0] != '\0';
}

std::string FuseUnavailableReason() {
  int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open /dev/fuse: ") + strerror(errno);
  close(fd);
  if (RunCommand("command -v fusermount3").exit_code != 0) return "fusermount3 is not installed";
  return "";
}

bool FuseIoUringUnderTest() {
  const char* v = getenv("THINFS_TEST_FUSE_IO_URING");
  return v != nullptr && std::string(v) == "1";
}

namespace {

constexpr char kEnableUring[] = "/sys/module/fuse/parameters/enable_uring";

// Puts the knob back as it was when the process exits.
class UringKnob {
 public:
  std::string Set(bool on) {
    const std::string want = on ? "Y" : "N";
    std::lock_guard<std::mutex> l(mu_);
    std::ifstream in(kEnableUring);
    if (!in) return std::string("no ") + kEnableUring + " (FUSE over io_uring needs Linux 6.14)";
    std::string value;
    std::getline(in, value);
    if (!saved_) {
      original_ = value;
      saved_ = true;
    }
    if (value == want) return "";
    std::ofstream out(kEnableUring);
    out << want << "\n";
    out.flush();
    if (!out) return std::string("cannot write ") + kEnableUring + ": " + strerror(errno);
    return "";
  }
  ~UringKnob() {
    if (saved_) {
      std::ofstream out(kEnableUring);
      out << original_ << "\n";
    }
  }

 private:
  std::mutex mu_;
  bool saved_ = false;
  std::string original_;
};

}  // namespace

std::string SetFuseIoUring(bool on) {
  static UringKnob knob;
  return knob.Set(on);
}

std::string WithTransportUnderTest(const std::string& options) {
  if (!FuseIoUringUnderTest() || options.find("io_uring=") != std::string::npos) return options;
  return options.empty() ? "io_uring=on" : options + ",io_uring=on";
}

long long UringRequestsInLog(const std::string& log) {
  const std::string marker = " requests through io_uring)";
  size_t end = log.rfind(marker);
  if (end == std::string::npos) return -1;
  size_t start = log.rfind('(', end);
  if (start == std::string::npos) return -1;
  return std::atoll(log.substr(start + 1, end - start - 1).c_str());
}

int MountReadaheadKib(const std::string& mountpoint) {
  struct stat st {};
  if (stat(mountpoint.c_str(), &st) != 0) {
    ADD_FAILURE() << mountpoint << ": " << strerror(errno);
    return -1;
  }
  const std::string path = "/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" +
                           std::to_string(minor(st.st_dev)) + "/read_ahead_kb";
  std::ifstream in(path);
  int kib = -1;
  if (!(in >> kib)) ADD_FAILURE() << "cannot read " << path;
  return kib;
}

std::string LoopUnavailableReason() {
  if (access("/dev/loop-control", R_OK | W_OK) != 0) {
    return std::string("cannot use /dev/loop-control: ") + strerror(errno);
  }
  CommandResult r = RunCommand("losetup -f");
  if (r.exit_code != 0) return "losetup -f failed: " + r.output;
  return "";
}

std::vector<pid_t> FindMountDaemons(const std::string& pool) {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::vector<std::string> argv = CmdlineOf(std::string("/proc/") + e->d_name);
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == "mount" && argv[i + 1] == pool && ProcessAlive(static_cast<pid_t>(pid))) {
        pids.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  closedir(proc);
  return pids;
}

std::vector<std::string> MountpointsUnder(const std::string& prefix) {
  std::vector<std::string> out;
  Result<std::vector<MountInfoEntry>> mounts = ReadMountInfo();
  if (!mounts.ok()) return out;
  for (const MountInfoEntry& m : *mounts) {
    if (m.mountpoint.starts_with(prefix)) out.push_back(m.mountpoint);
  }
  return out;
}

bool IsThinfsMounted(const std::string& path) {
  Result<std::vector<MountInfoEntry>> mounts = ReadMountInfo();
  if (!mounts.ok()) return false;
  for (const MountInfoEntry& m : *mounts) {
    if (m.mountpoint == path && m.fstype == kThinfsFsType) return true;
  }
  return false;
}

std::string& RegisteredBinary() {
  static std::string path;
  return path;
}

std::string ThinfsBinary() {
  if (!RegisteredBinary().empty()) return RegisteredBinary();
  const char* env = getenv("THINFS_BINARY");
  return env != nullptr && env[0] != '\0' ? env : "thinfs";
}

void SetThinfsBinary(const std::string& path) { RegisteredBinary() = path; }

void FillPattern(uint64_t seed, uint64_t offset, void* buf, size_t size) {
  auto* out = static_cast<unsigned char*>(buf);
  for (size_t i = 0; i < size; ++i) {
    uint64_t pos = offset + i;
    uint64_t word = SplitMix64(seed * 0x100000001b3ULL ^ (pos >> 3));
    out[i] = static_cast<unsigned char>(word >> ((pos & 7) * 8));
  }
}

std::vector<char> Pattern(uint64_t seed, uint64_t offset, size_t size) {
  std::vector<char> v(size);
  FillPattern(seed, offset, v.data(), size);
  return v;
}

void E2eTest::SetUp() {
  std::string why = FuseUnavailableReason();
  if (!why.empty()) {
    if (InCi()) FAIL() << "FUSE is required under CI: " << why;
    GTEST_SKIP() << "FUSE unavailable: " << why;
  }
  if (FuseIoUringUnderTest()) {
    why = SetFuseIoUring(true);
    if (!why.empty()) {
      if (InCi()) FAIL() << "FUSE over io_uring is required by this run under CI: " << why;
      GTEST_SKIP() << "FUSE over io_uring unavailable: " << why;
    }
  }
  char tmpl[] = "/tmp/thinfs-e2e-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr) << strerror(errno);
  dir_ = tmpl;
  pool_ = dir_ + "/pool";
  mnt_ = dir_ + "/mnt";
  ASSERT_EQ(mkdir(mnt_.c_str(), 0755), 0) << strerror(errno);
}

void E2eTest::TearDown() {
  if (dir_.empty()) return;
  // File systems a test mounted from loop devices (under dir_) go first.
  for (const std::string& inner : MountpointsUnder(dir_ + "/")) {
    if (inner == mnt_) continue;
    // A test that failed between fsfreeze -f and -u must not leave the
    // file system frozen (umount -l of a frozen fs never finishes).
    RunCommand("fsfreeze -u " + ShellQuote(inner) + " 2>/dev/null", std::chrono::seconds(30));
    RunCommand("umount -l " + ShellQuote(inner), std::chrono::seconds(30));
  }
  // Loop devices keep files in the mount busy: detach them next.
  for (const std::string& loop : loops_) {
    CommandResult r = RunCommand("losetup -d " + ShellQuote(loop), std::chrono::seconds(30));
    if (r.exit_code != 0) ADD_FAILURE() << "losetup -d " << loop << ": " << r.output;
  }
  loops_.clear();
  if (IsThinfsMounted(mnt_)) {
    CommandResult r = RunCommand("fusermount3 -u " + ShellQuote(mnt_), std::chrono::seconds(30));
    if (r.exit_code != 0) {
      RunCommand("fusermount3 -u -z " + ShellQuote(mnt_), std::chrono::seconds(30));
    }
  }
  // The daemon exits once unmounted; give it a moment, then insist.
  auto deadline = steady_clock::now() + std::chrono::seconds(10);
  while (!FindMountDaemons(pool_).empty() && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  for (pid_t pid : FindMountDaemons(pool_)) kill(pid, SIGKILL);
  if (foreground_pid_ > 0) {
    int status = 0;
    waitpid(foreground_pid_, &status, 0);
    foreground_pid_ = -1;
  }
  // A killed daemon leaves a dead mount behind.
  if (IsThinfsMounted(mnt_)) {
    RunCommand("fusermount3 -u -z " + ShellQuote(mnt_), std::chrono::seconds(30));
  }
  if (HasFailure()) {
    std::string log = Log();
    if (!log.empty()) fprintf(stderr, "--- daemon log (%s) ---\n%s\n", dir_.c_str(), log.c_str());
  }
  RunCommand("rm -rf " + ShellQuote(dir_), std::chrono::seconds(60));
}

void E2eTest::RequireLoopDevices() {
  std::string why = LoopUnavailableReason();
  if (why.empty()) return;
  if (InCi()) FAIL() << "loop devices are required under CI: " << why;
  GTEST_SKIP() << "loop devices unavailable: " << why;
}

void E2eTest::FormatPool(const std::string& size, const std::string& block_size) {
  std::string cmd =
      ShellQuote(ThinfsBinary()) + " format " + ShellQuote(pool_) + " --size " + ShellQuote(size);
  if (!block_size.empty()) cmd += " --block-size " + ShellQuote(block_size);
  CommandResult r = RunCommand(cmd);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
}

std::string E2eTest::MountForeground(const std::string& options, std::chrono::seconds timeout) {
  if (foreground_pid_ > 0) return "a foreground daemon is already running";
  int log_fd = open(log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return std::string("open log: ") + strerror(errno);
  // The log holds every mount of the test: this one's lines come after.
  const size_t log_start = Log().size();
  std::string binary = ThinfsBinary();
  std::vector<std::string> args = {binary, "mount", pool_, mnt_, "-f"};
  std::string all_options = WithTransportUnderTest(options);
  if (!all_options.empty()) {
    args.push_back("-o");
    args.push_back(all_options);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return std::string("fork: ") + strerror(errno);
  }
  if (pid == 0) {
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(log_fd);
  foreground_pid_ = pid;
  auto deadline = steady_clock::now() + timeout;
  while (steady_clock::now() < deadline) {
    int status = 0;
    if (ReapChild(pid, &status)) {
      foreground_pid_ = -1;
      return "the daemon exited (status " + std::to_string(status) + ") before mounting:\n" + Log();
    }
    if (IsThinfsMounted(mnt_)) {
      // stat waits for the kernel's INIT to be answered.
      struct stat st {};
      if (stat(mnt_.c_str(), &st) != 0) return std::string("stat mount: ") + strerror(errno);
      const bool rings = all_options.find("io_uring=on") != std::string::npos ||
                         (FuseIoUringUnderTest() &&
                          all_options.find("io_uring=off") == std::string::npos);
      if (rings) {
        // The rings register just after INIT; until then requests take
        // /dev/fuse. statfs always reaches the daemon. Tests that count
        // requests served at once need every entry in: `thinfs mount` in
        // the background returns only then (fs/uring.h, OnSettled), but a
        // daemon in the foreground is mounted at INIT, so this waits.
        for (;;) {
          const std::string log = Log();
          const bool served = log.find(kFirstRingRequest, log_start) != std::string::npos;
          if (served && log.find(kRingsRegistered, log_start) != std::string::npos) break;
          if (steady_clock::now() >= deadline) {
            return std::string(served ? "not every ring entry registered"
                                      : "no request through io_uring") +
                   " after " + std::to_string(timeout.count()) + "s:\n" + log;
          }
          struct statvfs sv {};
          statvfs(mnt_.c_str(), &sv);
          std::this_thread::sleep_for(milliseconds(5));
        }
      }
      return "";
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  return "no mount after " + std::to_string(timeout.count()) + "s:\n" + Log();
}

CommandResult E2eTest::MountDaemon(const std::string& options) {
  std::string cmd = ShellQuote(ThinfsBinary()) + " mount " + ShellQuote(pool_) + " " +
                    ShellQuote(mnt_);
  std::string all_options = WithTransportUnderTest(options);
  if (!all_options.empty()) cmd += " -o " + ShellQuote(all_options);
  return RunCommand(cmd, std::chrono::seconds(60));
}

std::string E2eTest::Unmount(std::chrono::seconds timeout) {
  CommandResult r = RunCommand("fusermount3 -u " + ShellQuote(mnt_), timeout);
  if (r.exit_code != 0) return "fusermount3 -u: " + r.output;
  auto deadline = steady_clock::now() + timeout;
  if (foreground_pid_ > 0) {
    while (steady_clock::now() < deadline) {
      int status = 0;
      if (ReapChild(foreground_pid_, &status)) {
        foreground_pid_ = -1;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          return "daemon ended with status " + std::to_string(status) + ":\n" + Log();
        }
        return "";
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return "daemon still running " + std::to_string(timeout.count()) + "s after unmount";
  }
  while (steady_clock::now() < deadline) {
    if (FindMountDaemons(pool_).empty()) return "";
    std::this_thread::sleep_for(milliseconds(20));
  }
  return "daemon still running " + std::to_string(timeout.count()) + "s after unmount";
}

void E2eTest::KillDaemonHard() {
  for (pid_t pid : FindMountDaemons(pool_)) kill(pid, SIGKILL);
  if (foreground_pid_ > 0) {
    int status = 0;
    waitpid(foreground_pid_, &status, 0);
    foreground_pid_ = -1;
  }
  auto deadline = steady_clock::now() + std::chrono::seconds(10);
  while (!FindMountDaemons(pool_).empty() && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  CommandResult r = RunCommand("fusermount3 -u " + ShellQuote(mnt_), std::chrono::seconds(30));
  if (r.exit_code != 0) RunCommand("fusermount3 -u -z " + ShellQuote(mnt_));
}

std::string E2eTest::AttachLoop(const std::string& file, bool direct_io) {
  std::string cmd = std::string("losetup -f --show ") + (direct_io ? "--direct-io=on " : "") +
                    ShellQuote(file);
  CommandResult r = RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  if (r.exit_code != 0) return "";
  std::string dev = r.output.substr(0, r.output.find('\n'));
  loops_.push_back(dev);
  return dev;
}

std::string E2eTest::DetachLoop(const std::string& dev) {
  CommandResult r = RunCommand("losetup -d " + ShellQuote(dev), std::chrono::seconds(30));
  if (r.exit_code != 0) return "losetup -d " + dev + ": " + r.output;
  std::erase(loops_, dev);
  return "";
}

CommandResult E2eTest::Thinfs(const std::vector<std::string>& args, std::chrono::seconds timeout) {
  std::string cmd = ShellQuote(ThinfsBinary());
  for (const std::string& a : args) cmd += " " + ShellQuote(a);
  return RunCommand(cmd, timeout);
}

uint64_t E2eTest::PoolUsedBlocks() {
  struct statvfs st {};
  EXPECT_EQ(statvfs(mnt_.c_str(), &st), 0) << strerror(errno);
  return st.f_blocks - st.f_bfree;
}

uint64_t E2eTest::PoolBlockSize() {
  struct statvfs st {};
  EXPECT_EQ(statvfs(mnt_.c_str(), &st), 0) << strerror(errno);
  return st.f_frsize;
}

std::string E2eTest::Log() const { return ReadFile(log_path()); }

}  // namespace thinfs::testing
