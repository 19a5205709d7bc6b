// DeferredCopies: copy-on-write whose copy is made at the next commit.
//
// A partial write to a shared block used to read the whole old block, merge
// the write and write the whole new block before the write returned: with
// 64 KiB blocks, a 4 KiB random write into a snapshot cost a random 64 KiB
// read. Here the write only writes its own bytes into the new block and
// records what the block still owes: the sectors not written yet, which
// still read from the old block ("source"). Reads of the new block take
// each sector from where it currently is. Commit() completes every owed
// copy, sorted by source block (mostly sequential reads), before its data
// sync, so a committed mapping always points at a complete block and the
// on-disk format is unchanged: a crash loses the owed copies together with
// the uncommitted mappings that needed them.
//
// Why the source block stays intact until its copy is made: a copy is owed
// only between the write that started it and the commit that follows.
// Blocks freed meanwhile go back to the allocator only after that commit
// (SpaceMap), and a block is written in place only by a device owning it
// alone, at its current epoch, with every committed count agreeing — never
// the source of an uncommitted copy-on-write (Pool::Impl::WriteBlock).
//
// A block is split into at most 64 sectors (of at least 4 KiB); a sector is
// either all new data or all source. A write that covers part of a sector
// still owed copies the rest of that sector from the source first.
//
// Held copies: while the table holds fewer than `held_capacity` of them, an
// owed copy keeps its written sectors in a block-sized buffer in memory
// instead of writing them into the new block, and the copy writes the whole
// block in one piece (source sectors and held ones). A block written in one
// aligned piece is cached by the host as one large folio; written in two
// (the write's sectors, then the rest) ext4 caches it as up to five, and
// every later cached read of it copies folio by folio (docs/benchmarks.md,
// levers 20, 29 and 31). The write itself then costs a memcpy, not a
// pwrite. Not where copies share data (a reflink's clone keeps the layout
// of the source): those write through as before.
//
// Thread safety: all methods may be called concurrently. Each owed copy has
// a mutex, held across its I/O; it is a leaf lock (nothing is locked while
// it is held). Callers serialise writes to one block (the stripe lock), as
// for BlockDevice.

#ifndef THINFS_CORE_DEFERRED_COPY_H_
#define THINFS_CORE_DEFERRED_COPY_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block_device.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs {

class DeferredCopies {
 public:
  // `capacity`: how many copies may be owed at once (0: none, every
  // copy-on-write copies at once). `held_capacity`: how many of them may
  // hold their written sectors in memory (a block-sized buffer each) until
  // the copy is made; 0: every owed copy writes through.
  DeferredCopies(BlockDevice* data, uint64_t block_size, size_t capacity,
                 size_t held_capacity = 0);
  ~DeferredCopies();
  DeferredCopies(const DeferredCopies&) = delete;
  DeferredCopies& operator=(const DeferredCopies&) = delete;

  // Copies owed now, and how many of them hold their sectors in memory.
  size_t size() const { return count_.load(std::memory_order_acquire); }
  size_t held() const;
  size_t capacity() const { return capacity_; }
  // Whether Start() may be called (the table is not full).
  bool HasRoom() const { return size() < capacity_; }
  // Bytes per sector.
  uint64_t sector_size() const { return sector_; }

  // Writes `buf` at `offset` into `block`, a block just allocated whose
  // other bytes are to be those of `source`, and records the copy as owed.
  // Bytes of partly written sectors are copied from `source` now. A held
  // copy (see above) keeps all of it in memory: nothing reaches `block`
  // before the copy is made, or before in-place writes cover every sector.
  // REQUIRES: HasRoom(); `block` not yet visible to any reader; `source` is
  // not itself owing a copy (Owes(source) is false).
  Status Start(PoolBlock block, PoolBlock source, uint64_t offset,
               std::span<const std::byte> buf);

  // Whether `block` still owes a copy.
  bool Owes(PoolBlock block) const;

  // Reads `block` as its contents are meant to be: sectors not yet copied
  // from the source. `around`: where the block owes no copy, the data
  // device may read around the read (BlockDevice::ReadAround, lever 44);
  // a block that owes one is not in the data area yet.
  Status Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf, bool around = false);

  // Writes in place into `block`; sectors it covers no longer owe a copy
  // (the rest of a partly covered one is copied first).
  Status Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf);

  // `block` was freed: nothing is owed for it any more.
  void Drop(PoolBlock block);

  // Makes every copy owed when it is called, in source order (a held copy
  // in one whole-block write). Copies
  // started meanwhile may or may not be made. On error the copies not made
  // stay owed (and readable). The commit calls it, and the pool's
  // background copier between commits; calls may overlap, and each copy
  // is made once. `made`, if given, is raised by the copies this call
  // made (not those an overlapping call made).
  Status CompleteAll(uint64_t* made = nullptr);

  // Copies made so far by CompleteAll() (statistics).
  uint64_t completed() const { return completed_.load(std::memory_order_relaxed); }

 private:
  struct Owed;
  struct Shard {
    Mutex mu;
    std::unordered_map<uint64_t, std::shared_ptr<Owed>> owed GUARDED_BY(mu);
  };
  static constexpr size_t kShards = 16;

  Shard& ShardOf(PoolBlock b) const {
    return shards_[(b.value * 0x9E3779B97F4A7C15ULL >> 60) % kShards];
  }
  std::shared_ptr<Owed> Find(PoolBlock block) const;
  // Removes `o` from the table (if still there).
  void Erase(const Owed& o);
  // The sector holding byte `offset` of a block, and where sector k ends.
  uint64_t SectorOf(uint64_t offset) const { return offset / sector_; }
  uint64_t SectorEnd(uint64_t k) const;
  // Writes buf into o.block and marks its sectors, copying the uncovered
  // parts of partly covered sectors still owed from the source.
  // REQUIRES: o.mu held, the copy not yet made.
  Status WriteLocked(Owed& o, uint64_t offset, std::span<const std::byte> buf);
  // Copies every sector still owed. REQUIRES: o.mu held.
  Status CompleteLocked(Owed& o, std::vector<std::byte>* scratch);
  // The same for a held copy: the block in one write, then its buffer
  // freed. REQUIRES: o.mu held, o.held set.
  Status CompleteHeldLocked(Owed& o, std::vector<std::byte>* scratch);
  // A held copy whose sectors are all written: writes its buffer into the
  // block and frees it. REQUIRES: o.mu held, o.written == all_.
  Status FlushHeldLocked(Owed& o);
  // Frees o's buffer, if it has one. REQUIRES: o.mu held.
  void ReleaseHeldLocked(Owed& o);
  // A free block-sized buffer, from a new slab if none is free; null when
  // all held_capacity_ buffers are in use or memory is short.
  std::byte* TakeBuffer();

  BlockDevice* const data_;
  const uint64_t block_size_;
  const uint64_t sector_;
  const uint64_t sectors_;
  const uint64_t all_;  // mask with every sector set
  const size_t capacity_;
  const size_t held_capacity_;
  mutable std::array<Shard, kShards> shards_;
  std::atomic<size_t> count_{0};
  // The buffers of held copies come from slabs of kSlabBuffers, mapped
  // with their pages faulted in and kept until destruction (at most
  // held_capacity_ buffers in all): each page a copy touched first in
  // fresh memory from the allocator would cost a page fault, on the test
  // VM more than the write itself (docs/benchmarks.md, lever 31).
  // Lock order: a leaf, taken with or without an Owed's mutex held.
  static constexpr size_t kSlabBuffers = 16;
  mutable Mutex free_mu_;
  std::vector<std::pair<void*, size_t>> slabs_ GUARDED_BY(free_mu_);  // address, bytes
  size_t slab_buffers_ GUARDED_BY(free_mu_) = 0;
  std::vector<std::byte*> free_ GUARDED_BY(free_mu_);
  std::atomic<uint64_t> completed_{0};
};

}  // namespace thinfs

#endif  // THINFS_CORE_DEFERRED_COPY_H_
