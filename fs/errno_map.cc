#include "fs/errno_map.h"

#include <cerrno>

namespace thinfs::fs {

int ToErrno(const Status& s) {
  using Code = Status::Code;
  switch (s.code()) {
    case Code::kOk:
      return 0;
    case Code::kNotFound:
      return ENOENT;
    case Code::kExists:
      return EEXIST;
    case Code::kNoSpace:
      return ENOSPC;
    case Code::kReadOnly:
      return EROFS;
    case Code::kInvalidArgument:
      return EINVAL;
    case Code::kNameTooLong:
      return ENAMETOOLONG;
    case Code::kIOError:
      // A saved errno of 0 or a negative value would make fuse_reply_err
      // report success or garbage.
      return s.saved_errno() > 0 ? s.saved_errno() : EIO;
    case Code::kCorruption:
      return EIO;
    case Code::kBusy:
      return EBUSY;
    case Code::kNotSupported:
      return EOPNOTSUPP;
    case Code::kPermissionDenied:
      return EACCES;
    case Code::kNotEmpty:
      return ENOTEMPTY;
  }
  return EIO;
}

}  // namespace thinfs::fs
