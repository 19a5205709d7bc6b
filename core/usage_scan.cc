#include "core/usage_scan.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/resolved_walk.h"
#include "core/vector_map_iterator.h"

namespace thinfs {

namespace {

bool Live(const DeviceRecord& r) {
  return (r.flags & (DeviceRecord::kHidden | DeviceRecord::kDeleting)) == 0;
}

// Copies the whole map, in iteration order; false when it has more than
// `max` entries.
Result<bool> LoadMap(MetadataStore* store, size_t max, std::vector<MapEntry>* out) {
  std::unique_ptr<MapIterator> it = store->NewMapIterator();
  for (it->Seek(VolumeId(0), VolumeBlock(0)); it->Valid(); it->Next()) {
    if (out->size() >= max) {
      out->clear();
      out->shrink_to_fit();
      return false;
    }
    out->push_back(it->entry());
  }
  THINFS_RETURN_IF_ERROR(it->status());
  return true;
}

}  // namespace

Status ScanUsage(MetadataStore* store, uint64_t block_size,
                 std::unordered_map<uint64_t, DeviceUsage>* out, size_t max_entries_in_memory) {
  out->clear();
  THINFS_ASSIGN_OR_RETURN(std::vector<DeviceRecord> devices, store->LoadDevices());
  std::vector<MapEntry> map;
  THINFS_ASSIGN_OR_RETURN(bool in_memory, LoadMap(store, max_entries_in_memory, &map));
  const ResolvedWalk::DeviceIndex index = ResolvedWalk::IndexDevices(devices);
  ResolvedWalk::IteratorFactory new_iterator;
  if (in_memory) {
    new_iterator = [&map] { return std::make_unique<VectorMapIterator>(&map); };
  } else {
    new_iterator = [store] { return store->NewMapIterator(); };
  }

  // Pass 1: readers per data block, saturating at 2 (all that matters).
  std::unordered_map<uint64_t, uint8_t> readers;
  for (const DeviceRecord& r : devices) {
    if (!Live(r)) continue;
    THINFS_ASSIGN_OR_RETURN(std::unique_ptr<ResolvedWalk> walk,
                            ResolvedWalk::Create(new_iterator, index, r.id, block_size));
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
                            ResolvedWalk::Create(new_iterator, index, r.id, block_size));
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
