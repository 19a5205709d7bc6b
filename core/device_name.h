// The rule for device names: 1-128 characters of [A-Za-z0-9._+-], not
// starting with '.' (so a name is a file name in the mount, and no name is
// "." or ".."). Apart from core/pool.h so that the CLI's front binary
// (tools/front.cc) checks a name without linking the engine.
//
// Thread safety: pure.

#ifndef THINFS_CORE_DEVICE_NAME_H_
#define THINFS_CORE_DEVICE_NAME_H_

#include <string>

#include "core/status.h"

namespace thinfs {

// Ok, kNameTooLong, or kInvalidArgument saying what is wrong.
Status ValidateDeviceName(const std::string& name);

}  // namespace thinfs

#endif  // THINFS_CORE_DEVICE_NAME_H_
