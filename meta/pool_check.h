// CheckPool: the metadata verifier and repairer behind `thinfs check`
// (thin_check / thin_repair for thinfs).
//
// It works offline on the parts of a pool the engine uses, a MetadataStore
// and a SpaceMap, so the same code checks a RocksDB pool on disk and an
// in-memory pool in tests. It verifies:
//   - the superblock's own fields, and that the space map covers exactly
//     its data_blocks;
//   - the device table: ids below next_device_id; every parent exists; the
//     ancestry is acyclic; parent_epoch < the parent's epoch; visible
//     devices have valid, unique names; flags are known and consistent (a
//     device being deleted reads nothing and no live device reads through
//     it; a hidden device has a child to hide for);
//   - the block map: every record decodes (one that does not, key or
//     value, is reported and skipped, and the walk goes on, like thin_check
//     past a damaged node); every version belongs to an existing device
//     and to an epoch the device has reached; every data block it names
//     lies inside the data area and is allocated in the space map (the
//     space map may over-report, never under-report);
//   - reference counts: a block named by N >= 2 versions has count N, a
//     block named by one version or none has no entry; a block named by
//     several versions with no count is "double mapped" (an in-place write
//     through one would change the others); each current-epoch version of
//     a shared block carries MapValue::kMaybeShared (else the engine would
//     overwrite it in place);
//   - mapped-block counts: each live device's mapped_blocks (st_blocks of
//     its file, what du shows) equals the blocks it reads from the data
//     area, its own versions and its parent chain's resolved over its size
//     (like thin_check's mapped-blocks check of the device details), counted
//     over the map as repair leaves it;
//   - leaks: blocks allocated in the space map that no version names
//     (warnings: reclaimable, expected after a crash).
//
// With `repair`, it then fixes what it can, in one metadata batch and one
// space-map rebuild, records every change, and verifies again:
//   - drops versions of missing devices, versions from epochs their device
//     has not reached (no one can read either), and turns versions naming a
//     block outside the data area into tombstones (the block reads zeros
//     instead of exposing an older version);
//   - turns undecodable records into tombstones too (their data is lost,
//     as thin_repair loses unreadable mappings) and deletes records whose
//     key is malformed. Their pool blocks are unknown: counting without
//     them is right only once they are gone, so plain check reports the
//     counts and leaks it sees (noting the skipped records) and changes
//     nothing, and repair removes them in the same batch that fixes the
//     counts, before the space map is rebuilt;
//   - sets every refcount entry to the exact count, drops the rest, and
//     flags current-epoch versions of shared blocks kMaybeShared;
//   - sets each live device's mapped_blocks to the blocks it reads once the
//     map is repaired (a version made a tombstone no longer counts);
//   - marks a hidden device with nothing left to hide for as deleting;
//   - rebuilds the space map from the block map (reclaiming leaks) and
//     marks it clean at the new transaction id.
// Damage it cannot fix (an unreadable superblock or device record, a
// block map RocksDB itself cannot read (an SST block checksum: the walk
// cannot step past it, so counts, refcounts and the space map go
// unchecked and unrebuilt), a missing parent, a cycle, duplicate names, a
// future parent epoch) is reported and left.
//
// Thread safety: the pool must not be open elsewhere (the caller holds the
// pool lock); one call at a time per store.

#ifndef THINFS_META_POOL_CHECK_H_
#define THINFS_META_POOL_CHECK_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/metadata.h"
#include "core/space_map.h"
#include "core/status.h"

namespace thinfs::meta {

struct CheckFinding {
  enum class Severity : uint8_t { kError, kWarning };
  Severity severity = Severity::kError;
  // Stable identifier of the kind of problem, e.g. "mapping-outside-data-area"
  // (the list is in meta/pool_check.cc, kinds are never renamed).
  std::string kind;
  // One line naming the device, vblock, epoch and block involved.
  std::string message;
  std::optional<uint64_t> device;
  std::optional<uint64_t> vblock;
  std::optional<uint64_t> epoch;
  std::optional<uint64_t> block;
  // What repair did about it; empty when nothing was done.
  std::string repair;
};

struct CheckOptions {
  bool repair = false;
  // Called now and then during long passes: a phase name, units done and
  // the total (0 when unknown). May be empty.
  std::function<void(const char* phase, uint64_t done, uint64_t total)> progress;
  // Findings listed per severity; the rest are only counted.
  size_t max_listed = 1000;
  // The mapped-block counts walk a copy of the block map in memory (about
  // 40 bytes an entry) when it has at most this many entries, else the
  // store's iterators (slower: every device walks its whole chain).
  size_t max_map_entries_in_memory = size_t{4} << 20;
};

struct CheckReport {
  // Findings of the (first) verification, errors and warnings in the order
  // found, at most max_listed of each severity.
  std::vector<CheckFinding> findings;
  uint64_t error_count = 0;
  uint64_t warning_count = 0;
  // Changes made by repair, one line each (also in findings[].repair).
  std::vector<std::string> changes;
  uint64_t errors_corrected = 0;  // errors whose repair was applied
  // After a repair: the errors the re-verification still found (0 when the
  // repair left a clean pool). Without repair: error_count.
  uint64_t errors_left = 0;
  std::vector<CheckFinding> remaining;  // the re-verification's errors

  uint64_t devices = 0;
  uint64_t mappings = 0;
  uint64_t undecodable_mappings = 0;  // block-map records skipped as damaged
  uint64_t referenced_blocks = 0;
  uint64_t shared_blocks = 0;  // named by two or more versions
  uint64_t refcount_entries = 0;
  uint64_t leaked_blocks = 0;  // before repair
  uint64_t reclaimed_blocks = 0;  // leaks freed by repair

  bool clean() const { return errors_left == 0; }
};

// Verifies (and with options.repair, repairs) `store` against `space`.
// `space` may be null when the space map could not be opened: the bitmap
// checks are skipped (and repair leaves the space map alone).
// REQUIRES for repair: a writable store and space map, nothing else using
// either.
// Findings are not failures: returns an error status only when the store
// or space map fails to read or write (kIOError), or when a repair commit
// fails.
Result<CheckReport> CheckPool(MetadataStore* store, SpaceMap* space, const CheckOptions& options);

}  // namespace thinfs::meta

#endif  // THINFS_META_POOL_CHECK_H_
