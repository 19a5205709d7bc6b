#include "core/deferred_copy.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace thinfs {

namespace {

constexpr uint64_t kMaxSectors = 64;

uint64_t Bit(uint64_t k) { return uint64_t{1} << k; }

// The smallest multiple of 4 KiB that splits a block into at most 64.
uint64_t SectorSizeFor(uint64_t block_size) {
  const uint64_t pages = (block_size + kMinBlockSize - 1) / kMinBlockSize;
  return kMinBlockSize * ((pages + kMaxSectors - 1) / kMaxSectors);
}

}  // namespace

struct DeferredCopies::Owed {
  Owed(PoolBlock b, PoolBlock s) : block(b), source(s) {}
  const PoolBlock block;
  const PoolBlock source;
  Mutex mu;
  uint64_t written GUARDED_BY(mu) = 0;  // bit k: sector k holds its data
  bool done GUARDED_BY(mu) = false;     // nothing owed: read `block` as is
  // A held copy's block as it is meant to be, for the sectors in `written`
  // (the others are unset); null: written sectors are in `block`.
  std::byte* held GUARDED_BY(mu) = nullptr;  // one of the slabs' buffers
};

DeferredCopies::DeferredCopies(BlockDevice* data, uint64_t block_size, size_t capacity,
                               size_t held_capacity)
    : data_(data),
      block_size_(block_size),
      sector_(SectorSizeFor(block_size)),
      sectors_((block_size + sector_ - 1) / sector_),
      all_(sectors_ == 64 ? ~uint64_t{0} : Bit(sectors_) - 1),
      capacity_(capacity),
      held_capacity_(std::min(held_capacity, capacity)) {}

DeferredCopies::~DeferredCopies() {
  MutexLock l(&free_mu_);
  for (const auto& [addr, len] : slabs_) ::munmap(addr, len);
}

uint64_t DeferredCopies::SectorEnd(uint64_t k) const {
  return std::min((k + 1) * sector_, block_size_);
}

std::shared_ptr<DeferredCopies::Owed> DeferredCopies::Find(PoolBlock block) const {
  if (count_.load(std::memory_order_acquire) == 0) return nullptr;
  Shard& s = ShardOf(block);
  MutexLock l(&s.mu);
  auto it = s.owed.find(block.value);
  return it == s.owed.end() ? nullptr : it->second;
}

void DeferredCopies::Erase(const Owed& o) {
  Shard& s = ShardOf(o.block);
  MutexLock l(&s.mu);
  auto it = s.owed.find(o.block.value);
  if (it == s.owed.end() || it->second.get() != &o) return;
  s.owed.erase(it);
  count_.fetch_sub(1, std::memory_order_acq_rel);
}

bool DeferredCopies::Owes(PoolBlock block) const { return Find(block) != nullptr; }

Status DeferredCopies::WriteLocked(Owed& o, uint64_t offset, std::span<const std::byte> buf) {
  o.mu.AssertHeld();
  if (buf.empty()) return Status::Ok();
  const uint64_t end = offset + buf.size();
  const uint64_t first = SectorOf(offset);
  const uint64_t last = SectorOf(end - 1);
  std::byte* const held = o.held;
  // Copies [from, to) of the source into the block (into the buffer of a
  // held copy).
  auto copy = [&](uint64_t from, uint64_t to) -> Status {
    if (held != nullptr) {
      return data_->Read(o.source, from, std::span<std::byte>(held + from, to - from));
    }
    return data_->Copy(o.source, o.block, from, to - from);
  };
  for (uint64_t k : {first, last}) {
    if (o.written & Bit(k)) continue;
    const uint64_t s = k * sector_;
    const uint64_t e = SectorEnd(k);
    if (k == first && offset > s) THINFS_RETURN_IF_ERROR(copy(s, offset));
    if (k == last && end < e) THINFS_RETURN_IF_ERROR(copy(end, e));
    if (first == last) break;
  }
  if (held != nullptr) {
    std::memcpy(held + offset, buf.data(), buf.size());
  } else {
    THINFS_RETURN_IF_ERROR(data_->Write(o.block, offset, buf));
  }
  for (uint64_t k = first; k <= last; ++k) o.written |= Bit(k);
  return Status::Ok();
}

Status DeferredCopies::FlushHeldLocked(Owed& o) {
  o.mu.AssertHeld();
  THINFS_CHECK(o.written == all_);
  THINFS_RETURN_IF_ERROR(
      data_->Write(o.block, 0, std::span<const std::byte>(o.held, block_size_)));
  ReleaseHeldLocked(o);
  return Status::Ok();
}

void DeferredCopies::ReleaseHeldLocked(Owed& o) {
  o.mu.AssertHeld();
  if (o.held == nullptr) return;
  MutexLock l(&free_mu_);
  free_.push_back(o.held);
  o.held = nullptr;
}

std::byte* DeferredCopies::TakeBuffer() {
  MutexLock l(&free_mu_);
  if (free_.empty()) {
    // A slab of up to kSlabBuffers buffers, its pages faulted in by the
    // mmap itself (one system call, not a trap per page).
    const size_t n = std::min(kSlabBuffers, held_capacity_ - slab_buffers_);
    if (n == 0) return nullptr;
    const size_t len = n * block_size_;
    void* addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (addr == MAP_FAILED) return nullptr;  // no memory: write through
    slabs_.emplace_back(addr, len);
    slab_buffers_ += n;
    for (size_t i = n; i-- > 0;) free_.push_back(static_cast<std::byte*>(addr) + i * block_size_);
  }
  std::byte* b = free_.back();
  free_.pop_back();
  return b;
}

size_t DeferredCopies::held() const {
  MutexLock l(&free_mu_);
  return slab_buffers_ - free_.size();
}

Status DeferredCopies::Start(PoolBlock block, PoolBlock source, uint64_t offset,
                             std::span<const std::byte> buf) {
  auto o = std::make_shared<Owed>(block, source);
  {
    MutexLock l(&o->mu);
    if (held_capacity_ > 0 && !data_->SharesCopies()) o->held = TakeBuffer();
    Status s = WriteLocked(*o, offset, buf);
    if (s.ok() && o->written == all_) {
      // The write and its edges covered every sector.
      if (o->held != nullptr) s = FlushHeldLocked(*o);
      o->done = true;
    }
    if (!s.ok() || o->done) {
      ReleaseHeldLocked(*o);
      return s;
    }
  }
  Shard& s = ShardOf(block);
  MutexLock l(&s.mu);
  s.owed[block.value] = std::move(o);
  count_.fetch_add(1, std::memory_order_acq_rel);
  return Status::Ok();
}

Status DeferredCopies::Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf,
                            bool around) {
  std::shared_ptr<Owed> o = Find(block);
  if (!o) return around ? data_->ReadAround(block, offset, buf) : data_->Read(block, offset, buf);
  MutexLock l(&o->mu);
  if (o->done) return data_->Read(block, offset, buf);
  const uint64_t end = offset + buf.size();
  uint64_t pos = offset;
  while (pos < end) {
    // The run of sectors from pos that read from the same place.
    const bool written = o->written & Bit(SectorOf(pos));
    uint64_t run_end = SectorEnd(SectorOf(pos));
    while (run_end < end && static_cast<bool>(o->written & Bit(SectorOf(run_end))) == written) {
      run_end = SectorEnd(SectorOf(run_end));
    }
    run_end = std::min(run_end, end);
    std::span<std::byte> out = buf.subspan(pos - offset, run_end - pos);
    if (written && o->held != nullptr) {
      std::memcpy(out.data(), o->held + pos, out.size());
    } else {
      THINFS_RETURN_IF_ERROR(data_->Read(written ? o->block : o->source, pos, out));
    }
    pos = run_end;
  }
  return Status::Ok();
}

Status DeferredCopies::Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf) {
  std::shared_ptr<Owed> o = Find(block);
  if (!o) return data_->Write(block, offset, buf);
  {
    MutexLock l(&o->mu);
    if (o->done) return data_->Write(block, offset, buf);
    THINFS_RETURN_IF_ERROR(WriteLocked(*o, offset, buf));
    if (o->written != all_) return Status::Ok();
    // In-place writes filled every sector: nothing is owed. A held copy
    // writes its block now. If that fails, the write itself is in the
    // buffer and reads show it: the block stays owed like any copy that
    // failed, and the commit that makes it again reports the error.
    if (o->held != nullptr && !FlushHeldLocked(*o).ok()) return Status::Ok();
    o->done = true;
  }
  Erase(*o);
  return Status::Ok();
}

void DeferredCopies::Drop(PoolBlock block) {
  std::shared_ptr<Owed> o = Find(block);
  if (!o) return;
  {
    MutexLock l(&o->mu);
    o->done = true;
    ReleaseHeldLocked(*o);
  }
  Erase(*o);
}

Status DeferredCopies::CompleteLocked(Owed& o, std::vector<std::byte>* scratch) {
  o.mu.AssertHeld();
  if (o.held != nullptr) return CompleteHeldLocked(o, scratch);
  // Where copies share data, each run of owed sectors is one Copy();
  // otherwise one read of the whole source block (sequential in source
  // order, which is how CompleteAll goes), then only the sectors still owed
  // are written.
  const bool share = data_->SharesCopies();
  if (!share) {
    scratch->resize(block_size_);
    THINFS_RETURN_IF_ERROR(data_->Read(o.source, 0, *scratch));
  }
  uint64_t k = 0;
  while (k < sectors_) {
    if (o.written & Bit(k)) {
      ++k;
      continue;
    }
    uint64_t j = k;
    while (j < sectors_ && !(o.written & Bit(j))) ++j;
    const uint64_t from = k * sector_;
    const uint64_t to = SectorEnd(j - 1);
    THINFS_RETURN_IF_ERROR(
        share ? data_->Copy(o.source, o.block, from, to - from)
              : data_->Write(o.block, from,
                             std::span<const std::byte>(*scratch).subspan(from, to - from)));
    k = j;
  }
  o.written = all_;
  o.done = true;
  return Status::Ok();
}

Status DeferredCopies::CompleteHeldLocked(Owed& o, std::vector<std::byte>* scratch) {
  o.mu.AssertHeld();
  // The whole source into `scratch`, the held sectors over it, one write.
  // (Reading the source into the held buffer instead would touch all of
  // its pages: a page fault each the first time, which costs more than the
  // copy.) Nothing of a held copy is in its block before this write, so a
  // failed one leaves it owed and readable as it was.
  scratch->resize(block_size_);
  THINFS_RETURN_IF_ERROR(data_->Read(o.source, 0, *scratch));
  for (uint64_t k = 0; k < sectors_; ++k) {
    if (o.written & Bit(k)) {
      std::memcpy(scratch->data() + k * sector_, o.held + k * sector_, SectorEnd(k) - k * sector_);
    }
  }
  THINFS_RETURN_IF_ERROR(data_->Write(o.block, 0, *scratch));
  ReleaseHeldLocked(o);
  o.written = all_;
  o.done = true;
  return Status::Ok();
}

Status DeferredCopies::CompleteAll(uint64_t* made) {
  std::vector<std::shared_ptr<Owed>> owed;
  for (Shard& s : shards_) {
    MutexLock l(&s.mu);
    for (const auto& [b, o] : s.owed) owed.push_back(o);
  }
  std::sort(owed.begin(), owed.end(),
            [](const auto& a, const auto& b) { return a->source.value < b->source.value; });
  // Every source read is started before the first is waited for: the disk
  // sees them all at once, not one at a time. Neighbours merge into one
  // hint. (Nothing is read where copies share data.)
  for (size_t i = 0; i < owed.size() && !data_->SharesCopies();) {
    size_t j = i + 1;
    while (j < owed.size() && owed[j]->source.value <= owed[j - 1]->source.value + 1) ++j;
    data_->Prefetch(owed[i]->source, owed[j - 1]->source.value - owed[i]->source.value + 1);
    i = j;
  }
  std::vector<std::byte> scratch;
  for (const std::shared_ptr<Owed>& o : owed) {
    {
      MutexLock l(&o->mu);
      if (!o->done) {
        THINFS_RETURN_IF_ERROR(CompleteLocked(*o, &scratch));
        completed_.fetch_add(1, std::memory_order_relaxed);
        if (made != nullptr) ++*made;
      }
    }
    Erase(*o);
  }
  return Status::Ok();
}

}  // namespace thinfs
