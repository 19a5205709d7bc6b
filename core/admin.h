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
// It also defines the control socket's wire format (below) and the status
// report both paths print.
//
// Thread safety: RunAdmin may run concurrently on one Pool (the engine is
// thread-safe). The codec and format functions are pure.

#ifndef THINFS_CORE_ADMIN_H_
#define THINFS_CORE_ADMIN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/pool.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs {

// Exit codes, as the CLI's (tools/cli.h).
inline constexpr int kAdminOk = 0;
inline constexpr int kAdminUsage = 1;    // bad or missing argument, bad name or size
inline constexpr int kAdminFailure = 2;  // the operation failed (no such device, exists, ...)

// A command and its arguments. Commands and their argument keys:
//   create      name, size              size: ParseSize syntax ("10G")
//   snapshot    source, name
//   delete      name
//   resize      name, size
//   rename      from, to
//   list
//   status
//   grow        size                    grows the data area to size (ParseSize);
//                                       refuses to shrink
//   mountpoint                          (daemon only) where the pool is mounted
// Every command takes json=0|1 (default 0): the reply's `json` is filled in
// either case; `text` only without it.
struct AdminRequest {
  std::string command;
  std::vector<std::pair<std::string, std::string>> args;

  // The value of `key`, or nullptr.
  const std::string* Find(std::string_view key) const;
};

struct AdminReply {
  int exit_code = kAdminOk;
  std::string text;   // for stdout ("" when the request asked for JSON)
  std::string json;   // one JSON document ("" on failure)
  std::string error;  // one line, no newline, for stderr ("" on success)

  static AdminReply Error(int exit_code, std::string message);
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
};

// The text `thinfs status` prints (lines ending in '\n').
std::string FormatStatusText(const PoolStatusReport& r);
// One JSON object: pool, uuid, created, created_ns, data_path, data_bytes,
// block_size, data_blocks, used_blocks, free_blocks, devices,
// transaction_id, bitmap_clean, low_water_blocks, below_low_water, mounted, mountpoint (string or null), and
// when mounted "counters": {reads, writes, provisions, cow_copies,
// deferred_copies, discards, commits, data_syncs, gc_backlog}.
std::string FormatStatusJson(const PoolStatusReport& r);

// "2024-05-01T12:00:00Z" for a CLOCK_REALTIME time in nanoseconds.
std::string FormatUtcTime(int64_t ns);
// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string FormatUuidBytes(const uint8_t (&uuid)[16]);

// --- Wire format of the control socket ------------------------------------
//
// One connection carries one request and then one reply, each a frame:
//
//   frame = length (uint32, little-endian) followed by `length` body bytes
//   body  = line*, every line "key=value\n"
//   key   = 1 to 32 characters of [a-z0-9_.-]
//   value = bytes, each byte outside 0x21-0x7e and each '%' written as %XX
//           (two upper-case hex digits); no other byte may be escaped, so
//           every value has exactly one encoding
//
// A request body is "thinfs-admin=1", "command=NAME", then one line per
// argument (keys unique, at most kAdminMaxArgs). A reply body is exactly
// "thinfs-admin=1", "exit=N" (0-255, no leading zero), "text=...",
// "json=...", "error=...", in that order. A request frame holds at most
// kAdminMaxRequestFrame bytes, header included; a reply frame at most
// kAdminMaxReplyFrame. The decoders accept nothing else: a wrong length,
// version, key, order, escape or line ending is kInvalidArgument.

inline constexpr size_t kAdminFrameHeader = 4;
inline constexpr size_t kAdminMaxRequestFrame = 64 * 1024;
inline constexpr size_t kAdminMaxReplyFrame = 16 * 1024 * 1024;
inline constexpr size_t kAdminMaxArgs = 64;

// Returns the frame, or kInvalidArgument for a bad command or key, too many
// arguments or a frame above kAdminMaxRequestFrame.
Result<std::string> EncodeAdminRequest(const AdminRequest& request);
Result<AdminRequest> DecodeAdminRequest(std::string_view frame);
// A reply too large for a frame is replaced by an error reply saying so.
std::string EncodeAdminReply(const AdminReply& reply);
Result<AdminReply> DecodeAdminReply(std::string_view frame);
// The body length announced by the first kAdminFrameHeader bytes of a frame.
// kInvalidArgument when `header` is not 4 bytes or the frame would exceed
// `max_frame`.
Result<size_t> DecodeAdminFrameHeader(std::string_view header, size_t max_frame);

}  // namespace thinfs

#endif  // THINFS_CORE_ADMIN_H_
