// Mount commands: mount, umount.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "core/mountinfo.h"
#include "fs/mount.h"
#include "meta/pool_dir.h"
#include "tools/cli.h"

namespace thinfs::tools {
namespace {

// The pool lock of the thinfs daemon serving `mountpoint`, opened read-only
// (-1 when `mountpoint` is not a thinfs mount, or its lock is unreadable).
int OpenLockOfMount(const std::string& mountpoint) {
  char real[PATH_MAX];
  if (::realpath(mountpoint.c_str(), real) == nullptr) return -1;
  Result<std::vector<MountInfoEntry>> mounts = ReadMountInfo();
  if (!mounts.ok()) return -1;
  std::optional<std::string> pool = ThinfsPoolOnMountpoint(*mounts, real);
  if (!pool) return -1;
  return ::open(meta::PoolPaths::For(*pool).lock.c_str(), O_RDONLY | O_CLOEXEC);
}

// Waits until the daemon holding `lock_fd`'s lock has let it go: after the
// unmount it still makes its final commit and marks the bitmap clean, and
// the pool is not usable (receive, check, mount) before. Returns false on
// timeout.
bool WaitForDaemonExit(int lock_fd, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool said = false;
  const auto start = std::chrono::steady_clock::now();
  while (::flock(lock_fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return true;  // nothing to wait for
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    if (!said && now - start > std::chrono::seconds(2) && ::isatty(STDERR_FILENO)) {
      std::cerr << "thinfs umount: waiting for the daemon's final commit..." << std::endl;
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::flock(lock_fd, LOCK_UN);
  return true;
}

}  // namespace

int RunMount(const std::vector<std::string>& args) {
  CommandLine cl("mount", "POOL MOUNTPOINT [-f] [-o OPTIONS]",
                 "Serves the pool's devices as sparse files under MOUNTPOINT (an empty\n"
                 "directory) through FUSE. Returns once the mount is usable and keeps\n"
                 "serving as a daemon that logs to syslog; -f stays in the foreground and\n"
                 "logs to stderr. 'thinfs umount MOUNTPOINT', 'fusermount3 -u MOUNTPOINT',\n"
                 "SIGTERM or SIGINT end it cleanly (final commit, clean bitmap).");
  cl.Positional("POOL", "pool directory (see 'thinfs format')");
  cl.Positional("MOUNTPOINT", "empty directory to mount on");
  cl.AddOptions()
      ("foreground,f", po::bool_switch(), "stay in the foreground, log to stderr")
      ("options,o", po::value<std::string>()->value_name("OPTIONS")->default_value(""),
       "comma-separated mount options, listed below");
  cl.SetEpilog(
      "Mount options (-o, comma-separated):\n"
      "  ro | rw                read-only mount (default rw)\n"
      "  allow_other            let other users see the mount\n"
      "  commit_interval=DUR    periodic commit (N, Nms, Ns, Nm; 0 off; default 1s)\n"
      "  sync_overwrites=on|off the periodic commit also syncs data overwritten\n"
      "                         in place (default on; off: only fsync or the\n"
      "                         kernel's writeback makes it durable)\n"
      "  cache_size=SIZE        metadata block cache (default 64M)\n"
      "  map_cache=SIZE         block-map cache in memory (default 16M; 0 off)\n"
      "  deferred_copy=SIZE     copy-on-write copying a partial write may leave\n"
      "                         to the next commit (default 1G; 0 off)\n"
      "  background_copies=on|off  a thread makes those copies before the commit\n"
      "                         (default on; off: the commit makes them all)\n"
      "  zero_detect=on|off     whole-block zero writes unmap (default on)\n"
      "  direct_io=on|off       O_DIRECT on the pool's data file (default off)\n"
      "  direct_reads=on|off    a read of several blocks through a volume file\n"
      "                         opened O_DIRECT (a loop device, qemu's\n"
      "                         cache=none) that the host's cache does not\n"
      "                         hold reads the data file with O_DIRECT\n"
      "                         (default on)\n"
      "  direct_writes=on|off   a stream of writes through a volume file opened\n"
      "                         O_DIRECT goes to the disk at once, its whole\n"
      "                         blocks past the host's cache, as over a raw\n"
      "                         disk, not at the next commit (default on)\n"
      "  mapped_reads=on|off    reads of cached data copied out of a mapping of\n"
      "                         the data file, no system call (default off: the\n"
      "                         first copy of a page costs more than a pread,\n"
      "                         and mapped pages survive drop_caches)\n"
      "  read_around=SIZE       a random read within a block whose data are not\n"
      "                         cached reads the block's SIZE-aligned window into\n"
      "                         the host's cache, for the reads that follow\n"
      "                         (default 64K, at most the block; 0 off)\n"
      "  reflink=on|off         copy-on-write copies as reflinks inside the data\n"
      "                         file where its file system can (default on)\n"
      "  writeback_cache=on|off kernel writeback cache (default off)\n"
      "  page_cache=on|off      the kernel's page cache for volume files (default\n"
      "                         on; off: every open is direct I/O, parallel\n"
      "                         writes, no double caching; MAP_SHARED fails)\n"
      "  readahead=SIZE         the mount's readahead window: how far the kernel\n"
      "                         reads ahead of a sequential reader, and so the\n"
      "                         size of its read requests (a multiple of 4K up\n"
      "                         to 64M; default 1M; 0: the kernel's 128K; set in\n"
      "                         /sys/class/bdi, so root only: else 128K stays)\n"
      "  threads=N              FUSE worker threads at most (1-1024, default 32)\n"
      "  io_uring=auto|on|off   FUSE over io_uring where the kernel offers it (Linux\n"
      "                         6.14+ with /sys/module/fuse/parameters/enable_uring\n"
      "                         set to Y; default auto; on: refuse to mount without)\n"
      "  uring_threads=N        with io_uring, threads per CPU queue (1-1024,\n"
      "                         default 16, at most 256 in all): how many requests\n"
      "                         of one caller are served at once\n"
      "  cpu_latency=off|USEC   while requests arrive (until 50 ms after the\n"
      "                         last), cap the machine's CPU wake-up latency at\n"
      "                         USEC µs (PM QoS); 0 makes idle CPUs poll, which\n"
      "                         halves a FUSE round trip on VMs whose idle vCPUs\n"
      "                         halt, at the cost of CPU time; root only\n"
      "                         (default off)\n"
      "  log_level=error|warning|info|debug\n"
      "  low_water=SIZE|N%      warn once (log, status) when free space falls\n"
      "                         below SIZE or N% of the pool (default off)\n"
      "  low_water_cmd=PATH     then run PATH POOL (not waited for) with\n"
      "                         THINFS_POOL, THINFS_FREE_BLOCKS, THINFS_DATA_BLOCKS\n"
      "                         set, e.g. a script that runs 'thinfs grow'\n"
      "  no_space=error|wait:DUR  pool full: ENOSPC at once (default), or hold\n"
      "                         writes up to DUR (e.g. wait:30s) for a grow\n"
      "\n"
      "Example:\n"
      "  thinfs mount /srv/pool /mnt/vols\n"
      "  truncate -s 20G /mnt/vols/vm1 && losetup -f --show /mnt/vols/vm1\n"
      "  thinfs mount /srv/pool /mnt/vols -o ro,allow_other\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  Result<fs::MountOptions> options = fs::ParseMountOptions(
      cl.Arg(0), cl.Arg(1), cl.Get<std::string>("options"), cl.Get<bool>("foreground"));
  if (!options.ok()) return cl.Fail(kExitUsage, options.status().message());
  int rc = fs::RunMount(*options);
  return rc == 0 ? kExitOk : kExitFailure;
}

int RunUmount(const std::vector<std::string>& args) {
  CommandLine cl("umount", "MOUNTPOINT [--timeout SECONDS]",
                 "Unmounts a thinfs mount; the daemon commits, marks the bitmap clean\n"
                 "and exits. Returns once it has (at most --timeout seconds), so the pool\n"
                 "can be used at once. 'fusermount3 -u MOUNTPOINT' unmounts without\n"
                 "waiting.");
  cl.Positional("MOUNTPOINT", "where the pool is mounted");
  cl.AddOptions()("timeout",
                  po::value<unsigned>()->value_name("SECONDS")->default_value(
                      300),
                  "how long to wait for the daemon to exit after the unmount");
  cl.SetEpilog("Example:\n  thinfs umount /mnt/vols\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  const int lock_fd = OpenLockOfMount(cl.Arg(0));
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{lock_fd};
  pid_t pid = ::fork();
  if (pid < 0) return cl.Fail(kExitFailure, std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::execlp("fusermount3", "fusermount3", "-u", "--", cl.Arg(0).c_str(),
             static_cast<char*>(nullptr));
    std::cerr << "thinfs umount: cannot run fusermount3: " << std::strerror(errno) << "\n";
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return cl.Fail(kExitFailure, "could not unmount " + cl.Arg(0));
  }
  if (lock_fd >= 0 &&
      !WaitForDaemonExit(lock_fd, std::chrono::seconds(cl.Get<unsigned>("timeout")))) {
    return cl.Fail(kExitFailure, "unmounted " + cl.Arg(0) +
                                     ", but the daemon still holds the pool after " +
                                     std::to_string(cl.Get<unsigned>("timeout")) + " s");
  }
  return kExitOk;
}

}  // namespace thinfs::tools
