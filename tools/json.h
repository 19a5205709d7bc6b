// The CLI's JSON writer lives in core/json.h (the control socket's replies
// use it too); this header keeps the tools:: spelling.

#ifndef THINFS_TOOLS_JSON_H_
#define THINFS_TOOLS_JSON_H_

#include "core/json.h"

namespace thinfs::tools {

using ::thinfs::JsonWriter;

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_JSON_H_
