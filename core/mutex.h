// Mutex, SharedMutex and their scoped lockers, annotated for clang's
// -Wthread-safety analysis. Under gcc the annotations compile away.
//
// Thread safety: these are the synchronisation primitives.

#ifndef THINFS_CORE_MUTEX_H_
#define THINFS_CORE_MUTEX_H_

#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define THINFS_TSA(x) __attribute__((x))
#else
#define THINFS_TSA(x)
#endif

#define CAPABILITY(x) THINFS_TSA(capability(x))
#define SCOPED_CAPABILITY THINFS_TSA(scoped_lockable)
#define GUARDED_BY(x) THINFS_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) THINFS_TSA(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) THINFS_TSA(acquired_before(__VA_ARGS__))
#define REQUIRES(...) THINFS_TSA(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) THINFS_TSA(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) THINFS_TSA(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) THINFS_TSA(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) THINFS_TSA(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) THINFS_TSA(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) THINFS_TSA(release_generic_capability(__VA_ARGS__))
#define EXCLUDES(...) THINFS_TSA(locks_excluded(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS THINFS_TSA(no_thread_safety_analysis)

namespace thinfs {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void AssertHeld() const THINFS_TSA(assert_capability(this)) {}

  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void LockShared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() RELEASE() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex* const mu_;
};

class SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_->LockShared(); }
  ~ReaderLock() RELEASE() { mu_->UnlockShared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// A condition variable that waits on a thinfs::Mutex.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  // REQUIRES: the mutex is held (not expressible to the analysis).
  void Wait() NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lk(mu_->native(), std::adopt_lock);
    cv_.wait(lk);
    lk.release();
  }
  // Returns false on timeout.
  template <typename Duration>
  bool WaitFor(Duration d) NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lk(mu_->native(), std::adopt_lock);
    bool signalled = cv_.wait_for(lk, d) == std::cv_status::no_timeout;
    lk.release();
    return signalled;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace thinfs

#endif  // THINFS_CORE_MUTEX_H_
