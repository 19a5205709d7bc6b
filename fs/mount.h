// `thinfs mount`: the entry points the CLI calls, and the hooks the control
// socket (fs/control.h) uses: kernel cache invalidation, delete and resize.
//
// RunMount() mounts POOL on MOUNTPOINT through FUSE (low-level API,
// multi-threaded loop) and serves it until it is unmounted (`fusermount3 -u`,
// `umount`) or the daemon gets SIGTERM/SIGINT/SIGHUP; then it commits and
// closes the pool. Unless `foreground` is set it daemonizes and the calling
// process returns 0 only once the mount is usable, or non-zero after printing
// why the mount failed (busy pool, bad mountpoint, ...).
//
// Thread safety: ParseMountOptions is a pure function. RunMount is called
// once per process. The Notify* functions may be called from any thread while
// RunMount serves a mount (but not from a FUSE callback); they do nothing
// otherwise. So may the *Served functions.

#ifndef THINFS_FS_MOUNT_H_
#define THINFS_FS_MOUNT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/admin.h"
#include "core/pool.h"
#include "core/status.h"
#include "core/types.h"
#include "fs/uring.h"

namespace thinfs::fs {

struct MountOptions {
  std::string pool;
  std::string mountpoint;
  bool foreground = false;
  bool read_only = false;
  bool allow_other = false;
  std::chrono::milliseconds commit_interval{1000};
  // The periodic commit also syncs overwrites in place (PoolOptions).
  bool sync_overwrites = true;
  size_t block_cache_bytes = 64 << 20;
  // Block-map cache in front of RocksDB (core/map_cache.h), bytes; 0 off.
  size_t map_cache_bytes = 16 << 20;
  // Copy-on-write copying owed to the next commit (core/deferred_copy.h),
  // bytes of data blocks; 0 copies at once.
  uint64_t deferred_copy_bytes = PoolOptions().deferred_copy_bytes;
  // Owed copies made by a background thread, not only by the commit.
  bool background_copies = PoolOptions().background_copies;
  bool zero_detection = true;
  bool direct_io = false;  // O_DIRECT on the data file
  // Cached data read out of a mapping of the data file (lever 35).
  bool mapped_reads = false;
  // A read of several blocks through a file opened O_DIRECT, not cached,
  // reads the data file with O_DIRECT (core/pool.h ReadCache, lever 46).
  bool direct_reads = true;
  // A write through a file opened O_DIRECT starts writing its data back at
  // once (core/pool.h WriteCache, lever 51).
  bool direct_writes = true;
  // A random read within one block, not cached, reads this much of the
  // block around it into the host's cache (lever 44); 0 off.
  uint64_t read_around_bytes = 64 << 10;
  // Copy-on-write copies as reflinks inside the data file where its file
  // system can (XFS, btrfs).
  bool reflink = true;
  bool writeback_cache = false;
  // The kernel's page cache for volume files; off: every open is direct I/O
  // (FOPEN_DIRECT_IO, with parallel direct writes), as if opened O_DIRECT.
  bool page_cache = true;
  // The mount's readahead window (ServeConfig::readahead_bytes); 0: the
  // kernel's default (128 KiB).
  uint32_t readahead_bytes = 1 << 20;
  // FUSE worker threads at most: how many requests are served at once.
  unsigned threads = 32;
  // With FUSE over io_uring: ring threads per CPU queue, each serving one
  // request at a time (docs/benchmarks.md, lever 36).
  unsigned uring_threads = 16;
  // FUSE over io_uring (fs/uring.h): auto uses it when the kernel offers
  // it; on also refuses to mount when the kernel's knob is off.
  UringMode io_uring = UringMode::kAuto;
  // While requests arrive, a CPU wake-up latency limit in µs for the whole
  // machine (fs/cpu_latency.h); 0 makes idle CPUs poll. Unset: off.
  std::optional<uint32_t> cpu_latency_us;
  std::string log_level = "info";
  // Low-water mark: an absolute size in bytes, or a percentage of the data
  // area at mount time (at most one is non-zero; both zero: off).
  uint64_t low_water_bytes = 0;
  uint32_t low_water_percent = 0;
  // Run (not waited for) when free space falls below the mark.
  std::string low_water_cmd;
  // How long a write waits for space when the pool is full (0: ENOSPC at once).
  std::chrono::milliseconds no_space_timeout{0};
};

// Builds MountOptions from the CLI's arguments. `dash_o` is the -o string,
// comma separated, e.g. "ro,allow_other,commit_interval=500ms,cache_size=128M,
// zero_detect=off,direct_io=on". Recognised:
//   ro | rw                     read-only mount (default rw)
//   allow_other                 let other users in (default: only the mounter)
//   commit_interval=DUR         periodic commit; DUR is N, Nms, Ns or Nm
//                               (bare N = milliseconds, 0 = off)
//   sync_overwrites=on|off      periodic commit syncs overwrites in place too
//                               (default on; off: they wait for fsync)
//   cache_size=SIZE             metadata block cache; SIZE is N[K|M|G]
//   map_cache=SIZE              block-map cache in memory (default 16M; 0 off)
//   deferred_copy=SIZE          COW copying left to the next commit (1G; 0 off)
//   background_copies=on|off    a thread makes owed copies before the commit (on)
//   zero_detect=on|off          whole-block zero writes unmap (default on)
//   direct_io=on|off            O_DIRECT on the pool's data file (default off)
//   direct_reads=on|off         reads of several blocks through a file
//                               opened O_DIRECT, not cached, read the data
//                               file with O_DIRECT (default on)
//   direct_writes=on|off        streams of writes through a file opened
//                               O_DIRECT go to the disk at once, whole
//                               blocks past the host's cache (default on)
//   read_around=SIZE            a random read within a block, not cached,
//                               reads the block's SIZE-aligned window into
//                               the host's cache (default 64K; 0 off)
//   reflink=on|off              COW copies reflinked in the data file where
//                               its file system can (default on)
//   writeback_cache=on|off      kernel writeback cache (default off)
//   page_cache=on|off           the kernel's page cache for volume files
//                               (default on; off: every open is direct I/O;
//                               not with writeback_cache=on)
//   readahead=SIZE              the mount's readahead window: a multiple of 4K
//                               up to 64M, 0 for the kernel's 128K (default
//                               1M; needs root, else the kernel's stays)
//   threads=N                   FUSE worker threads at most, 1-1024 (default 32)
//   io_uring=auto|on|off        FUSE over io_uring where the kernel offers it
//                               (default auto; on: fail to mount if it does not)
//   uring_threads=N             ring threads per CPU queue with io_uring,
//                               1-1024 (default 16; at most 256 in all)
//   cpu_latency=off|USEC        while requests arrive, hold the machine's CPU
//                               wake-up latency to USEC µs (0: idle CPUs
//                               poll); needs write access to
//                               /dev/cpu_dma_latency (default off)
//   log_level=error|warning|info|debug
//   low_water=SIZE|N%           warn (log, status) when free space falls below
//                               SIZE bytes or N% (1-99) of the data area
//   low_water_cmd=PATH          absolute path of a program run with the pool
//                               directory as argument when that happens, with
//                               THINFS_POOL, THINFS_FREE_BLOCKS and
//                               THINFS_DATA_BLOCKS in its environment
//   no_space=error|wait:DUR     full pool: ENOSPC at once (default), or hold
//                               writes up to DUR for space (grow, deletes)
// Returns kInvalidArgument naming the offending option.
Result<MountOptions> ParseMountOptions(const std::string& pool, const std::string& mountpoint,
                                       const std::string& dash_o, bool foreground);

// Mounts and serves; see the file comment. Returns a process exit code:
// 0 after a clean unmount (or, in the parent of a daemon, once the mount is
// usable), 1 when the mount could not be set up, 2 when serving ended with
// an error (e.g. the final commit failed).
int RunMount(const MountOptions& options);

// Tell the kernel that the directory entry `name` may have changed (created,
// deleted or renamed behind the mount's back, e.g. by the control socket).
void NotifyEntryChanged(const std::string& name);
// Tell the kernel that the attributes and the data of device `id` may have
// changed; its cached pages are dropped.
void NotifyInodeChanged(VolumeId id);
// Tell the kernel to drop its cached pages of bytes [offset, offset +
// length) of device `id`, whose contents changed other than through them.
void NotifyRangeChanged(VolumeId id, uint64_t offset, uint64_t length);

// How the kernel's requests reach the mount RunMount serves: io_uring once
// a request came through a ring (fs/uring.h), else /dev/fuse.
FuseTransportInfo CurrentFuseTransport();

// Delete and resize for the control socket. While RunMount serves a mount
// they go through its FUSE server: a deleted device still open in the mount
// keeps working until its last close (as after unlink(2)), and a resize is
// ordered with grow-on-write. Otherwise they call the pool directly.
// Return the engine's status.
Status DeleteDeviceServed(Pool* pool, const std::string& name);
Status ResizeDeviceServed(Pool* pool, VolumeId id, uint64_t size);

}  // namespace thinfs::fs

#endif  // THINFS_FS_MOUNT_H_
