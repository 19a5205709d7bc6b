#include "tools/stream_ids.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tools/file_sync.h"

namespace thinfs::tools {

namespace {

constexpr const char* kFileName = "stream-guids";
constexpr const char* kFirstLine = "thinfs-stream-guids 1";

bool Live(const DeviceRecord& r) {
  return (r.flags & (DeviceRecord::kHidden | DeviceRecord::kDeleting | DeviceRecord::kDetached)) ==
         0;
}

}  // namespace

Result<StreamGuids> StreamGuids::Load(const std::string& pool_root) {
  StreamGuids g;
  g.path_ = pool_root + "/" + kFileName;
  if (::access(g.path_.c_str(), F_OK) != 0) {
    if (errno == ENOENT) return g;
    return Status::FromErrno(errno, "access " + g.path_);
  }
  std::ifstream in(g.path_);
  if (!in) return Status::IOError("cannot read " + g.path_);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (n == 1) {
      if (line != kFirstLine) return Status::Corruption(g.path_ + ":1: not a stream-guids file");
      continue;
    }
    std::istringstream fields(line);
    uint64_t id = 0;
    std::string hex;
    ReceivedGuid e;
    if (!(fields >> id >> hex >> e.mtime_ns >> e.size) || !StreamGuid::FromHex(hex, &e.guid)) {
      return Status::Corruption(g.path_ + ":" + std::to_string(n) + ": malformed entry");
    }
    g.entries_[id] = e;
  }
  return g;
}

StreamGuid StreamGuids::IdentityOf(const uint8_t (&pool_uuid)[16],
                                   const DeviceRecord& device) const {
  auto it = entries_.find(device.id.value);
  if (it != entries_.end() && it->second.mtime_ns == device.mtime_ns &&
      it->second.size == device.size) {
    return it->second.guid;
  }
  uint8_t buf[16 + 8 * 4];
  std::memcpy(buf, pool_uuid, 16);
  const uint64_t fields[4] = {device.id.value, static_cast<uint64_t>(device.created_ns),
                              static_cast<uint64_t>(device.mtime_ns), device.size};
  for (int i = 0; i < 4; ++i) {
    for (int b = 0; b < 8; ++b) buf[16 + 8 * i + b] = static_cast<uint8_t>(fields[i] >> (8 * b));
  }
  XXH128_hash_t h = XXH3_128bits(buf, sizeof buf);
  StreamGuid g;
  for (int b = 0; b < 8; ++b) {
    g.bytes[b] = static_cast<uint8_t>(h.high64 >> (8 * b));
    g.bytes[8 + b] = static_cast<uint8_t>(h.low64 >> (8 * b));
  }
  if (g.zero()) g.bytes[0] = 1;  // zero means "no base" in a stream header
  return g;
}

const DeviceRecord* StreamGuids::FindByGuid(const StreamGuid& guid,
                                            const std::vector<DeviceRecord>& devices,
                                            const std::string** modified) const {
  *modified = nullptr;
  for (const DeviceRecord& r : devices) {
    if (!Live(r)) continue;
    auto it = entries_.find(r.id.value);
    if (it == entries_.end() || !(it->second.guid == guid)) continue;
    if (it->second.mtime_ns == r.mtime_ns && it->second.size == r.size) return &r;
    *modified = &r.name;
  }
  return nullptr;
}

Status StreamGuids::Record(uint64_t id, const ReceivedGuid& entry,
                           const std::vector<DeviceRecord>& devices) {
  // Receives into one mounted pool may run at once: each holds the lock
  // from re-reading the file to renaming its new version, so none loses
  // what another recorded meanwhile.
  const std::string lock_path = path_ + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return Status::FromErrno(errno, "open " + lock_path);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // also releases the flock
  } unlock{lock};
  while (::flock(lock, LOCK_EX) != 0) {
    if (errno != EINTR) return Status::FromErrno(errno, "flock " + lock_path);
  }
  const std::string root = path_.substr(0, path_.rfind('/'));
  THINFS_ASSIGN_OR_RETURN(StreamGuids now, Load(root.empty() ? "/" : root));
  entries_ = std::move(now.entries_);
  entries_[id] = entry;

  // Dropped: entries of devices gone. A device id missing from `devices`
  // but above every id in it may belong to a device created after that
  // list was read (ids only grow): kept.
  uint64_t max_listed = id;
  for (const DeviceRecord& r : devices) max_listed = std::max(max_listed, r.id.value);
  std::string text = std::string(kFirstLine) + "\n";
  for (const auto& [dev, e] : entries_) {
    bool keep = dev > max_listed;
    for (const DeviceRecord& r : devices) keep = keep || (r.id.value == dev && Live(r));
    if (!keep) continue;
    text += std::to_string(dev) + " " + e.guid.Hex() + " " + std::to_string(e.mtime_ns) + " " +
            std::to_string(e.size) + "\n";
  }
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return Status::IOError("write " + tmp);
  }
  THINFS_RETURN_IF_ERROR(SyncPath(tmp, O_RDONLY));
  if (::rename(tmp.c_str(), path_.c_str()) != 0) return Status::FromErrno(errno, "rename " + tmp);
  return SyncPath(root.empty() ? "/" : root, O_RDONLY | O_DIRECTORY);
}

}  // namespace thinfs::tools
