// MemMetadataStore: MetadataStore in memory, for engine tests.
//
// Same semantics as meta::RocksDbStore (the contract suite in
// tests/meta/metadata_store_test.cc runs both), plus crash simulation:
// with SetDurableOnlyOnSync(true), DropUnsyncedCommits() reverts the state
// to what the last Commit(sync=true) left, as a power loss would; and
// FailNextCommit() makes the next Commit() fail without applying anything.
//
// A batch is applied in field order: superblock, put_devices,
// delete_devices, put_mappings, delete_mappings, refcounts (RocksDbStore
// writes its WriteBatch in the same order, so a key both put and deleted
// in one batch ends up deleted in both).
//
// Thread safety: every method may be called concurrently (one internal
// mutex); Commit() calls are serialised by the caller. A MapIterator does
// not pin a snapshot: each Seek/Next re-finds its position under the
// mutex, so it sees commits made while it lives (RocksDbStore's iterators
// read a snapshot). Iterators must not outlive the store.

#ifndef THINFS_CORE_MEM_METADATA_H_
#define THINFS_CORE_MEM_METADATA_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "core/metadata.h"
#include "core/mutex.h"

namespace thinfs {

class MemMetadataStore final : public MetadataStore {
 public:
  // A store holding `sb` and nothing else; its initial state is durable.
  explicit MemMetadataStore(const Superblock& sb = Superblock());
  ~MemMetadataStore() override;
  MemMetadataStore(const MemMetadataStore&) = delete;
  MemMetadataStore& operator=(const MemMetadataStore&) = delete;

  // MetadataStore. Reads never fail. Commit returns kIOError once after
  // FailNextCommit() (without applying the batch), else OK.
  Result<Superblock> ReadSuperblock() override;
  Result<std::vector<DeviceRecord>> LoadDevices() override;
  Result<std::optional<Version>> FindVersion(VolumeId device, VolumeBlock vblock,
                                             Epoch max_epoch) override;
  Result<std::vector<Version>> ListVersions(VolumeId device, VolumeBlock vblock) override;
  Result<uint32_t> GetRefcount(PoolBlock block) override;
  Result<std::vector<std::pair<PoolBlock, uint32_t>>> ListRefcounts() override;
  std::unique_ptr<MapIterator> NewMapIterator() override;
  Status Commit(const MetaBatch& batch, bool sync) override;
  // 32 bytes per stored version (the design target of the RocksDB store);
  // `compact` has no effect.
  Result<uint64_t> MapBytesOnDisk(bool compact) override;

  // With `on`, only Commit(sync=true) makes state durable: every commit
  // since the last synced one can be dropped by DropUnsyncedCommits().
  // Turning it on makes the current state the durable one. Off (the
  // default), every commit is durable.
  void SetDurableOnlyOnSync(bool on);
  // Simulates a crash: reverts to the state after the last Commit with
  // sync=true (or the state when SetDurableOnlyOnSync(true) was called).
  // No effect while SetDurableOnlyOnSync is off.
  void DropUnsyncedCommits();
  // The next Commit() returns kIOError and applies nothing.
  void FailNextCommit();

 private:
  // (device, vblock, ~epoch): the newest version of a block sorts first,
  // like the RocksDB key.
  using MapKey = std::tuple<uint64_t, uint64_t, uint32_t>;
  struct State {
    Superblock superblock;
    std::map<uint64_t, DeviceRecord> devices;
    std::map<MapKey, MapValue> map;
    std::map<uint64_t, uint32_t> refcounts;
  };
  class Iter;

  static void Apply(const MetaBatch& batch, State* state);

  // Lock order: a leaf; taken by Iter too.
  mutable Mutex mu_;
  State live_ GUARDED_BY(mu_);
  // Guarded by mu_; meaningful only while durable_only_on_sync_.
  State durable_ GUARDED_BY(mu_);
  bool durable_only_on_sync_ GUARDED_BY(mu_) = false;
  bool fail_next_commit_ GUARDED_BY(mu_) = false;
  // Commits applied to live_ but not to durable_, oldest first.
  std::vector<MetaBatch> unsynced_ GUARDED_BY(mu_);
};

}  // namespace thinfs

#endif  // THINFS_CORE_MEM_METADATA_H_
