#include "core/mem_metadata.h"

namespace thinfs {

class MemMetadataStore::Iter final : public MapIterator {
 public:
  explicit Iter(MemMetadataStore* store) : store_(store) {}

  bool Valid() const override { return valid_; }
  const MapEntry& entry() const override { return entry_; }
  void Seek(VolumeId device, VolumeBlock vblock) override {
    MutexLock lock(&store_->mu_);
    // ~UINT32_MAX == 0: the newest possible version of the block.
    Load(store_->live_.map.lower_bound(MapKey(device.value, vblock.value, 0)));
  }
  void Next() override {
    if (!valid_) return;
    MutexLock lock(&store_->mu_);
    // Re-find by key: the map may have changed since the last step.
    Load(store_->live_.map.upper_bound(key_));
  }
  Status status() const override { return Status::Ok(); }

 private:
  void Load(std::map<MapKey, MapValue>::const_iterator it) NO_THREAD_SAFETY_ANALYSIS {
    valid_ = it != store_->live_.map.end();
    if (!valid_) return;
    key_ = it->first;
    entry_.device = VolumeId(std::get<0>(key_));
    entry_.vblock = VolumeBlock(std::get<1>(key_));
    entry_.epoch = ~std::get<2>(key_);
    entry_.value = it->second;
  }

  MemMetadataStore* const store_;
  bool valid_ = false;
  MapKey key_;
  MapEntry entry_;
};

MemMetadataStore::MemMetadataStore(const Superblock& sb) {
  MutexLock lock(&mu_);
  live_.superblock = sb;
  durable_.superblock = sb;
}

MemMetadataStore::~MemMetadataStore() = default;

Result<Superblock> MemMetadataStore::ReadSuperblock() {
  MutexLock lock(&mu_);
  return live_.superblock;
}

Result<std::vector<DeviceRecord>> MemMetadataStore::LoadDevices() {
  MutexLock lock(&mu_);
  std::vector<DeviceRecord> out;
  out.reserve(live_.devices.size());
  for (const auto& [id, d] : live_.devices) out.push_back(d);
  return out;
}

Result<std::optional<Version>> MemMetadataStore::FindVersion(VolumeId device,
                                                             VolumeBlock vblock,
                                                             Epoch max_epoch) {
  MutexLock lock(&mu_);
  auto it = live_.map.lower_bound(MapKey(device.value, vblock.value, ~max_epoch));
  if (it == live_.map.end() || std::get<0>(it->first) != device.value ||
      std::get<1>(it->first) != vblock.value) {
    return std::optional<Version>();
  }
  return std::optional<Version>(Version{~std::get<2>(it->first), it->second});
}

Result<std::vector<Version>> MemMetadataStore::ListVersions(VolumeId device, VolumeBlock vblock) {
  MutexLock lock(&mu_);
  std::vector<Version> out;
  for (auto it = live_.map.lower_bound(MapKey(device.value, vblock.value, 0));
       it != live_.map.end() && std::get<0>(it->first) == device.value &&
       std::get<1>(it->first) == vblock.value;
       ++it) {
    out.push_back(Version{~std::get<2>(it->first), it->second});
  }
  return out;
}

Result<uint32_t> MemMetadataStore::GetRefcount(PoolBlock block) {
  MutexLock lock(&mu_);
  auto it = live_.refcounts.find(block.value);
  return it == live_.refcounts.end() ? uint32_t{0} : it->second;
}

Result<std::vector<std::pair<PoolBlock, uint32_t>>> MemMetadataStore::ListRefcounts() {
  MutexLock lock(&mu_);
  std::vector<std::pair<PoolBlock, uint32_t>> out;
  for (const auto& [block, count] : live_.refcounts) out.emplace_back(PoolBlock(block), count);
  return out;
}

std::unique_ptr<MapIterator> MemMetadataStore::NewMapIterator() {
  return std::make_unique<Iter>(this);
}

void MemMetadataStore::Apply(const MetaBatch& batch, State* state) {
  if (batch.superblock) state->superblock = *batch.superblock;
  for (const DeviceRecord& d : batch.put_devices) state->devices[d.id.value] = d;
  for (VolumeId id : batch.delete_devices) state->devices.erase(id.value);
  for (const MapEntry& e : batch.put_mappings) {
    MapValue v = e.value;
    // The RocksDB encoding stores no block for tombstones; keep the two
    // stores observably identical.
    if (v.tombstone()) v.block = PoolBlock(0);
    state->map[MapKey(e.device.value, e.vblock.value, ~e.epoch)] = v;
  }
  for (const MetaBatch::MappingKey& m : batch.delete_mappings) {
    state->map.erase(MapKey(m.device.value, m.vblock.value, ~m.epoch));
  }
  for (const auto& [block, count] : batch.refcounts) {
    if (count >= 2) {
      state->refcounts[block.value] = count;
    } else {
      state->refcounts.erase(block.value);
    }
  }
}

Status MemMetadataStore::Commit(const MetaBatch& batch, bool sync) {
  MutexLock lock(&mu_);
  if (fail_next_commit_) {
    fail_next_commit_ = false;
    return Status::IOError("commit: injected failure (MemMetadataStore::FailNextCommit)");
  }
  Apply(batch, &live_);
  if (!durable_only_on_sync_) return Status::Ok();
  if (sync) {
    for (const MetaBatch& b : unsynced_) Apply(b, &durable_);
    unsynced_.clear();
    Apply(batch, &durable_);
  } else {
    unsynced_.push_back(batch);
  }
  return Status::Ok();
}

Result<uint64_t> MemMetadataStore::MapBytesOnDisk(bool /*compact*/) {
  MutexLock lock(&mu_);
  return uint64_t{32} * live_.map.size();
}

void MemMetadataStore::SetDurableOnlyOnSync(bool on) {
  MutexLock lock(&mu_);
  if (on && !durable_only_on_sync_) {
    durable_ = live_;
    unsynced_.clear();
  }
  durable_only_on_sync_ = on;
}

void MemMetadataStore::DropUnsyncedCommits() {
  MutexLock lock(&mu_);
  if (!durable_only_on_sync_) return;
  live_ = durable_;
  unsynced_.clear();
}

void MemMetadataStore::FailNextCommit() {
  MutexLock lock(&mu_);
  fail_next_commit_ = true;
}

}  // namespace thinfs
