// ReceiveTarget: the pool `thinfs receive` builds a device in, behind the
// few operations the receive loop needs (tools/cmd_send.cc), so that one
// loop serves both ways of reaching a pool, as ReadView does for send:
//
//   - unmounted: the pool opened here (OpenPoolHere); metadata changes and
//     data go to the engine directly, Commit() commits it;
//   - mounted: every metadata change is a request on the daemon's control
//     socket (create, snapshot, resize, delete); the data is written
//     through the mounted file MOUNTPOINT/NAME (pwrite, and
//     fallocate(PUNCH_HOLE | KEEP_SIZE), which the daemon turns into a
//     discard); the rename is rename(2) in the mount, the same path as `mv`
//     there, so a replaced device still open in the mount (a loop device
//     over it) is detached and keeps its old data until its last close, as
//     after unlink(2); Commit() is fsync() of the mount's root directory,
//     which makes the daemon commit. The committed device records come
//     from a checkpoint the daemon writes (tools/daemon_checkpoint.h).
//
// Either way the device records Devices() returns are the committed ones,
// so the stream identities recorded after a receive (tools/stream_ids.h)
// hold the same mtime and size in both modes.
//
// Thread safety: single-threaded.

#ifndef THINFS_TOOLS_RECEIVE_TARGET_H_
#define THINFS_TOOLS_RECEIVE_TARGET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/metadata.h"
#include "core/status.h"

namespace thinfs::tools {

class ReceiveTarget {
 public:
  virtual ~ReceiveTarget() = default;

  // The pool directory (where stream-guids lives) and its block size.
  virtual const std::string& root() const = 0;
  virtual uint64_t block_size() const = 0;
  // "" when unmounted, else where the pool is mounted.
  virtual const std::string& mountpoint() const = 0;

  // The committed device records (a mounted pool commits first).
  virtual Result<std::vector<DeviceRecord>> Devices() = 0;

  // The metadata changes, as the engine's calls of the same names.
  virtual Status CreateDevice(const std::string& name, uint64_t size) = 0;
  virtual Status CreateSnapshot(const std::string& origin, const std::string& name) = 0;
  virtual Status ResizeDevice(const std::string& name, uint64_t size) = 0;
  virtual Status DeleteDevice(const std::string& name) = 0;
  // Renames `from` to `to`; kExists when `to` exists and !replace.
  virtual Status RenameDevice(const std::string& from, const std::string& to, bool replace) = 0;

  // Opens device `name` for Write and Punch.
  virtual Status OpenData(const std::string& name) = 0;
  // Writes like pwrite(2) into the open device.
  virtual Status Write(uint64_t offset, std::span<const std::byte> data) = 0;
  // Unmaps [offset, offset + length) of the open device (reads zeros).
  virtual Status Punch(uint64_t offset, uint64_t length) = 0;
  // Closes the open device (if any); mounted, fsync()s it first.
  virtual Status CloseData() = 0;

  // Makes every change so far durable.
  virtual Status Commit() = 0;
  // Releases the pool (unmounted: closes the engine, which commits).
  virtual Status Close() = 0;
};

// Opens the pool at `dir` for a receive: here when unmounted, else through
// its mount daemon. Returns the error of opening it (kBusy when the pool is
// locked by something that is not a daemon answering on control.sock).
Result<std::unique_ptr<ReceiveTarget>> OpenReceiveTarget(const std::string& dir);

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_RECEIVE_TARGET_H_
