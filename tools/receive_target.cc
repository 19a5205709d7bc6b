#include "tools/receive_target.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <utility>

#include "core/admin.h"
#include "core/pool.h"
#include "meta/pool_dir.h"
#include "meta/rocksdb_store.h"
#include "tools/control_client.h"
#include "tools/daemon_checkpoint.h"
#include "tools/file_sync.h"
#include "tools/pool_here.h"

namespace thinfs::tools {

namespace {

// ---- unmounted: the engine, opened here ------------------------------------

class PoolTarget final : public ReceiveTarget {
 public:
  explicit PoolTarget(std::unique_ptr<OpenPool> open) : open_(std::move(open)) {}

  const std::string& root() const override { return open_->files.paths.root; }
  uint64_t block_size() const override { return open_->sb.block_size; }
  const std::string& mountpoint() const override { return no_mountpoint_; }

  Result<std::vector<DeviceRecord>> Devices() override { return pool().store()->LoadDevices(); }
  Status CreateDevice(const std::string& name, uint64_t size) override {
    return pool().CreateDevice(name, size).status();
  }
  Status CreateSnapshot(const std::string& origin, const std::string& name) override {
    return pool().CreateSnapshot(origin, name).status();
  }
  Status ResizeDevice(const std::string& name, uint64_t size) override {
    return pool().ResizeDevice(name, size);
  }
  Status DeleteDevice(const std::string& name) override { return pool().DeleteDevice(name); }
  Status RenameDevice(const std::string& from, const std::string& to, bool replace) override {
    return pool().RenameDevice(from, to, replace);
  }

  Status OpenData(const std::string& name) override {
    THINFS_ASSIGN_OR_RETURN(volume_, pool().OpenVolume(name));
    return Status::Ok();
  }
  Status Write(uint64_t offset, std::span<const std::byte> data) override {
    return volume_->Write(offset, data);
  }
  Status Punch(uint64_t offset, uint64_t length) override {
    return volume_->Discard(offset, length);
  }
  Status CloseData() override {
    volume_.reset();
    return Status::Ok();
  }

  Status Commit() override { return pool().Commit(); }
  Status Close() override {
    volume_.reset();
    return open_->Close();
  }

 private:
  Pool& pool() { return *open_->pool; }

  const std::string no_mountpoint_;
  std::unique_ptr<OpenPool> open_;
  std::shared_ptr<Volume> volume_;  // the device OpenData opened
};

// ---- mounted: the daemon's control socket and the mounted files ------------

class MountTarget final : public ReceiveTarget {
 public:
  MountTarget(meta::PoolPaths paths, std::string mountpoint)
      : paths_(std::move(paths)), mountpoint_(std::move(mountpoint)) {}
  ~MountTarget() override {
    if (fd_ >= 0) ::close(fd_);
  }
  MountTarget(const MountTarget&) = delete;
  MountTarget& operator=(const MountTarget&) = delete;

  // Reads the block size from a first checkpoint.
  Status Init() {
    return WithCommitted([this](meta::RocksDbStore& store) -> Status {
      THINFS_ASSIGN_OR_RETURN(Superblock sb, store.ReadSuperblock());
      block_size_ = sb.block_size;
      return Status::Ok();
    });
  }

  const std::string& root() const override { return paths_.root; }
  uint64_t block_size() const override { return block_size_; }
  const std::string& mountpoint() const override { return mountpoint_; }

  Result<std::vector<DeviceRecord>> Devices() override {
    std::vector<DeviceRecord> devices;
    THINFS_RETURN_IF_ERROR(WithCommitted([&devices](meta::RocksDbStore& store) -> Status {
      THINFS_ASSIGN_OR_RETURN(devices, store.LoadDevices());
      return Status::Ok();
    }));
    return devices;
  }
  Status CreateDevice(const std::string& name, uint64_t size) override {
    return Call({"create", {{"name", name}, {"size", std::to_string(size)}}});
  }
  Status CreateSnapshot(const std::string& origin, const std::string& name) override {
    // What the kernel may still cache for the origin goes to the daemon
    // first, as `thinfs snapshot` does on a mounted pool.
    THINFS_RETURN_IF_ERROR(SyncPath(Path(origin), O_RDONLY));
    return Call({"snapshot", {{"source", origin}, {"name", name}}});
  }
  Status ResizeDevice(const std::string& name, uint64_t size) override {
    return Call({"resize", {{"name", name}, {"size", std::to_string(size)}}});
  }
  Status DeleteDevice(const std::string& name) override { return Call({"delete", {{"name", name}}}); }
  Status RenameDevice(const std::string& from, const std::string& to, bool replace) override {
    const std::string a = Path(from), b = Path(to);
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), replace ? 0 : RENAME_NOREPLACE) !=
        0) {
      if (errno == EEXIST) return Status::Exists("device '" + to + "' exists");
      return Status::FromErrno(errno, "rename " + a + " to " + b);
    }
    return Status::Ok();
  }

  Status OpenData(const std::string& name) override {
    THINFS_RETURN_IF_ERROR(CloseData());
    path_ = Path(name);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) return Status::FromErrno(errno, "open " + path_);
    return Status::Ok();
  }
  Status Write(uint64_t offset, std::span<const std::byte> data) override {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done,
                           static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::FromErrno(errno, "write " + path_);
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }
  Status Punch(uint64_t offset, uint64_t length) override {
    if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                    static_cast<off_t>(length)) != 0) {
      return Status::FromErrno(errno, "punch a hole in " + path_);
    }
    return Status::Ok();
  }
  // fsync before close: the writes and punches are committed, and with the
  // writeback cache the kernel has sent what it held before Devices()
  // reads the mtime.
  Status CloseData() override {
    if (fd_ < 0) return Status::Ok();
    Status s;
    if (::fsync(fd_) != 0) s = Status::FromErrno(errno, "fsync " + path_);
    if (::close(fd_) != 0 && s.ok()) s = Status::FromErrno(errno, "close " + path_);
    fd_ = -1;
    return s;
  }

  // fsyncdir of the mount's root: the daemon commits the pool.
  Status Commit() override { return SyncPath(mountpoint_, O_RDONLY | O_DIRECTORY); }
  Status Close() override { return CloseData(); }

 private:
  std::string Path(const std::string& name) const { return mountpoint_ + "/" + name; }

  // Runs `read` on a checkpoint of the committed metadata (the daemon
  // commits before writing it), removed afterwards.
  Status WithCommitted(const std::function<Status(meta::RocksDbStore&)>& read) {
    bool answered = false;
    Result<std::unique_ptr<DaemonCheckpoint>> cp =
        DaemonCheckpoint::Take(paths_, ".receive-", &answered);
    if (!answered) return Status::IOError("the mount daemon of " + paths_.root + " went away");
    if (!cp.ok()) return cp.status().WithContext("checkpoint of the mounted pool");
    THINFS_ASSIGN_OR_RETURN(std::unique_ptr<meta::RocksDbStore> store,
                            OpenStoreHere((*cp)->dir(), /*read_only=*/true));
    return read(*store);
  }

  Status Call(const AdminRequest& request) {
    std::optional<Result<AdminReply>> reply = CallDaemon(paths_.root, request);
    if (!reply) return Status::IOError("the mount daemon of " + paths_.root + " went away");
    if (!reply->ok()) return reply->status();
    if ((*reply)->exit_code != kAdminOk) return Status::IOError((*reply)->error);
    return Status::Ok();
  }

  const meta::PoolPaths paths_;
  const std::string mountpoint_;
  uint64_t block_size_ = 0;
  int fd_ = -1;       // the device OpenData opened, or -1
  std::string path_;  // its path in the mount
};

}  // namespace

Result<std::unique_ptr<ReceiveTarget>> OpenReceiveTarget(const std::string& dir) {
  Result<std::unique_ptr<OpenPool>> here = OpenPoolHere(dir, false);
  if (here.ok()) return std::unique_ptr<ReceiveTarget>(new PoolTarget(std::move(*here)));
  if (here.status().code() != Status::Code::kBusy) return here.status();
  std::optional<Result<std::string>> where = DaemonMountpoint(dir);
  if (!where) return here.status();  // locked by something that is not a daemon
  if (!where->ok()) return where->status();
  auto target = std::make_unique<MountTarget>(meta::PoolPaths::For(dir), **where);
  THINFS_RETURN_IF_ERROR(target->Init());
  return std::unique_ptr<ReceiveTarget>(std::move(target));
}

}  // namespace thinfs::tools
