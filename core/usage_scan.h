// Mapped / exclusive / shared block counts of every device in one scan of
// the committed block map (thinfs list), like thin_ls.
//
// Pool::ComputeUsage answers for one device by resolving each of its blocks
// and asking every child of the owning version whether it reads it too:
// listing N snapshots of one origin costs O(N^2 x blocks). ScanUsage walks
// each device once to count, per data block, how many live devices read it,
// then walks each again to classify its blocks: O(N x blocks) with an
// iterator per chain level (core/resolved_walk.h) and no point lookups.
//
// A mapped block is shared when another live device, or another block of
// the same device (a range clone), reads the same data block; otherwise it
// is exclusive: deleting the device would free it. This is the definition
// `thinfs list` documents. (ComputeUsage counts the readers of one version
// plus the stored reference count, which can differ both ways: a reference
// held by a version no live device sees counts as shared there, and
// sharing through a range clone whose version lacks kMaybeShared is
// missed; tests/core/resolved_walk_test.cc checks ScanUsage against point
// lookups.)
//
// Reads the committed state only: commit first. Thread safety: as
// MetadataStore.

#ifndef THINFS_CORE_USAGE_SCAN_H_
#define THINFS_CORE_USAGE_SCAN_H_

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "core/metadata.h"
#include "core/pool.h"
#include "core/status.h"

namespace thinfs {

// Fills `out` with the usage of every live device (not hidden, not being
// deleted), by id value. kIOError / kCorruption from the store.
// (An out-parameter: gcc 12 -O2 warns falsely, -Wfree-nonheap-object, on a
// Result<unordered_map> moved through a variant.)
//
// Every device walks the entries of its whole parent chain, so N snapshots
// of one origin visit the origin's entries N times: from a copy in memory
// a visit costs nanoseconds, through a RocksDB iterator a microsecond or
// more. A map of up to `max_entries_in_memory` entries (about 40 bytes
// each) is copied first; a larger one is walked with store iterators.
inline constexpr size_t kScanEntriesInMemory = size_t{4} << 20;
Status ScanUsage(MetadataStore* store, uint64_t block_size,
                 std::unordered_map<uint64_t, DeviceUsage>* out,
                 size_t max_entries_in_memory = kScanEntriesInMemory);

}  // namespace thinfs

#endif  // THINFS_CORE_USAGE_SCAN_H_
