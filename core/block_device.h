// BlockDevice: the pool's data area, block n at byte n * block_size.
//
// Implementations: FileBlockDevice (a regular file or a block device, pread/
// pwrite, optional O_DIRECT, copies reflinked where the file system can),
// MemBlockDevice (tests) and FaultInjectionBlockDevice (tests: drops
// unsynced writes, fails the Nth I/O, tears writes).
//
// Contract in syscall terms: Read behaves like pread(2) of whole requested
// bytes, Write like pwrite(2) of all bytes, Sync like fdatasync(2): every
// Write completed before Sync() started is durable when it returns OK.
//
// Thread safety: all methods may be called concurrently. Concurrent writes
// to overlapping ranges have undefined interleaving, like pwrite. With
// O_DIRECT, an unaligned write is a read-modify-write of the 4 KiB sectors
// it touches: writes to one block must not run concurrently (the engine's
// stripe lock guarantees it).

#ifndef THINFS_CORE_BLOCK_DEVICE_H_
#define THINFS_CORE_BLOCK_DEVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs {

class BlockDevice {
 public:
  virtual ~BlockDevice() = default;

  // Reads buf.size() bytes at `offset` bytes into block `block`.
  // REQUIRES: offset + buf.size() <= block_size; block < data_blocks.
  // Returns kIOError (with errno) on failure.
  virtual Status Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf) = 0;

  // Writes buf at `offset` bytes into block `block`. Same REQUIRES.
  virtual Status Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf) = 0;

  // Makes every completed Write durable (fdatasync).
  virtual Status Sync() = 0;

  // Hints that `count` blocks from `block` hold nothing of value (punches a
  // hole in a sparse file). Reads of such blocks afterwards may return
  // anything; callers never read a block they have not written. May be a
  // no-op.
  virtual Status Discard(PoolBlock block, uint64_t count) = 0;

  // Makes `count` blocks from `block` read as zeros, like fallocate
  // ZERO_RANGE: cheaper than Write() of zeros where the device can (a hole
  // punched in a sparse file, BLKZEROOUT). Durable after Sync() like a
  // write. The default writes zero buffers.
  virtual Status WriteZeroes(PoolBlock block, uint64_t count);

  // Makes blocks up to `new_data_blocks` addressable. A regular file is
  // extended (sparse, ftruncate) and the new size synced unless fixed in
  // size; a block device must already hold them. Returns kNoSpace when the
  // device is too small, kInvalidArgument when new_data_blocks is below the
  // current count, or the errno status. The default returns kNotSupported.
  virtual Status Grow(uint64_t new_data_blocks);

  // Hints that `count` blocks from `block` will be read soon, so that reads
  // of many blocks can be in flight at once (posix_fadvise WILLNEED). The
  // default does nothing.
  virtual void Prefetch(PoolBlock block, uint64_t count);

  // Read() of a read within `block` that is not the next read of a
  // sequential reader. A device may also bring the rest of the read-around
  // window that holds it into the host's page cache when the read's data
  // are not cached, so that later reads of the window find it there
  // (docs/benchmarks.md, lever 44). The default is Read().
  virtual Status ReadAround(PoolBlock block, uint64_t offset, std::span<std::byte> buf);

  // A run of consecutive blocks.
  struct Run {
    PoolBlock first;
    uint64_t count = 0;
  };
  // The same hint for the runs of blocks one read is about to read, in
  // order, but only when the cache does not already hold the last run's
  // end: where it does, the kernel's own readahead is ahead of the reader
  // and a hint would only cut it short. A read of one run, given a
  // scratch buffer, is instead read through the cache into `scratch`:
  // `head` bytes into the run's first block, up to scratch.size() bytes
  // and no further than the run's end. The kernel then sees a reader's
  // read and reads ahead of a sequential one, which it does not after a
  // hint (docs/benchmarks.md, lever 21). The caller overwrites scratch
  // afterwards. Returns whether the runs'
  // end was not cached (and so hinted or read). The default does nothing
  // and returns false.
  // REQUIRES: head < block_size.
  virtual bool PrefetchForRead(std::span<const Run> runs, uint64_t head,
                               std::span<std::byte> scratch);

  // A piece of a read: buf.size() bytes from `offset` bytes into `block`,
  // running on into the blocks after it when longer than the rest of it.
  struct ReadPiece {
    PoolBlock block;
    uint64_t offset = 0;
    std::span<std::byte> buf;
  };
  // What the caller's probe found of the pieces a ReadPieces reads, and
  // whose cache is to keep them. Only a hint: the data read is the same
  // either way.
  enum class Cache {
    kUnknown,  // not probed, or not cached and the host's cache is to keep them
    kHeld,     // in the host's page cache (PrefetchForRead returned false)
    // Not in the host's page cache (RunsCached returned false), and the
    // reader keeps its own cache of them: read past the host's, where the
    // device can (CanReadPastCache), so that the host neither caches them
    // a second time nor copies them through fresh pages (lever 46).
    kBypass,
  };
  // Reads every piece, as Read() of each block it covers would. The default
  // reads block by block; a file's device reads a piece with one pread, so
  // that a read of consecutive blocks pays one system call, not one per
  // block, and when kHeld copies it out of a mapping of the file, which
  // costs none. REQUIRES: every piece inside the data area.
  virtual Status ReadPieces(std::span<const ReadPiece> pieces, Cache cache);

  // Whether the host's page cache holds the last run's last page, the
  // probe of PrefetchForRead without its hints and without reading
  // anything in: false where the device cannot tell so. The default
  // returns false.
  virtual bool RunsCached(std::span<const Run> runs);

  // Whether ReadPieces can read kBypass pieces past the host's page cache.
  // The default returns false.
  virtual bool CanReadPastCache() const { return false; }

  // Hints that the runs were just written for a writer that keeps no
  // cache of them (Volume::Write with WriteCache::kWriter): their data
  // should head for the disk now, as such a writer's data does over a raw
  // disk, not wait in the host's cache for Sync() or the kernel's
  // write-back (docs/benchmarks.md, lever 51). Only a hint: durability
  // still comes from Sync() alone. The default does nothing.
  virtual void StartWriteback(std::span<const Run> runs);

  // Writes buf at `offset` bytes into `block`, running on into the blocks
  // after it when longer than the rest of it, past the host's page cache
  // where the device can: for a writer that keeps no cache of its own, so
  // that its data go to the disk as they come, as over a raw disk, neither
  // copied into the host's cache nor written by one writer at a time
  // (docs/benchmarks.md, lever 52). Returns false, having written nothing,
  // where it cannot (not 4 KiB-aligned, no such descriptor, the file
  // system refused): the caller then writes with Write(). Durable after
  // Sync() like a write. The default returns false.
  // REQUIRES: inside the data area.
  virtual Result<bool> WritePastCache(PoolBlock block, uint64_t offset,
                                      std::span<const std::byte> buf);

  // Copies bytes [offset, offset + len) of block `from` to the same bytes of
  // block `to`, like Read then Write of them; durable after Sync() like a
  // write. Where the file system can share the data instead (a reflink:
  // FICLONERANGE on XFS or btrfs), no data is read or written. The default
  // reads and writes through a buffer.
  // REQUIRES: from != to; offset + len <= block_size.
  virtual Status Copy(PoolBlock from, PoolBlock to, uint64_t offset, uint64_t len);

  // Whether Copy() shares data rather than reading and writing it: then
  // prefetching a copy's source is wasted I/O. The default is false.
  virtual bool SharesCopies() const { return false; }

  // The geometry at open; Grow() extends the addressable blocks beyond
  // geometry().data_blocks() without changing it.
  virtual const Geometry& geometry() const = 0;
};

// pread/pwrite over an open file descriptor (regular file or block device).
class FileBlockDevice final : public BlockDevice {
 public:
  // Opens `path` read-write (O_DIRECT when `direct`); the geometry tells the
  // block size and how many blocks the caller will address.
  // Returns kNotFound, kPermissionDenied or kIOError.
  static Result<std::unique_ptr<FileBlockDevice>> Open(const std::string& path,
                                                       const Geometry& geometry,
                                                       bool direct, bool read_only);
  ~FileBlockDevice() override;
  FileBlockDevice(const FileBlockDevice&) = delete;
  FileBlockDevice& operator=(const FileBlockDevice&) = delete;

  // Also any length that stays inside the data area (ReadPieces' pieces).
  Status Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf) override;
  Status Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf) override;
  Status Sync() override;
  Status Discard(PoolBlock block, uint64_t count) override;
  Status WriteZeroes(PoolBlock block, uint64_t count) override;
  Status Grow(uint64_t new_data_blocks) override;
  // Starts reading into the page cache; nothing with O_DIRECT.
  void Prefetch(PoolBlock block, uint64_t count) override;
  // sync_file_range(SYNC_FILE_RANGE_WRITE) of each run: starts writing its
  // dirty pages without waiting for them; nothing with O_DIRECT.
  void StartWriteback(std::span<const Run> runs) override;
  // A 4 KiB-aligned write goes with O_DIRECT through the second descriptor
  // (ReadPieces' kBypass), submitted with Linux AIO and waited for, so
  // that the file's inode lock, which ext4 holds for an O_DIRECT write
  // into a hole, is not held while the disk writes it; a buffer that is
  // not 4 KiB-aligned (a FUSE request's data are not) is first copied into
  // an aligned buffer the calling thread keeps for this, as large as its
  // largest such write. Nothing with O_DIRECT on the device's own
  // descriptor (Write() is past the cache already).
  Result<bool> WritePastCache(PoolBlock block, uint64_t offset,
                              std::span<const std::byte> buf) override;
  // First a preadv2(RWF_NOWAIT) of the read: cached data cost that one
  // system call, as a Read() of them does. What it could not read, the
  // window that holds it is hinted for (posix_fadvise(WILLNEED): one read
  // of the disk for the window's missing pages), then read with pread,
  // which waits for it. The window is the read-around size aligned within
  // the block (EnableReadAround). Not hinted: a read as long as the window
  // or across its end; a window of which cachestat(2) finds pages reclaim
  // evicted (the cache does not hold the working set: what is read around
  // would be lost again before it is read); anything with O_DIRECT, or
  // without a window, which reads as Read().
  Status ReadAround(PoolBlock block, uint64_t offset, std::span<std::byte> buf) override;
  // Probes the last run's last page first: one system call for a read
  // whose blocks are cached, however scattered. The probe is cachestat(2),
  // which reads nothing in, where the kernel has it (Linux 6.5) and lets
  // the descriptor ask; elsewhere preadv2(RWF_NOWAIT) of the last byte,
  // which on a miss starts reading that page and so may see a miss as a
  // hit (the read then goes unhinted).
  bool PrefetchForRead(std::span<const Run> runs, uint64_t head,
                       std::span<std::byte> scratch) override;
  // One pread per piece (O_DIRECT: Read() of each). When kHeld and
  // after EnableMappedReads(), a copy out of the data file's mapping
  // instead (docs/benchmarks.md, lever 35), no system call however
  // scattered; a page the cache lost after all is read alone (the mapping
  // is MADV_RANDOM: no read-around). A piece the mapping does not cover,
  // or whose copy faults (SIGBUS: past the file's end, or a page the kernel
  // could not read), falls back to its pread, which reads zeros or fails as
  // Read() would.
  // kBypass: a piece whose offset, length and buffer are 4 KiB-aligned is
  // read with O_DIRECT through a second descriptor of the file (opened at
  // Open where the file system allows it), so that the disk's DMA fills
  // the caller's buffer: no page of the host's cache is allocated, filled
  // and copied out of. Several such pieces are read at once (Linux AIO). The kernel writes dirty cached pages of the range
  // back first, so the data read is what Read() would read. Other pieces,
  // or all where the file system refused O_DIRECT, as kUnknown.
  Status ReadPieces(std::span<const ReadPiece> pieces, Cache cache) override;
  bool RunsCached(std::span<const Run> runs) override;
  bool CanReadPastCache() const override {
    return bypass_fd_ >= 0 && bypass_.load(std::memory_order_relaxed);
  }
  // A reflink (FICLONERANGE) of the 4 KiB-aligned part of the range where
  // the data file's file system supports it (found at Open by cloning
  // within a scratch O_TMPFILE next to it), pread/pwrite for the rest.
  Status Copy(PoolBlock from, PoolBlock to, uint64_t offset, uint64_t len) override;
  bool SharesCopies() const override { return clone_.load(std::memory_order_relaxed); }
  const Geometry& geometry() const override { return geometry_; }

  // Copy() reads and writes even where the file system could reflink.
  // Call before sharing the object.
  void DisableClones() { clone_.store(false); }

  // Maps the file so that ReadPieces of cached data copies out of the
  // mapping (lever 35; not with O_DIRECT, and nothing if mmap fails). Off
  // by default: a page's first copy out of the mapping costs more than a
  // pread of it, and pages the daemon has mapped stay cached through
  // drop_caches. Call before sharing the object.
  void EnableMappedReads();

  // ReadAround() reads around in windows of `bytes` (a multiple of 4 KiB; the block
  // size where larger; 0, the default: no read-around), aligned within the
  // block: a read of fewer bytes whose page is not cached makes the disk
  // read the window, which the host's readahead does not do for a random
  // read. Nothing with O_DIRECT. Call before sharing the object.
  void EnableReadAround(uint64_t bytes) { read_around_ = bytes; }
  uint64_t read_around() const { return read_around_; }

  // A regular file that Grow() must not extend (one the user gave with
  // `format --data`: it is theirs to size). Call before sharing the object.
  void set_fixed_size(bool fixed) { fixed_size_ = fixed; }

  int fd() const { return fd_; }
  bool direct() const { return direct_; }
  // Pieces ReadPieces has read past the cache several at once, so far.
  uint64_t pieces_read_at_once() const { return at_once_.load(std::memory_order_relaxed); }
  // How many bytes of the file ReadPieces can copy out of its mapping: 0
  // without EnableMappedReads(), with O_DIRECT or when mmap failed.
  uint64_t mapped_length() const {
    const Mapping* m = mapping_.load();
    return m == nullptr ? 0 : m->len;
  }

 private:
  FileBlockDevice(int fd, const Geometry& g, bool direct, bool is_blockdev)
      : fd_(fd), geometry_(g), direct_(direct), is_blockdev_(is_blockdev) {}

  // Whether the page holding byte `offset` of the file is in the page
  // cache (PrefetchForRead's probe): cachestat(2), else a one-byte
  // preadv2(RWF_NOWAIT), which on a miss starts reading the page.
  bool CachedAt(uint64_t offset);
  // The same by cachestat(2) alone; nullopt where it cannot tell.
  std::optional<bool> CachestatAt(uint64_t offset);
  // The byte after the last run's last block. REQUIRES: !runs.empty().
  uint64_t EndOf(std::span<const Run> runs) const;

  // Maps the first `len` bytes of the file read-only, unless a mapping as
  // long is current; a failed mmap leaves reads to pread.
  void MapUpTo(uint64_t len);
  // Copies `buf.size()` bytes from byte `pos` of the file out of the
  // mapping; false when the mapping does not cover them or the copy
  // faulted.
  bool CopyMapped(uint64_t pos, std::span<std::byte> buf) const;
  // Reads `buf.size()` bytes from byte `pos` of the file with O_DIRECT;
  // false when it cannot (not aligned, no such descriptor) or the kernel
  // refused, and then the caller reads them through the cache.
  bool ReadPastCache(uint64_t pos, std::span<std::byte> buf);
  // ReadPastCache of every aligned piece at once (Linux AIO, 32 at a time);
  // sets done[i] for each piece read whole and returns how many. The
  // others are left for ReadPastCache or Read one by one.
  size_t ReadPastCacheAtOnce(std::span<const ReadPiece> pieces, std::vector<bool>* done);

  struct Mapping {
    const std::byte* base = nullptr;
    uint64_t len = 0;
  };

  const int fd_;
  // The file again with O_DIRECT (read-only when the device is), for
  // ReadPastCache and WritePastCache; -1 when fd_ is O_DIRECT already or
  // the file system refused (set at Open).
  int bypass_fd_ = -1;
  bool bypass_writes_ = false;  // bypass_fd_ is open for writing
  // Cleared if a read or write through bypass_fd_ fails after all
  // (EINVAL: the file system wants a larger alignment than 4 KiB).
  std::atomic<bool> bypass_{true};
  std::atomic<uint64_t> at_once_{0};  // pieces_read_at_once()
  const Geometry geometry_;
  const bool direct_;
  const bool is_blockdev_;
  bool fixed_size_ = false;  // set before use, read-only after
  // Copy() may reflink. Cleared if the file system refuses one after all.
  std::atomic<bool> clone_{false};
  uint64_t clone_align_ = 4096;  // the file system's block size
  // CachedAt() may ask cachestat(2). Cleared once the kernel does not tell.
  std::atomic<bool> cachestat_{true};
  uint64_t read_around_ = 0;  // set before use, read-only after
  // ReadAround() may probe with preadv2(RWF_NOWAIT). Cleared once the file
  // system refuses it (it then probes with CachedAt()).
  std::atomic<bool> nowait_{true};
  // The longest mapping of the file, read by ReadPieces without a lock.
  // Grow() maps the file again, longer, and earlier mappings stay until
  // the device closes: a reader may still be copying out of one.
  std::atomic<const Mapping*> mapping_{nullptr};
  Mutex mappings_mu_;
  std::vector<std::unique_ptr<Mapping>> mappings_ GUARDED_BY(mappings_mu_);
};

}  // namespace thinfs

#endif  // THINFS_CORE_BLOCK_DEVICE_H_
