// FolioCensus: how the host's page cache holds a range of a file.
//
// A read of cached file data copies it folio by folio; a 64 KiB block the
// page cache holds as one folio reads faster than one held as sixteen
// 4 KiB pages (docs/benchmarks.md, levers 20 and 29). Which folios the
// kernel made depends on the writes that filled the range, so the engine's
// benchmark and tests count them: each cached page of the range is mapped
// into this process, its page frame looked up in /proc/self/pagemap and its
// flags in /proc/kpageflags (root only).

#ifndef THINFS_CORE_FOLIO_CENSUS_H_
#define THINFS_CORE_FOLIO_CENSUS_H_

#include <cstdint>

#include "core/status.h"

namespace thinfs {

struct FolioCensus {
  uint64_t folios = 0;    // folios a read of the range touches
  uint64_t uncached = 0;  // 4 KiB pages of the range not in the page cache
  // The touched folios' sizes in 4 KiB pages, summed (whole folios, also
  // where one reaches past the range): folio_pages / folios is their mean
  // size. A large folio holding several blocks is copied by a read of
  // them with less work per byte than one folio per block.
  uint64_t folio_pages = 0;
};

// Counts the folios holding bytes [offset, offset + len) of `fd`, a regular
// file open for reading. A folio reaching into the range from before it
// counts. Pages are only looked at, never read in.
// REQUIRES: offset and len multiples of 4 KiB; the range inside the file.
// Returns kPermissionDenied or kIOError where the kernel does not tell.
Result<FolioCensus> CensusFolios(int fd, uint64_t offset, uint64_t len);

}  // namespace thinfs

#endif  // THINFS_CORE_FOLIO_CENSUS_H_
