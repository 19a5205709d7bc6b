// BitmapSpaceMap: the SpaceMap of a pool, kept in the mmapped file
// pool/bitmap (format: the "Bitmap file" section of meta/format.h).
//
// One bit per data block. Allocate() sets the bit in the shared mapping at
// once, so the kernel may write it back at any time; Free() only queues the
// block, whose bit stays set until Release() after the metadata commit.
// After any crash the file therefore over-reports, never under-reports
// (DESIGN.md invariant 6).
//
// Allocation searches 64-bit words from a rotating cursor that continues
// after the last allocated block and wraps around, so sequential allocation
// is O(1) amortised.
//
// Lifecycle of a writer: Create() or Open(); MarkDirty() before the first
// change; Sync(generation) at every commit; MarkClean(generation) at clean
// shutdown. Changing bits while the header says clean is a bug
// (THINFS_CHECK): the body checksum would go stale.
//
// Thread safety: all methods may be called concurrently. Sync, MarkDirty,
// MarkClean and Grow are serialised among themselves and run their msync
// without blocking Allocate/Free.

#ifndef THINFS_META_BITMAP_SPACE_MAP_H_
#define THINFS_META_BITMAP_SPACE_MAP_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "core/space_map.h"
#include "core/status.h"
#include "core/types.h"
#include "meta/format.h"

namespace thinfs::meta {

class BitmapSpaceMap final : public SpaceMap {
 public:
  // Creates `path` for `blocks` blocks of `block_size`, all free, with a
  // clean header at generation 0, and makes it durable (fsync of the file
  // and its directory).
  // Returns kExists if the file exists, kInvalidArgument for an illegal
  // block size, kIOError (with errno) otherwise.
  static Result<std::unique_ptr<BitmapSpaceMap>> Create(const std::string& path, uint64_t blocks,
                                                        uint64_t block_size);

  // Opens an existing bitmap. Verifies magic, header checksum, format
  // version, incompat flags, geometry (against the superblock's values),
  // file length and, when the header says clean, the body checksum.
  // read_only maps PROT_READ; mutating a read-only map is a bug.
  // Returns kNotFound; kCorruption naming what was expected and what was
  // found ("bitmap header checksum mismatch: expected 0x..., found 0x...");
  // kNotSupported for an unknown format version or incompat flag;
  // kInvalidArgument on geometry mismatch (a block size other than
  // expected, fewer blocks than expected; more blocks are accepted: a grow
  // interrupted before the superblock's commit); kIOError.
  static Result<std::unique_ptr<BitmapSpaceMap>> Open(const std::string& path,
                                                      uint64_t expected_blocks,
                                                      uint64_t expected_block_size, bool read_only);

  // Unmaps without writing anything: dropping the object is what a crash
  // looks like to the file (minus pages the kernel has not written back).
  ~BitmapSpaceMap() override;
  BitmapSpaceMap(const BitmapSpaceMap&) = delete;
  BitmapSpaceMap& operator=(const BitmapSpaceMap&) = delete;

  // SpaceMap. Mutators (Allocate, Free, Release, MarkUsed,
  // ClearAllForRebuild) REQUIRE a writable map whose header is dirty
  // (MarkDirty() called); Allocate on a read-only map returns kReadOnly.
  // Block arguments REQUIRE block < total_blocks().
  Result<PoolBlock> Allocate() override;
  Result<PoolBlock> AllocateRun(uint64_t max, uint64_t* count) override;
  void Unallocate(PoolBlock first, uint64_t count) override;
  // REQUIRES: block is allocated and not already queued or taken.
  void Free(PoolBlock block) override;
  std::vector<PoolBlock> TakePendingFrees() override;
  // REQUIRES: every block came from TakePendingFrees() and is not yet
  // released.
  void Release(const std::vector<PoolBlock>& blocks) override;
  // msyncs the body, then writes `generation` into the header and starts
  // the header's write-back without waiting for it (after a crash the
  // header may lag the metadata, which CheckBitmapGeneration accepts).
  // When no bit changed since the last successful Sync (or since Open or
  // MarkDirty), the file already holds every bit: only the header is
  // written.
  // Returns kReadOnly on a read-only map, kIOError on msync failure.
  Status Sync(uint64_t generation) override;
  // Idempotent: a block that is already used stays used.
  void MarkUsed(PoolBlock block) override;
  // Clears every bit, forgets queued frees and resets the cursor.
  // REQUIRES: no frees taken by TakePendingFrees() await Release().
  void ClearAllForRebuild() override;
  // Pending-free blocks are still allocated.
  bool IsAllocated(PoolBlock block) const override;
  uint64_t total_blocks() const override;
  uint64_t free_blocks() const override;

  // The clean flag as found at Open (true after Create).
  bool was_clean() const override { return was_clean_; }

  // Clears the clean flag in the header and msyncs it; only then may bits
  // change. No-op when already dirty.
  // Returns kReadOnly on a read-only map, kIOError on msync failure.
  Status MarkDirty() override;

  // Clean shutdown: msyncs the body, then writes `generation`, the body
  // checksum and the clean flag into the header and msyncs it. Bits must
  // not change afterwards until MarkDirty().
  // Frees queued or taken but not yet released stay allocated in the file
  // (a leak that check reclaims); releasing them afterwards is a bug.
  // Returns kReadOnly on a read-only map, kIOError on msync failure.
  Status MarkClean(uint64_t generation) override;

  // The generation of the last Sync/MarkClean, or as found at Open.
  uint64_t generation() const;

  // Extends the file and the mapping to `new_blocks`; the new blocks are
  // free. The file is extended and fsynced before the header names the new
  // size. Works on a clean or dirty map (a clean one stays clean with the
  // new body checksum).
  // Returns kInvalidArgument when new_blocks < total_blocks(), kReadOnly on
  // a read-only map, kNoSpace or kIOError when the file cannot grow.
  Status Grow(uint64_t new_blocks) override;

  const std::string& path() const { return path_; }

 private:
  BitmapSpaceMap(std::string path, int fd, bool read_only, uint64_t block_size, std::byte* base,
                 uint64_t map_len, uint64_t nr_blocks, uint64_t generation, bool clean);

  // Allocate() with mu_ held (AllocateRun takes its first block so).
  Result<PoolBlock> AllocateLocked() REQUIRES(mu_);
  uint64_t Word(uint64_t i) const REQUIRES(mu_);
  void SetWord(uint64_t i, uint64_t w) REQUIRES(mu_);
  bool TestBit(uint64_t block) const REQUIRES(mu_);
  // XXH64 of the body bytes that cover `nr_blocks` blocks.
  uint64_t BodyChecksum(uint64_t nr_blocks) const REQUIRES(mu_);
  using HeaderPage = std::array<std::byte, kBitmapHeaderSize>;
  // The header page for `clean`, `nr_blocks` and `generation` (a clean
  // one with the checksum of the body's current bytes), encoded in memory.
  HeaderPage EncodeHeaderPage(bool clean, uint64_t nr_blocks, uint64_t generation) const
      REQUIRES(mu_);
  // Writes `page` over the file's header with one pwrite, never through
  // the mapping. A process that dies in a write(2) of one page leaves the
  // page cache holding the old page or the new one; one killed among its
  // stores into the mapping leaves what it had stored, a zeroed or half
  // sealed header that no open accepts, and the kernel writes that back.
  // Does not sync. REQUIRES: sync_mu_ held, or the map not yet shared.
  Status WriteHeaderPage(const HeaderPage& page) const;
  // msync of [offset, offset + len) of the mapping (page-aligned outward).
  static Status MsyncRange(std::byte* base, uint64_t offset, uint64_t len);

  // Constant after construction.
  const std::string path_;
  const int fd_;
  const bool read_only_;
  const uint64_t block_size_;
  const bool was_clean_;

  // Serialises Sync, MarkDirty, MarkClean and Grow, which rewrite the header
  // page and (Grow) move the mapping. Held across their msync, which it
  // must cover so that two header writes never race one write-back; the
  // allocation path never takes it. Lock order: sync_mu_ before mu_.
  Mutex sync_mu_ ACQUIRED_BEFORE(mu_);

  // Guards the mapping and all allocation state. Never held across msync.
  mutable Mutex mu_;
  std::byte* base_ GUARDED_BY(mu_);  // the whole file, header page first
  uint64_t map_len_ GUARDED_BY(mu_);
  uint64_t nr_blocks_ GUARDED_BY(mu_);
  uint64_t nr_words_ GUARDED_BY(mu_);
  // Padding bits of the last word, forced to "used" when searching.
  uint64_t tail_mask_ GUARDED_BY(mu_);
  uint64_t free_blocks_ GUARDED_BY(mu_);
  // Next block to try; the search continues from here and wraps.
  uint64_t cursor_ GUARDED_BY(mu_) = 0;
  uint64_t generation_ GUARDED_BY(mu_);
  // In-core copy of the header's clean flag; true freezes the body.
  bool clean_ GUARDED_BY(mu_);
  // 1 bit per block queued by Free() and not yet Release()d; catches double
  // frees without touching the file.
  std::vector<uint64_t> pending_bits_ GUARDED_BY(mu_);
  // Queued by Free(), not yet taken by TakePendingFrees().
  std::vector<PoolBlock> queued_ GUARDED_BY(mu_);
  // Taken by TakePendingFrees(), not yet Release()d.
  uint64_t in_flight_ GUARDED_BY(mu_) = 0;
  // A bit changed (SetWord) since the last successful Sync began; false
  // lets Sync skip its msyncs.
  bool changed_since_sync_ GUARDED_BY(mu_) = false;
};

}  // namespace thinfs::meta

#endif  // THINFS_META_BITMAP_SPACE_MAP_H_
