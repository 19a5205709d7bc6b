#include "core/mapping_walk.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

namespace thinfs {

Result<MappingWalk> MappingWalk::Open(MetadataStore* store) {
  THINFS_ASSIGN_OR_RETURN(Superblock sb, store->ReadSuperblock());
  THINFS_ASSIGN_OR_RETURN(std::vector<DeviceRecord> devices, store->LoadDevices());
  return MappingWalk(store, sb, std::move(devices));
}

MappingWalk::MappingWalk(MetadataStore* store, Superblock sb, std::vector<DeviceRecord> devices)
    : store_(store), superblock_(sb), devices_(std::move(devices)) {
  std::sort(devices_.begin(), devices_.end(),
            [](const DeviceRecord& a, const DeviceRecord& b) { return a.id < b.id; });
  for (size_t i = 0; i < devices_.size(); ++i) index_[devices_[i].id.value] = i;
}

bool MappingWalk::Visible(const DeviceRecord& d) {
  constexpr uint32_t kInvisible =
      DeviceRecord::kHidden | DeviceRecord::kDeleting | DeviceRecord::kDetached;
  return (d.flags & kInvisible) == 0 && !d.name.empty();
}

std::vector<const DeviceRecord*> MappingWalk::VisibleDevices() const {
  std::vector<const DeviceRecord*> out;
  for (const DeviceRecord& d : devices_) {
    if (Visible(d)) out.push_back(&d);
  }
  return out;
}

Status MappingWalk::ForEach(VolumeId id, uint64_t begin, uint64_t end,
                            const std::function<Status(const ResolvedMapping&)>& fn) const {
  // One level per device of the chain, nearest first. A block falls through
  // from a level to the next only below the level's limit, and limits only
  // shrink going up, so a block at or past a level's limit is decided
  // before it (or reads zeros).
  struct Level {
    const DeviceRecord* device;
    Epoch max_epoch;
    uint64_t limit;
    std::unique_ptr<MapIterator> it;
  };
  std::vector<Level> chain;
  auto found = index_.find(id.value);
  if (found == index_.end()) return Status::NotFound("no device " + std::to_string(id.value));
  const DeviceRecord* d = &devices_[found->second];
  const Geometry geometry(superblock_.block_size, superblock_.data_blocks);
  uint64_t limit = std::min(end, geometry.BlocksFor(d->size));
  Epoch max_epoch = d->epoch;
  while (true) {
    if (chain.size() > devices_.size()) {
      return Status::Corruption("the parent chain of device " + std::to_string(id.value) +
                                " loops");
    }
    chain.push_back(Level{d, max_epoch, limit, store_->NewMapIterator()});
    if (!d->has_parent) break;
    limit = std::min(limit, d->parent_limit);
    if (limit <= begin) break;
    max_epoch = d->parent_epoch;
    auto p = index_.find(d->parent.value);
    if (p == index_.end()) {
      return Status::Corruption("device " + std::to_string(d->id.value) +
                                " has a missing parent " + std::to_string(d->parent.value));
    }
    d = &devices_[p->second];
  }
  if (chain.front().limit <= begin) return Status::Ok();

  for (Level& l : chain) {
    l.it->Seek(l.device->id, VolumeBlock(begin));
    THINFS_RETURN_IF_ERROR(l.it->status());
  }
  auto at = [](const Level& l) -> std::optional<uint64_t> {
    if (!l.it->Valid() || l.it->entry().device != l.device->id) return std::nullopt;
    uint64_t b = l.it->entry().vblock.value;
    if (b >= l.limit) return std::nullopt;
    return b;
  };
  while (true) {
    std::optional<uint64_t> cur;
    for (const Level& l : chain) {
      std::optional<uint64_t> b = at(l);
      if (b && (!cur || *b < *cur)) cur = b;
    }
    if (!cur) break;
    std::optional<ResolvedMapping> decided;
    bool zero = false;
    for (Level& l : chain) {
      if (*cur >= l.limit) break;
      // Versions of one block come newest first: the first at or below
      // the level's epoch is what the level reads.
      for (std::optional<uint64_t> b = at(l); b && *b == *cur; b = at(l)) {
        const MapEntry& e = l.it->entry();
        if (!decided && !zero && e.epoch <= l.max_epoch) {
          if (e.value.tombstone()) {
            zero = true;
          } else {
            decided = ResolvedMapping{e.vblock, e.value.block, e.device, e.epoch, e.value.flags};
          }
        }
        l.it->Next();
      }
      THINFS_RETURN_IF_ERROR(l.it->status());
    }
    if (decided) THINFS_RETURN_IF_ERROR(fn(*decided));
  }
  return Status::Ok();
}

}  // namespace thinfs
