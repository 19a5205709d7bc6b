// The FUSE callbacks. fs/server.h describes the inode scheme; docs/fuse.md
// what each operation maps to.

// 3.12: the loop configuration object, which can set max_threads.
#define FUSE_USE_VERSION 312

#include "fs/server.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/falloc.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/mountinfo.h"
#include "core/mutex.h"
#include "fs/errno_map.h"
#include "fs/log.h"
#include "fs/mount.h"

namespace thinfs::fs {
namespace {

constexpr fuse_ino_t kRootIno = FUSE_ROOT_ID;
// Every change to the namespace and to file contents goes through this
// daemon (the control socket invalidates explicitly), so the kernel may
// cache for a while; one second bounds the staleness of any attribute
// missed. Cached file data has no such bound: see PagesChanged.
constexpr double kAttrTimeout = 1.0;
constexpr double kEntryTimeout = 1.0;
constexpr uint64_t kNameMax = 128;

fuse_ino_t InoOf(VolumeId id) { return id.value + 1; }
VolumeId IdOf(fuse_ino_t ino) { return VolumeId(ino - 1); }

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

timespec TimespecOf(int64_t ns) {
  timespec ts{};
  ts.tv_sec = ns / 1'000'000'000;
  ts.tv_nsec = ns % 1'000'000'000;
  if (ts.tv_nsec < 0) {
    ts.tv_nsec += 1'000'000'000;
    ts.tv_sec -= 1;
  }
  return ts;
}

int64_t NsOf(const timespec& ts) { return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec; }

// What the kernel may hold in its page cache of one device, shared by the
// device's open handles (Server::OpenEntry). The mount does not ask for
// FUSE_CAP_AUTO_INVAL_DATA, so the kernel keeps a file's pages until they
// are dropped explicitly; PagesChanged keeps them true to the device.
struct PageCacheState {
  // Handles open with the page cache (not direct I/O).
  std::atomic<int> cached_opens{0};
  // A change bypassed the page cache: the next cached open keeps no pages.
  std::atomic<bool> stale{false};
};

// An open device file; fi->fh points to one.
struct FileHandle {
  std::shared_ptr<Volume> volume;
  VolumeId id;
  // Set by writes through this handle, cleared by flush: close(2) commits
  // only what this handle changed.
  std::atomic<bool> dirty{false};  // written by any worker, read at flush
  // Shared by every handle of the device. With the writeback cache the
  // kernel writes dirty pages back through any writable handle of the inode,
  // not necessarily the one that dirtied them, so close(2) of a handle must
  // commit if any handle's write-back reached us since the last commit.
  std::shared_ptr<std::atomic<bool>> device_dirty;
  // Shared by every handle of the device; uses_cache is set once, at open.
  std::shared_ptr<PageCacheState> cache;
  bool uses_cache = false;
};

// An open root directory: a snapshot of the listing taken at opendir, so
// that readdir offsets stay meaningful while devices come and go.
struct DirHandle {
  std::vector<DeviceInfo> devices;
};

FileHandle* FileOf(fuse_file_info* fi) { return reinterpret_cast<FileHandle*>(fi->fh); }
DirHandle* DirOf(fuse_file_info* fi) { return reinterpret_cast<DirHandle*>(fi->fh); }

class Server {
 public:
  Server(Pool* pool, const ServeConfig& config, std::function<void()> on_ready)
      : pool_(pool),
        config_(config),
        block_size_(pool->geometry().block_size()),
        on_ready_(std::move(on_ready)),
        counts_(config.counts != nullptr ? config.counts : &own_counts_) {}

  Pool* pool() const { return pool_; }
  const ServeConfig& config() const { return config_; }
  RequestCounts& counts() { return *counts_; }
  UringTransport* uring() const { return uring_; }
  void set_uring(UringTransport* t) { uring_ = t; }

  void Ready() {
    if (on_ready_) on_ready_();
    on_ready_ = nullptr;
  }

  struct stat RootStat() const {
    struct stat st {};
    st.st_ino = kRootIno;
    st.st_mode = S_IFDIR | 0755;
    st.st_nlink = 2;
    st.st_uid = config_.root_uid;
    st.st_gid = config_.root_gid;
    st.st_blksize = static_cast<blksize_t>(block_size_);
    st.st_mtim = TimespecOf(config_.root_mtime_ns);
    st.st_ctim = TimespecOf(config_.root_ctime_ns);
    st.st_atim = st.st_mtim;
    return st;
  }

  struct stat StatOf(const DeviceInfo& d) const {
    struct stat st {};
    st.st_ino = InoOf(d.id);
    st.st_mode = S_IFREG | (d.mode & 07777);
    st.st_nlink = 1;
    st.st_uid = d.uid;
    st.st_gid = d.gid;
    st.st_size = static_cast<off_t>(d.size);
    st.st_blksize = static_cast<blksize_t>(block_size_);
    st.st_blocks = static_cast<blkcnt_t>(d.mapped_blocks * (block_size_ / 512));
    st.st_atim = TimespecOf(d.atime_ns);
    st.st_mtim = TimespecOf(d.mtime_ns);
    st.st_ctim = TimespecOf(d.ctime_ns);
    return st;
  }

  fuse_entry_param EntryOf(const DeviceInfo& d) const {
    fuse_entry_param e{};
    e.ino = InoOf(d.id);
    e.generation = 0;
    e.attr = StatOf(d);
    e.attr_timeout = kAttrTimeout;
    e.entry_timeout = kEntryTimeout;
    return e;
  }

  // Attributes of inode `ino`, also for a device that was unlinked while
  // open (it has no name any more; the engine may not list it).
  Result<struct stat> StatIno(fuse_ino_t ino) {
    if (ino == kRootIno) return RootStat();
    VolumeId id = IdOf(ino);
    Result<DeviceInfo> info = pool_->GetDevice(id);
    if (info.ok()) return StatOf(*info);
    std::shared_ptr<Volume> open_volume = AnyOpenVolume(id);
    if (!info.status().IsNotFound() || open_volume == nullptr) return info.status();
    struct stat st {};
    st.st_ino = ino;
    st.st_mode = S_IFREG | 0600;
    st.st_nlink = 0;
    st.st_size = static_cast<off_t>(open_volume->size());
    st.st_blksize = static_cast<blksize_t>(block_size_);
    return st;
  }

  // --- Open files ------------------------------------------------------------

  Result<FileHandle*> OpenHandle(VolumeId id) {
    MutexLock l(&mu_);
    // Under mu_ so that unlink sees every open before deciding between
    // delete and detach.
    THINFS_ASSIGN_OR_RETURN(std::shared_ptr<Volume> volume, pool_->OpenVolume(id));
    auto handle = std::make_unique<FileHandle>();
    handle->volume = std::move(volume);
    handle->id = id;
    OpenEntry& entry = open_[id];
    if (entry.count++ == 0 && stale_.erase(id) > 0) entry.cache->stale.store(true);
    if (entry.volume.expired()) entry.volume = handle->volume;
    handle->device_dirty = entry.dirty;
    handle->cache = entry.cache;
    live_files_.insert(handle.get());
    counts_->open_files.fetch_add(1, std::memory_order_relaxed);
    return handle.release();
  }

  // Counts `handle` as using the page cache, and says whether its open may
  // keep the kernel's pages of the device: not if they went stale since.
  // The count goes up before the flag is read, and PagesChanged sets the
  // flag before it reads the count, so a change racing this open is caught
  // by one or the other.
  static bool UseCache(FileHandle& handle) {
    handle.uses_cache = true;
    handle.cache->cached_opens.fetch_add(1);
    return !handle.cache->stale.exchange(false);
  }

  // The bytes [offset, offset + length) of `handle`'s device changed other
  // than through the kernel's page cache (the kernel may or may not have
  // dropped the pages itself). Drops them now if a cached open may be
  // reading them, and in any case when the next cached open comes. Called
  // after the change is in the pool, outside the engine's locks: the
  // kernel may wait on pages locked by reads other workers serve.
  void PagesChanged(const FileHandle& handle, uint64_t offset, uint64_t length) {
    PageCacheState& cache = *handle.cache;
    if (!cache.stale.load()) cache.stale.store(true);
    if (cache.cached_opens.load() == 0 || length == 0) return;
    counts_->invalidations.fetch_add(1, std::memory_order_relaxed);
    NotifyRangeChanged(handle.id, offset, length);
  }

  void MarkStale(VolumeId id) {
    MutexLock l(&mu_);
    auto it = open_.find(id);
    if (it != open_.end()) {
      it->second.cache->stale.store(true);
    } else {
      stale_.insert(id);
    }
  }

  void CloseHandle(FileHandle* handle) {
    VolumeId id = handle->id;
    bool delete_now = false;
    {
      MutexLock l(&mu_);
      if (handle->uses_cache) handle->cache->cached_opens.fetch_sub(1);
      auto it = open_.find(id);
      if (it != open_.end() && --it->second.count == 0) {
        delete_now = detached_.erase(id) > 0;
        // The kernel keeps the pages after the last close, unless the
        // device goes with it.
        if (it->second.cache->stale.load() && !delete_now) stale_.insert(id);
        open_.erase(it);
      }
      live_files_.erase(handle);
    }
    delete handle;
    counts_->open_files.fetch_sub(1, std::memory_order_relaxed);
    if (delete_now) {
      Status s = pool_->DeleteDetached(id);
      if (!s.ok()) {
        THINFS_LOG_ERROR("delete of unlinked device %llu at last close: %s",
                         static_cast<unsigned long long>(id.value), s.ToString().c_str());
      }
    }
  }

  // An open root directory, owned here until ReleaseDir.
  DirHandle* NewDir(std::vector<DeviceInfo> devices) {
    auto dir = std::make_unique<DirHandle>();
    dir->devices = std::move(devices);
    MutexLock l(&mu_);
    return live_dirs_.emplace(dir.get(), std::move(dir)).first->first;
  }
  void ReleaseDir(DirHandle* dir) {
    MutexLock l(&mu_);
    live_dirs_.erase(dir);
  }

  // After the session ended: closes what the kernel never released (a
  // SIGTERM or an unmount can come before the RELEASE of a file still
  // open), as its release would have, deleting unlinked devices at their
  // last close. REQUIRES: no request is being served any more.
  void CloseLeftoverHandles() {
    std::vector<FileHandle*> files;
    {
      MutexLock l(&mu_);
      files.assign(live_files_.begin(), live_files_.end());
      live_dirs_.clear();
    }
    if (!files.empty()) {
      THINFS_LOG_INFO("closing %zu file handle(s) the kernel did not release", files.size());
    }
    for (FileHandle* f : files) CloseHandle(f);
  }

  std::shared_ptr<Volume> AnyOpenVolume(VolumeId id) {
    MutexLock l(&mu_);
    auto it = open_.find(id);
    return it == open_.end() ? nullptr : it->second.volume.lock();
  }

  // unlink(2): a device still open here keeps working until its last close.
  Status Unlink(const std::string& name) {
    THINFS_ASSIGN_OR_RETURN(DeviceInfo info, pool_->GetDevice(name));
    MutexLock l(&mu_);
    return RemoveNameLocked(name, info.id);
  }

  // rename(2), replacing an open target the way unlink does.
  Status Rename(const std::string& from, const std::string& to, bool replace) {
    MutexLock l(&mu_);
    if (replace && from != to) {
      Result<DeviceInfo> target = pool_->GetDevice(to);
      if (target.ok() && open_.count(target->id) > 0) {
        THINFS_RETURN_IF_ERROR(pool_->DetachName(to));
        detached_.insert(target->id);
      }
    }
    return pool_->RenameDevice(from, to, replace);
  }

  // --- Sizes -----------------------------------------------------------------

  // Grows device `id` to at least `end` bytes (writes past the end behave
  // like a file's).
  Status GrowTo(const Volume& volume, VolumeId id, uint64_t end) {
    if (end <= volume.size()) return Status::Ok();
    MutexLock l(&resize_mu_);
    if (end <= volume.size()) return Status::Ok();
    // Like any write: durable at the next fsync or periodic commit.
    return pool_->ResizeDevice(id, end, /*commit=*/false);
  }

  Status Resize(VolumeId id, uint64_t size) {
    MutexLock l(&resize_mu_);
    return pool_->ResizeDevice(id, size);
  }

  uint64_t block_size() const { return block_size_; }

 private:
  struct OpenEntry {
    int count = 0;
    std::weak_ptr<Volume> volume;
    std::shared_ptr<std::atomic<bool>> dirty = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<PageCacheState> cache = std::make_shared<PageCacheState>();
  };
  Status RemoveNameLocked(const std::string& name, VolumeId id) REQUIRES(mu_) {
    if (open_.count(id) == 0) {
      Status s = pool_->DeleteDevice(name);
      if (s.ok()) stale_.erase(id);
      return s;
    }
    THINFS_RETURN_IF_ERROR(pool_->DetachName(name));
    detached_.insert(id);
    return Status::Ok();
  }

  // Constant after construction.
  Pool* const pool_;
  const ServeConfig config_;
  const uint64_t block_size_;
  // Called once: by the INIT worker, or over io_uring by the ring thread
  // (or timer) that settles the rings.
  std::function<void()> on_ready_;
  RequestCounts own_counts_;
  RequestCounts* const counts_;
  // Set while Serve() serves over io_uring too; the I/O hooks reach it.
  UringTransport* uring_ = nullptr;

  // Lock order: resize_mu_ before mu_. Neither is held across a reply.
  // Serialises size changes so that concurrent grow-on-write and truncate
  // never move the size backwards.
  Mutex resize_mu_;
  Mutex mu_;
  std::unordered_map<VolumeId, OpenEntry> open_ GUARDED_BY(mu_);
  // Devices whose name was removed while open: deleted at the last close.
  std::unordered_set<VolumeId> detached_ GUARDED_BY(mu_);
  // Devices whose data changed behind the kernel's page cache.
  std::unordered_set<VolumeId> stale_ GUARDED_BY(mu_);
  // Handles given to the kernel and not released yet (CloseLeftoverHandles).
  std::unordered_set<FileHandle*> live_files_ GUARDED_BY(mu_);
  std::unordered_map<DirHandle*, std::unique_ptr<DirHandle>> live_dirs_ GUARDED_BY(mu_);
};

Server* ServerOf(fuse_req_t req) { return static_cast<Server*>(fuse_req_userdata(req)); }

void ReplyError(fuse_req_t req, const Status& s, const char* op) {
  int err = ToErrno(s);
  // Expected outcomes (a lookup miss, a full pool, a bad name) are debug
  // noise; everything else is worth a line.
  if (s.IsNotFound() || s.IsNoSpace() || s.IsInvalidArgument() ||
      s.code() == Status::Code::kExists || s.code() == Status::Code::kNameTooLong) {
    THINFS_LOG_DEBUG("%s: %s", op, s.ToString().c_str());
  } else if (s.IsCorruption()) {
    // Damaged metadata: the request fails with EIO rather than serve what
    // the record would point at; say what to do about it.
    THINFS_LOG_ERROR("%s: %s (damaged metadata: unmount and run 'thinfs check POOL')", op,
                     s.ToString().c_str());
  } else {
    THINFS_LOG_ERROR("%s: %s", op, s.ToString().c_str());
  }
  fuse_reply_err(req, err);
}

// Runs `body` (which replies) and turns an escaping exception into a reply.
// Replies are the last statement of every body, so an exception means no
// reply has been sent yet.
template <typename Body>
void Guarded(fuse_req_t req, const char* op, Body&& body) noexcept {
  if (CpuLatencyHold* hold = ServerOf(req)->config().cpu_latency) hold->Touch();
  try {
    body();
  } catch (const std::bad_alloc&) {
    THINFS_LOG_ERROR("%s: out of memory", op);
    fuse_reply_err(req, ENOMEM);
  } catch (const std::exception& e) {
    THINFS_LOG_ERROR("%s: unexpected exception: %s", op, e.what());
    fuse_reply_err(req, EIO);
  } catch (...) {
    THINFS_LOG_ERROR("%s: unexpected exception", op);
    fuse_reply_err(req, EIO);
  }
}

// Same for callbacks that must not reply (forget, release of a directory).
template <typename Body>
void GuardedNoReply(const char* op, Body&& body) noexcept {
  try {
    body();
  } catch (...) {
    THINFS_LOG_ERROR("%s: unexpected exception", op);
  }
}

bool IsRootChild(fuse_req_t req, fuse_ino_t parent) {
  if (parent == kRootIno) return true;
  fuse_reply_err(req, ENOTDIR);
  return false;
}

// Sets the readahead window of the mount on config.mountpoint, which the
// kernel made at mount(2) with the default of 128 KiB. Called at INIT,
// before the reply: the kernel then takes the smaller of the window and the
// reply's max_readahead, and every later open starts with it. Logs and
// carries on with the kernel's window when it cannot (not root, no sysfs).
void SetMountReadahead(const ServeConfig& config) {
  Result<std::vector<MountInfoEntry>> mounts = ReadMountInfo();
  if (!mounts.ok()) {
    THINFS_LOG_WARNING("readahead not set: %s", mounts.status().ToString().c_str());
    return;
  }
  // Just mounted, so ours is the topmost mount there.
  const MountInfoEntry* ours = TopMountOn(*mounts, config.mountpoint);
  if (ours == nullptr || ours->fstype != kThinfsFsType || ours->source != config.fsname) {
    THINFS_LOG_WARNING("readahead not set: no mount of %s on %s in /proc/self/mountinfo",
                       config.fsname.c_str(), config.mountpoint.c_str());
    return;
  }
  const std::string path = "/sys/class/bdi/" + ours->device + "/read_ahead_kb";
  const std::string kib = std::to_string(config.readahead_bytes / 1024);
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  bool ok = fd >= 0 && write(fd, kib.data(), kib.size()) == static_cast<ssize_t>(kib.size());
  const int err = errno;
  if (fd >= 0) close(fd);
  if (!ok) {
    THINFS_LOG_INFO("readahead stays at the kernel's default: cannot write %s: %s",
                    path.c_str(), strerror(err));
    return;
  }
  THINFS_LOG_INFO("readahead %s KiB (%s)", kib.c_str(), path.c_str());
}

// --- Callbacks -----------------------------------------------------------------

void OnInit(void* userdata, fuse_conn_info* conn) noexcept {
  auto* server = static_cast<Server*>(userdata);
  // libfuse presets max_write to the largest its read buffer holds
  // (FUSE_MAX_MAX_PAGES pages = 1 MiB, also the kernel's default
  // max_pages_limit) and asks the kernel for the matching max_pages. Raising
  // it further makes the kernel refuse our reads of /dev/fuse (EINVAL).
  conn->max_background = 64;
  conn->congestion_threshold = 48;
  conn->time_gran = 1;
  unsigned want = FUSE_CAP_ASYNC_DIO | FUSE_CAP_PARALLEL_DIROPS | FUSE_CAP_ASYNC_READ |
                  FUSE_CAP_READDIRPLUS;
  if (server->config().writeback_cache) want |= FUSE_CAP_WRITEBACK_CACHE;
  conn->want |= want & conn->capable;
  // We never implement O_TRUNC atomically in open; truncation comes as
  // setattr.
  conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
  // libfuse asks for AUTO_INVAL_DATA by default. With it, a read after a
  // write costs a GETATTR round trip (the write made the kernel's mtime
  // stale), and as the daemon's mtime differs from the kernel's, the reply
  // drops every cached page of the file. Every change of a volume's
  // contents goes through this mount or this daemon, so the daemon drops
  // what a change bypassing the page cache made stale (PagesChanged,
  // NotifyInodeChanged) instead.
  conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
  if (server->config().readahead_bytes != 0) {
    conn->max_readahead = server->config().readahead_bytes;
    SetMountReadahead(server->config());
  }
  if (server->config().writeback_cache && !(conn->capable & FUSE_CAP_WRITEBACK_CACHE)) {
    THINFS_LOG_WARNING("kernel lacks the writeback cache; mounting without it");
  }
  THINFS_LOG_INFO(
      "FUSE protocol %u.%u, max_write %u, max_readahead %u, max_background %u, "
      "up to %u worker threads, page cache %s, capable 0x%x, want 0x%x",
      conn->proto_major, conn->proto_minor, conn->max_write, conn->max_readahead,
      conn->max_background, server->config().max_threads,
      server->config().page_cache ? "on" : "off (direct I/O)", conn->capable, conn->want);
  // Over io_uring the mount is ready once the rings have settled, every
  // entry in (fs/uring.h, OnSettled), not at INIT: a burst that came
  // before would be served by fewer entries.
  GuardedNoReply("init", [&] {
    if (UringTransport* rings = server->uring()) {
      rings->OnSettled([server] { server->Ready(); });
    } else {
      server->Ready();
    }
  });
}

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) noexcept {
  Guarded(req, "lookup", [&] {
    if (!IsRootChild(req, parent)) return;
    Server* server = ServerOf(req);
    Result<DeviceInfo> info = server->pool()->GetDevice(std::string(name));
    if (!info.ok()) {
      if (info.status().IsNotFound() || info.status().IsInvalidArgument() ||
          info.status().code() == Status::Code::kNameTooLong) {
        // A name that cannot exist is simply absent for lookup.
        int err = info.status().code() == Status::Code::kNameTooLong ? ENAMETOOLONG : ENOENT;
        fuse_reply_err(req, err);
        return;
      }
      ReplyError(req, info.status(), "lookup");
      return;
    }
    fuse_entry_param e = server->EntryOf(*info);
    fuse_reply_entry(req, &e);
  });
}

void OnForget(fuse_req_t req, fuse_ino_t, uint64_t) noexcept {
  // Inode numbers derive from device ids: there is no table to trim.
  fuse_reply_none(req);
}

void OnForgetMulti(fuse_req_t req, size_t, fuse_forget_data*) noexcept { fuse_reply_none(req); }

void OnGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) noexcept {
  Guarded(req, "getattr", [&] {
    ServerOf(req)->counts().getattr.fetch_add(1, std::memory_order_relaxed);
    Result<struct stat> st = ServerOf(req)->StatIno(ino);
    if (!st.ok()) {
      ReplyError(req, st.status(), "getattr");
      return;
    }
    fuse_reply_attr(req, &*st, kAttrTimeout);
  });
}

void OnSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
               fuse_file_info*) noexcept {
  Guarded(req, "setattr", [&] {
    if (ino == kRootIno) {
      fuse_reply_err(req, EPERM);
      return;
    }
    Server* server = ServerOf(req);
    VolumeId id = IdOf(ino);
    std::optional<uint32_t> mode, uid, gid;
    std::optional<int64_t> atime, mtime;
    int64_t now = NowNs();
    if (to_set & FUSE_SET_ATTR_MODE) mode = S_IFREG | (attr->st_mode & 07777);
    if (to_set & FUSE_SET_ATTR_UID) uid = attr->st_uid;
    if (to_set & FUSE_SET_ATTR_GID) gid = attr->st_gid;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
      atime = now;
    } else if (to_set & FUSE_SET_ATTR_ATIME) {
      atime = NsOf(attr->st_atim);
    }
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
      mtime = now;
    } else if (to_set & FUSE_SET_ATTR_MTIME) {
      mtime = NsOf(attr->st_mtim);
    }
    if (to_set & FUSE_SET_ATTR_SIZE) {
      if (attr->st_size < 0) {
        fuse_reply_err(req, EINVAL);
        return;
      }
      Status s = server->Resize(id, static_cast<uint64_t>(attr->st_size));
      if (!s.ok()) {
        ReplyError(req, s, "setattr(size)");
        return;
      }
    }
    if (mode || uid || gid || atime || mtime) {
      Status s = server->pool()->SetAttrs(id, mode, uid, gid, atime, mtime);
      if (!s.ok()) {
        ReplyError(req, s, "setattr");
        return;
      }
    }
    Result<struct stat> st = server->StatIno(ino);
    if (!st.ok()) {
      ReplyError(req, st.status(), "setattr");
      return;
    }
    fuse_reply_attr(req, &*st, kAttrTimeout);
  });
}

// Creates the device behind mknod/create of a regular file. On failure
// replies (EPERM for anything but a regular file) and returns nullopt.
std::optional<DeviceInfo> CreateRegular(fuse_req_t req, Server* server, const char* name,
                                        mode_t mode, const char* op) {
  if (!S_ISREG(mode)) {
    // Only thin devices live here.
    fuse_reply_err(req, EPERM);
    return std::nullopt;
  }
  const fuse_ctx* ctx = fuse_req_ctx(req);
  DeviceAttrs attrs{static_cast<uint32_t>(S_IFREG | (mode & 07777)), ctx->uid, ctx->gid};
  Result<VolumeId> id = server->pool()->CreateDevice(name, 0, attrs);
  if (!id.ok()) {
    ReplyError(req, id.status(), op);
    return std::nullopt;
  }
  Result<DeviceInfo> info = server->pool()->GetDevice(*id);
  if (!info.ok()) {
    ReplyError(req, info.status(), op);
    return std::nullopt;
  }
  return *info;
}

void OnMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t) noexcept {
  Guarded(req, "mknod", [&] {
    if (!IsRootChild(req, parent)) return;
    Server* server = ServerOf(req);
    std::optional<DeviceInfo> info = CreateRegular(req, server, name, mode, "mknod");
    if (!info) return;
    fuse_entry_param e = server->EntryOf(*info);
    fuse_reply_entry(req, &e);
  });
}

void OnNotPermitted(fuse_req_t req) noexcept { fuse_reply_err(req, EPERM); }

void OnMkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t) noexcept { OnNotPermitted(req); }
void OnSymlink(fuse_req_t req, const char*, fuse_ino_t, const char*) noexcept {
  OnNotPermitted(req);
}
void OnLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) noexcept { OnNotPermitted(req); }
// Every entry is a device file; there is nothing to rmdir.
void OnRmdir(fuse_req_t req, fuse_ino_t, const char*) noexcept { fuse_reply_err(req, ENOTDIR); }

void OnUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) noexcept {
  Guarded(req, "unlink", [&] {
    if (!IsRootChild(req, parent)) return;
    Status s = ServerOf(req)->Unlink(name);
    if (!s.ok()) {
      ReplyError(req, s, "unlink");
      return;
    }
    fuse_reply_err(req, 0);
  });
}

void OnRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
              const char* newname, unsigned int flags) noexcept {
  Guarded(req, "rename", [&] {
    if (parent != kRootIno || newparent != kRootIno) {
      fuse_reply_err(req, ENOTDIR);
      return;
    }
    if (flags & RENAME_EXCHANGE) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    if (flags & ~static_cast<unsigned>(RENAME_NOREPLACE)) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    Status s = ServerOf(req)->Rename(name, newname, !(flags & RENAME_NOREPLACE));
    if (!s.ok()) {
      ReplyError(req, s, "rename");
      return;
    }
    fuse_reply_err(req, 0);
  });
}

// Writes through a direct-I/O handle bypass the page cache of cached
// opens; OnWrite drops what they change (PagesChanged).
void SetOpenFlags(Server* server, fuse_file_info* fi) {
  if ((fi->flags & O_DIRECT) || !server->config().page_cache) {
    fi->direct_io = 1;
    fi->keep_cache = 0;
  } else {
    fi->keep_cache = Server::UseCache(*FileOf(fi)) ? 1 : 0;
  }
}

// Replies to an open as fuse_reply_open would, and for a direct-I/O open
// also says FOPEN_PARALLEL_DIRECT_WRITES (FUSE 7.36, Linux 6.2), which
// libfuse 3.14's fuse_file_info has no bit for. Without it the kernel holds
// the inode lock exclusively across each direct write's whole round trip,
// so threads writing one volume file with O_DIRECT (qemu cache=none with
// aio=threads, fio --direct=1 --numjobs=N) take turns. With it they share
// the lock, unless the write extends the file, appends, or another open of
// the inode uses the page cache (the kernel checks each write). The reply
// body is a fuse_open_out and nothing else, so it goes as a buffer. The flag
// came in Linux 6.2, and Debian 12's 6.1 has it too (its FUSE says 7.38;
// DirectWritesFromManyThreadsRunAtOnce passes there); kernels without it
// ignore the flag.
int ReplyOpen(fuse_req_t req, const fuse_file_info* fi) {
  if (!fi->direct_io) return fuse_reply_open(req, fi);
  static_assert(sizeof(fuse_open_out) == 16, "the FUSE open reply's wire size");
  fuse_open_out out{};
  out.fh = fi->fh;
  out.open_flags = FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES;
  if (fi->keep_cache) out.open_flags |= FOPEN_KEEP_CACHE;
  if (fi->nonseekable) out.open_flags |= FOPEN_NONSEEKABLE;
  if (fi->noflush) out.open_flags |= FOPEN_NOFLUSH;
  return fuse_reply_buf(req, reinterpret_cast<const char*>(&out), sizeof(out));
}

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) noexcept {
  Guarded(req, "open", [&] {
    if (ino == kRootIno) {
      fuse_reply_err(req, EISDIR);
      return;
    }
    Server* server = ServerOf(req);
    VolumeId id = IdOf(ino);
    Result<FileHandle*> handle = server->OpenHandle(id);
    if (!handle.ok()) {
      ReplyError(req, handle.status(), "open");
      return;
    }
    fi->fh = reinterpret_cast<uint64_t>(*handle);
    SetOpenFlags(server, fi);
    if (ReplyOpen(req, fi) != 0) {
      // The opener went away (interrupted): no release will come.
      server->CloseHandle(*handle);
    }
  });
}

void OnCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) noexcept {
  Guarded(req, "create", [&] {
    if (!IsRootChild(req, parent)) return;
    Server* server = ServerOf(req);
    std::optional<DeviceInfo> info = CreateRegular(req, server, name, mode, "create");
    if (!info) return;
    Result<FileHandle*> handle = server->OpenHandle(info->id);
    if (!handle.ok()) {
      ReplyError(req, handle.status(), "create");
      return;
    }
    fi->fh = reinterpret_cast<uint64_t>(*handle);
    SetOpenFlags(server, fi);
    fuse_entry_param e = server->EntryOf(*info);
    if (fuse_reply_create(req, &e, fi) != 0) server->CloseHandle(*handle);
  });
}

// Per-thread read buffer: reads are up to max_pages (1 MiB) and arrive on a
// bounded set of workers, so reuse beats an allocation per read. Page
// aligned, as a ring entry's payload is, so that a read past the host's
// cache can go to it with O_DIRECT (ReadCache::kReader).
std::byte* ReadBuffer(size_t size) {
  constexpr std::align_val_t kAlign{4096};
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, kAlign); }
  };
  thread_local std::unique_ptr<std::byte[], Free> buf;
  thread_local size_t capacity = 0;
  if (capacity < size) {
    buf.reset(static_cast<std::byte*>(::operator new[](size, kAlign)));
    capacity = size;
  }
  return buf.get();
}

void OnRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) noexcept {
  Guarded(req, "read", [&] {
    ServerOf(req)->counts().read.fetch_add(1, std::memory_order_relaxed);
    FileHandle* handle = FileOf(fi);
    // Under io_uring, straight into the ring entry: the reply is not copied.
    std::byte* buf = UringTransport::ReplyBuffer(size);
    if (buf == nullptr) buf = ReadBuffer(size);
    // An O_DIRECT opener (a loop device, qemu's cache=none) caches what it
    // reads itself (libfuse passes the file's flags with each read).
    const ReadCache cache = (fi->flags & O_DIRECT) && ServerOf(req)->config().direct_reads
                                ? ReadCache::kReader
                                : ReadCache::kHost;
    Result<size_t> n = handle->volume->Read(static_cast<uint64_t>(off), std::span(buf, size), cache);
    if (!n.ok()) {
      ReplyError(req, n.status(), "read");
      return;
    }
    fuse_reply_buf(req, reinterpret_cast<const char*>(buf), *n);
  });
}

void OnWrite(fuse_req_t req, fuse_ino_t, const char* data, size_t size, off_t off,
             fuse_file_info* fi) noexcept {
  Guarded(req, "write", [&] {
    Server* server = ServerOf(req);
    server->counts().write.fetch_add(1, std::memory_order_relaxed);
    FileHandle* handle = FileOf(fi);
    uint64_t offset = static_cast<uint64_t>(off);
    Status s = server->GrowTo(*handle->volume, handle->id, offset + size);
    if (s.ok()) {
      // An O_DIRECT opener (a loop device, qemu's cache=none) caches above
      // the volume and expects its writes to head for the disk.
      const WriteCache cache = (fi->flags & O_DIRECT) && server->config().direct_writes
                                   ? WriteCache::kWriter
                                   : WriteCache::kHost;
      s = handle->volume->Write(
          offset, std::span(reinterpret_cast<const std::byte*>(data), size), cache);
    }
    // Also after a failed write, which may have written part of the range.
    if (!handle->uses_cache) server->PagesChanged(*handle, offset, size);
    if (!s.ok()) {
      ReplyError(req, s, "write");
      return;
    }
    handle->dirty.store(true, std::memory_order_relaxed);
    if (server->config().writeback_cache) {
      handle->device_dirty->store(true, std::memory_order_relaxed);
    }
    fuse_reply_write(req, size);
  });
}

void OnFlush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) noexcept {
  Guarded(req, "flush", [&] {
    FileHandle* handle = FileOf(fi);
    // close(2) makes durable what this handle wrote; a handle that only
    // read has nothing to commit. With the writeback cache the kernel has
    // just written this handle's dirty pages back (before sending FLUSH),
    // possibly through another handle: see device_dirty.
    bool dirty = handle->dirty.exchange(false);
    if (ServerOf(req)->config().writeback_cache && handle->device_dirty->exchange(false)) {
      dirty = true;
    }
    if (dirty) {
      Status s = handle->volume->Flush();
      if (!s.ok()) {
        handle->dirty.store(true);
        handle->device_dirty->store(true);
        ReplyError(req, s, "flush");
        return;
      }
    }
    fuse_reply_err(req, 0);
  });
}

void OnFsync(fuse_req_t req, fuse_ino_t, int datasync, fuse_file_info* fi) noexcept {
  Guarded(req, "fsync", [&] {
    FileHandle* handle = FileOf(fi);
    // fsync covers writes made through any descriptor: always commit.
    // fdatasync leaves a write's new times to a later commit, so the
    // handle stays dirty: its close commits them.
    if (datasync == 0) {
      handle->dirty.store(false);
      handle->device_dirty->store(false);
    }
    Status s = handle->volume->Flush(/*data_only=*/datasync != 0);
    if (!s.ok()) {
      ReplyError(req, s, "fsync");
      return;
    }
    fuse_reply_err(req, 0);
  });
}

void OnRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) noexcept {
  Guarded(req, "release", [&] {
    ServerOf(req)->CloseHandle(FileOf(fi));
    fuse_reply_err(req, 0);
  });
}

void OnOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) noexcept {
  Guarded(req, "opendir", [&] {
    if (ino != kRootIno) {
      fuse_reply_err(req, ENOTDIR);
      return;
    }
    Server* server = ServerOf(req);
    DirHandle* dir = server->NewDir(server->pool()->ListDevices());
    fi->fh = reinterpret_cast<uint64_t>(dir);
    if (fuse_reply_open(req, fi) != 0) server->ReleaseDir(dir);
  });
}

// Offsets: 0 starts; entry i (0 ".", 1 "..", 2+k device k) carries offset
// i + 1, the position of the entry after it.
void ReadDir(fuse_req_t req, size_t size, off_t off, fuse_file_info* fi, bool plus) {
  Server* server = ServerOf(req);
  DirHandle* dir = DirOf(fi);
  std::vector<char> buf(size);
  size_t used = 0;
  size_t total = dir->devices.size() + 2;
  for (size_t i = static_cast<size_t>(std::max<off_t>(off, 0)); i < total; ++i) {
    const char* name = nullptr;
    fuse_entry_param e{};
    if (i < 2) {
      name = i == 0 ? "." : "..";
      e.attr = server->RootStat();
      e.ino = kRootIno;
    } else {
      const DeviceInfo& d = dir->devices[i - 2];
      name = d.name.c_str();
      e = server->EntryOf(d);
    }
    off_t next = static_cast<off_t>(i + 1);
    size_t need =
        plus ? fuse_add_direntry_plus(req, buf.data() + used, size - used, name, &e, next)
             : fuse_add_direntry(req, buf.data() + used, size - used, name, &e.attr, next);
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void OnReaddir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) noexcept {
  Guarded(req, "readdir", [&] { ReadDir(req, size, off, fi, /*plus=*/false); });
}

void OnReaddirplus(fuse_req_t req, fuse_ino_t, size_t size, off_t off,
                   fuse_file_info* fi) noexcept {
  Guarded(req, "readdirplus", [&] { ReadDir(req, size, off, fi, /*plus=*/true); });
}

void OnReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) noexcept {
  ServerOf(req)->ReleaseDir(DirOf(fi));
  fuse_reply_err(req, 0);
}

void OnFsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) noexcept {
  Guarded(req, "fsyncdir", [&] {
    Status s = ServerOf(req)->pool()->Commit();
    if (!s.ok()) {
      ReplyError(req, s, "fsyncdir");
      return;
    }
    fuse_reply_err(req, 0);
  });
}

void OnStatfs(fuse_req_t req, fuse_ino_t) noexcept {
  Guarded(req, "statfs", [&] {
    PoolStats stats = ServerOf(req)->pool()->Stats();
    struct statvfs st {};
    st.f_bsize = stats.block_size;
    st.f_frsize = stats.block_size;
    st.f_blocks = stats.data_blocks;
    st.f_bfree = stats.free_blocks;
    st.f_bavail = stats.free_blocks;
    // Device ids are 64-bit and never reused: report a large fixed budget
    // so that df -i shows the device count as used inodes.
    constexpr fsfilcnt_t kInodeBudget = UINT32_MAX;
    st.f_files = kInodeBudget;
    st.f_ffree = kInodeBudget - std::min<fsfilcnt_t>(stats.devices, kInodeBudget);
    st.f_favail = st.f_ffree;
    st.f_namemax = kNameMax;
    fuse_reply_statfs(req, &st);
  });
}

// ENOSYS, not ENOTSUP: the kernel then remembers that this file system has
// no xattrs (fc->no_getxattr etc.) and answers EOPNOTSUPP itself. With
// ENOTSUP it would ask again on every write(2), because file_remove_privs
// looks up security.capability each time: one extra round trip per write.
void OnNoXattr(fuse_req_t req) noexcept {
  ServerOf(req)->counts().xattr.fetch_add(1, std::memory_order_relaxed);
  fuse_reply_err(req, ENOSYS);
}
void OnSetxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) noexcept {
  OnNoXattr(req);
}
void OnGetxattr(fuse_req_t req, fuse_ino_t, const char*, size_t) noexcept { OnNoXattr(req); }
void OnListxattr(fuse_req_t req, fuse_ino_t, size_t size) noexcept {
  ServerOf(req)->counts().xattr.fetch_add(1, std::memory_order_relaxed);
  // An empty list rather than an error: ls -l and cp -a ask.
  if (size == 0) {
    fuse_reply_xattr(req, 0);
  } else {
    fuse_reply_buf(req, nullptr, 0);
  }
}
void OnRemovexattr(fuse_req_t req, fuse_ino_t, const char*) noexcept { OnNoXattr(req); }

void OnFallocate(fuse_req_t req, fuse_ino_t, int mode, off_t off, off_t len,
                 fuse_file_info* fi) noexcept {
  Guarded(req, "fallocate", [&] {
    Server* server = ServerOf(req);
    FileHandle* handle = FileOf(fi);
    if (off < 0 || len <= 0) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    uint64_t offset = static_cast<uint64_t>(off);
    uint64_t end = offset + static_cast<uint64_t>(len);
    bool keep_size = mode & FALLOC_FL_KEEP_SIZE;
    int op = mode & ~FALLOC_FL_KEEP_SIZE;
    Status s;
    if (op == 0 || op == FALLOC_FL_ZERO_RANGE) {
      if (!keep_size) s = server->GrowTo(*handle->volume, handle->id, end);
      uint64_t size = handle->volume->size();
      uint64_t clipped_end = std::min(end, size);
      if (s.ok() && offset < clipped_end) {
        s = op == 0 ? handle->volume->Provision(offset, clipped_end - offset)
                    : handle->volume->Discard(offset, clipped_end - offset);
      }
    } else if (op == FALLOC_FL_PUNCH_HOLE && keep_size) {
      uint64_t clipped_end = std::min(end, handle->volume->size());
      if (offset < clipped_end) s = handle->volume->Discard(offset, clipped_end - offset);
    } else {
      fuse_reply_err(req, EOPNOTSUPP);
      return;
    }
    if (op != 0) {
      // The kernel drops these pages itself (truncate_pagecache_range) after
      // a success; this does not depend on which kernels do so for which
      // modes, and covers a failure part way.
      server->PagesChanged(*handle, offset, static_cast<uint64_t>(len));
    }
    if (!s.ok()) {
      ReplyError(req, s, "fallocate");
      return;
    }
    if (op != 0) handle->dirty.store(true, std::memory_order_relaxed);
    fuse_reply_err(req, 0);
  });
}

void OnLseek(fuse_req_t req, fuse_ino_t, off_t off, int whence, fuse_file_info* fi) noexcept {
  Guarded(req, "lseek", [&] {
    FileHandle* handle = FileOf(fi);
    if (off < 0) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    if (whence != SEEK_DATA && whence != SEEK_HOLE) {
      // The kernel resolves SEEK_SET/CUR/END itself.
      fuse_reply_err(req, EINVAL);
      return;
    }
    uint64_t offset = static_cast<uint64_t>(off);
    Result<uint64_t> pos = whence == SEEK_DATA ? handle->volume->SeekData(offset)
                                               : handle->volume->SeekHole(offset);
    if (!pos.ok()) {
      if (pos.status().IsNotFound()) {
        fuse_reply_err(req, ENXIO);
        return;
      }
      ReplyError(req, pos.status(), "lseek");
      return;
    }
    fuse_reply_lseek(req, static_cast<off_t>(*pos));
  });
}

void OnCopyFileRange(fuse_req_t req, fuse_ino_t, off_t off_in, fuse_file_info* fi_in, fuse_ino_t,
                     off_t off_out, fuse_file_info* fi_out, size_t len, int flags) noexcept {
  Guarded(req, "copy_file_range", [&] {
    Server* server = ServerOf(req);
    FileHandle* src = FileOf(fi_in);
    FileHandle* dst = FileOf(fi_out);
    if (flags != 0 || off_in < 0 || off_out < 0) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    uint64_t in = static_cast<uint64_t>(off_in);
    uint64_t out = static_cast<uint64_t>(off_out);
    uint64_t src_size = src->volume->size();
    // Like a file: copying from at or past the source's end copies nothing.
    uint64_t n = in >= src_size ? 0 : std::min<uint64_t>(len, src_size - in);
    if (n == 0) {
      fuse_reply_write(req, 0);
      return;
    }
    Status s = server->GrowTo(*dst->volume, dst->id, out + n);
    if (s.ok()) s = server->pool()->ShareRange(src->id, in, dst->id, out, n);
    // As for fallocate: the kernel drops the destination's pages too.
    server->PagesChanged(*dst, out, n);
    if (!s.ok()) {
      ReplyError(req, s, "copy_file_range");
      return;
    }
    dst->dirty.store(true, std::memory_order_relaxed);
    fuse_reply_write(req, n);
  });
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.lookup = OnLookup;
  ops.forget = OnForget;
  ops.forget_multi = OnForgetMulti;
  ops.getattr = OnGetattr;
  ops.setattr = OnSetattr;
  ops.mknod = OnMknod;
  ops.mkdir = OnMkdir;
  ops.unlink = OnUnlink;
  ops.rmdir = OnRmdir;
  ops.symlink = OnSymlink;
  ops.rename = OnRename;
  ops.link = OnLink;
  ops.open = OnOpen;
  ops.read = OnRead;
  ops.write = OnWrite;
  ops.flush = OnFlush;
  ops.release = OnRelease;
  ops.fsync = OnFsync;
  ops.opendir = OnOpendir;
  ops.readdir = OnReaddir;
  ops.readdirplus = OnReaddirplus;
  ops.releasedir = OnReleasedir;
  ops.fsyncdir = OnFsyncdir;
  ops.statfs = OnStatfs;
  ops.setxattr = OnSetxattr;
  ops.getxattr = OnGetxattr;
  ops.listxattr = OnListxattr;
  ops.removexattr = OnRemovexattr;
  ops.create = OnCreate;
  ops.fallocate = OnFallocate;
  ops.lseek = OnLseek;
  ops.copy_file_range = OnCopyFileRange;
  return ops;
}

// --- Session ---------------------------------------------------------------------

// The mounted session and its server, for the Notify* hooks. Set before the
// loop starts, cleared (under g_session_mu) before the session is destroyed.
Mutex g_session_mu;
fuse_session* g_session GUARDED_BY(g_session_mu) = nullptr;
Server* g_server GUARDED_BY(g_session_mu) = nullptr;

// Drops the kernel's cached pages of [offset, offset + length) of device
// `id` (length 0: all of them); the kernel drops its attributes too.
void DropPagesLocked(VolumeId id, uint64_t offset, uint64_t length) REQUIRES(g_session_mu) {
  int rc = fuse_lowlevel_notify_inval_inode(g_session, InoOf(id), static_cast<off_t>(offset),
                                            static_cast<off_t>(length));
  if (rc != 0 && rc != -ENOENT) {
    THINFS_LOG_WARNING("invalidate %llu bytes at %llu of device %llu (0: all): %s",
                       static_cast<unsigned long long>(length),
                       static_cast<unsigned long long>(offset),
                       static_cast<unsigned long long>(id.value), strerror(-rc));
  }
}

// libfuse reports why a mount failed through its log; keep the last error
// so that Serve() can return it.
Mutex g_fuse_log_mu;
std::string g_last_fuse_error GUARDED_BY(g_fuse_log_mu);

void FuseLogToOurs(enum fuse_log_level level, const char* fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t len = strlen(msg);
  while (len > 0 && msg[len - 1] == '\n') msg[--len] = '\0';
  LogLevel ours = LogLevel::kDebug;
  if (level <= FUSE_LOG_ERR) {
    ours = LogLevel::kError;
    MutexLock l(&g_fuse_log_mu);
    g_last_fuse_error = msg;
  } else if (level <= FUSE_LOG_WARNING) {
    ours = LogLevel::kWarning;
  } else if (level <= FUSE_LOG_INFO) {
    ours = LogLevel::kInfo;
  }
  Log(ours, "libfuse: %s", msg);
}

std::string TakeLastFuseError() {
  MutexLock l(&g_fuse_log_mu);
  std::string e = std::move(g_last_fuse_error);
  g_last_fuse_error.clear();
  return e.empty() ? "see the log for details" : e;
}

// Mount options ("-o") escape commas and backslashes in values.
std::string EscapeOption(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// libfuse's custom I/O hooks, through which every /dev/fuse worker receives
// and replies; they get the session's userdata, the Server. libfuse starts
// and ends the workers itself (fuse_session_loop_mt), so each names itself
// on its first receive, before it first waits: `top -H`, perf and gdb then
// tell them from the main thread and the engine's threads (README "mount").
ssize_t WorkerRead(int fd, void* buf, size_t len, void* userdata) {
  thread_local bool named = false;
  if (!named) {
    pthread_setname_np(pthread_self(), "thinfs-fuse");
    named = true;
  }
  UringTransport* rings = static_cast<Server*>(userdata)->uring();
  return rings != nullptr ? rings->Read(fd, buf, len) : ::read(fd, buf, len);
}

ssize_t WorkerWritev(int fd, iovec* iov, int count, void* userdata) {
  UringTransport* rings = static_cast<Server*>(userdata)->uring();
  return rings != nullptr ? rings->Writev(fd, iov, count) : ::writev(fd, iov, count);
}

}  // namespace

Status Serve(Pool* pool, const ServeConfig& config, std::function<void()> on_ready) {
  fuse_set_log_func(FuseLogToOurs);
  Server server(pool, config, std::move(on_ready));
  fuse_lowlevel_ops ops = MakeOps();

  std::string mount_opts = "default_permissions,fsname=" + EscapeOption(config.fsname) +
                           ",subtype=thinfs";
  if (config.allow_other) mount_opts += ",allow_other";
  if (config.read_only) mount_opts += ",ro";
  std::vector<std::string> argv_storage = {"thinfs", "-o", mount_opts};
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());

  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, &server);
  // fuse_session_new may copy `args` onto the heap (fuse_opt_add_arg).
  fuse_opt_free_args(&args);
  if (se == nullptr) {
    return Status::IOError("cannot create the FUSE session: " + TakeLastFuseError());
  }
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_destroy(se);
    return Status::IOError("cannot install signal handlers: " + TakeLastFuseError());
  }
  if (fuse_session_mount(se, config.mountpoint.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return Status::IOError("cannot mount on " + config.mountpoint + ": " + TakeLastFuseError());
  }
  // Destroyed after the session (which closes the FUSE fd): its buffers
  // outlive every ring.
  std::unique_ptr<UringTransport> uring;
  int fd = fuse_session_fd(se);
  if (config.io_uring != UringMode::kOff) {
    uring = std::make_unique<UringTransport>(se, fd, config.uring_threads, &server.counts().uring);
    server.set_uring(uring.get());
  }
  fuse_custom_io io{};
  io.read = WorkerRead;
  io.writev = WorkerWritev;
  if (int rc = fuse_session_custom_io(se, &io, fd); rc != 0) {
    THINFS_LOG_WARNING("fuse_session_custom_io: %s; serving /dev/fuse only, with unnamed workers",
                       strerror(-rc));
    server.set_uring(nullptr);
    uring.reset();
  }
  {
    MutexLock l(&g_session_mu);
    g_session = se;
    g_server = &server;
  }
  THINFS_LOG_INFO("serving %s on %s", config.fsname.c_str(), config.mountpoint.c_str());

  fuse_loop_config* loop = fuse_loop_cfg_create();
  if (loop == nullptr) {
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return Status::IOError("cannot create the FUSE loop configuration");
  }
  fuse_loop_cfg_set_clone_fd(loop, 1);
  fuse_loop_cfg_set_idle_threads(loop, config.max_idle_threads);
  fuse_loop_cfg_set_max_threads(loop, config.max_threads);
  int rc = fuse_session_loop_mt(se, loop);
  fuse_loop_cfg_destroy(loop);
  // The ring threads finish what they serve; the unmount ends the rest.
  if (uring) uring->Stop();

  {
    MutexLock l(&g_session_mu);
    g_session = nullptr;
    g_server = nullptr;
  }
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  server.CloseLeftoverHandles();
  RequestCounts& n = server.counts();
  THINFS_LOG_INFO(
      "served %llu reads, %llu writes, %llu getattrs, %llu xattr requests (%llu requests "
      "through io_uring); dropped %llu ranges of cached pages",
      static_cast<unsigned long long>(n.read.load()),
      static_cast<unsigned long long>(n.write.load()),
      static_cast<unsigned long long>(n.getattr.load()),
      static_cast<unsigned long long>(n.xattr.load()),
      static_cast<unsigned long long>(n.uring.load()),
      static_cast<unsigned long long>(n.invalidations.load()));
  if (rc < 0) return Status::FromErrno(-rc, "FUSE loop");
  if (rc > 0) THINFS_LOG_INFO("got signal %d, unmounted %s", rc, config.mountpoint.c_str());
  return Status::Ok();
}

void NotifyEntryChanged(const std::string& name) {
  MutexLock l(&g_session_mu);
  if (g_session == nullptr) return;
  int rc = fuse_lowlevel_notify_inval_entry(g_session, kRootIno, name.c_str(), name.size());
  if (rc != 0 && rc != -ENOENT) {
    THINFS_LOG_WARNING("invalidate entry %s: %s", name.c_str(), strerror(-rc));
  }
}

void NotifyRangeChanged(VolumeId id, uint64_t offset, uint64_t length) {
  MutexLock l(&g_session_mu);
  if (g_session == nullptr) return;
  DropPagesLocked(id, offset, length);
}

void NotifyInodeChanged(VolumeId id) {
  MutexLock l(&g_session_mu);
  if (g_session == nullptr) return;
  g_server->MarkStale(id);
  DropPagesLocked(id, 0, 0);
}

FuseTransportInfo CurrentFuseTransport() {
  FuseTransportInfo info;
  MutexLock l(&g_session_mu);
  if (g_server == nullptr) return info;
  if (const CpuLatencyHold* hold = g_server->config().cpu_latency) {
    CpuLatencyInfo c;
    c.usec = hold->usec();
    c.held = hold->held();
    c.times_set = hold->times_set();
    c.ms_held = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(hold->time_held()).count());
    info.cpu_latency = c;
  }
  // The transport outlives g_server (Serve clears it first).
  const UringTransport* uring = g_server->uring();
  if (uring == nullptr || !uring->serving()) return info;
  info.io_uring = true;
  info.queues = uring->queues();
  info.threads_per_queue = uring->threads_per_queue();
  info.ring_requests = g_server->counts().uring.load(std::memory_order_relaxed);
  info.ring_entries = uring->entries_started();
  info.ring_entries_registered = uring->entries_registered();
  return info;
}

Status DeleteDeviceServed(Pool* pool, const std::string& name) {
  // g_session_mu keeps the server alive (Serve clears g_server under it
  // before destroying it). Lock order: g_session_mu -> Server::mu_.
  MutexLock l(&g_session_mu);
  if (g_server == nullptr) return pool->DeleteDevice(name);
  return g_server->Unlink(name);
}

Status ResizeDeviceServed(Pool* pool, VolumeId id, uint64_t size) {
  MutexLock l(&g_session_mu);
  if (g_server == nullptr) return pool->ResizeDevice(id, size);
  return g_server->Resize(id, size);
}

}  // namespace thinfs::fs
