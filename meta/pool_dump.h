// DumpPool: a pool's metadata as thin_dump XML or as JSON (`thinfs dump`).
//
// Each visible device is dumped with its resolved mapping (MappingWalk:
// what a read of the device finds, through parents, minus tombstones), the
// way dm-thin keeps a flat map per device; a data block read by several
// devices appears in each of their mappings. Hidden origins are not
// dumped: what they hold for their children is in the children's maps.
//
// Mapping of thinfs's notions onto thin_dump's fields (docs/interop.md):
//   superblock: uuid = the pool's, transaction = its transaction id,
//     time = 1, flags = 0, version = 2, data_block_size = block size / 512;
//   device: dev_id = the device id, transaction = 0, creation_time = 0,
//     snap_time = 1;
//   mapping time: 0 when another dumped device maps the same data block
//     (0 < snap_time: dm-thin sees the block as shared and copies it on
//     write), 1 otherwise (written in place).
// The names and sizes, which thin_dump's XML cannot carry, go into the
// side table (DumpOptions::table) and the JSON form.
//
// Thread safety: one call per store at a time; the store must not change
// during the call (an offline pool or a checkpoint).

#ifndef THINFS_META_POOL_DUMP_H_
#define THINFS_META_POOL_DUMP_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "core/metadata.h"
#include "core/status.h"

namespace thinfs::meta {

enum class DumpFormat { kXml, kJson };

struct DumpOptions {
  DumpFormat format = DumpFormat::kXml;
  // When set, also receives the device table: a '#' comment line, then
  // one line per device "DEV_ID<TAB>SIZE_BYTES<TAB>NAME" (what `thinfs
  // restore --table` reads back).
  std::FILE* table = nullptr;
  // Called now and then: mapped blocks walked so far, in a first pass that
  // counts them (total 0: unknown) and a second that writes them (of the
  // total).
  std::function<void(const char* phase, uint64_t done, uint64_t total)> progress;
};

struct DumpStats {
  uint64_t devices = 0;
  uint64_t mapped_blocks = 0;  // summed over devices
  uint64_t shared_blocks = 0;  // data blocks mapped by two or more devices
};

// Writes the dump of `store` to `out`. Returns the store's errors,
// kCorruption when a mapping names a block outside the data area, kIOError
// when writing fails (`what` names the output in the message).
Result<DumpStats> DumpPool(MetadataStore* store, std::FILE* out, const std::string& what,
                           const DumpOptions& options);

// The side table's header line.
inline constexpr const char* kDeviceTableHeader = "# thinfs device table: dev_id\tsize\tname\n";

}  // namespace thinfs::meta

#endif  // THINFS_META_POOL_DUMP_H_
