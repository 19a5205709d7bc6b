// FUSE over io_uring: requests served by threads pinned to the CPU that
// issued them.
//
// Through /dev/fuse, the kernel hands a request to whichever worker has
// waited longest, on any CPU. On a VM whose idle vCPUs halt at once, each of
// a request's two wake-ups that crosses CPUs costs about 25 µs, and a FUSE
// round trip takes 2.4-2.7 times as long as with client and server on one
// CPU (docs/benchmarks.md, lever 28). Linux 6.14 added FUSE over io_uring:
// one queue per CPU, each request queued on the queue of the CPU its caller
// runs on, and handed to a ring entry the server registered on that queue.
// With a thread pinned to each CPU the wake-ups of a synchronous caller
// stay local.
//
// libfuse 3.14 (Debian 12) predates it, so this adapter does the part
// libfuse does not, through libfuse's custom I/O hooks
// (fuse_session_custom_io):
//   - read: notes the kernel's INIT request and whether it offers
//     FUSE_OVER_IO_URING (it does when /sys/module/fuse/parameters/enable_uring
//     is Y);
//   - writev: adds FUSE_OVER_IO_URING to libfuse's INIT reply when offered,
//     starts the ring threads once the reply is written, and puts a reply to
//     a request that came through a ring into that ring entry's buffers
//     instead of writing it to /dev/fuse.
// A ring thread rebuilds the request as /dev/fuse would have delivered it,
// in front of the payload buffer (no copy of the payload), and runs it
// through fuse_session_process_buf(): libfuse's dispatch and thinfs's
// callbacks are unchanged. The reply is committed with
// FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which also re-arms the entry.
//
// Each ring thread owns one io_uring and one ring entry, so it serves one
// request at a time like a libfuse worker; the kernel gives a request to an
// idle entry of its CPU's queue, or queues it until one is. One thread of
// each queue is pinned to the queue's CPU; the others may run on any CPU,
// so that a burst of requests from one CPU is served by all. Until every
// queue has an entry the kernel keeps using /dev/fuse, and it always does
// for FORGET, INTERRUPT and notifications: libfuse's loop keeps running.
//
// Thread safety: Read and Writev may be called from any thread (libfuse's
// workers, the ring threads, notifications). Stop is called once, by the
// thread that ran the loop.

#ifndef THINFS_FS_URING_H_
#define THINFS_FS_URING_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"

struct fuse_session;

namespace thinfs::fs {

enum class UringMode {
  kOff,   // /dev/fuse only: libfuse's I/O untouched
  kAuto,  // io_uring when the kernel offers it at INIT
  kOn,    // the same; RunMount refuses to mount when the kernel's knob is off
};

// Whether the kernel offers FUSE over io_uring to new mounts: the module
// parameter reads Y. Empty if so, else why not (for messages).
std::string UringUnavailableReason();

class UringTransport {
 public:
  // `threads`: ring threads per CPU queue (fewer when there are more than
  // 256 in all; mount option uring_threads=N): a caller's requests all go
  // to its CPU's queue, so it bounds the requests of one caller served at
  // once.
  // `served`: counts the requests served through a ring (may be null).
  // Serves `se`, mounted on `fuse_fd`, once Read and Writev are the
  // session's I/O hooks (fs/server.cc installs them before the loop runs).
  UringTransport(fuse_session* se, int fuse_fd, unsigned threads,
                 std::atomic<uint64_t>* served);
  ~UringTransport();  // Stop()s, then frees the entries' buffers
  UringTransport(const UringTransport&) = delete;
  UringTransport& operator=(const UringTransport&) = delete;

  // Ends and joins the ring threads (each finishes the request it serves).
  // Idempotent. After it, requests a ring would get wait for the
  // connection's end (the unmount), as with libfuse's loop ended.
  void Stop();

  // A request came through a ring: the kernel uses them.
  bool serving() const { return serving_.load(std::memory_order_acquire); }
  // Valid once serving().
  unsigned queues() const { return queues_; }
  unsigned threads_per_queue() const { return per_queue_; }
  // Ring entries the kernel holds now, and how many the threads were made
  // to register (0 until they all started). The kernel hands a request to
  // an entry it holds when the request comes, or queues it for the next
  // entry that commits a reply: an entry registered later does not take
  // requests already queued. So a burst that comes before every entry is
  // registered is served by fewer threads than configured, as the test of
  // 32 reads at once saw (tests/e2e/server_test.cc). Logs "FUSE over
  // io_uring: all N ring entries registered" once they are.
  unsigned entries_registered() const { return registered_.load(std::memory_order_acquire); }
  unsigned entries_started() const { return entries_started_.load(std::memory_order_acquire); }

  // Calls `ready` once the rings have settled: the kernel holds every
  // entry the threads were made to register; or the rings will not serve
  // (the kernel did not offer them, INIT failed, no ring thread could be
  // made); or every entry the kernel does not hold it refused (logged); or
  // kSettleTimeout passed since the threads started, for an entry that
  // never registers (logged). At once if they already have.
  // Serve reports the mount ready through it (fs/server.cc), so that a
  // burst right after `thinfs mount` returns finds every entry in.
  void OnSettled(std::function<void()> ready);
  static constexpr std::chrono::seconds kSettleTimeout{5};
  // How often a reply the kernel refused is committed again (Run).
  static constexpr std::chrono::milliseconds kCommitRetry{100};

  // Ring threads started after this call wait `delay` before they register
  // their entry, but for each queue's pinned one: the kernel then serves
  // through the rings while most entries are not in, as on a loaded
  // machine. Zero (the default) for no wait.
  static void SetRegisterDelayForTesting(std::chrono::milliseconds delay);
  // `hook` runs with kInitRead once Read has seen the kernel's INIT, with
  // kReplyAsksForRings just before the INIT reply that asks for the rings
  // is written, with kReplyWritten just after, and with kRegistering in
  // each ring thread before it registers its entry (null: nothing): a
  // test's way to turn the kernel's knob on or off at those points. Set
  // before the mount.
  enum class InitStage { kInitRead, kReplyAsksForRings, kReplyWritten, kRegistering };
  static void SetInitHookForTesting(std::function<void(InitStage)> hook);

  // The libfuse hooks (through the session's userdata: fs/server.cc).
  ssize_t Read(int fd, void* buf, size_t len);
  ssize_t Writev(int fd, iovec* iov, int count);

  // When the calling thread serves a ring request and `size` bytes fit in
  // its entry's payload buffer, that buffer: a read reply built there is
  // not copied again. Else nullptr.
  static std::byte* ReplyBuffer(size_t size);

  struct Entry;  // one ring entry and its thread (fs/uring.cc)

 private:
  void StartThreads(uint32_t max_write, uint32_t max_pages);
  void Run(Entry* e);
  void ServeEntry(Entry* e);

  const unsigned threads_wanted_;
  std::atomic<uint64_t>* const served_;
  fuse_session* const se_;
  const int fuse_fd_;
  // eventfd, readable once Stop() begins; made by StartThreads before any
  // ring thread, which polls it.
  int stop_fd_ = -1;

  // INIT as the kernel sent it (set by Read before libfuse replies).
  std::atomic<uint64_t> init_unique_{0};
  std::atomic<bool> offered_{false};

  Mutex mu_;
  bool started_ GUARDED_BY(mu_) = false;
  std::atomic<bool> serving_{false};  // a request came through a ring
  // Set by StartThreads before any ring thread; serving() publishes them.
  unsigned queues_ = 0;
  unsigned per_queue_ = 0;
  // See entries_registered(). entries_started_ is set once every ring
  // thread is made; SettleIfAllAccountedFor logs when the entries
  // registered and refused add up to it.
  void NoteRegistered(int delta);
  // An entry the kernel refused for good (not a connection's end), with
  // the error it gave: it will never be registered. After an EOPNOTSUPP the
  // connection has no io_uring, and entries not yet registered are not
  // offered (see Run).
  void NoteRefused(int error);
  std::atomic<bool> connection_refused_{false};
  // Logs, once per mount, that the kernel refused a reply (EOPNOTSUPP
  // after the entry served a request), which Run commits again every
  // kCommitRetry.
  void NoteRefusedReply(unsigned qid);
  std::atomic<bool> reply_refused_logged_{false};
  // Settles once every entry is either registered or refused.
  void SettleIfAllAccountedFor();
  // Marks the rings settled and calls OnSettled's callback, once.
  void Settle();
  std::atomic<unsigned> registered_{0};
  std::atomic<unsigned> entries_started_{0};
  std::atomic<unsigned> refused_{0};
  std::atomic<bool> all_registered_logged_{false};
  Mutex settle_mu_;
  CondVar settle_cv_{&settle_mu_};  // settled, or Stop() began
  bool settled_ GUARDED_BY(settle_mu_) = false;
  bool settle_stop_ GUARDED_BY(settle_mu_) = false;
  std::function<void()> on_settled_ GUARDED_BY(settle_mu_);
  std::vector<std::unique_ptr<Entry>> entries_ GUARDED_BY(mu_);  // freed by the destructor
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
};

}  // namespace thinfs::fs

#endif  // THINFS_FS_URING_H_
