// Forwarders that let a test keep ownership of a pool's components across a
// simulated crash: the Pool owns the forwarder, the test owns the target.

#ifndef THINFS_TESTS_UTIL_FORWARDING_H_
#define THINFS_TESTS_UTIL_FORWARDING_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "core/block_device.h"
#include "core/metadata.h"
#include "core/space_map.h"

namespace thinfs::testing {

class ForwardingBlockDevice final : public BlockDevice {
 public:
  explicit ForwardingBlockDevice(BlockDevice* t) : t_(t) {}
  Status Read(PoolBlock b, uint64_t o, std::span<std::byte> buf) override {
    reads.fetch_add(1, std::memory_order_relaxed);
    return t_->Read(b, o, buf);
  }
  Status Write(PoolBlock b, uint64_t o, std::span<const std::byte> buf) override {
    if (before_write) {
      std::function<void()> hook = std::move(before_write);
      before_write = nullptr;
      hook();
    }
    if (each_write) each_write();
    if (record_writes) {
      std::lock_guard<std::mutex> l(writes_mu);
      writes.push_back(WriteIo{b.value, o, buf.size()});
    }
    return t_->Write(b, o, buf);
  }
  Status Sync() override { return t_->Sync(); }
  Status Discard(PoolBlock b, uint64_t n) override { return t_->Discard(b, n); }
  Status WriteZeroes(PoolBlock b, uint64_t n) override { return t_->WriteZeroes(b, n); }
  void Prefetch(PoolBlock b, uint64_t n) override {
    {
      std::lock_guard<std::mutex> l(prefetch_mu);
      prefetched_ahead.emplace_back(b.value, n);
    }
    t_->Prefetch(b, n);
  }
  bool PrefetchForRead(std::span<const Run> runs, uint64_t head,
                       std::span<std::byte> scratch) override {
    {
      std::lock_guard<std::mutex> l(prefetch_mu);
      for (const Run& r : runs) {
        prefetched.emplace_back(r.first.value, r.count);
        reads_before_prefetch.push_back(reads.load(std::memory_order_relaxed));
      }
      prefetch_reads.emplace_back(head, scratch.size());
    }
    return t_->PrefetchForRead(runs, head, scratch) || report_cold;
  }
  Status ReadAround(PoolBlock b, uint64_t o, std::span<std::byte> buf) override {
    {
      std::lock_guard<std::mutex> l(prefetch_mu);
      read_arounds.push_back(ReadAroundCall{b.value, o, buf.size()});
    }
    reads.fetch_add(1, std::memory_order_relaxed);
    return t_->ReadAround(b, o, buf);
  }
  // Block by block through this forwarder (BlockDevice's default), so that
  // `reads` counts them; the cache each call was given is recorded.
  Status ReadPieces(std::span<const ReadPiece> pieces, Cache cache) override {
    {
      std::lock_guard<std::mutex> l(prefetch_mu);
      piece_caches.push_back(cache);
    }
    return BlockDevice::ReadPieces(pieces, cache);
  }
  void StartWriteback(std::span<const Run> runs) override {
    {
      std::lock_guard<std::mutex> l(prefetch_mu);
      for (const Run& r : runs) written_back.emplace_back(r.first.value, r.count);
    }
    t_->StartWriteback(runs);
  }
  // With writes_past_cache, the pool's writes past the host's cache are
  // recorded in past_cache_writes and reach the target block by block as
  // plain writes (a MemBlockDevice has no cache to go past); otherwise they
  // are the target's.
  Result<bool> WritePastCache(PoolBlock b, uint64_t o, std::span<const std::byte> buf) override {
    if (!writes_past_cache) return t_->WritePastCache(b, o, buf);
    if (during_past_write) {
      std::function<void()> hook = std::move(during_past_write);
      during_past_write = nullptr;
      hook();
    }
    {
      std::lock_guard<std::mutex> l(writes_mu);
      past_cache_writes.push_back(WriteIo{b.value, o, buf.size()});
    }
    const uint64_t bs = t_->geometry().block_size();
    for (uint64_t done = 0; done < buf.size();) {
      const uint64_t pos = o + done;
      const uint64_t n = std::min<uint64_t>(bs - pos % bs, buf.size() - done);
      THINFS_RETURN_IF_ERROR(t_->Write(PoolBlock(b.value + pos / bs), pos % bs, buf.subspan(done, n)));
      done += n;
    }
    return true;
  }
  bool RunsCached(std::span<const Run> runs) override {
    return report_cached || (!report_cold && t_->RunsCached(runs));
  }
  bool CanReadPastCache() const override { return reads_past_cache || t_->CanReadPastCache(); }
  Status Copy(PoolBlock from, PoolBlock to, uint64_t o, uint64_t n) override {
    return t_->Copy(from, to, o, n);
  }
  bool SharesCopies() const override { return shares_copies || t_->SharesCopies(); }
  Status Grow(uint64_t n) override { return t_->Grow(n); }
  const Geometry& geometry() const override { return t_->geometry(); }

  // Run once, at the start of the next Write, before it reaches the target
  // (a test's way to act in the middle of an engine write). Set it only
  // while no write is running.
  std::function<void()> before_write;
  // Run at the start of every Write, from the writing thread. Set it only
  // while no write is running.
  std::function<void()> each_write;
  // Reads that reached the device through this forwarder (not those a
  // Copy() makes inside the target).
  std::atomic<uint64_t> reads{0};
  // Every PrefetchForRead hint as (first pool block, count), and how many reads
  // had reached the device when it came.
  std::mutex prefetch_mu;
  std::vector<std::pair<uint64_t, uint64_t>> prefetched;
  std::vector<uint64_t> reads_before_prefetch;
  // Per PrefetchForRead call: (head, scratch size).
  std::vector<std::pair<uint64_t, size_t>> prefetch_reads;
  // Every Prefetch hint (the engine's readahead) as (first pool block, count).
  std::vector<std::pair<uint64_t, uint64_t>> prefetched_ahead;
  // Every ReadAround call as (pool block, offset, length).
  struct ReadAroundCall {
    uint64_t block, offset, len;
    bool operator==(const ReadAroundCall&) const = default;
  };
  std::vector<ReadAroundCall> read_arounds;
  // The cache given to each ReadPieces call.
  std::vector<Cache> piece_caches;
  // Every StartWriteback hint's runs as (first pool block, count).
  std::vector<std::pair<uint64_t, uint64_t>> written_back;
  // PrefetchForRead reports every read not cached, as a cold page cache
  // would (the target may be a MemBlockDevice, which hints nothing), and
  // RunsCached says not cached.
  bool report_cold = false;
  // RunsCached says cached, as a warm page cache would.
  bool report_cached = false;
  // Claim that ReadPieces can read past the host's cache (ReadCache::kReader
  // reads then take that path over a MemBlockDevice, which cannot).
  bool reads_past_cache = false;
  // Claim that copies share data, like a reflinking file system: the
  // engine then never reads a copy's source itself.
  bool shares_copies = false;
  // With record_writes set, every Write that reaches the target through
  // this forwarder as (pool block, offset, length).
  struct WriteIo {
    uint64_t block, offset, len;
    bool operator==(const WriteIo&) const = default;
  };
  bool record_writes = false;
  std::mutex writes_mu;
  std::vector<WriteIo> writes;
  // Claim to write past the host's cache (WritePastCache above); every such
  // write as (pool block, offset, length), under writes_mu.
  bool writes_past_cache = false;
  std::vector<WriteIo> past_cache_writes;
  // Run once, from the writing thread, at the start of the next
  // WritePastCache (writes_past_cache set), before anything is written. Set
  // it only while no write is running.
  std::function<void()> during_past_write;

 private:
  BlockDevice* const t_;
};

class ForwardingSpaceMap final : public SpaceMap {
 public:
  explicit ForwardingSpaceMap(SpaceMap* t) : t_(t) {}
  Result<PoolBlock> Allocate() override { return t_->Allocate(); }
  Result<PoolBlock> AllocateRun(uint64_t max, uint64_t* count) override {
    return t_->AllocateRun(max, count);
  }
  void Unallocate(PoolBlock first, uint64_t count) override { t_->Unallocate(first, count); }
  void Free(PoolBlock b) override { t_->Free(b); }
  std::vector<PoolBlock> TakePendingFrees() override { return t_->TakePendingFrees(); }
  void Release(const std::vector<PoolBlock>& b) override { t_->Release(b); }
  Status Sync(uint64_t g) override { return t_->Sync(g); }
  void MarkUsed(PoolBlock b) override { t_->MarkUsed(b); }
  void ClearAllForRebuild() override { t_->ClearAllForRebuild(); }
  bool was_clean() const override { return t_->was_clean(); }
  Status MarkDirty() override { return t_->MarkDirty(); }
  Status MarkClean(uint64_t g) override { return t_->MarkClean(g); }
  Status Grow(uint64_t n) override { return t_->Grow(n); }
  bool IsAllocated(PoolBlock b) const override { return t_->IsAllocated(b); }
  uint64_t total_blocks() const override { return t_->total_blocks(); }
  uint64_t free_blocks() const override { return t_->free_blocks(); }

 private:
  SpaceMap* const t_;
};

class ForwardingMetadataStore final : public MetadataStore {
 public:
  explicit ForwardingMetadataStore(MetadataStore* t) : t_(t) {}
  Result<Superblock> ReadSuperblock() override { return t_->ReadSuperblock(); }
  Result<std::vector<DeviceRecord>> LoadDevices() override { return t_->LoadDevices(); }
  Result<std::optional<Version>> FindVersion(VolumeId d, VolumeBlock b, Epoch e) override {
    return t_->FindVersion(d, b, e);
  }
  Result<std::vector<Version>> ListVersions(VolumeId d, VolumeBlock b) override {
    return t_->ListVersions(d, b);
  }
  Result<uint32_t> GetRefcount(PoolBlock b) override { return t_->GetRefcount(b); }
  Result<std::vector<std::pair<PoolBlock, uint32_t>>> ListRefcounts() override {
    return t_->ListRefcounts();
  }
  std::unique_ptr<MapIterator> NewMapIterator() override { return t_->NewMapIterator(); }
  std::unique_ptr<MapIterator> NewMapIteratorSkippingDamaged(
      std::function<void(const DamagedMapRecord&)> on_damaged) override {
    return t_->NewMapIteratorSkippingDamaged(std::move(on_damaged));
  }
  Status Commit(const MetaBatch& b, bool sync) override { return t_->Commit(b, sync); }
  Result<uint64_t> MapBytesOnDisk(bool c) override { return t_->MapBytesOnDisk(c); }

 private:
  MetadataStore* const t_;
};

}  // namespace thinfs::testing

#endif  // THINFS_TESTS_UTIL_FORWARDING_H_
