// CachedPages: how much of a range of a file the host's page cache holds,
// asked without reading anything in.
//
// The read path asks it of one page before it hints or reads a run of the
// data area (FileBlockDevice::PrefetchForRead): a page there means the
// kernel's readahead is ahead of the reader. A probe by preadv2(RWF_NOWAIT)
// is no such question, since a miss starts reading the page in, and when
// that read completes before the kernel looks again the miss reads as a
// hit. cachestat(2) (Linux 6.5) only counts.

#ifndef THINFS_CORE_PAGE_CACHE_H_
#define THINFS_CORE_PAGE_CACHE_H_

#include <cstdint>

#include "core/status.h"

namespace thinfs {

// The number of pages of bytes [offset, offset + len) of `fd` in the page
// cache, pages being read in or written back included; a page the range
// reaches into counts. Reads nothing in. Returns kNotSupported where the
// kernel has no cachestat(2), and kPermissionDenied where it refuses to
// tell (newer kernels may refuse a descriptor not open for writing, of a
// file the caller may not write).
// REQUIRES: len > 0.
Result<uint64_t> CachedPages(int fd, uint64_t offset, uint64_t len);

// What cachestat(2) tells of bytes [offset, offset + len) of `fd`: pages
// cached (as CachedPages), of them those dirty and those being written
// back, and pages that reclaim evicted and whose place the kernel still
// remembers (its shadow entries; drop_caches, POSIX_FADV_DONTNEED and
// truncation leave none). The same errors as CachedPages.
// REQUIRES: len > 0.
struct PageCacheCounts {
  uint64_t cached = 0;
  uint64_t dirty = 0;
  uint64_t writeback = 0;
  uint64_t evicted = 0;
};
Result<PageCacheCounts> CountPages(int fd, uint64_t offset, uint64_t len);

}  // namespace thinfs

#endif  // THINFS_CORE_PAGE_CACHE_H_
