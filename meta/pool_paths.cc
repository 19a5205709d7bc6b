#include "meta/pool_paths.h"

namespace thinfs::meta {

PoolPaths PoolPaths::For(const std::string& root) {
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  PoolPaths p;
  p.root = r;
  std::string prefix = r == "/" ? r : r + "/";
  p.data = prefix + "data";
  p.meta = prefix + "meta";
  p.bitmap = prefix + "bitmap";
  p.lock = prefix + "lock";
  p.control_socket = prefix + "control.sock";
  return p;
}

}  // namespace thinfs::meta
