// FUSE over io_uring under libfuse 3.14: see fs/uring.h.

#define FUSE_USE_VERSION 312

#include "fs/uring.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <liburing.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "core/check.h"
#include "fs/log.h"

namespace thinfs::fs {
namespace {

// The kernel's FUSE-over-io_uring ABI (include/uapi/linux/fuse.h since
// Linux 6.14, protocol 7.42). Debian 12's headers are older.
constexpr uint64_t kFuseOverIoUring = 1ULL << 41;  // INIT flag, in flags2
constexpr uint32_t kFuseOverIoUring2 = static_cast<uint32_t>(kFuseOverIoUring >> 32);
constexpr uint32_t kCmdRegister = 1;
constexpr uint32_t kCmdCommitAndFetch = 2;

struct RingEntInOut {
  uint64_t flags;
  uint64_t commit_id;  // the request's unique, to commit its reply with
  uint32_t payload_sz;
  uint32_t padding;
  uint64_t reserved;
};

struct RingReqHeader {
  char in_out[128];  // fuse_in_header of the request; fuse_out_header of the reply
  char op_in[128];   // the request's first argument (its per-opcode struct)
  RingEntInOut ring_ent_in_out;
};

// In the SQE's 80 bytes of command data.
struct RingCmdReq {
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};
static_assert(sizeof(RingCmdReq) <= 80);

static_assert(sizeof(fuse_in_header) == 40 && sizeof(fuse_out_header) == 16);
static_assert(offsetof(fuse_init_in, flags2) == 16);
static_assert(offsetof(fuse_init_out, max_write) == 20);
static_assert(offsetof(fuse_init_out, max_pages) == 28);
static_assert(offsetof(fuse_init_out, flags2) == 32);

// An entry's memory: the headers, then kLead bytes later the payload. A
// request is rebuilt as /dev/fuse delivers it (in header, first argument,
// payload) in the bytes just before the payload.
constexpr size_t kLead = 4096;
static_assert(sizeof(RingReqHeader) + sizeof(fuse_in_header) + 128 <= kLead);

constexpr uint64_t kEntryTag = 1;
constexpr uint64_t kStopTag = 2;
constexpr uint64_t kRetryTag = 3;  // the wait before a refused reply is committed again

// A zeroed 128-byte SQE (the ring is set up with IORING_SETUP_SQE128).
io_uring_sqe* ZeroedSqe(io_uring* ring) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring);
  if (sqe == nullptr) {  // never with our two SQEs in flight, but be safe
    io_uring_submit(ring);
    sqe = io_uring_get_sqe(ring);
  }
  THINFS_CHECK(sqe != nullptr);
  // Through an integer: GCC's bounds check takes sqe->cmd (an array of 0)
  // for the end of the object.
  auto* bytes = reinterpret_cast<unsigned char*>(reinterpret_cast<uintptr_t>(sqe));
  std::memset(bytes, 0, 2 * sizeof(io_uring_sqe));
  return sqe;
}

// The SQE's 80 bytes of command data.
void SetCmd(io_uring_sqe* sqe, const void* cmd, size_t size) {
  auto* bytes = reinterpret_cast<unsigned char*>(reinterpret_cast<uintptr_t>(sqe));
  std::memcpy(bytes + offsetof(io_uring_sqe, cmd), cmd, size);
}

constexpr char kEnableUring[] = "/sys/module/fuse/parameters/enable_uring";

// The kernel makes one queue per possible CPU (num_possible_cpus()).
unsigned PossibleCpus() {
  std::ifstream in("/sys/devices/system/cpu/possible");
  std::string list;
  if (in && std::getline(in, list)) {
    unsigned count = 0;
    std::stringstream ranges(list);
    std::string range;
    while (std::getline(ranges, range, ',')) {
      unsigned lo = 0, hi = 0;
      if (std::sscanf(range.c_str(), "%u-%u", &lo, &hi) == 2 && hi >= lo) {
        count += hi - lo + 1;
      } else if (std::sscanf(range.c_str(), "%u", &lo) == 1) {
        count += 1;
      }
    }
    if (count > 0) return count;
  }
  long n = sysconf(_SC_NPROCESSORS_CONF);
  return n > 0 ? static_cast<unsigned>(n) : 1;
}

// Flags from the most to the least efficient: task work (the kernel copying
// a request into our buffers) runs only when the thread waits for it.
int InitRing(io_uring* ring) {
  const unsigned kTries[] = {
      IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
      IORING_SETUP_SQE128 | IORING_SETUP_COOP_TASKRUN,
      IORING_SETUP_SQE128,
  };
  int rc = -EINVAL;
  for (unsigned flags : kTries) {
    io_uring_params p{};
    p.flags = flags;
    rc = io_uring_queue_init_params(4, ring, &p);
    if (rc != -EINVAL) return rc;
  }
  return rc;
}

}  // namespace

struct UringTransport::Entry {
  unsigned qid = 0;
  bool pinned = true;
  std::byte* mem = nullptr;
  size_t mem_size = 0;
  RingReqHeader* header = nullptr;
  std::byte* payload = nullptr;
  size_t payload_size = 0;
  iovec iov[2]{};
  // The request being served (its reply goes into this entry).
  uint64_t unique = 0;
  uint64_t commit_id = 0;
  bool replied = false;
};

namespace {
thread_local UringTransport::Entry* tls_entry = nullptr;
std::atomic<int64_t> register_delay_ms_for_testing{0};
Mutex init_hook_mu;
std::function<void(UringTransport::InitStage)> init_hook_for_testing GUARDED_BY(init_hook_mu);

void RunInitHook(UringTransport::InitStage stage) {
  MutexLock l(&init_hook_mu);
  if (init_hook_for_testing) init_hook_for_testing(stage);
}
}  // namespace

void UringTransport::SetRegisterDelayForTesting(std::chrono::milliseconds delay) {
  register_delay_ms_for_testing.store(delay.count());
}

void UringTransport::SetInitHookForTesting(std::function<void(InitStage)> hook) {
  MutexLock l(&init_hook_mu);
  init_hook_for_testing = std::move(hook);
}

std::string UringUnavailableReason() {
  std::ifstream in(kEnableUring);
  if (!in) {
    return std::string("the kernel has no FUSE over io_uring (no ") + kEnableUring +
           "; it needs Linux 6.14 or later)";
  }
  std::string value;
  std::getline(in, value);
  if (value == "Y" || value == "1") return "";
  return std::string(kEnableUring) + " is " + value + " (as root: echo Y > " + kEnableUring +
         ")";
}

UringTransport::UringTransport(fuse_session* se, int fuse_fd, unsigned threads,
                               std::atomic<uint64_t>* served)
    : threads_wanted_(std::max(1u, threads)), served_(served), se_(se), fuse_fd_(fuse_fd) {}

UringTransport::~UringTransport() {
  Stop();
  MutexLock l(&mu_);
  // The threads are gone, so the kernel no longer copies into the buffers
  // (a request assigned to a dead thread's entry fails instead).
  for (std::unique_ptr<Entry>& e : entries_) {
    if (e->mem != nullptr) munmap(e->mem, e->mem_size);
  }
  if (stop_fd_ >= 0) close(stop_fd_);
}

ssize_t UringTransport::Read(int fd, void* buf, size_t len) {
  ssize_t n = ::read(fd, buf, len);
  constexpr ssize_t kInitSize = sizeof(fuse_in_header) + offsetof(fuse_init_in, flags2) + 4;
  if (n >= kInitSize) {
    const auto* in = static_cast<const fuse_in_header*>(buf);
    if (in->opcode == FUSE_INIT) {
      fuse_init_in arg{};
      std::memcpy(&arg, in + 1, offsetof(fuse_init_in, flags2) + 4);
      offered_.store((arg.flags & FUSE_INIT_EXT) != 0 && (arg.flags2 & kFuseOverIoUring2) != 0);
      init_unique_.store(in->unique);
      RunInitHook(InitStage::kInitRead);
    }
  }
  return n;
}

ssize_t UringTransport::Writev(int fd, iovec* iov, int count) {
  if (count < 1 || iov[0].iov_len != sizeof(fuse_out_header)) return ::writev(fd, iov, count);
  fuse_out_header out;
  std::memcpy(&out, iov[0].iov_base, sizeof out);

  // A reply to the request this ring thread serves: into its entry.
  Entry* e = tls_entry;
  if (e != nullptr && !e->replied && out.unique == e->unique && out.unique != 0) {
    size_t off = 0;
    for (int i = 1; i < count; ++i) {
      if (iov[i].iov_len > e->payload_size - off) {
        errno = EINVAL;  // larger than max_write: libfuse logs it
        return -1;
      }
      std::byte* to = e->payload + off;
      if (iov[i].iov_base != to) std::memmove(to, iov[i].iov_base, iov[i].iov_len);
      off += iov[i].iov_len;
    }
    std::memcpy(e->header->in_out, &out, sizeof out);
    e->header->ring_ent_in_out.payload_sz = static_cast<uint32_t>(off);
    e->replied = true;
    return static_cast<ssize_t>(sizeof out + off);
  }

  // libfuse's INIT reply: ask for io_uring where the kernel offered it.
  uint64_t init = init_unique_.load();
  if (init == 0 || out.unique != init || count != 2) return ::writev(fd, iov, count);
  init_unique_.store(0);
  fuse_init_out arg{};
  const size_t arg_size = iov[1].iov_len;
  // libfuse 3.14 sends the whole struct; a layout of another size is not
  // one we know how to patch.
  const bool known = arg_size >= offsetof(fuse_init_out, flags2) + 4 && arg_size <= sizeof arg;
  // The kernel takes io_uring for the connection only if its knob is still
  // on when it reads this reply. If the knob went off since the offer (the
  // test suite turns it on and back off), the rings would be refused:
  // don't ask. It is looked at again once the reply is written; this look
  // is not redundant with that one: without it, the knob off when the
  // kernel reads the reply and back on for the look after would leave a
  // connection without io_uring taking entries (the hazard below).
  const bool knob_off = offered_.load() && !UringUnavailableReason().empty();
  if (out.error != 0 || !offered_.load() || !known || knob_off) {
    THINFS_LOG_INFO("FUSE requests through /dev/fuse (%s)",
                    !offered_.load() ? "the kernel does not offer io_uring"
                    : !known         ? "INIT reply of an unknown size"
                    : knob_off       ? "the kernel's knob enable_uring went off after its offer"
                                     : "INIT failed");
    ssize_t n = ::writev(fd, iov, count);
    Settle();  // no ring will serve
    return n;
  }
  std::memcpy(&arg, iov[1].iov_base, arg_size);
  arg.flags |= FUSE_INIT_EXT;
  arg.flags2 |= kFuseOverIoUring2;
  iovec patched[2] = {iov[0], {&arg, arg_size}};
  RunInitHook(InitStage::kReplyAsksForRings);
  ssize_t n = ::writev(fd, patched, 2);
  RunInitHook(InitStage::kReplyWritten);
  // If the knob is off now, it may have been off while the kernel read the
  // reply: then the connection has no io_uring. Linux 6.18 still takes
  // ring entries on such a connection while the knob is on, routes
  // requests to them, and refuses their replies once it is off: the
  // requests wait. So no entry is offered. (Off and back on within this
  // write is not caught: Run stops offering at the first refused entry,
  // and commits a refused reply again until the knob is back on.)
  if (n >= 0 && !UringUnavailableReason().empty()) {
    THINFS_LOG_INFO(
        "FUSE requests through /dev/fuse (the kernel's knob enable_uring went off while the "
        "kernel read our INIT reply)");
    Settle();  // no ring will serve
    return n;
  }
  // The kernel has processed INIT once the write returns: rings may register.
  if (n >= 0) StartThreads(arg.max_write, arg.max_pages);
  if (n < 0 || entries_started() == 0) {
    Settle();  // no ring will serve
  } else {
    NoteRegistered(0);  // every entry may be in already
  }
  return n;
}

std::byte* UringTransport::ReplyBuffer(size_t size) {
  Entry* e = tls_entry;
  if (e == nullptr || e->replied || size > e->payload_size) return nullptr;
  return e->payload;
}

void UringTransport::StartThreads(uint32_t max_write, uint32_t max_pages) {
  MutexLock l(&mu_);
  if (stopped_ || started_) return;
  started_ = true;
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) {
    THINFS_LOG_ERROR("FUSE over io_uring: eventfd: %s; serving /dev/fuse only", strerror(errno));
    return;  // no queue gets an entry: the kernel keeps /dev/fuse
  }
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // The kernel's minimum: max(FUSE_MIN_READ_BUFFER, max_write, max_pages pages).
  size_t payload = std::max<size_t>({8192, max_write, size_t{max_pages} * page});
  payload = (payload + page - 1) / page * page;
  queues_ = PossibleCpus();
  // A caller's requests all go to its CPU's queue, so `threads` (mount
  // option uring_threads=N, default 16) bounds what one caller has served
  // at once. 32, as threads=32 serves through /dev/fuse, had every request
  // of a depth-32 burst wake a thread of its own, and such reads ran
  // 28-35% slower than with 16 (docs/benchmarks.md, lever 36). Bounded in
  // all on large machines (each thread holds a max_write buffer, touched
  // as used).
  constexpr unsigned kMaxRingThreads = 256;
  unsigned per_queue = std::clamp(kMaxRingThreads / queues_, 1u, threads_wanted_);
  per_queue_ = per_queue;  // before any ring thread: serving() publishes it
  for (unsigned q = 0; q < queues_; ++q) {
    for (unsigned t = 0; t < per_queue; ++t) {
      auto e = std::make_unique<Entry>();
      e->qid = q;
      // One thread per queue pinned to its CPU, started last so that its
      // entry is likely the first the kernel hands a request to (a queue's
      // idle entries are used last-in first-out): a lone synchronous
      // caller stays on its CPU. The others may run anywhere, so that a
      // burst from one CPU (a queue depth of 32, a loop device's worker)
      // is served by every CPU. Pinning all of a queue's threads halved
      // 4 KiB reads at queue depth 32 (docs/benchmarks.md, lever 33).
      e->pinned = t + 1 == per_queue;
      e->mem_size = kLead + payload;
      void* mem = mmap(nullptr, e->mem_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
      if (mem == MAP_FAILED) {
        THINFS_LOG_ERROR("FUSE over io_uring: cannot map %zu bytes: %s", e->mem_size,
                         strerror(errno));
        continue;  // that queue may lack entries: the kernel keeps /dev/fuse
      }
      e->mem = static_cast<std::byte*>(mem);
      e->header = reinterpret_cast<RingReqHeader*>(e->mem);
      e->payload = e->mem + kLead;
      e->payload_size = payload;
      e->iov[0] = {e->header, sizeof(RingReqHeader)};
      e->iov[1] = {e->payload, payload};
      Entry* raw = e.get();
      entries_.push_back(std::move(e));
      threads_.emplace_back([this, raw] { Run(raw); });
    }
  }
  THINFS_LOG_INFO("FUSE over io_uring: %u queues, %u ring threads each, %zu-byte payloads",
                  queues_, per_queue, payload);
  entries_started_.store(static_cast<unsigned>(threads_.size()));
  if (threads_.empty()) return;
  // Settles the rings after kSettleTimeout if some entry never registers,
  // so that the mount is reported ready anyway (it is served, by fewer
  // entries or through /dev/fuse).
  threads_.emplace_back([this] {
    pthread_setname_np(pthread_self(), "thinfs-uring");
    const auto deadline = std::chrono::steady_clock::now() + kSettleTimeout;
    bool late;
    {
      MutexLock l(&settle_mu_);
      while (!settled_ && !settle_stop_ && std::chrono::steady_clock::now() < deadline) {
        settle_cv_.WaitFor(deadline - std::chrono::steady_clock::now());
      }
      late = !settled_ && !settle_stop_;
    }
    if (late) {
      THINFS_LOG_WARNING(
          "FUSE over io_uring: %u of %u ring entries registered after %lld s; the mount is "
          "ready without the rest",
          entries_registered(), entries_started(),
          static_cast<long long>(kSettleTimeout.count()));
      Settle();
    }
  });
}

void UringTransport::NoteRegistered(int delta) {
  registered_.fetch_add(static_cast<unsigned>(delta));
  SettleIfAllAccountedFor();
}

void UringTransport::NoteRefused(int error) {
  // After the entry left registered_ (if it was in): the sum of the two
  // may fall short for a moment, never pass for complete too early.
  if (error == EOPNOTSUPP) connection_refused_.store(true);
  if (refused_.fetch_add(1) == 0) {
    THINFS_LOG_WARNING(
        "FUSE over io_uring: the kernel refused a ring entry of this mount: %s%s", strerror(error),
        error == EOPNOTSUPP ? " (was the knob enable_uring turned off between INIT and our reply?)"
                            : "");
  }
  SettleIfAllAccountedFor();
}

void UringTransport::NoteRefusedReply(unsigned qid) {
  if (reply_refused_logged_.exchange(true)) return;
  THINFS_LOG_ERROR(
      "FUSE over io_uring: queue %u: the kernel refused our reply (%s): its knob enable_uring is "
      "off, and this connection did not take io_uring at INIT. The request waits; its reply is "
      "committed again every %lld ms until the knob is back on or the mount ends",
      qid, strerror(EOPNOTSUPP), static_cast<long long>(kCommitRetry.count()));
}

void UringTransport::SettleIfAllAccountedFor() {
  // Sequentially consistent: whichever of the last change to the three
  // counts comes last sees all of them.
  unsigned started = entries_started_.load();
  if (started == 0) return;
  unsigned refused = refused_.load();
  unsigned registered = registered_.load();
  if (registered + refused != started || all_registered_logged_.exchange(true)) return;
  if (refused == 0) {
    // Tests wait for this line (tests/util/e2e_util.h, kRingsRegistered).
    THINFS_LOG_INFO("FUSE over io_uring: all %u ring entries registered", started);
  } else {
    THINFS_LOG_WARNING(
        "FUSE over io_uring: the kernel refused %u of %u ring entries; %s", refused, started,
        registered == 0 ? "requests go through /dev/fuse" : "the others serve the mount");
  }
  Settle();
}

void UringTransport::OnSettled(std::function<void()> ready) {
  {
    MutexLock l(&settle_mu_);
    if (!settled_) {
      on_settled_ = std::move(ready);
      return;
    }
  }
  ready();
}

void UringTransport::Settle() {
  std::function<void()> ready;
  {
    MutexLock l(&settle_mu_);
    if (settled_) return;
    settled_ = true;
    ready = std::move(on_settled_);
    settle_cv_.SignalAll();
  }
  if (ready) ready();
}

void UringTransport::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    threads = std::move(threads_);
  }
  {
    MutexLock l(&settle_mu_);
    settle_stop_ = true;
    settle_cv_.SignalAll();
  }
  if (stop_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t n = write(stop_fd_, &one, sizeof one);
    (void)n;  // an eventfd write of 1 cannot fail short of overflow
  }
  for (std::thread& t : threads) t.join();
}

void UringTransport::Run(Entry* e) {
  pthread_setname_np(pthread_self(), "thinfs-uring");
  // libfuse's handlers end the loop on SIGTERM, SIGINT and SIGHUP: leave
  // them to threads that wake its loop (a ring thread would only retry its
  // io_uring_enter).
  sigset_t signals;
  sigemptyset(&signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) sigaddset(&signals, sig);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  CPU_SET(e->qid, &cpus);
  // The point of the queue: serve requests on the CPU that issued them. A
  // CPU we may not run on (a cpuset) still gets its queue served.
  if (e->pinned && sched_setaffinity(0, sizeof cpus, &cpus) != 0) {
    THINFS_LOG_DEBUG("ring thread of queue %u not pinned: %s", e->qid, strerror(errno));
  }
  io_uring ring;
  int rc = InitRing(&ring);
  if (rc < 0) {
    THINFS_LOG_ERROR("FUSE over io_uring: io_uring_queue_init: %s; queue %u keeps /dev/fuse",
                     strerror(-rc), e->qid);
    return;
  }
  auto submit_cmd = [&](uint32_t op, uint64_t commit_id) {
    io_uring_sqe* sqe = ZeroedSqe(&ring);
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = fuse_fd_;
    sqe->cmd_op = op;
    sqe->addr = reinterpret_cast<uint64_t>(e->iov);
    sqe->len = 2;
    RingCmdReq req{};
    req.qid = static_cast<uint16_t>(e->qid);
    req.commit_id = commit_id;
    SetCmd(sqe, &req, sizeof req);
    io_uring_sqe_set_data64(sqe, kEntryTag);
  };
  io_uring_sqe* poll = ZeroedSqe(&ring);
  io_uring_prep_poll_add(poll, stop_fd_, POLLIN);
  io_uring_sqe_set_data64(poll, kStopTag);
  if (int64_t ms = register_delay_ms_for_testing.load(); ms > 0 && !e->pinned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  // The kernel takes the entry while io_uring_enter submits the command:
  // the command completes only with a request, or with an error, and an
  // error it meets before taking the entry is in the CQ once the submit
  // returns. So the entry counts as registered when the submit returned
  // and no error of it is in the CQ; counting it before looking had the
  // count reach every entry for a moment while the kernel refused them
  // all.
  bool counted = false;  // this entry is in registered_
  auto register_entry = [&] {
    if (connection_refused_.load()) {
      // Another entry was refused with EOPNOTSUPP: the connection has no
      // io_uring. Linux 6.18 still takes an entry while the knob is on
      // (it checks the knob or the connection), and replies through such
      // entries are refused once the knob goes off: their requests would
      // wait until it is back on (the retry below).
      NoteRefused(EOPNOTSUPP);
      return false;
    }
    submit_cmd(kCmdRegister, 0);
    int n = io_uring_submit(&ring);
    if (n < 0) {
      THINFS_LOG_ERROR("FUSE over io_uring: io_uring_enter: %s; queue %u has one entry less",
                       strerror(-n), e->qid);
      NoteRefused(-n);
      return false;
    }
    bool failed_at_once = false;
    unsigned head;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring, head, cqe) {
      if (cqe->user_data == kEntryTag && cqe->res < 0) failed_at_once = true;
    }
    if (!failed_at_once) {
      counted = true;
      NoteRegistered(1);
    }
    return true;
  };
  RunInitHook(InitStage::kRegistering);
  bool entry_live = register_entry();

  int not_ready = 0;
  bool served_one = false;
  bool done = false;
  // A reply the kernel refused (see below), committed again every
  // kCommitRetry: how many times so far.
  uint64_t refused_commits = 0;
  static_assert(kCommitRetry < std::chrono::seconds(1), "tv_nsec below holds all of it");
  __kernel_timespec retry_wait{};
  retry_wait.tv_nsec = std::chrono::nanoseconds(kCommitRetry).count();
  while (!done && entry_live) {
    rc = io_uring_submit_and_wait(&ring, 1);
    if (rc < 0 && rc != -EINTR) {
      THINFS_LOG_ERROR("FUSE over io_uring: io_uring_enter: %s", strerror(-rc));
      break;
    }
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
      uint64_t tag = cqe->user_data;
      int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      if (tag == kStopTag) {
        done = true;
        continue;
      }
      if (tag == kRetryTag) {
        submit_cmd(kCmdCommitAndFetch, e->commit_id);
        continue;
      }
      if (res == -EOPNOTSUPP && served_one) {
        // Our reply was refused: the knob is off and the connection has no
        // io_uring. Linux 6.18 took this entry anyway while the knob was on
        // (docs/fuse.md, "The knob changing under a mount"). The request
        // waits for this reply, which is still in the entry, and the kernel
        // takes it again once the knob is back on: commit it every
        // kCommitRetry until then, or until the mount ends (the stop, or
        // ENOTCONN). Giving up would leave the request waiting for good.
        if (refused_commits++ == 0) NoteRefusedReply(e->qid);
        io_uring_sqe* wait = ZeroedSqe(&ring);
        io_uring_prep_timeout(wait, &retry_wait, 0, 0);
        io_uring_sqe_set_data64(wait, kRetryTag);
        continue;
      }
      if (res >= 0 && refused_commits > 0) {
        THINFS_LOG_WARNING(
            "FUSE over io_uring: queue %u: a reply the kernel refused went through after %llu "
            "tries",
            e->qid, static_cast<unsigned long long>(refused_commits));
        refused_commits = 0;
      }
      if (res < 0 && counted) {
        counted = false;
        NoteRegistered(-1);  // the kernel let go of the entry
      }
      if (res == -EAGAIN && not_ready++ < 5000) {
        // INIT not processed yet (it is, once our INIT reply was written).
        usleep(1000);
        entry_live = register_entry();
        continue;
      }
      if (res < 0) {
        // ENOTCONN/ECONNABORTED: the connection ended (unmount, abort).
        if (res != -ENOTCONN && res != -ECONNABORTED && res != -ECANCELED) {
          if (served_one) {
            THINFS_LOG_ERROR("FUSE over io_uring: queue %u: %s", e->qid, strerror(-res));
          } else {
            // Never taken: the mount's readiness must not wait for it.
            NoteRefused(-res);
          }
        }
        entry_live = false;
        continue;
      }
      served_one = true;
      ServeEntry(e);
      submit_cmd(kCmdCommitAndFetch, e->commit_id);
    }
  }
  // Submits a commit still queued, so its caller gets the reply.
  io_uring_submit(&ring);
  io_uring_queue_exit(&ring);
}

void UringTransport::ServeEntry(Entry* e) {
  fuse_in_header in;
  std::memcpy(&in, e->header->in_out, sizeof in);
  uint32_t payload_sz = e->header->ring_ent_in_out.payload_sz;
  e->commit_id = e->header->ring_ent_in_out.commit_id;
  e->unique = in.unique;
  e->replied = false;
  size_t op_size = in.len - sizeof in - payload_sz;
  bool sane = in.len >= sizeof in + payload_sz && op_size <= sizeof e->header->op_in &&
              payload_sz <= e->payload_size;
  if (sane) {
    std::byte* start = e->payload - sizeof in - op_size;
    std::memcpy(start, &in, sizeof in);
    std::memcpy(start + sizeof in, e->header->op_in, op_size);
    fuse_buf buf{};
    buf.size = in.len;
    buf.mem = start;
    if (!serving_.exchange(true, std::memory_order_acq_rel)) {
      // Tests wait for this line (tests/util/e2e_util.h, kFirstRingRequest).
      THINFS_LOG_INFO("FUSE over io_uring: serving requests through the rings");
    }
    tls_entry = e;
    fuse_session_process_buf(se_, &buf);
    tls_entry = nullptr;
    if (served_ != nullptr) served_->fetch_add(1, std::memory_order_relaxed);
  } else {
    THINFS_LOG_ERROR("FUSE over io_uring: malformed request (opcode %u, len %u, payload %u)",
                     in.opcode, in.len, payload_sz);
  }
  if (!e->replied) {
    // Every request a ring carries wants a reply; never leave one hanging.
    fuse_out_header out{};
    out.len = sizeof out;
    out.error = -EIO;
    out.unique = e->unique;
    std::memcpy(e->header->in_out, &out, sizeof out);
    e->header->ring_ent_in_out.payload_sz = 0;
    e->replied = true;
  }
}

}  // namespace thinfs::fs
