// The one conversion from thinfs::Status to errno values, used by every FUSE
// callback. errno exists only in fs/.
//
// Thread safety: pure function.

#ifndef THINFS_FS_ERRNO_MAP_H_
#define THINFS_FS_ERRNO_MAP_H_

#include "core/status.h"

namespace thinfs::fs {

// kOk->0, kNotFound->ENOENT, kExists->EEXIST, kNoSpace->ENOSPC,
// kReadOnly->EROFS, kInvalidArgument->EINVAL, kNameTooLong->ENAMETOOLONG,
// kIOError->its saved errno or EIO, kCorruption->EIO, kBusy->EBUSY,
// kNotSupported->EOPNOTSUPP, kPermissionDenied->EACCES,
// kNotEmpty->ENOTEMPTY.
int ToErrno(const Status& s);

}  // namespace thinfs::fs

#endif  // THINFS_FS_ERRNO_MAP_H_
