// An engine over in-memory, fault-injecting components that survive a
// simulated crash, plus the consistency checks every engine test shares.

#ifndef THINFS_TESTS_UTIL_ENGINE_FIXTURE_H_
#define THINFS_TESTS_UTIL_ENGINE_FIXTURE_H_

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/fault_injection_block_device.h"
#include "core/mem_metadata.h"
#include "core/mem_space_map.h"
#include "core/pool.h"
#include "tests/util/forwarding.h"

#define ASSERT_OK(expr)                                   \
  do {                                                    \
    ::thinfs::Status s_ = (expr);                         \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)
#define EXPECT_OK(expr)                                   \
  do {                                                    \
    ::thinfs::Status s_ = (expr);                         \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)

namespace thinfs::testing {

// Counts what the engine asks of the store (to prove O(1) properties
// without timing anything).
class CountingStore final : public MetadataStore {
 public:
  explicit CountingStore(MetadataStore* t) : t_(t) {}
  Result<Superblock> ReadSuperblock() override { return t_->ReadSuperblock(); }
  Result<std::vector<DeviceRecord>> LoadDevices() override { return t_->LoadDevices(); }
  Result<std::optional<Version>> FindVersion(VolumeId d, VolumeBlock b, Epoch e) override {
    ++finds;
    return t_->FindVersion(d, b, e);
  }
  Result<std::vector<Version>> ListVersions(VolumeId d, VolumeBlock b) override {
    ++lists;
    return t_->ListVersions(d, b);
  }
  Result<uint32_t> GetRefcount(PoolBlock b) override { return t_->GetRefcount(b); }
  Result<std::vector<std::pair<PoolBlock, uint32_t>>> ListRefcounts() override {
    return t_->ListRefcounts();
  }
  std::unique_ptr<MapIterator> NewMapIterator() override {
    ++iterators;
    return t_->NewMapIterator();
  }
  Status Commit(const MetaBatch& b, bool sync) override {
    last_batch_records = b.put_devices.size() + b.delete_devices.size() + b.put_mappings.size() +
                         b.delete_mappings.size() + b.refcounts.size();
    return t_->Commit(b, sync);
  }
  Result<uint64_t> MapBytesOnDisk(bool c) override { return t_->MapBytesOnDisk(c); }

  std::atomic<uint64_t> finds{0};
  std::atomic<uint64_t> lists{0};
  std::atomic<uint64_t> iterators{0};
  // Every way the engine reads the block map, for "reads nothing of it".
  uint64_t map_reads() const { return finds + lists + iterators; }
  std::atomic<uint64_t> last_batch_records{0};

 private:
  MetadataStore* const t_;
};

struct EngineFixture {
  EngineFixture(uint64_t block_size, uint64_t blocks, PoolOptions options = DefaultOptions())
      : geometry(block_size, blocks), options(options) {
    Superblock sb;
    sb.block_size = block_size;
    sb.data_blocks = blocks;
    data = std::make_unique<FaultInjectionBlockDevice>(geometry, /*seed=*/1);
    space = std::make_unique<MemSpaceMap>(blocks);
    store = std::make_unique<MemMetadataStore>(sb);
    store->SetDurableOnlyOnSync(true);
    Open();
  }
  ~EngineFixture() {
    if (pool) pool->AbandonForTesting();
  }

  static PoolOptions DefaultOptions() {
    PoolOptions o;
    o.commit_interval = std::chrono::milliseconds(0);
    o.background_gc = false;
    o.background_copies = false;
    return o;
  }

  void Open() {
    counting = std::make_unique<CountingStore>(store.get());
    auto forwarder = std::make_unique<ForwardingBlockDevice>(data.get());
    data_forwarder = forwarder.get();
    auto p = Pool::Open(std::move(forwarder),
                        std::make_unique<ForwardingSpaceMap>(space.get()),
                        std::make_unique<ForwardingMetadataStore>(counting.get()), options);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pool = std::move(*p);
  }

  // Power loss: every unsynced write and uncommitted change is gone.
  void Crash() {
    pool->AbandonForTesting();
    pool.reset();
    data->DropUnsyncedWrites();
    space->DropUnsynced();
    store->DropUnsyncedCommits();
    Open();
  }

  void CleanReopen() {
    ASSERT_OK(pool->Close());
    pool.reset();
    space->DropUnsynced();
    store->DropUnsyncedCommits();
    Open();
  }

  std::vector<std::byte> ReadAll(const std::string& name) {
    std::vector<std::byte> buf;
    ReadAll(name, &buf);
    return buf;
  }

  // The same into *buf, whose memory is reused: a test that reads whole
  // devices after every step (the model test) spares the allocation and
  // its page faults, which under ASan (every freed block quarantined, so
  // every new one fresh) were a third of its time.
  void ReadAll(const std::string& name, std::vector<std::byte>* buf) {
    buf->clear();
    auto v = pool->OpenVolume(name);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    if (!v.ok()) return;
    buf->resize((*v)->size());
    auto n = (*v)->Read(0, *buf);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
  }

  // Checks the metadata against itself: every mapped block allocated,
  // reference counts exact, nothing outside the data area. With
  // `exact_usage` (after GC), also that the pool uses exactly the blocks
  // the visible devices read from.
  void CheckConsistency(bool exact_usage) {
    ASSERT_OK(pool->Commit());
    std::map<uint64_t, uint32_t> refs;
    auto it = store->NewMapIterator();
    it->Seek(VolumeId(0), VolumeBlock(0));
    for (; it->Valid(); it->Next()) {
      const MapEntry& e = it->entry();
      if (e.value.tombstone()) continue;
      ASSERT_LT(e.value.block.value, pool->Stats().data_blocks);
      EXPECT_TRUE(space->IsAllocated(e.value.block))
          << "block " << e.value.block.value << " mapped by device " << e.device.value
          << " is free in the space map";
      refs[e.value.block.value]++;
    }
    ASSERT_OK(it->status());
    auto stored = store->ListRefcounts();
    ASSERT_TRUE(stored.ok());
    std::map<uint64_t, uint32_t> rc;
    for (auto& [b, n] : *stored) rc[b.value] = n;
    for (auto& [b, n] : refs) {
      if (n >= 2) {
        EXPECT_EQ(rc[b], n) << "refcount of block " << b;
      } else {
        EXPECT_EQ(rc.count(b), 0u) << "block " << b << " has one reference but a count entry";
      }
    }
    for (auto& [b, n] : rc) EXPECT_GE(refs[b], 2u) << "stale refcount entry for block " << b;
    if (!exact_usage) return;
    std::set<uint64_t> visible;
    for (const DeviceInfo& d : pool->ListDevices()) {
      uint64_t blocks = geometry.BlocksFor(d.size);
      for (uint64_t b = 0; b < blocks; ++b) {
        auto m = pool->MappedBlockForTesting(d.id, b);
        ASSERT_TRUE(m.ok());
        if (*m) visible.insert((*m)->value);
      }
    }
    PoolStats st = pool->Stats();
    std::string leaks;
    auto it2 = store->NewMapIterator();
    it2->Seek(VolumeId(0), VolumeBlock(0));
    for (; it2->Valid(); it2->Next()) {
      const MapEntry& e = it2->entry();
      if (e.value.tombstone() || visible.count(e.value.block.value)) continue;
      leaks += " (dev " + std::to_string(e.device.value) + " vblock " +
               std::to_string(e.vblock.value) + " epoch " + std::to_string(e.epoch) +
               " -> block " + std::to_string(e.value.block.value) + ")";
      if (std::getenv("THINFS_MODEL_TRACE")) {  // NOLINT(concurrency-mt-unsafe)
        for (uint64_t id = 1; id < 64; ++id) {
          auto vs = store->ListVersions(VolumeId(id), e.vblock);
          if (!vs.ok() || vs->empty()) continue;
          std::string line = "  vblock " + std::to_string(e.vblock.value) + " dev " + std::to_string(id) + ":";
          for (auto& v : *vs) {
            line += " e" + std::to_string(v.epoch) +
                    (v.value.tombstone() ? "=T" : "=" + std::to_string(v.value.block.value));
          }
          auto info = pool->GetDevice(VolumeId(id));
          if (info.ok()) line += " size_blocks=" + std::to_string(geometry.BlocksFor(info->size));
          std::fprintf(stderr, "%s\n", line.c_str());
        }
      }
    }
    ASSERT_EQ(st.used_blocks, visible.size())
        << "used blocks differ from what devices see; unseen versions:" << leaks;
  }

  Geometry geometry;
  PoolOptions options;
  std::unique_ptr<FaultInjectionBlockDevice> data;
  std::unique_ptr<MemSpaceMap> space;
  std::unique_ptr<MemMetadataStore> store;
  std::unique_ptr<CountingStore> counting;
  std::unique_ptr<Pool> pool;
  // The pool's data device (owned by the pool; replaced by every Open).
  ForwardingBlockDevice* data_forwarder = nullptr;
};

// Opens device `name`, failing the test (and returning nullptr) if it
// cannot be opened.
inline std::shared_ptr<Volume> OpenOrFail(Pool& p, const std::string& name) {
  auto v = p.OpenVolume(name);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v.ok() ? *v : nullptr;
}

inline std::vector<std::byte> Pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x);
  }
  return v;
}

}  // namespace thinfs::testing

#endif  // THINFS_TESTS_UTIL_ENGINE_FIXTURE_H_
