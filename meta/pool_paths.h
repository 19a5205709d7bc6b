// The paths of a pool directory's parts (layout in meta/pool_dir.h). Kept
// apart from pool_dir.h, which opens the parts, so that code that only
// names them (the CLI's front binary, tools/front.cc, finding the control
// socket) links no RocksDB.
//
// Thread safety: pure.

#ifndef THINFS_META_POOL_PATHS_H_
#define THINFS_META_POOL_PATHS_H_

#include <string>

namespace thinfs::meta {

struct PoolPaths {
  std::string root;
  std::string data;
  std::string meta;
  std::string bitmap;
  std::string lock;
  std::string control_socket;

  // The paths of the pool at `root` (trailing slashes dropped; not resolved).
  static PoolPaths For(const std::string& root);
};

}  // namespace thinfs::meta

#endif  // THINFS_META_POOL_PATHS_H_
