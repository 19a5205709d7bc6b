// Pool and Volume: the thin-provisioning engine.
//
// A Pool owns the data area (BlockDevice), the allocator (SpaceMap) and the
// persistent metadata (MetadataStore), and maps every thin device onto the
// data area with dm-thin's versioned-mapping idea (DESIGN.md):
//
//   - each device has an epoch; a snapshot S of D takes parent (D, D.epoch)
//     and bumps D.epoch, so creating it writes two records whatever D's size;
//   - the block map holds versions (device, vblock, epoch) -> MapValue; a
//     read takes the newest own version, else asks the parent at the parent
//     epoch, and so on up the chain;
//   - a write to a block whose newest version is of the current epoch and
//     not shared overwrites it in place; otherwise it provisions a new block
//     (copy-on-write) stamped with the current epoch.
//
// Uncommitted metadata changes live in an in-memory overlay in front of the
// store; Commit() (core/transaction.h describes the protocol) makes them
// durable in one batch. Blocks released by a change return to the allocator
// only after the commit that contains the change.
//
// Thread safety: every method may be called from any thread. Lock order
// (outer first): Volume::io_mu_ -> stripe locks (by index) -> swap_mu_
// (shared) -> overlay shard mutexes / refcount_mu_ -> devices_mu_ ->
// allocator. commit_mu_ is outermost for Commit() and is never taken while
// holding any of the others. No lock is held across a data-area sync. The
// mutex of an owed copy-on-write copy (core/deferred_copy.h) is a leaf,
// held across that block's data I/O only.

#ifndef THINFS_CORE_POOL_H_
#define THINFS_CORE_POOL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/block_device.h"
#include "core/device_name.h"
#include "core/metadata.h"
#include "core/space_map.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs {

struct PoolStats;

struct PoolOptions {
  // Periodic commit interval (dm-thin commits every second). Zero turns the
  // periodic commit off: only Commit()/Flush() and management operations
  // commit.
  std::chrono::milliseconds commit_interval{1000};
  // Whether the periodic commit also syncs data overwritten in place (in
  // blocks whose mapping is already committed). On (default): every
  // periodic commit syncs every write before it, so a crash loses at most
  // commit_interval of any write (DESIGN.md invariant 5), at the cost of a
  // data sync per interval under any write load. Off, like ext4's
  // data=ordered (or dm-thin over a disk with a volatile write cache): the
  // periodic commit syncs the data file only when it writes mappings to new
  // data (provisioning, copy-on-write), which is what keeps stale data
  // unreachable; overwrites in place are durable on fsync, on any commit
  // that syncs, and otherwise when the kernel writes them back. Explicit
  // commits (fsync, snapshot, unmount, Commit()/Flush()) always sync
  // everything.
  bool sync_overwrites = true;
  // A whole-block write of zeros unmaps instead of provisioning.
  bool zero_detection = true;
  // Memory for the block-map cache in front of the metadata store
  // (core/map_cache.h): what recently used (device, block)s resolve to.
  // Rounded down to a power of two of entries; 0 turns it off.
  size_t map_cache_bytes = size_t{16} << 20;
  // How much copy-on-write copying may be owed to the next commit
  // (core/deferred_copy.h), in bytes of data blocks: a partial write to a
  // shared block then writes only its bytes, and the commit copies the
  // rest. Full: copies are made at once, as with 0. When half full, the
  // periodic commit is started early. 1 GiB holds a burst of first writes
  // to 16384 shared 64 KiB blocks (about 150 bytes of memory each); an
  // fsync after such a burst waits for up to this much copying
  // (docs/benchmarks.md, lever 23).
  uint64_t deferred_copy_bytes = uint64_t{1} << 30;
  // Refuse every change with kReadOnly.
  bool read_only = false;
  // Make owed copy-on-write copies (deferred_copy_bytes) in a background
  // thread as they accumulate, 20 ms after the first, instead of
  // leaving them all to the commit: the commit, and so an fsync, then has
  // fewer to make. Tests turn it off to see what a commit makes.
  bool background_copies = true;
  // Run the garbage collector in a background thread. Tests turn it off and
  // call RunGcForTesting() to control when it runs.
  bool background_gc = true;
  // How long a write that finds the pool full waits for space (grow or
  // frees) before failing with kNoSpace. Zero fails at once (dm-thin's
  // error_if_no_space).
  std::chrono::milliseconds no_space_timeout{0};
  // Use division instead of shift/mask even for power-of-two block sizes
  // (benchmarks compare the two).
  bool force_generic_geometry_for_testing = false;
  // Where the engine reports events worth a log line (recovery, slow or
  // failed commits): level 0 error, 1 warning, 2 info. Empty: silent.
  std::function<void(int level, const std::string& message)> log;
  // A commit slower than this is logged as a warning.
  std::chrono::milliseconds slow_commit{1000};
  // Low-water mark in blocks; 0 turns it off. When free blocks fall below
  // it the engine logs one warning and calls on_low_water once; both re-arm
  // when free blocks rise above the mark again (grow, deletes).
  uint64_t low_water_blocks = 0;
  // Called on the thread whose allocation crossed the mark, possibly with
  // engine locks held: it must return quickly and must not call the Pool.
  // The PoolStats carries the space fields only (block_size, data_blocks,
  // free_blocks, used_blocks, low_water_blocks, below_low_water).
  std::function<void(const PoolStats&)> on_low_water;
};

// Ownership, permission and times of a device file.
struct DeviceAttrs {
  uint32_t mode = 0100644;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

struct DeviceInfo {
  VolumeId id;
  std::string name;
  uint64_t size = 0;
  Epoch epoch = 0;
  bool has_parent = false;
  VolumeId parent;
  std::string parent_name;  // "" when the parent is hidden or absent
  Epoch parent_epoch = 0;
  uint64_t mapped_blocks = 0;  // blocks that read from the data area
  uint32_t mode = 0100644;
  uint32_t uid = 0;
  uint32_t gid = 0;
  int64_t created_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  int64_t atime_ns = 0;
};

struct DeviceUsage {
  uint64_t mapped_blocks = 0;     // visible, reading from the data area
  uint64_t exclusive_blocks = 0;  // of those, seen by no other device
  uint64_t shared_blocks = 0;     // of those, seen by another device too
};

struct PoolStats {
  uint64_t block_size = 0;
  uint64_t data_blocks = 0;
  uint64_t free_blocks = 0;
  uint64_t used_blocks = 0;
  uint64_t devices = 0;
  uint64_t transaction_id = 0;
  // Counters since open.
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t provisions = 0;
  uint64_t cow_copies = 0;
  uint64_t deferred_copies = 0;  // owed copies made later (commit or copier)
  uint64_t discards = 0;
  uint64_t commits = 0;
  uint64_t data_syncs = 0;  // commits that synced the data file
  uint64_t gc_backlog = 0;  // devices and candidate blocks waiting for GC
  // Latency of the last (up to 1024) commits that wrote something, in
  // microseconds, owed copies included: 50th, 90th and 99th percentile and
  // the maximum.
  uint64_t commit_p50_us = 0;
  uint64_t commit_p90_us = 0;
  uint64_t commit_p99_us = 0;
  uint64_t commit_max_us = 0;
  bool read_only = false;
  // PoolOptions::low_water_blocks (0: off), and whether free blocks are
  // below it now.
  uint64_t low_water_blocks = 0;
  bool below_low_water = false;
};

class Pool;
struct VolumeState;

// Whose cache is to keep what a read returns.
enum class ReadCache {
  kHost,  // the host's page cache of the data file (the default)
  // The reader's own: it opened the volume with O_DIRECT (a loop device,
  // a VM's disk with cache=none, a database). A read of several blocks
  // that the host's cache does not hold then reads the data file past it
  // (O_DIRECT) into the reader's buffer, rather than through pages the
  // host allocates, fills, copies out of and keeps as a second copy of
  // the reader's (docs/benchmarks.md, lever 46).
  kReader,
};

// Whose cache is to keep what a write wrote until the next commit.
enum class WriteCache {
  kHost,  // the host's page cache of the data file, written back when the
          // commit syncs it or the kernel's write-back comes (the default)
  // Nobody's: the writer opened the volume with O_DIRECT (a loop device,
  // a VM's disk with cache=none) and caches above it itself. A write that
  // continues one of the device's last few such writes (a stream: a file
  // written through a loop device) heads for the disk at once, as it
  // would over a raw disk, so that the writer's next flush finds it
  // written, not a gigabyte to write: its whole blocks past the host's
  // cache (BlockDevice::WritePastCache, written before they are mapped,
  // docs/benchmarks.md, lever 52), the rest with its write-back started
  // (BlockDevice::StartWriteback, lever 51). Other writes stay in the
  // host's cache as with kHost: written back one by one, random writes ran
  // at half the rate (lever 51). Durability is the same either way: Flush.
  kWriter,
};

// An open thin device. Obtained from Pool::OpenVolume; stays usable after
// the device is unlinked (DetachName) until the last handle goes.
//
// Contract in syscall terms: Read behaves like pread(2) (short at the end of
// the device), Write like pwrite(2) of all bytes inside the device, Discard
// like fallocate(PUNCH_HOLE) (reads return zeros after it), Flush like
// fdatasync(2) (everything written before is durable).
class Volume {
 public:
  ~Volume();
  Volume(const Volume&) = delete;
  Volume& operator=(const Volume&) = delete;

  VolumeId id() const;

  // Returns the bytes read; 0 at or past the end. The bytes are the same
  // whatever `cache` says.
  Result<size_t> Read(uint64_t offset, std::span<std::byte> buf,
                      ReadCache cache = ReadCache::kHost);
  // REQUIRES: offset + buf.size() <= size(). Returns kInvalidArgument past
  // the end, kNoSpace when a block cannot be provisioned, kReadOnly.
  // The bytes written are the same whatever `cache` says.
  Status Write(uint64_t offset, std::span<const std::byte> buf,
               WriteCache cache = WriteCache::kHost);
  // Unmaps whole blocks in the range and zeroes the partial edges.
  Status Discard(uint64_t offset, uint64_t length);
  // Provisions every unmapped block in the range (fallocate mode 0).
  Status Provision(uint64_t offset, uint64_t length);
  // Commits the pool: every write before it is durable. With `data_only`
  // (fdatasync), a device record whose only change is a write's new
  // mtime/ctime is left to the next other commit (the periodic one, an
  // fsync, a close of a written file), as fdatasync(2) leaves a file's
  // timestamps.
  Status Flush(bool data_only = false);
  uint64_t size() const;

  // The first offset >= `offset` that is (SeekData) or is not (SeekHole)
  // backed by a mapped block. kNotFound (ENXIO) when there is none
  // before the end; SeekHole at the end returns size().
  Result<uint64_t> SeekData(uint64_t offset);
  Result<uint64_t> SeekHole(uint64_t offset);

 private:
  friend class Pool;
  Volume(Pool* pool, std::shared_ptr<VolumeState> state);
  Pool* const pool_;
  const std::shared_ptr<VolumeState> state_;
};

class Pool {
 public:
  // Builds the engine over opened components and starts the background
  // threads. If the space map was not cleanly closed, rebuilds it from the
  // block map (recovery). Deletes orphans left by an unclean shutdown.
  // Returns kCorruption if the metadata is inconsistent.
  static Result<std::unique_ptr<Pool>> Open(std::unique_ptr<BlockDevice> data,
                                            std::unique_ptr<SpaceMap> space,
                                            std::unique_ptr<MetadataStore> store,
                                            const PoolOptions& options);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Final commit and stop of background work. The pool is unusable after.
  Status Close();

  // --- Devices -------------------------------------------------------------
  // Names: 1-128 characters of [A-Za-z0-9._+-], not starting with '.'
  // (core/device_name.h).
  static Status ValidateName(const std::string& name) { return ValidateDeviceName(name); }

  // Creates an empty thin device of `size` bytes. kExists, kInvalidArgument,
  // kNameTooLong, kReadOnly.
  Result<VolumeId> CreateDevice(const std::string& name, uint64_t size,
                                const DeviceAttrs& attrs = {});
  // Creates a writable snapshot `name` of `origin` in O(1). Everything
  // written to `origin` before the call is in the snapshot, nothing after.
  Result<VolumeId> CreateSnapshot(const std::string& origin, const std::string& name);
  // Deletes a device; its blocks return to the pool in the background.
  Status DeleteDevice(const std::string& name);
  // Removes the name but keeps the device alive for open Volumes; the
  // device is deleted by DeleteDetached(), or at the next Open.
  Status DetachName(const std::string& name);
  Status DeleteDetached(VolumeId id);
  // Grows or shrinks; shrinking unmaps what lies beyond the new size.
  // Commits unless `commit` is false (a file growing under writes past its
  // end becomes durable with the next fsync or periodic commit, like any
  // write).
  Status ResizeDevice(const std::string& name, uint64_t new_size);
  Status ResizeDevice(VolumeId id, uint64_t new_size, bool commit = true);
  // Renames `from` to `to`. With `replace`, an existing `to` is deleted
  // first (rename(2) semantics); without, kExists.
  Status RenameDevice(const std::string& from, const std::string& to, bool replace = false);
  // Updates mode/uid/gid and times (nullopt leaves a field unchanged).
  Status SetAttrs(VolumeId id, std::optional<uint32_t> mode, std::optional<uint32_t> uid,
                  std::optional<uint32_t> gid, std::optional<int64_t> atime_ns,
                  std::optional<int64_t> mtime_ns);

  Result<DeviceInfo> GetDevice(const std::string& name) const;
  Result<DeviceInfo> GetDevice(VolumeId id) const;
  // Visible devices in name order.
  std::vector<DeviceInfo> ListDevices() const;
  // Walks the device's mappings (O(mapped blocks)).
  Result<DeviceUsage> ComputeUsage(VolumeId id);

  Result<std::shared_ptr<Volume>> OpenVolume(VolumeId id);
  Result<std::shared_ptr<Volume>> OpenVolume(const std::string& name);

  // Shares `length` bytes of `src` at `src_offset` into `dst` at
  // `dst_offset` (copy_file_range): whole aligned blocks by reference,
  // edges by copy. When the whole of src is copied onto an empty dst of the
  // same size, dst becomes an O(1) snapshot of src.
  Status ShareRange(VolumeId src, uint64_t src_offset, VolumeId dst, uint64_t dst_offset,
                    uint64_t length);

  // --- Pool ------------------------------------------------------------------
  // Makes every completed change durable (see core/transaction.h).
  Status Commit();
  // Grows the data area to `new_data_blocks`: the data device grows (a
  // regular file is extended; a block device must be large enough already),
  // then the space map, then the superblock's data_blocks is committed. A
  // crash in between leaves a space map larger than the superblock, which
  // Open() completes. Wakes writers waiting for space.
  // Returns kInvalidArgument when new_data_blocks is below the current size
  // (shrinking is refused) or the device is too small, kReadOnly, kIOError.
  Status Grow(uint64_t new_data_blocks);
  PoolStats Stats() const;
  const Geometry& geometry() const;
  MetadataStore* store();
  SpaceMap* space_map();

  // Runs the collector until nothing is left to collect, then commits.
  Status RunGcForTesting();
  // The commit the periodic committer makes (PoolOptions::sync_overwrites).
  Status PeriodicCommitForTesting();
  // The data block that block `vblock` of device `id` reads from, or
  // nullopt when it reads zeros.
  Result<std::optional<PoolBlock>> MappedBlockForTesting(VolumeId id, uint64_t vblock);
  // Stops background threads and drops every uncommitted change without
  // committing, as if the process died. The pool is unusable after.
  void AbandonForTesting();

 private:
  friend class Volume;
  struct Impl;
  explicit Pool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace thinfs

#endif  // THINFS_CORE_POOL_H_
