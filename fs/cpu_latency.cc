// A CPU wake-up latency limit held while a mount serves requests: see
// fs/cpu_latency.h.

#include "fs/cpu_latency.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fs/log.h"

namespace thinfs::fs {

Result<std::unique_ptr<CpuLatencyHold>> CpuLatencyHold::Open(uint32_t usec,
                                                             const std::string& device,
                                                             std::chrono::milliseconds hold) {
  if (usec > static_cast<uint32_t>(kNoLimit)) {
    return Status::InvalidArgument("cpu_latency: " + std::to_string(usec) + " µs is too large");
  }
  int fd = ::open(device.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "cpu_latency: open " + device);
  return std::unique_ptr<CpuLatencyHold>(new CpuLatencyHold(fd, usec, hold));
}

CpuLatencyHold::CpuLatencyHold(int fd, uint32_t usec, std::chrono::milliseconds hold)
    : fd_(fd), usec_(usec), hold_(hold) {
  thread_ = std::thread([this] { Run(); });
}

CpuLatencyHold::~CpuLatencyHold() {
  {
    MutexLock l(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  thread_.join();
  ::close(fd_);
}

void CpuLatencyHold::WriteLocked(int32_t value) {
  // The device takes a binary s32 (cpu_latency_qos_write).
  if (::write(fd_, &value, sizeof value) != static_cast<ssize_t>(sizeof value) &&
      !write_failed_) {
    write_failed_ = true;
    THINFS_LOG_ERROR("cpu_latency: cannot set the CPU latency limit: %s", strerror(errno));
  }
}

void CpuLatencyHold::Set() {
  MutexLock l(&mu_);
  if (held_.load(std::memory_order_relaxed) || stop_) return;
  WriteLocked(static_cast<int32_t>(usec_));
  ++times_set_;
  set_at_ = std::chrono::steady_clock::now();
  held_.store(true, std::memory_order_release);
  cv_.SignalAll();
}

void CpuLatencyHold::Run() {
  pthread_setname_np(pthread_self(), "thinfs-cpulat");
  MutexLock l(&mu_);
  while (!stop_) {
    if (!held_.load(std::memory_order_relaxed)) {
      cv_.Wait();
      continue;
    }
    // One period: requests that arrive in it keep the limit for the next.
    touched_.store(false, std::memory_order_relaxed);
    const auto end = std::chrono::steady_clock::now() + hold_;
    for (auto now = std::chrono::steady_clock::now(); !stop_ && now < end;
         now = std::chrono::steady_clock::now()) {
      cv_.WaitFor(end - now);
    }
    if (stop_) break;
    if (!touched_.load(std::memory_order_relaxed)) {
      WriteLocked(kNoLimit);
      held_.store(false, std::memory_order_release);
      time_held_ += std::chrono::steady_clock::now() - set_at_;
    }
  }
  if (held_.load(std::memory_order_relaxed)) {
    time_held_ += std::chrono::steady_clock::now() - set_at_;
    held_.store(false, std::memory_order_release);
  }
}

uint64_t CpuLatencyHold::times_set() const {
  MutexLock l(&mu_);
  return times_set_;
}

std::chrono::nanoseconds CpuLatencyHold::time_held() const {
  MutexLock l(&mu_);
  std::chrono::nanoseconds total = time_held_;
  if (held_.load(std::memory_order_relaxed)) total += std::chrono::steady_clock::now() - set_at_;
  return total;
}

}  // namespace thinfs::fs
