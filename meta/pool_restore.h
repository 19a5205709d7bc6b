// RestorePool: builds a pool's metadata from thin_dump XML over an existing
// data area laid out the dm-thin way (block n at n * block size), without
// copying data (`thinfs restore`).
//
// Each <device> becomes a thinfs device with the same id (dev_id 0, which
// thinfs does not use, gets the next free id), its own block-map versions at
// epoch 0 and no parent. A data block mapped by N devices gets reference
// count N and the kMaybeShared flag on every version, so a write to it
// through any device copies it first (COW), as dm-thin would. The bitmap
// marks exactly the mapped blocks. Names and sizes come from the side table
// written by `thinfs dump --table`; without one a device is named
// thin<dev_id> and sized to its highest mapped block.
//
// Atomic: everything is validated while parsing, and the pool is built in
// a temporary directory next to `root` and renamed into place only when
// complete (its metadata committed and the bitmap closed cleanly). On any
// failure the temporary directory is removed and `root` is untouched. The
// data area is never written.
//
// Input checks (kInvalidArgument, with "FILE:LINE:COLUMN: " for the XML and
// "TABLE:LINE: " for the table): everything ParseThinXml checks, plus a
// block size thinfs cannot use, a data area smaller than nr_data_blocks
// blocks, duplicate dev_ids, overlapping origin ranges in one device, a
// data block mapped twice by one device (dm-thin never does that: it would
// be written in place through one mapping under the other), a table naming
// an unknown device, a bad or duplicate name, a size below a device's
// highest mapped block.
//
// Thread safety: reentrant; `root` must not be used by anyone else.

#ifndef THINFS_META_POOL_RESTORE_H_
#define THINFS_META_POOL_RESTORE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"

namespace thinfs::meta {

struct RestoreOptions {
  std::string xml_path;    // the thin_dump XML
  std::string data_path;   // the data file or block device (as format --data)
  std::string table_path;  // optional side table (DumpOptions::table)
  // Called now and then: a phase, done and total (bytes of XML, then blocks).
  std::function<void(const char* phase, uint64_t done, uint64_t total)> progress;
};

struct RestoreStats {
  uint64_t devices = 0;
  uint64_t mapped_blocks = 0;  // summed over devices
  uint64_t shared_blocks = 0;  // data blocks mapped by two or more devices
  uint64_t used_blocks = 0;    // distinct data blocks mapped
  uint64_t block_size = 0;
  uint64_t data_blocks = 0;
};

// Creates the pool `root`, which must not exist or be an empty directory
// (kExists otherwise). Returns kInvalidArgument for bad input (see above),
// kNotFound for a missing file, or the errno status of a failing step.
Result<RestoreStats> RestorePool(const std::string& root, const RestoreOptions& options);

}  // namespace thinfs::meta

#endif  // THINFS_META_POOL_RESTORE_H_
