// fsync(2) of a path, for the CLI's own files (POOL/stream-guids and its
// directory) and for files of a mount (a device file, the mount's root,
// whose fsyncdir makes the daemon commit).
//
// Header-only. Thread-safe.

#ifndef THINFS_TOOLS_FILE_SYNC_H_
#define THINFS_TOOLS_FILE_SYNC_H_

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "core/status.h"

namespace thinfs::tools {

// Opens `path` with `flags` (O_RDONLY, or O_RDONLY | O_DIRECTORY), fsyncs
// and closes it. The errno status of the step that failed.
inline Status SyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::FromErrno(err, "fsync " + path);
  return Status::Ok();
}

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_FILE_SYNC_H_
