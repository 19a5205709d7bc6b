// RunMount: opens the pool (the only fs/ file that uses meta/) and serves it.

#include <pthread.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/mountinfo.h"
#include "core/pool.h"
#include "fs/control.h"
#include "fs/cpu_latency.h"
#include "fs/daemon.h"
#include "fs/log.h"
#include "fs/mount.h"
#include "fs/server.h"
#include "meta/pool_dir.h"

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#endif

namespace thinfs::fs {
namespace {

Result<std::string> RealPath(const std::string& path, const char* what) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) {
    return Status::FromErrno(errno, std::string(what) + " " + path);
  }
  return std::string(buf);
}

// Where the data lives: the symlink target for `format --data`, else the
// pool's own file.
std::string DataPathOf(const std::string& data) {
  char buf[PATH_MAX];
  ssize_t n = readlink(data.c_str(), buf, sizeof buf);
  if (n > 0 && static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  return data;
}

// A daemon serving a loop device must not be throttled or recursed into by
// page reclaim that waits on the loop device itself (see prctl(2)).
void BecomeIoFlusher() {
  if (prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) == 0) return;
  int err = errno;
  THINFS_LOG_INFO("PR_SET_IO_FLUSHER not set (%s): a loop device over this mount may stall "
                  "under memory pressure",
                  strerror(err));
}

// Runs `cmd POOL` with the pool's space in its environment, LVM-autoextend
// style. The engine calls this on an I/O thread, so the spawn and the wait
// happen on a detached thread; posix_spawn because the daemon is
// multi-threaded (nothing but exec runs in the child).
void RunLowWaterCommand(const std::string& cmd, const std::string& pool_root, const PoolStats& s) {
  std::thread([cmd, pool_root, s] {
    pthread_setname_np(pthread_self(), "thinfs-lowwater");
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "THINFS_", 7) != 0) env_strings.emplace_back(*e);
    }
    env_strings.push_back("THINFS_POOL=" + pool_root);
    env_strings.push_back("THINFS_FREE_BLOCKS=" + std::to_string(s.free_blocks));
    env_strings.push_back("THINFS_DATA_BLOCKS=" + std::to_string(s.data_blocks));
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string arg0 = cmd;
    std::string arg1 = pool_root;
    char* argv[] = {arg0.data(), arg1.data(), nullptr};
    pid_t pid = 0;
    int err = posix_spawn(&pid, cmd.c_str(), nullptr, nullptr, argv, envp.data());
    if (err != 0) {
      THINFS_LOG_ERROR("low_water_cmd %s: %s", cmd.c_str(), strerror(err));
      return;
    }
    THINFS_LOG_INFO("low_water_cmd %s started (pid %d)", cmd.c_str(), static_cast<int>(pid));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      THINFS_LOG_WARNING("low_water_cmd %s failed (wait status %d)", cmd.c_str(), status);
    }
  }).detach();
}

// Why a pool could not be opened, and, when the pool is damaged, what to
// run about it.
std::string CannotOpen(const std::string& pool_root, const Status& s) {
  std::string why = "cannot open pool " + pool_root + ": " + s.ToString();
  if (s.IsCorruption()) {
    why += "\nThe pool is damaged; nothing was mounted. Run 'thinfs check " + pool_root +
           "' to see the damage and 'thinfs check --repair " + pool_root +
           "' to fix what can be fixed.";
  }
  return why;
}

// Opens the pool and serves it; reports through `startup`. Returns the exit
// code of the serving process.
int OpenAndServe(const MountOptions& options, const std::string& pool_root,
                 const std::string& mountpoint, Startup& startup) {
  BecomeIoFlusher();

  meta::OpenOptions open_options;
  open_options.read_only = options.read_only;
  open_options.direct_io = options.direct_io;
  open_options.mapped_reads = options.mapped_reads;
  open_options.read_around_bytes = options.read_around_bytes;
  open_options.reflink = options.reflink;
  open_options.block_cache_bytes = options.block_cache_bytes;
  // PoolFiles keeps the pool lock: it lives until the pool is closed.
  Result<meta::PoolFiles> files = meta::OpenPoolFiles(pool_root, open_options);
  if (!files.ok()) {
    startup.ReportFailure(CannotOpen(pool_root, files.status()));
    return 1;
  }

  // The store stays alive inside the Pool until Close(); the control
  // socket's checkpoint uses it through this pointer while serving.
  meta::RocksDbStore* store = files->store.get();
  PoolOptions pool_options;
  pool_options.commit_interval = options.commit_interval;
  pool_options.sync_overwrites = options.sync_overwrites;
  pool_options.zero_detection = options.zero_detection;
  pool_options.map_cache_bytes = options.map_cache_bytes;
  pool_options.deferred_copy_bytes = options.deferred_copy_bytes;
  pool_options.background_copies = options.background_copies;
  pool_options.log = [](int level, const std::string& message) {
    LogLevel l = level <= 0 ? LogLevel::kError : level == 1 ? LogLevel::kWarning : LogLevel::kInfo;
    Log(l, "%s", message.c_str());
  };
  pool_options.read_only = options.read_only;
  pool_options.no_space_timeout = options.no_space_timeout;
  const uint64_t data_blocks = files->superblock.data_blocks;
  if (options.low_water_percent != 0) {
    pool_options.low_water_blocks = data_blocks * options.low_water_percent / 100;
  } else {
    pool_options.low_water_blocks = options.low_water_bytes / files->superblock.block_size;
  }
  // A mark of 0 blocks (a size below one block) would be "off": keep it on.
  if ((options.low_water_percent != 0 || options.low_water_bytes != 0) &&
      pool_options.low_water_blocks == 0) {
    pool_options.low_water_blocks = 1;
  }
  if (!options.low_water_cmd.empty()) {
    pool_options.on_low_water = [cmd = options.low_water_cmd, pool_root](const PoolStats& s) {
      RunLowWaterCommand(cmd, pool_root, s);
    };
  }
  Result<std::unique_ptr<Pool>> pool =
      Pool::Open(std::move(files->data), std::move(files->bitmap), std::move(files->store),
                 pool_options);
  if (!pool.ok()) {
    startup.ReportFailure(CannotOpen(pool_root, pool.status()));
    return 1;
  }

  struct stat root_st {};
  if (stat(pool_root.c_str(), &root_st) != 0) {
    startup.ReportFailure("pool " + pool_root + ": " + strerror(errno));
    Status s = (*pool)->Close();
    (void)s;
    return 1;
  }
  ServeConfig config;
  config.fsname = ThinfsMountSource(pool_root);
  config.mountpoint = mountpoint;
  config.read_only = options.read_only;
  config.allow_other = options.allow_other;
  config.writeback_cache = options.writeback_cache;
  config.page_cache = options.page_cache;
  config.direct_reads = options.direct_reads;
  config.direct_writes = options.direct_writes;
  config.readahead_bytes = options.readahead_bytes;
  config.max_threads = options.threads;
  config.uring_threads = options.uring_threads;
  config.io_uring = options.io_uring;
  config.max_idle_threads = options.threads;
  config.root_uid = root_st.st_uid;
  config.root_gid = root_st.st_gid;
  config.root_mtime_ns = int64_t{root_st.st_mtim.tv_sec} * 1'000'000'000 + root_st.st_mtim.tv_nsec;
  config.root_ctime_ns = int64_t{root_st.st_ctim.tv_sec} * 1'000'000'000 + root_st.st_ctim.tv_nsec;

  // Closed after Serve: the ring threads and workers that touch it are gone.
  std::unique_ptr<CpuLatencyHold> cpu_latency;
  if (options.cpu_latency_us) {
    Result<std::unique_ptr<CpuLatencyHold>> hold = CpuLatencyHold::Open(*options.cpu_latency_us);
    if (!hold.ok()) {
      startup.ReportFailure(hold.status().ToString() + " (the option needs write access to " +
                            CpuLatencyHold::kDevice + ", as root)");
      Status s = (*pool)->Close();
      (void)s;
      return 1;
    }
    cpu_latency = std::move(*hold);
    config.cpu_latency = cpu_latency.get();
    THINFS_LOG_INFO("cpu_latency: CPU wake-up latency held to %u µs while requests arrive",
                    cpu_latency->usec());
  }

  // The control socket lets the CLI manage the pool the daemon now owns.
  // It starts before the mount (requests that arrive early change the pool;
  // the mount shows the result when it appears) and stops before the close.
  ControlConfig control;
  control.pool_root = pool_root;
  control.socket_path = files->paths.control_socket;
  control.checkpoint = [store](const std::string& dir) -> Status {
    Result<std::string> r = store->CheckpointTo(dir);
    return r.ok() ? Status::Ok() : r.status();
  };
  control.mountpoint = mountpoint;
  control.data_path = DataPathOf(files->paths.data);
  control.owner_uid = root_st.st_uid;
  Result<std::unique_ptr<ControlServer>> control_server = ControlServer::Start(pool->get(), control);
  if (!control_server.ok()) {
    startup.ReportFailure("pool " + pool_root + ": " + control_server.status().ToString());
    Status s = (*pool)->Close();
    (void)s;
    return 1;
  }

  Status served = Serve(pool->get(), config, [&startup] { startup.ReportReady(); });
  (*control_server)->Stop();
  if (cpu_latency) {
    THINFS_LOG_INFO("cpu_latency: held %u µs %llu times, %.1f s in all", cpu_latency->usec(),
                    static_cast<unsigned long long>(cpu_latency->times_set()),
                    std::chrono::duration<double>(cpu_latency->time_held()).count());
    cpu_latency.reset();
  }
  bool was_ready = startup.reported();
  if (!served.ok() && !was_ready) {
    startup.ReportFailure(served.ToString());
  } else if (!served.ok()) {
    THINFS_LOG_ERROR("%s", served.ToString().c_str());
  } else if (!was_ready) {
    startup.ReportFailure("the mount on " + mountpoint + " ended before the kernel initialised it");
  }
  Status closed = (*pool)->Close();
  if (!closed.ok()) {
    THINFS_LOG_ERROR("closing pool %s: %s", pool_root.c_str(), closed.ToString().c_str());
    return 2;
  }
  THINFS_LOG_INFO("pool %s closed cleanly", pool_root.c_str());
  if (!was_ready) return 1;
  return served.ok() ? 0 : 2;
}

}  // namespace

int RunMount(const MountOptions& options) {
  SetLogSink(LogSink::kStderr);
  Result<LogLevel> level = ParseLogLevel(options.log_level);
  if (!level.ok()) {
    fprintf(stderr, "thinfs: mount: %s\n", level.status().ToString().c_str());
    return 1;
  }
  SetLogLevel(*level);

  // Checked before forking so that the user sees the error directly.
  Status mp = CheckMountpoint(options.mountpoint);
  if (!mp.ok()) {
    fprintf(stderr, "thinfs: mount: %s\n", mp.message().c_str());
    return 1;
  }
  if (options.io_uring == UringMode::kOn) {
    std::string why = UringUnavailableReason();
    if (!why.empty()) {
      fprintf(stderr, "thinfs: mount: io_uring=on, but %s\n", why.c_str());
      return 1;
    }
  }
  Result<std::string> mountpoint = RealPath(options.mountpoint, "mountpoint");
  Result<std::string> pool_root = RealPath(options.pool, "pool");
  for (const Status& s : {mountpoint.status(), pool_root.status()}) {
    if (!s.ok()) {
      fprintf(stderr, "thinfs: mount: %s\n", s.message().c_str());
      return 1;
    }
  }

  if (options.foreground) {
    Startup startup = Startup::Foreground();
    return OpenAndServe(options, *pool_root, *mountpoint, startup);
  }
  // Fork before the pool starts threads or takes its lock: both belong to
  // the daemon.
  int exit_code = 0;
  std::optional<Startup> startup = Startup::Daemonize(&exit_code);
  if (!startup) return exit_code;
  return OpenAndServe(options, *pool_root, *mountpoint, *startup);
}

}  // namespace thinfs::fs
