#include "core/usage_scan.h"

#include <memory>
#include <optional>
#include <vector>

#include "core/mapping_walk.h"

namespace thinfs {

namespace {

bool Live(const DeviceRecord& r) {
  return (r.flags & (DeviceRecord::kHidden | DeviceRecord::kDeleting)) == 0;
}

}  // namespace

Status ScanUsage(MetadataStore* store, uint64_t block_size,
                 std::unordered_map<uint64_t, DeviceUsage>* out) {
  out->clear();
  THINFS_ASSIGN_OR_RETURN(std::vector<DeviceRecord> devices, store->LoadDevices());

  // Pass 1: readers per data block, saturating at 2 (all that matters).
  std::unordered_map<uint64_t, uint8_t> readers;
  for (const DeviceRecord& r : devices) {
    if (!Live(r)) continue;
    THINFS_ASSIGN_OR_RETURN(std::unique_ptr<ResolvedWalk> walk,
                            ResolvedWalk::Create(store, devices, r.id, block_size));
    while (true) {
      THINFS_ASSIGN_OR_RETURN(std::optional<ResolvedBlock> b, walk->Next());
      if (!b) break;
      uint8_t& n = readers[b->block.value];
      if (n < 2) ++n;
    }
  }

  // Pass 2: classify each device's blocks.
  for (const DeviceRecord& r : devices) {
    if (!Live(r)) continue;
    THINFS_ASSIGN_OR_RETURN(std::unique_ptr<ResolvedWalk> walk,
                            ResolvedWalk::Create(store, devices, r.id, block_size));
    DeviceUsage u;
    while (true) {
      THINFS_ASSIGN_OR_RETURN(std::optional<ResolvedBlock> b, walk->Next());
      if (!b) break;
      u.mapped_blocks++;
      if (readers[b->block.value] >= 2) {
        u.shared_blocks++;
      } else {
        u.exclusive_blocks++;
      }
    }
    (*out)[r.id.value] = u;
  }
  return Status::Ok();
}

}  // namespace thinfs
