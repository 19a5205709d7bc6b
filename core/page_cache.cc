#include "core/page_cache.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

// Debian 12's kernel headers (6.1) predate cachestat(2). 451 is its number
// on every architecture of the unified syscall table (alpha alone differs).
#if !defined(__NR_cachestat) && !defined(__alpha__)
#define __NR_cachestat 451
#endif

namespace thinfs {
namespace {

// include/uapi/linux/mman.h, Linux 6.5.
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};

}  // namespace

Result<uint64_t> CachedPages(int fd, uint64_t offset, uint64_t len) {
  THINFS_ASSIGN_OR_RETURN(const PageCacheCounts counts, CountPages(fd, offset, len));
  return counts.cached;
}

Result<PageCacheCounts> CountPages(int fd, uint64_t offset, uint64_t len) {
#ifndef __NR_cachestat
  (void)fd, (void)offset, (void)len;
  return Status::NotSupported("cachestat(2): no system call number for this architecture");
#else
  CachestatRange range{offset, len};
  Cachestat stat{};
  if (::syscall(__NR_cachestat, fd, &range, &stat, 0) != 0) {
    if (errno == ENOSYS) return Status::NotSupported("cachestat(2) needs Linux 6.5");
    return Status::FromErrno(errno, "cachestat");
  }
  return PageCacheCounts{stat.nr_cache, stat.nr_dirty, stat.nr_writeback, stat.nr_evicted};
#endif
}

}  // namespace thinfs
