// THINFS_CHECK: a bug is not an error. A failed check logs where and what,
// then aborts.

#ifndef THINFS_CORE_CHECK_H_
#define THINFS_CORE_CHECK_H_

namespace thinfs::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr);
}  // namespace thinfs::internal

#define THINFS_CHECK(cond)                                                    \
  do {                                                                        \
    if (!(cond)) ::thinfs::internal::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)

#endif  // THINFS_CORE_CHECK_H_
