#include "meta/fault_injection_env.h"

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <string>

#include "core/mutex.h"

namespace thinfs::meta {

namespace {

struct FileState {
  uint64_t pos = 0;      // bytes written so far
  uint64_t synced = 0;   // bytes covered by the last Sync/Fsync
  bool ever_synced = false;
};

class TrackingFs final : public rocksdb::FileSystemWrapper {
 public:
  TrackingFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}

  const char* Name() const override { return "ThinfsFaultInjectionFs"; }

  bool active() const { return active_.load(); }
  void set_active(bool a) { active_.store(a); }

  rocksdb::IOStatus Inactive(const std::string& what) const {
    return rocksdb::IOStatus::IOError("fault injection: file system inactive", what);
  }

  // Called by TrackedFile.
  void Wrote(const std::string& name, uint64_t end) {
    MutexLock lock(&mu_);
    FileState& f = files_[name];
    if (end > f.pos) f.pos = end;
  }
  void Truncated(const std::string& name, uint64_t size) {
    MutexLock lock(&mu_);
    files_[name].pos = size;
  }
  void Synced(const std::string& name) {
    MutexLock lock(&mu_);
    FileState& f = files_[name];
    f.synced = f.pos;
    f.ever_synced = true;
  }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    (void)f, (void)old, (void)o, (void)r, (void)dbg;
    return rocksdb::IOStatus::NotSupported("fault injection: no WAL recycling");
  }
  rocksdb::IOStatus NewRandomRWFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    (void)f, (void)o, (void)r, (void)dbg;
    return rocksdb::IOStatus::NotSupported("fault injection: random RW files untracked");
  }
  rocksdb::IOStatus DeleteFile(const std::string& f, const rocksdb::IOOptions& o,
                               rocksdb::IODebugContext* dbg) override {
    if (!active()) return Inactive(f);
    rocksdb::IOStatus s = target()->DeleteFile(f, o, dbg);
    if (s.ok()) {
      MutexLock lock(&mu_);
      files_.erase(f);
    }
    return s;
  }
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& dst,
                               const rocksdb::IOOptions& o,
                               rocksdb::IODebugContext* dbg) override {
    if (!active()) return Inactive(src);
    rocksdb::IOStatus s = target()->RenameFile(src, dst, o, dbg);
    if (s.ok()) {
      MutexLock lock(&mu_);
      auto it = files_.find(src);
      files_.erase(dst);
      if (it != files_.end()) {
        files_[dst] = it->second;
        files_.erase(src);
      }
    }
    return s;
  }
  rocksdb::IOStatus LinkFile(const std::string& src, const std::string& dst,
                             const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    if (!active()) return Inactive(src);
    return target()->LinkFile(src, dst, o, dbg);
  }

  Status DropUnsyncedData() {
    MutexLock lock(&mu_);
    for (auto it = files_.begin(); it != files_.end();) {
      const FileState& f = it->second;
      if (!f.ever_synced) {
        if (::unlink(it->first.c_str()) != 0 && errno != ENOENT) {
          return Status::FromErrno(errno, "drop unsynced: unlink " + it->first);
        }
        it = files_.erase(it);
        continue;
      }
      if (::truncate(it->first.c_str(), static_cast<off_t>(f.synced)) != 0 && errno != ENOENT) {
        return Status::FromErrno(errno, "drop unsynced: truncate " + it->first);
      }
      it->second.pos = f.synced;
      ++it;
    }
    return Status::Ok();
  }

 private:
  // A flag, not a lock: checked on every I/O by RocksDB's threads.
  std::atomic<bool> active_{true};
  Mutex mu_;  // a leaf
  std::map<std::string, FileState> files_ GUARDED_BY(mu_);
};

class TrackedFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  TrackedFile(TrackingFs* fs, std::string name, uint64_t pos,
              std::unique_ptr<rocksdb::FSWritableFile> t)
      : FSWritableFileOwnerWrapper(std::move(t)), fs_(fs), name_(std::move(name)), pos_(pos) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive(name_);
    rocksdb::IOStatus s = target()->Append(data, o, dbg);
    if (s.ok()) Advance(pos_ + data.size());
    return s;
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive(name_);
    rocksdb::IOStatus s = target()->Append(data, o, info, dbg);
    if (s.ok()) Advance(pos_ + data.size());
    return s;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& o,
                                     rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive(name_);
    rocksdb::IOStatus s = target()->PositionedAppend(data, offset, o, dbg);
    if (s.ok()) Advance(offset + data.size());
    return s;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& o,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive(name_);
    rocksdb::IOStatus s = target()->PositionedAppend(data, offset, o, info, dbg);
    if (s.ok()) Advance(offset + data.size());
    return s;
  }
  rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive(name_);
    rocksdb::IOStatus s = target()->Truncate(size, o, dbg);
    if (s.ok()) {
      pos_ = size;
      fs_->Truncated(name_, size);
    }
    return s;
  }
  rocksdb::IOStatus Flush(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive(name_);
    return target()->Flush(o, dbg);
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive(name_);
    rocksdb::IOStatus s = target()->Sync(o, dbg);
    if (s.ok()) fs_->Synced(name_);
    return s;
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive(name_);
    rocksdb::IOStatus s = target()->Fsync(o, dbg);
    if (s.ok()) fs_->Synced(name_);
    return s;
  }
  // RangeSync promises nothing about durability: forwarded, not counted.
  rocksdb::IOStatus RangeSync(uint64_t offset, uint64_t n, const rocksdb::IOOptions& o,
                              rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive(name_);
    return target()->RangeSync(offset, n, o, dbg);
  }
  // Closing does not make data durable; an inactive file system still
  // releases the descriptor.
  rocksdb::IOStatus Close(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    return target()->Close(o, dbg);
  }

 private:
  void Advance(uint64_t end) {
    if (end > pos_) pos_ = end;
    fs_->Wrote(name_, pos_);
  }

  TrackingFs* const fs_;
  const std::string name_;
  uint64_t pos_;
};

rocksdb::IOStatus TrackingFs::NewWritableFile(const std::string& f,
                                              const rocksdb::FileOptions& o,
                                              std::unique_ptr<rocksdb::FSWritableFile>* r,
                                              rocksdb::IODebugContext* dbg) {
  if (!active()) return Inactive(f);
  std::unique_ptr<rocksdb::FSWritableFile> file;
  rocksdb::IOStatus s = target()->NewWritableFile(f, o, &file, dbg);
  if (!s.ok()) return s;
  {
    MutexLock lock(&mu_);
    files_[f] = FileState();  // created or truncated: nothing durable yet
  }
  *r = std::make_unique<TrackedFile>(this, f, 0, std::move(file));
  return s;
}

rocksdb::IOStatus TrackingFs::ReopenWritableFile(const std::string& f,
                                                 const rocksdb::FileOptions& o,
                                                 std::unique_ptr<rocksdb::FSWritableFile>* r,
                                                 rocksdb::IODebugContext* dbg) {
  if (!active()) return Inactive(f);
  std::unique_ptr<rocksdb::FSWritableFile> file;
  rocksdb::IOStatus s = target()->ReopenWritableFile(f, o, &file, dbg);
  if (!s.ok()) return s;
  uint64_t size = 0;
  rocksdb::IOStatus st = target()->GetFileSize(f, rocksdb::IOOptions(), &size, dbg);
  if (!st.ok()) return st;
  {
    MutexLock lock(&mu_);
    auto [it, inserted] = files_.try_emplace(f);
    if (inserted) {  // untracked until now: its contents count as synced
      it->second.pos = it->second.synced = size;
      it->second.ever_synced = true;
    }
  }
  *r = std::make_unique<TrackedFile>(this, f, size, std::move(file));
  return s;
}

}  // namespace

struct FaultInjectionFs::Rep {
  std::shared_ptr<TrackingFs> fs;
  std::unique_ptr<rocksdb::Env> env;
};

FaultInjectionFs::FaultInjectionFs(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
FaultInjectionFs::~FaultInjectionFs() = default;

std::unique_ptr<FaultInjectionFs> FaultInjectionFs::Create() {
  auto rep = std::make_unique<Rep>();
  rep->fs = std::make_shared<TrackingFs>();
  rep->env = rocksdb::NewCompositeEnv(rep->fs);
  return std::unique_ptr<FaultInjectionFs>(new FaultInjectionFs(std::move(rep)));
}

void* FaultInjectionFs::env() { return rep_->env.get(); }

void FaultInjectionFs::SetFilesystemActive(bool active) { rep_->fs->set_active(active); }

Status FaultInjectionFs::DropUnsyncedData() { return rep_->fs->DropUnsyncedData(); }

}  // namespace thinfs::meta
