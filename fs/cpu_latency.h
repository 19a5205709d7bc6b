// A CPU wake-up latency limit held while a mount serves requests (mount
// option cpu_latency=USEC; docs/benchmarks.md, lever 37).
//
// Every FUSE request wakes the server, and the reply wakes the caller. An
// idle CPU that must first leave a deep idle state answers late: on a VM
// whose idle vCPUs halt (no guest halt polling), each wake-up that lands
// on a halted vCPU costs about 25 µs, and a FUSE round trip is 2-5 times as
// long as it is between two running CPUs (lever 28). The kernel's PM QoS
// lets a process cap that exit latency for the whole machine: while a
// request writes USEC to /dev/cpu_dma_latency, cpuidle chooses no idle
// state slower to leave than USEC; 0 makes idle CPUs poll instead of
// halting (the haltpoll driver's POLL state, the same with intel_idle or
// ACPI states). Closing the file drops the request.
//
// Polling costs CPU time (the host's, on a VM) whenever a CPU is idle, so
// the limit is held only while requests arrive: the first request after a
// quiet spell sets it, and a thread lifts it (writes the "no limit" value)
// once no request came for a whole `hold` period, between one and two
// periods after the last.
//
// Thread safety: Touch() may be called from any thread; it costs two
// atomic loads when the limit is already held and a request came
// in the current period. The other members may be called from any thread.

#ifndef THINFS_FS_CPU_LATENCY_H_
#define THINFS_FS_CPU_LATENCY_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "core/mutex.h"
#include "core/status.h"

namespace thinfs::fs {

class CpuLatencyHold {
 public:
  static constexpr char kDevice[] = "/dev/cpu_dma_latency";
  // How long requests may pause before the limit is lifted.
  static constexpr std::chrono::milliseconds kDefaultHold{50};
  // PM QoS's "no limit" (PM_QOS_CPU_LATENCY_DEFAULT_VALUE, 2000 s).
  static constexpr int32_t kNoLimit = 2'000'000'000;

  // Opens `device` for writing (root only for the real one) and starts the
  // thread that lifts the limit. The limit is not held until Touch().
  static Result<std::unique_ptr<CpuLatencyHold>> Open(
      uint32_t usec, const std::string& device = kDevice,
      std::chrono::milliseconds hold = kDefaultHold);
  ~CpuLatencyHold();  // stops the thread; closing the device drops the limit
  CpuLatencyHold(const CpuLatencyHold&) = delete;
  CpuLatencyHold& operator=(const CpuLatencyHold&) = delete;

  // A request arrived: hold the limit if it is not held.
  void Touch() {
    if (!touched_.load(std::memory_order_relaxed)) {
      touched_.store(true, std::memory_order_relaxed);
    }
    if (!held_.load(std::memory_order_acquire)) Set();
  }

  uint32_t usec() const { return usec_; }
  bool held() const { return held_.load(std::memory_order_acquire); }
  // How many times the limit was set, and for how long in all (the span
  // now running included).
  uint64_t times_set() const;
  std::chrono::nanoseconds time_held() const;

 private:
  CpuLatencyHold(int fd, uint32_t usec, std::chrono::milliseconds hold);
  void Set();
  void Run();
  // Writes `value` to the device; logs a failure once.
  void WriteLocked(int32_t value) REQUIRES(mu_);

  const int fd_;
  const uint32_t usec_;
  const std::chrono::milliseconds hold_;
  std::atomic<bool> touched_{false};
  std::atomic<bool> held_{false};
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  bool stop_ GUARDED_BY(mu_) = false;
  bool write_failed_ GUARDED_BY(mu_) = false;
  uint64_t times_set_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point set_at_ GUARDED_BY(mu_);
  std::chrono::nanoseconds time_held_ GUARDED_BY(mu_){0};
  std::thread thread_;
};

}  // namespace thinfs::fs

#endif  // THINFS_FS_CPU_LATENCY_H_
