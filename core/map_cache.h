// A fixed-size, direct-mapped cache of block-map answers: (device, block) ->
// what a read of that block resolves to. It saves the RocksDB seek (and the
// walk up the snapshot chain) that every 4 KiB FUSE request otherwise pays.
//
// Correctness rests on two counters, never on timing:
//   - every slot has a generation, bumped by Invalidate(dev, b) after the
//     block map's edit of (dev, b) is visible. A reader takes a Ticket (the
//     slot's generation) before it resolves from the map, and Fill stores
//     its answer only if the generation has not moved since: an edit that
//     raced with the resolve makes the fill a no-op.
//   - every entry carries the device's own generation (`dev_gen`), bumped by
//     changes that alter many blocks at once (resize, clone, a new parent
//     limit). Lookup misses when it differs.
// A lookup that misses or a fill that is refused only costs a map lookup.
//
// Thread-safe. Slots share kLocks mutexes; each is held for a few loads.

#ifndef THINFS_CORE_MAP_CACHE_H_
#define THINFS_CORE_MAP_CACHE_H_

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <type_traits>

#include "core/mutex.h"

namespace thinfs {

template <typename Value>
class MapCache {
 public:
  struct Ticket {
    size_t slot = 0;
    uint64_t gen = 0;
  };

  // `entries` is rounded down to a power of two; 0 disables the cache (every
  // Lookup misses, Fill and Invalidate do nothing).
  explicit MapCache(size_t entries)
      : mask_(entries == 0 ? 0 : std::bit_floor(entries) - 1),
        slots_(entries == 0 ? nullptr : AllocateSlots(mask_ + 1)) {}

  // Memory per entry, for sizing the cache in bytes.
  static constexpr size_t EntryBytes() { return sizeof(Slot); }

  bool enabled() const { return slots_ != nullptr; }
  size_t capacity() const { return enabled() ? mask_ + 1 : 0; }

  // On a hit copies the answer into *out. On a miss fills *ticket for Fill.
  bool Lookup(uint64_t dev, uint64_t b, uint64_t dev_gen, Value* out, Ticket* ticket) {
    if (!enabled()) return false;
    size_t i = SlotOf(dev, b);
    Slot& s = slots_[i];
    MutexLock l(&LockOf(i));
    if (s.valid && s.dev == dev && s.b == b && s.dev_gen == dev_gen) {
      *out = s.value;
      hits_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    *ticket = Ticket{i, s.gen};
    misses_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  // Stores an answer resolved after Lookup handed out `ticket`, unless the
  // slot was invalidated in between.
  void Fill(const Ticket& ticket, uint64_t dev, uint64_t b, uint64_t dev_gen, const Value& v) {
    if (!enabled()) return;
    Slot& s = slots_[ticket.slot];
    MutexLock l(&LockOf(ticket.slot));
    if (s.gen != ticket.gen) return;
    s.valid = true;
    s.dev = dev;
    s.b = b;
    s.dev_gen = dev_gen;
    s.value = v;
  }

  // Call after every change of (dev, b)'s versions has become visible.
  void Invalidate(uint64_t dev, uint64_t b) {
    if (!enabled()) return;
    size_t i = SlotOf(dev, b);
    Slot& s = slots_[i];
    MutexLock l(&LockOf(i));
    ++s.gen;
    if (s.dev == dev && s.b == b) s.valid = false;
  }

  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  uint64_t misses() const { return misses_.load(std::memory_order_relaxed); }

 private:
  static constexpr size_t kLocks = 1024;

  // A slot of zero bytes is empty: `valid` is false, and nothing else of
  // an invalid slot is read but `gen`, `dev` and `b`, for which zero is
  // as good as any value.
  struct Slot {
    bool valid = false;
    uint64_t dev = 0;
    uint64_t b = 0;
    uint64_t dev_gen = 0;
    uint64_t gen = 0;
    Value value{};
  };
  static_assert(std::is_aggregate_v<Slot> && std::is_trivially_destructible_v<Slot>,
                "calloc creates Slot objects implicitly only for implicit-lifetime types");

  struct FreeSlots {
    void operator()(Slot* p) const { std::free(p); }
  };
  // From calloc, not new Slot[n], which writes every slot: the pages stay
  // unallocated until a slot in them is used, so the table (10 MiB at the
  // default map_cache=16M) costs neither memory nor time at Pool::Open
  // (docs/design.md, "Block-map cache").
  static std::unique_ptr<Slot[], FreeSlots> AllocateSlots(size_t n) {
    void* p = std::calloc(n, sizeof(Slot));
    if (p == nullptr) throw std::bad_alloc();
    return std::unique_ptr<Slot[], FreeSlots>(static_cast<Slot*>(p));
  }

  size_t SlotOf(uint64_t dev, uint64_t b) const {
    // splitmix64 finaliser over both halves of the key.
    uint64_t x = b * 0x9e3779b97f4a7c15ULL ^ (dev + 0x632be59bd9b4e019ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return static_cast<size_t>(x) & mask_;
  }
  Mutex& LockOf(size_t slot) { return locks_[slot % kLocks]; }

  const size_t mask_;
  std::unique_ptr<Slot[], FreeSlots> slots_;
  Mutex locks_[kLocks];
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
};

}  // namespace thinfs

#endif  // THINFS_CORE_MAP_CACHE_H_
