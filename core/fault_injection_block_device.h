// FaultInjectionBlockDevice: an in-memory BlockDevice that can lose power.
//
// It keeps two images: `durable`, the contents as of the last successful
// Sync(), and `current`, what reads see. Writes and discards go to current
// and are remembered as unsynced operations until Sync() applies them to
// durable. DropUnsyncedWrites() is the power cut: current := durable.
// With torn writes enabled, each unsynced write instead independently
// vanishes, persists only its first half, or persists whole (and each
// unsynced discard happens or not), chosen by a generator seeded at
// construction, so a failing run replays with the same seed.
//
// FailNthIo(n) makes the n-th subsequent Read/Write/Sync (counting from 1)
// fail with kIOError/EIO without any effect; a failed Sync makes nothing
// durable (the writes stay unsynced). Discard is not counted.
//
// Thread safety: all methods may be called concurrently.

#ifndef THINFS_CORE_FAULT_INJECTION_BLOCK_DEVICE_H_
#define THINFS_CORE_FAULT_INJECTION_BLOCK_DEVICE_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/block_device.h"
#include "core/mem_block_device.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/types.h"

namespace thinfs {

class FaultInjectionBlockDevice final : public BlockDevice {
 public:
  // `seed` drives the torn-write choices; tests log it.
  explicit FaultInjectionBlockDevice(const Geometry& geometry, uint64_t seed = 0);
  FaultInjectionBlockDevice(const FaultInjectionBlockDevice&) = delete;
  FaultInjectionBlockDevice& operator=(const FaultInjectionBlockDevice&) = delete;

  // BlockDevice. Out-of-range block or byte ranges are bugs (THINFS_CHECK).
  // Read, Write and Sync return kIOError (errno EIO) when FailNthIo picks
  // them, OK otherwise.
  Status Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf) override;
  Status Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf) override;
  // Makes every unsynced write and discard durable.
  Status Sync() override;
  // Unsynced like a write: the blocks read as zeros until a crash undoes it.
  Status Discard(PoolBlock block, uint64_t count) override;
  // Raises the addressable block count; never fails for a larger count.
  Status Grow(uint64_t new_data_blocks) override;
  const Geometry& geometry() const override { return geometry_; }

  // Simulates power loss: current := durable (with torn writes, after the
  // per-write choices above have been applied to durable).
  void DropUnsyncedWrites();

  // The n-th subsequent Read/Write/Sync fails once; 0 disables.
  void FailNthIo(uint64_t n);
  // Whether a failure FailNthIo asked for is still to come.
  bool FailurePending() const;

  // Enables torn writes for the next DropUnsyncedWrites().
  void SetTornWriteOnCrash(bool torn);

  // Every subsequent Read first sleeps `delay` (a slow disk), holding no
  // lock; zero, the default, disables.
  void SetReadDelay(std::chrono::microseconds delay);

  // Successful Sync() calls so far.
  uint64_t sync_count() const;

  // Writes and discards not yet made durable.
  size_t unsynced_ops() const;

  uint64_t seed() const { return seed_; }

 private:
  struct PendingOp {
    bool discard = false;
    uint64_t block = 0;
    uint64_t offset = 0;  // write only
    uint64_t count = 0;   // discard only
    std::vector<std::byte> data;
  };

  // True when this I/O is the one FailNthIo asked to fail.
  bool ShouldFail() REQUIRES(mu_);

  // Constant after construction.
  const Geometry geometry_;
  const uint64_t seed_;

  // Addressable blocks; atomic so that the range checks take no lock.
  std::atomic<uint64_t> data_blocks_;
  std::atomic<int64_t> read_delay_us_{0};

  mutable Mutex mu_;
  SparseBlockImage durable_ GUARDED_BY(mu_);
  SparseBlockImage current_ GUARDED_BY(mu_);
  std::vector<PendingOp> unsynced_ GUARDED_BY(mu_);
  uint64_t fail_countdown_ GUARDED_BY(mu_) = 0;
  bool torn_ GUARDED_BY(mu_) = false;
  uint64_t sync_count_ GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ GUARDED_BY(mu_);
};

}  // namespace thinfs

#endif  // THINFS_CORE_FAULT_INJECTION_BLOCK_DEVICE_H_
