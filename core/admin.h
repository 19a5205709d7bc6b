// The management commands of a pool (create, snapshot, delete, resize,
// rename, list, status), implemented once over the engine and shared by
// the two ways of reaching a pool:
//
//   - the CLI, when the pool is not mounted, opens the pool itself and
//     calls RunAdmin() (tools/cmd_dev.cc);
//   - the mount daemon runs RunAdmin() for requests that arrive on its
//     control socket, POOL/control.sock (fs/control.cc), since it owns the
//     pool while mounted.
//
// The requests, replies and the control socket's wire format are in
// core/admin_wire.h; this header adds what runs them and the status report
// both paths print.
//
// Thread safety: RunAdmin may run concurrently on one Pool (the engine is
// thread-safe). The format functions are pure.

#ifndef THINFS_CORE_ADMIN_H_
#define THINFS_CORE_ADMIN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "core/admin_wire.h"
#include "core/pool.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs {

// A mount daemon's CPU latency limit (mount option cpu_latency=USEC,
// fs/cpu_latency.h).
struct CpuLatencyInfo {
  uint32_t usec = 0;
  bool held = false;        // held now (requests arrived in the last 50-100 ms)
  uint64_t times_set = 0;   // since the mount
  uint64_t ms_held = 0;     // in all since the mount, the span now running included
};

// How the kernel's FUSE requests reach a mount daemon (fs/uring.h).
struct FuseTransportInfo {
  bool io_uring = false;           // through per-CPU rings, else /dev/fuse
  unsigned queues = 0;             // io_uring: the kernel's queues (one per CPU)
  unsigned threads_per_queue = 0;  // io_uring: ring threads serving each
  uint64_t ring_requests = 0;      // io_uring: requests served through the rings
  // io_uring: ring entries made (one per ring thread), and how many of them
  // the kernel holds now; fewer when a thread failed or took more than
  // UringTransport::kSettleTimeout to register, after which the mount is
  // ready without it (the daemon's log says which).
  unsigned ring_entries = 0;
  unsigned ring_entries_registered = 0;
  std::optional<CpuLatencyInfo> cpu_latency;  // unset: the option is off
};

// What the caller knows beyond the Pool, and how it wants changes done.
struct AdminContext {
  std::string pool_root;  // shown by status
  std::string data_path;  // shown by status
  std::string mountpoint;  // "" unless a mount daemon serves the request
  // Owner and mode of the devices `create` makes.
  DeviceAttrs create_attrs;
  // Replace the engine's DeleteDevice / ResizeDevice (the daemon routes them
  // through its FUSE server, so that a device open in the mount keeps
  // working after delete, like unlink(2)). Empty: call the Pool.
  std::function<Status(const std::string& name)> delete_device;
  std::function<Status(VolumeId id, uint64_t size)> resize_device;
  // Called after a change is committed: a name appeared, vanished or moved;
  // a device's size changed. The daemon invalidates the kernel's caches.
  std::function<void(const std::string& name)> entry_changed;
  std::function<void(VolumeId id)> inode_changed;
  // `checkpoint dir=DIR`: after a commit, writes a consistent copy of the
  // committed metadata to DIR (a RocksDB checkpoint: hard links, cheap), so
  // `thinfs check --read-only` can verify a mounted pool. Empty: the
  // command fails (only a daemon offers it).
  std::function<Status(const std::string& dir)> checkpoint;
  // The mount daemon's FUSE transport, shown by status. Empty: not mounted.
  std::function<FuseTransportInfo()> fuse_transport;
};

// Runs one command. Never throws; bad input is a reply with kAdminUsage and
// nothing changed, a failed operation kAdminFailure with the engine's
// message.
AdminReply RunAdmin(Pool& pool, const AdminRequest& request, const AdminContext& context);

// --- Status report --------------------------------------------------------

// What `thinfs status` shows, mounted or not.
struct PoolStatusReport {
  std::string pool;
  std::string uuid;
  int64_t created_ns = 0;
  std::string data_path;
  uint64_t block_size = 0;
  uint64_t data_blocks = 0;
  uint64_t used_blocks = 0;
  uint64_t free_blocks = 0;
  uint64_t devices = 0;
  uint64_t transaction_id = 0;
  bool bitmap_clean = false;
  std::string mountpoint;  // "" when not mounted
  // The mount's low-water mark in blocks (0: off, always when unmounted)
  // and whether free blocks are below it.
  uint64_t low_water_blocks = 0;
  bool below_low_water = false;
  // Engine counters since the daemon opened the pool (mounted only).
  std::optional<PoolStats> counters;
  // How FUSE requests reach the daemon (mounted only).
  std::optional<FuseTransportInfo> fuse;
};

// The text `thinfs status` prints (lines ending in '\n').
std::string FormatStatusText(const PoolStatusReport& r);
// One JSON object: pool, uuid, created, created_ns, data_path, data_bytes,
// block_size, data_blocks, used_blocks, free_blocks, devices,
// transaction_id, bitmap_clean, low_water_blocks, below_low_water, mounted,
// mountpoint (string or null), fuse_transport (null unless mounted, else
// {kind: "io_uring" or "dev_fuse", queues, ring_threads_per_queue,
// ring_requests, ring_entries, ring_entries_registered, cpu_latency: null
// when the mount option is off, else {usec, held, times_set, ms_held}}),
// and when mounted "counters": {reads, writes,
// provisions, cow_copies, deferred_copies, discards, commits, data_syncs,
// gc_backlog}.
std::string FormatStatusJson(const PoolStatusReport& r);

// "2024-05-01T12:00:00Z" for a CLOCK_REALTIME time in nanoseconds.
std::string FormatUtcTime(int64_t ns);
// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string FormatUuidBytes(const uint8_t (&uuid)[16]);

}  // namespace thinfs

#endif  // THINFS_CORE_ADMIN_H_
