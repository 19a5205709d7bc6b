#include "core/resolved_walk.h"

#include <algorithm>
#include <string>

namespace thinfs {

struct ResolvedWalk::Level {
  VolumeId device;
  Epoch max_epoch = 0;
  uint64_t limit = 0;  // blocks >= limit are not read from this level
  std::unique_ptr<MapIterator> it;
  bool done = false;
};

ResolvedWalk::~ResolvedWalk() = default;

Result<std::unique_ptr<ResolvedWalk>> ResolvedWalk::Create(
    MetadataStore* store, const std::vector<DeviceRecord>& devices, VolumeId id,
    uint64_t block_size) {
  return Create([store] { return store->NewMapIterator(); }, IndexDevices(devices), id,
                block_size);
}

ResolvedWalk::DeviceIndex ResolvedWalk::IndexDevices(const std::vector<DeviceRecord>& devices) {
  DeviceIndex index;
  for (const DeviceRecord& r : devices) index[r.id.value] = &r;
  return index;
}

Result<std::unique_ptr<ResolvedWalk>> ResolvedWalk::Create(const IteratorFactory& new_iterator,
                                                           const DeviceIndex& by_id, VolumeId id,
                                                           uint64_t block_size) {
  auto it = by_id.find(id.value);
  if (it == by_id.end()) return Status::NotFound("no device " + std::to_string(id.value));
  const DeviceRecord* rec = it->second;

  std::unique_ptr<ResolvedWalk> walk(new ResolvedWalk());
  uint64_t limit = rec->size / block_size + (rec->size % block_size != 0 ? 1 : 0);
  Epoch epoch = rec->epoch;
  while (true) {
    if (walk->levels_.size() > by_id.size()) {
      return Status::Corruption("parent chain of device " + std::to_string(id.value) +
                                " has a cycle");
    }
    Level level;
    level.device = rec->id;
    level.max_epoch = epoch;
    level.limit = limit;
    level.it = new_iterator();
    level.it->Seek(rec->id, VolumeBlock(0));
    walk->levels_.push_back(std::move(level));
    THINFS_RETURN_IF_ERROR(walk->Settle(&walk->levels_.back()));
    if (!rec->has_parent) break;
    limit = std::min(limit, rec->parent_limit);
    epoch = rec->parent_epoch;
    auto p = by_id.find(rec->parent.value);
    if (p == by_id.end()) {
      return Status::Corruption("device " + std::to_string(rec->id.value) +
                                " names a missing parent " + std::to_string(rec->parent.value));
    }
    rec = p->second;
  }
  return walk;
}

// Positions `level` at its first usable version (device matches, epoch at
// or below max_epoch, vblock below limit), or marks it done.
Status ResolvedWalk::Settle(Level* level) {
  MapIterator* it = level->it.get();
  while (!level->done) {
    if (!it->Valid()) {
      THINFS_RETURN_IF_ERROR(it->status());
      level->done = true;
      break;
    }
    const MapEntry& e = it->entry();
    if (e.device != level->device || e.vblock.value >= level->limit) {
      level->done = true;
      break;
    }
    if (e.epoch <= level->max_epoch) break;
    it->Next();
  }
  return Status::Ok();
}

Result<std::optional<ResolvedBlock>> ResolvedWalk::Next() {
  while (true) {
    uint64_t vb = UINT64_MAX;
    Level* answer = nullptr;
    // The nearest level with a version of the smallest pending vblock.
    for (Level& l : levels_) {
      if (l.done) continue;
      uint64_t b = l.it->entry().vblock.value;
      if (b < vb) {
        vb = b;
        answer = &l;
      }
    }
    if (answer == nullptr) return std::optional<ResolvedBlock>();
    ResolvedBlock out;
    const MapEntry& e = answer->it->entry();
    out.vblock = vb;
    out.owner = e.device;
    out.epoch = e.epoch;
    out.block = e.value.block;
    out.flags = e.value.flags;
    const bool tombstone = e.value.tombstone();
    // Every level moves past vb (older versions and the hidden answers of
    // farther levels).
    for (Level& l : levels_) {
      if (l.done || l.it->entry().vblock.value != vb) continue;
      while (l.it->Valid() && l.it->entry().device == l.device &&
             l.it->entry().vblock.value == vb) {
        l.it->Next();
      }
      THINFS_RETURN_IF_ERROR(Settle(&l));
    }
    if (!tombstone) return std::optional<ResolvedBlock>(out);
  }
}

const char* DiffKindName(DiffKind kind) {
  switch (kind) {
    case DiffKind::kSame:
      return "same";
    case DiffKind::kDifferent:
      return "different";
    case DiffKind::kLeftOnly:
      return "left_only";
    case DiffKind::kRightOnly:
      return "right_only";
  }
  return "?";
}

Status DiffWalks(ResolvedWalk* left, ResolvedWalk* right, bool include_same,
                 const std::function<Status(const DiffRange&)>& emit) {
  std::optional<DiffRange> open;
  auto add = [&](uint64_t b, DiffKind kind) -> Status {
    if (open && open->kind == kind && open->end == b) {
      open->end = b + 1;
      return Status::Ok();
    }
    if (open && (include_same || open->kind != DiffKind::kSame)) {
      THINFS_RETURN_IF_ERROR(emit(*open));
    }
    open = DiffRange{b, b + 1, kind};
    return Status::Ok();
  };
  THINFS_ASSIGN_OR_RETURN(std::optional<ResolvedBlock> l, left->Next());
  THINFS_ASSIGN_OR_RETURN(std::optional<ResolvedBlock> r, right->Next());
  while (l || r) {
    if (l && (!r || l->vblock < r->vblock)) {
      THINFS_RETURN_IF_ERROR(add(l->vblock, DiffKind::kLeftOnly));
      THINFS_ASSIGN_OR_RETURN(l, left->Next());
    } else if (r && (!l || r->vblock < l->vblock)) {
      THINFS_RETURN_IF_ERROR(add(r->vblock, DiffKind::kRightOnly));
      THINFS_ASSIGN_OR_RETURN(r, right->Next());
    } else {
      THINFS_RETURN_IF_ERROR(
          add(l->vblock, l->block == r->block ? DiffKind::kSame : DiffKind::kDifferent));
      THINFS_ASSIGN_OR_RETURN(l, left->Next());
      THINFS_ASSIGN_OR_RETURN(r, right->Next());
    }
  }
  if (open && (include_same || open->kind != DiffKind::kSame)) {
    THINFS_RETURN_IF_ERROR(emit(*open));
  }
  return Status::Ok();
}

}  // namespace thinfs
