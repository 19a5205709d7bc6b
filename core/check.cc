#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace thinfs::internal {

void CheckFailed(const char* file, int line, const char* expr) {
  std::fprintf(stderr, "thinfs: check failed at %s:%d: %s\n", file, line, expr);
  std::fflush(stderr);
  std::abort();
}

}  // namespace thinfs::internal
