// The FUSE low-level adapter: one regular file per visible thin device in a
// single root directory.
//
// Inode numbers are stable and need no table: the root is 1 and a device's
// inode is its VolumeId + 1 (ids are never reused), generation 0. Every
// callback is noexcept, replies exactly once and converts Status with
// ToErrno(). No lock is held across a fuse_reply_*.
//
// Thread safety: Serve() runs libfuse's multi-threaded loop; the callbacks
// run concurrently on its workers. NotifyEntryChanged/NotifyInodeChanged
// (fs/mount.h, implemented here) may be called from any thread.

#ifndef THINFS_FS_SERVER_H_
#define THINFS_FS_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "core/pool.h"
#include "core/status.h"
#include "core/types.h"
#include "fs/cpu_latency.h"
#include "fs/uring.h"

namespace thinfs::fs {

// Requests served, by kind: logged when the loop ends, and read by tests
// (e.g. that a write(2) costs one request, not a write plus a getxattr).
struct RequestCounts {
  std::atomic<uint64_t> read{0};
  std::atomic<uint64_t> write{0};
  std::atomic<uint64_t> getattr{0};
  std::atomic<uint64_t> xattr{0};  // get/set/list/removexattr
  // Ranges of cached pages the daemon told the kernel to drop, because a
  // change bypassed them (a direct-I/O write, fallocate, copy_file_range).
  std::atomic<uint64_t> invalidations{0};
  // Not a request count: the device files open now (opens and creates not
  // yet released). close(2) returns before the kernel's RELEASE reaches the
  // daemon, so a test that needs the daemon to have seen a close waits on it.
  std::atomic<int64_t> open_files{0};
  // Requests that came through FUSE over io_uring (fs/uring.h), of all kinds.
  std::atomic<uint64_t> uring{0};
};

struct ServeConfig {
  std::string fsname;      // "thinfs:/abs/pool" (shown by mount and df)
  std::string mountpoint;  // absolute
  bool read_only = false;
  bool allow_other = false;
  bool writeback_cache = false;
  // Off: every open of a volume file is answered as an O_DIRECT one
  // (FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES): no kernel page cache.
  bool page_cache = true;
  // A read through a file opened O_DIRECT asks the pool for
  // ReadCache::kReader (mount option direct_reads).
  bool direct_reads = true;
  // A write through a file opened O_DIRECT asks the pool for
  // WriteCache::kWriter (mount option direct_writes).
  bool direct_writes = true;
  // The root directory shows the pool directory's owner and times.
  uid_t root_uid = 0;
  gid_t root_gid = 0;
  int64_t root_mtime_ns = 0;
  int64_t root_ctime_ns = 0;
  // Worker threads libfuse's loop keeps while idle. The daemon keeps all
  // of them (max_threads, as the mount sets it): a worker that ends and is
  // started again at the next burst costs a thread, a /dev/fuse clone and
  // fresh buffers each time; 16 of 32 cost QD32 reads 12% (docs/
  // benchmarks.md, lever 47). Their buffers, about 2 MiB per worker, stay.
  unsigned max_idle_threads = 32;
  // Worker threads at most (libfuse starts them as requests wait; mount
  // option threads=N). Each serves one request at a time, so this bounds
  // the requests served at once: libfuse's default of 10 capped a loop
  // device with direct I/O, which keeps up to max_background (64)
  // asynchronous requests queued. 32 serves a queue depth of 32; 64 was
  // slower on 4-job random read/write (docs/benchmarks.md, lever 8).
  unsigned max_threads = 32;
  // FUSE over io_uring when the kernel offers it (fs/uring.h). The mount
  // checks kOn; here it means the same as kAuto.
  UringMode io_uring = UringMode::kAuto;
  // With io_uring: each CPU's queue gets this many ring threads (at most
  // 256 in all; mount option uring_threads=N). A caller's requests all go
  // to its CPU's queue, so this bounds what one thread has served at once.
  // 32 served a queue depth of 32 from one thread at once, but every
  // request of such a burst then woke its own thread, and 4 KiB reads at
  // depth 32 ran 28-35% slower than with 16 (docs/benchmarks.md, lever 36).
  unsigned uring_threads = 16;
  // The mount's readahead window in bytes (mount option readahead=SIZE):
  // the most the kernel reads ahead of a sequential reader of a volume
  // file, and so the size of its read requests, up to max_write (1 MiB).
  // The kernel's default for a FUSE mount is 128 KiB; a larger window is set
  // at INIT through /sys/class/bdi/MAJ:MIN/read_ahead_kb, which needs root
  // (docs/benchmarks.md, lever 40). 0 leaves the kernel's default.
  uint32_t readahead_bytes = 0;
  // Told of every request, to hold a CPU latency limit while they arrive
  // (mount option cpu_latency=USEC); null: off.
  CpuLatencyHold* cpu_latency = nullptr;
  // Where to count requests; nullptr: the server keeps its own counts.
  RequestCounts* counts = nullptr;
};

// Mounts `pool` on config.mountpoint and serves it until the file system is
// unmounted or the process gets SIGTERM, SIGINT or SIGHUP. `on_ready` runs
// once, on a FUSE worker, when the kernel's INIT has been answered: from
// then on the mount is usable. Does not close the pool.
// Returns kIOError when the session cannot be created or mounted (the
// message carries libfuse's reason), else OK once the loop has ended.
// REQUIRES: the mountpoint is an existing empty directory.
Status Serve(Pool* pool, const ServeConfig& config, std::function<void()> on_ready);

}  // namespace thinfs::fs

#endif  // THINFS_FS_SERVER_H_
