// End-to-end test helpers: shell commands with a timeout, and a fixture that
// formats a pool in a private temp dir, mounts it through the thinfs binary
// and always cleans up (unmount, kill the daemon, detach loop devices,
// remove the temp dir) in TearDown, even after a failed assertion.
//
// With the CI environment variable set, a missing /dev/fuse (or loop
// device, for tests that ask for one) fails the test instead of skipping it.
//
// Thread safety: a fixture is used by its test's thread only.

#ifndef THINFS_TESTS_UTIL_E2E_UTIL_H_
#define THINFS_TESTS_UTIL_E2E_UTIL_H_

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace thinfs::testing {

struct CommandResult {
  int exit_code = -1;  // 124 on timeout (timeout(1)), 128+N when killed by N
  std::string output;  // stdout and stderr, interleaved
};

// Runs `command` with /bin/sh under timeout(1).
CommandResult RunCommand(const std::string& command,
                         std::chrono::seconds timeout = std::chrono::seconds(120));

// Quotes `s` for /bin/sh.
std::string ShellQuote(const std::string& s);

// True when the CI environment variable is set and not empty.
bool InCi();

// "" when FUSE mounts are possible here, else why not.
std::string FuseUnavailableReason();
// "" when loop devices can be attached, else why not.
std::string LoopUnavailableReason();

// The ctest entries that rerun FUSE suites over FUSE's io_uring transport
// (tests/CMakeLists.txt) set THINFS_TEST_FUSE_IO_URING=1: mounts then ask
// for io_uring=on and the fixtures check that requests went through a ring.
bool FuseIoUringUnderTest();
// Sets /sys/module/fuse/parameters/enable_uring to Y (`on`) or N for new
// mounts; the value it had is put back when the test process exits. "" on
// success, else why not (not root, a kernel before 6.14). Tests that set it
// hold the ctest resource lock fuse_io_uring_knob (tests/test_costs.cmake).
std::string SetFuseIoUring(bool on);
// `options` (mount -o) plus io_uring=on under FuseIoUringUnderTest(),
// unless they choose io_uring= themselves.
std::string WithTransportUnderTest(const std::string& options);
// What a daemon logs when the first request reaches it through a ring.
inline constexpr char kFirstRingRequest[] = "FUSE over io_uring: serving";
// What it logs once the kernel holds every ring thread's entry (fs/uring.h,
// entries_registered()): until then a burst is served by fewer threads.
inline constexpr char kRingsRegistered[] = "FUSE over io_uring: all ";
// From a daemon's log (its last "served ..." line): the requests served
// through io_uring, or -1 if the log has no such line.
long long UringRequestsInLog(const std::string& log);

// The readahead window of the mount on `mountpoint` in KiB, as the kernel
// has it (/sys/class/bdi/MAJ:MIN/read_ahead_kb of its st_dev), or -1 with
// a test failure added when it cannot be read.
int MountReadaheadKib(const std::string& mountpoint);

// PIDs of processes whose command line is `thinfs mount POOL ...`.
std::vector<pid_t> FindMountDaemons(const std::string& pool);

// Mountpoints that start with `prefix`, from /proc/self/mountinfo with its
// escapes decoded (core/mountinfo.h): a path with spaces is found as it is.
std::vector<std::string> MountpointsUnder(const std::string& prefix);

// Whether `path` (as it is, not escaped) is the mountpoint of a fuse.thinfs
// file system.
bool IsThinfsMounted(const std::string& path);

// The path of the thinfs binary under test: the one registered by
// SetThinfsBinary (the test binaries' THINFS_BINARY, see below), else the
// THINFS_BINARY environment variable, else "thinfs".
std::string ThinfsBinary();
void SetThinfsBinary(const std::string& path);

#ifdef THINFS_BINARY
// Test binaries are compiled with THINFS_BINARY (tests/CMakeLists.txt);
// this helper library is not, so each including test registers it.
inline const bool kThinfsBinaryRegistered = (SetThinfsBinary(THINFS_BINARY), true);
#endif

class E2eTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Skips (or fails, under CI) unless loop devices work. Call at the start
  // of a test that attaches one.
  void RequireLoopDevices();

  // `thinfs format POOL --size SIZE [--block-size B]`; ASSERTs success.
  void FormatPool(const std::string& size, const std::string& block_size = "");

  // Mounts pool_ on mnt_ with `thinfs mount -f` in a child process whose
  // output goes to log_path(), and waits (up to `timeout`) until the mount
  // is usable. Returns "" on success, else the reason with the log.
  std::string MountForeground(const std::string& options = "",
                              std::chrono::seconds timeout = std::chrono::seconds(30));
  // `thinfs mount POOL MNT [-o OPTIONS]` (daemon mode); returns its result.
  CommandResult MountDaemon(const std::string& options = "");
  // fusermount3 -u, then waits for the daemon to exit. Returns "" on
  // success, else the reason.
  std::string Unmount(std::chrono::seconds timeout = std::chrono::seconds(30));
  // kill -9 of every daemon serving pool_, then fusermount3 -u of the dead
  // mount.
  void KillDaemonHard();

  // losetup over `file`; the device is detached in TearDown.
  std::string AttachLoop(const std::string& file, bool direct_io);
  // losetup -d of a device AttachLoop gave (then TearDown leaves it alone);
  // returns "" on success, else losetup's output.
  std::string DetachLoop(const std::string& dev);

  // `thinfs ARGS...` (each argument quoted), stdout and stderr together.
  CommandResult Thinfs(const std::vector<std::string>& args,
                       std::chrono::seconds timeout = std::chrono::seconds(120));

  // statvfs of the mount: used pool blocks and block size.
  uint64_t PoolUsedBlocks();
  uint64_t PoolBlockSize();

  std::string Log() const;  // the foreground daemon's output so far
  std::string log_path() const { return dir_ + "/daemon.log"; }
  std::string Vol(const std::string& name) const { return mnt_ + "/" + name; }

  std::string dir_;   // private temp dir
  std::string pool_;  // dir_/pool
  std::string mnt_;   // dir_/mnt
  pid_t foreground_pid_ = -1;
  std::vector<std::string> loops_;
};

// Deterministic pseudo-random bytes: the same (seed, offset) always gives
// the same byte, so any range can be checked independently.
void FillPattern(uint64_t seed, uint64_t offset, void* buf, size_t size);
std::vector<char> Pattern(uint64_t seed, uint64_t offset, size_t size);

}  // namespace thinfs::testing

#endif  // THINFS_TESTS_UTIL_E2E_UTIL_H_
