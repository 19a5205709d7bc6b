#include "core/block_device.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace thinfs {

Status BlockDevice::WriteZeroes(PoolBlock block, uint64_t count) {
  const uint64_t bs = geometry().block_size();
  std::vector<std::byte> zeros(std::min<uint64_t>(bs, 1 << 20));
  for (uint64_t i = 0; i < count; ++i) {
    for (uint64_t off = 0; off < bs; off += zeros.size()) {
      uint64_t n = std::min<uint64_t>(zeros.size(), bs - off);
      THINFS_RETURN_IF_ERROR(
          Write(PoolBlock(block.value + i), off, std::span<const std::byte>(zeros.data(), n)));
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<FileBlockDevice>> FileBlockDevice::Open(const std::string& path,
                                                               const Geometry& geometry,
                                                               bool direct, bool read_only) {
  int flags = (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  if (direct) flags |= O_DIRECT;
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return Status::FromErrno(errno, "open data " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Status::FromErrno(errno, "stat data " + path);
    ::close(fd);
    return s;
  }
  bool is_blockdev = S_ISBLK(st.st_mode);
  return std::unique_ptr<FileBlockDevice>(new FileBlockDevice(fd, geometry, direct, is_blockdev));
}

FileBlockDevice::~FileBlockDevice() { ::close(fd_); }

Status FileBlockDevice::Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf) {
  uint64_t pos = geometry_.BytesOf(block.value) + offset;
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::pread(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(pos + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "pread data");
    }
    if (n == 0) {
      // Past the end of a sparse data file that was never extended: zeros.
      std::fill(buf.begin() + static_cast<ptrdiff_t>(done), buf.end(), std::byte{0});
      return Status::Ok();
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FileBlockDevice::Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf) {
  uint64_t pos = geometry_.BytesOf(block.value) + offset;
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n =
        ::pwrite(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(pos + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "pwrite data");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FileBlockDevice::Sync() {
  if (::fdatasync(fd_) != 0) return Status::FromErrno(errno, "fdatasync data");
  return Status::Ok();
}

Status FileBlockDevice::WriteZeroes(PoolBlock block, uint64_t count) {
  uint64_t start = geometry_.BytesOf(block.value);
  uint64_t len = geometry_.BytesOf(count);
  if (is_blockdev_) {
    uint64_t range[2] = {start, len};
    if (::ioctl(fd_, BLKZEROOUT, range) == 0) return Status::Ok();
  } else if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         static_cast<off_t>(start), static_cast<off_t>(len)) == 0) {
    // A punched range of a regular file reads as zeros.
    return Status::Ok();
  }
  if (errno != EOPNOTSUPP && errno != ENOTTY && errno != EINVAL) {
    return Status::FromErrno(errno, "zero data");
  }
  return BlockDevice::WriteZeroes(block, count);
}

Status FileBlockDevice::Discard(PoolBlock block, uint64_t count) {
  uint64_t start = geometry_.BytesOf(block.value);
  uint64_t len = geometry_.BytesOf(count);
  if (is_blockdev_) {
    uint64_t range[2] = {start, len};
    // Best effort: not every device supports discard.
    (void)::ioctl(fd_, BLKDISCARD, range);
    return Status::Ok();
  }
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(start),
                  static_cast<off_t>(len)) != 0) {
    if (errno == EOPNOTSUPP) return Status::Ok();
    return Status::FromErrno(errno, "punch data");
  }
  return Status::Ok();
}

}  // namespace thinfs
