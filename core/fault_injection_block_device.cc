#include "core/fault_injection_block_device.h"

#include <cerrno>
#include <thread>
#include <utility>

#include "core/check.h"

namespace thinfs {

FaultInjectionBlockDevice::FaultInjectionBlockDevice(const Geometry& geometry, uint64_t seed)
    : geometry_(geometry),
      seed_(seed),
      data_blocks_(geometry.data_blocks()),
      durable_(geometry.block_size()),
      current_(geometry.block_size()),
      rng_(seed) {}

bool FaultInjectionBlockDevice::ShouldFail() {
  if (fail_countdown_ == 0) return false;
  return --fail_countdown_ == 0;
}

Status FaultInjectionBlockDevice::Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf) {
  THINFS_CHECK(block.value < data_blocks_.load(std::memory_order_acquire));
  if (const int64_t us = read_delay_us_.load(std::memory_order_relaxed); us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  MutexLock l(&mu_);
  if (ShouldFail()) return Status::FromErrno(EIO, "injected read fault");
  current_.Read(block.value, offset, buf);
  return Status::Ok();
}

Status FaultInjectionBlockDevice::Write(PoolBlock block, uint64_t offset,
                                        std::span<const std::byte> buf) {
  THINFS_CHECK(block.value < data_blocks_.load(std::memory_order_acquire));
  MutexLock l(&mu_);
  if (ShouldFail()) return Status::FromErrno(EIO, "injected write fault");
  current_.Write(block.value, offset, buf);
  PendingOp op;
  op.block = block.value;
  op.offset = offset;
  op.data.assign(buf.begin(), buf.end());
  unsynced_.push_back(std::move(op));
  return Status::Ok();
}

Status FaultInjectionBlockDevice::Sync() {
  MutexLock l(&mu_);
  if (ShouldFail()) return Status::FromErrno(EIO, "injected sync fault");
  // Replaying in order reproduces current exactly for the synced ranges.
  for (const PendingOp& op : unsynced_) {
    if (op.discard) {
      durable_.Discard(op.block, op.count);
    } else {
      durable_.Write(op.block, op.offset, op.data);
    }
  }
  unsynced_.clear();
  ++sync_count_;
  return Status::Ok();
}

Status FaultInjectionBlockDevice::Discard(PoolBlock block, uint64_t count) {
  THINFS_CHECK(block.value <= data_blocks_.load(std::memory_order_acquire) &&
               count <= data_blocks_.load(std::memory_order_acquire) - block.value);
  MutexLock l(&mu_);
  current_.Discard(block.value, count);
  PendingOp op;
  op.discard = true;
  op.block = block.value;
  op.count = count;
  unsynced_.push_back(std::move(op));
  return Status::Ok();
}

void FaultInjectionBlockDevice::DropUnsyncedWrites() {
  MutexLock l(&mu_);
  if (torn_) {
    for (const PendingOp& op : unsynced_) {
      const uint64_t choice = rng_() % 3;
      if (op.discard) {
        if (choice != 0) durable_.Discard(op.block, op.count);
      } else if (choice == 1) {
        durable_.Write(op.block, op.offset,
                       std::span<const std::byte>(op.data).first(op.data.size() / 2));
      } else if (choice == 2) {
        durable_.Write(op.block, op.offset, op.data);
      }
    }
  }
  unsynced_.clear();
  current_ = durable_;
}

void FaultInjectionBlockDevice::FailNthIo(uint64_t n) {
  MutexLock l(&mu_);
  fail_countdown_ = n;
}

bool FaultInjectionBlockDevice::FailurePending() const {
  MutexLock l(&mu_);
  return fail_countdown_ != 0;
}

void FaultInjectionBlockDevice::SetReadDelay(std::chrono::microseconds delay) {
  read_delay_us_.store(delay.count(), std::memory_order_relaxed);
}

void FaultInjectionBlockDevice::SetTornWriteOnCrash(bool torn) {
  MutexLock l(&mu_);
  torn_ = torn;
}

uint64_t FaultInjectionBlockDevice::sync_count() const {
  MutexLock l(&mu_);
  return sync_count_;
}

size_t FaultInjectionBlockDevice::unsynced_ops() const {
  MutexLock l(&mu_);
  return unsynced_.size();
}

Status FaultInjectionBlockDevice::Grow(uint64_t new_data_blocks) {
  if (new_data_blocks < data_blocks_.load(std::memory_order_acquire)) {
    return Status::InvalidArgument("the data area cannot shrink");
  }
  data_blocks_.store(new_data_blocks, std::memory_order_release);
  return Status::Ok();
}

}  // namespace thinfs
