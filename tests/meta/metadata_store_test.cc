// Contract suite for MetadataStore: the same cases, reopen included, over
// MemMetadataStore and meta::RocksDbStore.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/mem_metadata.h"
#include "core/metadata.h"
#include "meta/rocksdb_store.h"

namespace thinfs {
namespace {

Superblock TestSuperblock() {
  Superblock sb;
  for (int i = 0; i < 16; ++i) sb.uuid[i] = static_cast<uint8_t>(0xa0 + i);
  sb.block_size = 128 * 1024;
  sb.data_blocks = 123456789;
  sb.created_ns = 1700000000123456789;
  sb.transaction_id = 1;
  sb.next_device_id = 7;
  return sb;
}

class MemFactory {
 public:
  MetadataStore* Create(const Superblock& sb) {
    store_ = std::make_unique<MemMetadataStore>(sb);
    return store_.get();
  }
  // Memory has nothing to reopen: the same store stands for the reopened one.
  MetadataStore* Reopen() { return store_.get(); }

 private:
  std::unique_ptr<MemMetadataStore> store_;
};

class RocksFactory {
 public:
  RocksFactory() {
    char tmpl[] = "/tmp/thinfs_meta_test_XXXXXX";
    const char* d = mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    root_ = d != nullptr ? d : "/tmp/thinfs_meta_test_failed";
  }
  ~RocksFactory() {
    store_.reset();
    std::filesystem::remove_all(root_);
  }
  RocksFactory(const RocksFactory&) = delete;
  RocksFactory& operator=(const RocksFactory&) = delete;

  MetadataStore* Create(const Superblock& sb) {
    auto s = meta::RocksDbStore::Create(root_ + "/meta", sb, meta::RocksDbOptions());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    store_ = s.ok() ? std::move(*s) : nullptr;
    return store_.get();
  }
  MetadataStore* Reopen() {
    store_.reset();
    auto s = meta::RocksDbStore::Open(root_ + "/meta", meta::RocksDbOptions());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    store_ = s.ok() ? std::move(*s) : nullptr;
    return store_.get();
  }

 private:
  std::string root_;
  std::unique_ptr<meta::RocksDbStore> store_;
};

template <typename Factory>
class MetadataStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = factory_.Create(TestSuperblock());
    ASSERT_NE(store_, nullptr);
  }
  void Reopen() {
    store_ = factory_.Reopen();
    ASSERT_NE(store_, nullptr);
  }
  void CommitOk(const MetaBatch& b, bool sync = false) {
    Status s = store_->Commit(b, sync);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  Factory factory_;
  MetadataStore* store_ = nullptr;
};

using Factories = ::testing::Types<MemFactory, RocksFactory>;
class FactoryNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, MemFactory> ? "Mem" : "RocksDb";
  }
};
TYPED_TEST_SUITE(MetadataStoreTest, Factories, FactoryNames);

DeviceRecord Device(uint64_t id, std::string name) {
  DeviceRecord d;
  d.id = VolumeId(id);
  d.name = std::move(name);
  d.size = id * 4096 + 17;
  d.epoch = static_cast<Epoch>(id * 3);
  d.mode = 0100600;
  d.uid = 1000;
  d.gid = 100;
  d.created_ns = 11;
  d.mtime_ns = -12;
  d.ctime_ns = 13;
  d.atime_ns = INT64_MAX;
  return d;
}

MapEntry Entry(uint64_t dev, uint64_t vb, Epoch e, uint64_t pb, uint8_t flags = 0) {
  return MapEntry{VolumeId(dev), VolumeBlock(vb), e, MapValue{PoolBlock(pb), flags}};
}

TYPED_TEST(MetadataStoreTest, SuperblockRoundTrip) {
  auto sb = this->store_->ReadSuperblock();
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_EQ(*sb, TestSuperblock());

  Superblock next = TestSuperblock();
  next.transaction_id = 42;
  next.next_device_id = UINT64_MAX;
  next.data_blocks = 1;
  MetaBatch b;
  b.superblock = next;
  this->CommitOk(b, /*sync=*/true);
  EXPECT_EQ(*this->store_->ReadSuperblock(), next);
  this->Reopen();
  EXPECT_EQ(*this->store_->ReadSuperblock(), next);
}

TYPED_TEST(MetadataStoreTest, DevicePutLoadDelete) {
  auto empty = this->store_->LoadDevices();
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());

  DeviceRecord a = Device(1, "vol-a");
  DeviceRecord b = Device(UINT64_MAX - 1, "");
  DeviceRecord c = Device(300, std::string(4096, 'x'));
  c.has_parent = true;
  c.parent = VolumeId(1);
  c.parent_epoch = UINT32_MAX;
  c.flags = DeviceRecord::kHidden | DeviceRecord::kGcPending;
  MetaBatch put;
  put.put_devices = {b, a, c};
  this->CommitOk(put);
  auto loaded = this->store_->LoadDevices();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(*loaded, (std::vector<DeviceRecord>{a, c, b}));  // id order

  a.epoch += 1;
  a.name = "renamed";
  MetaBatch upd;
  upd.put_devices = {a};
  upd.delete_devices = {VolumeId(300), VolumeId(999)};  // 999 does not exist
  this->CommitOk(upd);
  EXPECT_EQ(*this->store_->LoadDevices(), (std::vector<DeviceRecord>{a, b}));
  this->Reopen();
  EXPECT_EQ(*this->store_->LoadDevices(), (std::vector<DeviceRecord>{a, b}));
}

TYPED_TEST(MetadataStoreTest, FindVersionPicksNewestAtOrBeforeMaxEpoch) {
  MetaBatch b;
  for (Epoch e : {Epoch{0}, Epoch{3}, Epoch{7}, Epoch{100}, UINT32_MAX}) {
    b.put_mappings.push_back(Entry(5, 10, e, 1000 + e));
  }
  // Neighbours that a sloppy seek would wander into.
  b.put_mappings.push_back(Entry(5, 9, 50, 1));
  b.put_mappings.push_back(Entry(5, 11, 0, 2));
  b.put_mappings.push_back(Entry(4, 10, 1, 3));
  b.put_mappings.push_back(Entry(6, 10, 0, 4));
  this->CommitOk(b);

  struct Probe {
    Epoch max;
    std::optional<Epoch> want;
  };
  for (const Probe& p : std::vector<Probe>{{0, 0},
                                           {1, 0},
                                           {3, 3},
                                           {6, 3},
                                           {7, 7},
                                           {99, 7},
                                           {100, 100},
                                           {UINT32_MAX - 1, 100},
                                           {UINT32_MAX, UINT32_MAX}}) {
    auto v = this->store_->FindVersion(VolumeId(5), VolumeBlock(10), p.max);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_TRUE(v->has_value()) << "max " << p.max;
    EXPECT_EQ((*v)->epoch, *p.want) << "max " << p.max;
    EXPECT_EQ((*v)->value.block, PoolBlock(1000 + *p.want));
  }
  // Only newer versions exist: none, not the next block's.
  auto none = this->store_->FindVersion(VolumeId(5), VolumeBlock(9), 49);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  none = this->store_->FindVersion(VolumeId(5), VolumeBlock(12), UINT32_MAX);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  none = this->store_->FindVersion(VolumeId(7), VolumeBlock(0), UINT32_MAX);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TYPED_TEST(MetadataStoreTest, MappingsTombstoneAndDelete) {
  MetaBatch b;
  b.put_mappings = {Entry(1, 0, 0, 77), Entry(1, 0, 1, 0, MapValue::kTombstone),
                    Entry(1, 1, 0, UINT64_MAX, MapValue::kMaybeShared)};
  this->CommitOk(b);
  auto v = this->store_->FindVersion(VolumeId(1), VolumeBlock(0), 5);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_TRUE((*v)->value.tombstone());
  EXPECT_EQ((*v)->epoch, 1u);
  v = this->store_->FindVersion(VolumeId(1), VolumeBlock(1), 0);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_EQ((*v)->value, (MapValue{PoolBlock(UINT64_MAX), MapValue::kMaybeShared}));

  MetaBatch del;
  del.delete_mappings = {{VolumeId(1), VolumeBlock(0), 1}, {VolumeId(1), VolumeBlock(1), 0}};
  this->CommitOk(del);
  this->Reopen();
  v = this->store_->FindVersion(VolumeId(1), VolumeBlock(0), UINT32_MAX);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_EQ((*v)->value, (MapValue{PoolBlock(77), 0}));
  v = this->store_->FindVersion(VolumeId(1), VolumeBlock(1), UINT32_MAX);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->has_value());
}

// A randomised model check over the edges of the key space: ids and
// vblocks 0, 1, 2 and near UINT64_MAX, epochs 0 and near UINT32_MAX.
TYPED_TEST(MetadataStoreTest, ModelCheckFindListIterate) {
  const unsigned seed = std::random_device()();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<uint64_t> ids = {0, 1, 2, UINT64_MAX - 1, UINT64_MAX};
  const std::vector<Epoch> epochs = {0, 1, 2, 5, UINT32_MAX - 1, UINT32_MAX};
  // (dev, vblock, epoch) -> block, ordered newest epoch first per block.
  using Key = std::tuple<uint64_t, uint64_t, uint32_t>;  // epoch inverted
  std::map<Key, uint64_t> model;
  MetaBatch b;
  for (uint64_t d : ids) {
    for (uint64_t vb : ids) {
      for (Epoch e : epochs) {
        if (rng() % 2) continue;
        const uint64_t pb = rng();
        model[Key(d, vb, ~e)] = pb;
        b.put_mappings.push_back(Entry(d, vb, e, pb));
      }
    }
  }
  this->CommitOk(b);

  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t d : ids) {
      for (uint64_t vb : ids) {
        std::vector<Version> want_list;
        for (auto it = model.lower_bound(Key(d, vb, 0));
             it != model.end() && std::get<0>(it->first) == d && std::get<1>(it->first) == vb;
             ++it) {
          want_list.push_back(Version{~std::get<2>(it->first), MapValue{PoolBlock(it->second)}});
        }
        auto list = this->store_->ListVersions(VolumeId(d), VolumeBlock(vb));
        ASSERT_TRUE(list.ok()) << list.status().ToString();
        EXPECT_EQ(*list, want_list) << d << "/" << vb;

        for (Epoch max : {Epoch{0}, Epoch{1}, Epoch{3}, Epoch{4}, Epoch{6}, UINT32_MAX - 2,
                          UINT32_MAX - 1, UINT32_MAX}) {
          std::optional<Version> want;
          for (const Version& v : want_list) {  // newest first
            if (v.epoch <= max) {
              want = v;
              break;
            }
          }
          auto got = this->store_->FindVersion(VolumeId(d), VolumeBlock(vb), max);
          ASSERT_TRUE(got.ok()) << got.status().ToString();
          EXPECT_EQ(*got, want) << d << "/" << vb << " max " << max;
        }

        // Seek lands on the first entry >= (d, vb, newest).
        std::unique_ptr<MapIterator> it = this->store_->NewMapIterator();
        it->Seek(VolumeId(d), VolumeBlock(vb));
        auto m = model.lower_bound(Key(d, vb, 0));
        ASSERT_EQ(it->Valid(), m != model.end());
        if (it->Valid()) {
          EXPECT_EQ(it->entry(), Entry(std::get<0>(m->first), std::get<1>(m->first),
                                       ~std::get<2>(m->first), m->second));
        }
        EXPECT_TRUE(it->status().ok());
      }
    }
    // A full scan from the start visits the model in order, across devices.
    std::vector<MapEntry> got;
    {
      std::unique_ptr<MapIterator> it = this->store_->NewMapIterator();
      for (it->Seek(VolumeId(0), VolumeBlock(0)); it->Valid(); it->Next()) {
        got.push_back(it->entry());
      }
      EXPECT_TRUE(it->status().ok());
    }  // iterators must not outlive the store across Reopen()
    std::vector<MapEntry> want;
    for (const auto& [k, pb] : model) {
      want.push_back(Entry(std::get<0>(k), std::get<1>(k), ~std::get<2>(k), pb));
    }
    EXPECT_EQ(got, want);
    this->Reopen();
  }
}

TYPED_TEST(MetadataStoreTest, IteratorSeeksAcrossDevices) {
  MetaBatch b;
  b.put_mappings = {Entry(1, 5, 0, 1), Entry(1, 5, 2, 2), Entry(1, 9, 0, 3), Entry(3, 0, 0, 4),
                    Entry(3, 1, 1, 5)};
  this->CommitOk(b);
  std::unique_ptr<MapIterator> it = this->store_->NewMapIterator();
  EXPECT_FALSE(it->Valid());
  it->Seek(VolumeId(1), VolumeBlock(6));
  ASSERT_TRUE(it->Valid());
  EXPECT_EQ(it->entry(), Entry(1, 9, 0, 3));
  it->Next();
  ASSERT_TRUE(it->Valid());  // crosses from device 1 into device 3
  EXPECT_EQ(it->entry(), Entry(3, 0, 0, 4));
  it->Seek(VolumeId(2), VolumeBlock(UINT64_MAX));
  ASSERT_TRUE(it->Valid());
  EXPECT_EQ(it->entry(), Entry(3, 0, 0, 4));
  it->Seek(VolumeId(1), VolumeBlock(5));
  ASSERT_TRUE(it->Valid());
  EXPECT_EQ(it->entry(), Entry(1, 5, 2, 2));  // newest epoch first
  it->Next();
  EXPECT_EQ(it->entry(), Entry(1, 5, 0, 1));
  it->Seek(VolumeId(3), VolumeBlock(2));
  EXPECT_FALSE(it->Valid());
  EXPECT_TRUE(it->status().ok());
}

TYPED_TEST(MetadataStoreTest, Refcounts) {
  MetaBatch b;
  b.refcounts = {{PoolBlock(9), 2}, {PoolBlock(3), 5}, {PoolBlock(UINT64_MAX), UINT32_MAX}};
  this->CommitOk(b);
  EXPECT_EQ(*this->store_->GetRefcount(PoolBlock(3)), 5u);
  EXPECT_EQ(*this->store_->GetRefcount(PoolBlock(4)), 0u);
  EXPECT_EQ(*this->store_->GetRefcount(PoolBlock(UINT64_MAX)), UINT32_MAX);

  MetaBatch c;
  c.refcounts = {{PoolBlock(3), 1}, {PoolBlock(9), 0}, {PoolBlock(10), 2}};
  this->CommitOk(c);
  this->Reopen();
  EXPECT_EQ(*this->store_->GetRefcount(PoolBlock(3)), 0u);
  EXPECT_EQ(*this->store_->GetRefcount(PoolBlock(9)), 0u);
  auto all = this->store_->ListRefcounts();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<std::pair<PoolBlock, uint32_t>>{
                      {PoolBlock(10), 2}, {PoolBlock(UINT64_MAX), UINT32_MAX}}));
}

TYPED_TEST(MetadataStoreTest, BatchAppliesAllOrderedPutsBeforeDeletes) {
  MetaBatch b;
  Superblock sb = TestSuperblock();
  sb.transaction_id = 2;
  b.superblock = sb;
  b.put_devices = {Device(7, "seven")};
  b.put_mappings = {Entry(7, 0, 0, 70), Entry(7, 1, 0, 71)};
  b.delete_mappings = {{VolumeId(7), VolumeBlock(1), 0}};  // same batch: deleted
  b.refcounts = {{PoolBlock(70), 2}};
  this->CommitOk(b, /*sync=*/true);
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_EQ(this->store_->ReadSuperblock()->transaction_id, 2u);
    EXPECT_EQ(this->store_->LoadDevices()->size(), 1u);
    EXPECT_TRUE(this->store_->FindVersion(VolumeId(7), VolumeBlock(0), 0)->has_value());
    EXPECT_FALSE(this->store_->FindVersion(VolumeId(7), VolumeBlock(1), 0)->has_value());
    EXPECT_EQ(*this->store_->GetRefcount(PoolBlock(70)), 2u);
    this->Reopen();
  }
}

TYPED_TEST(MetadataStoreTest, UnsyncedCommitsSurviveCleanReopen) {
  MetaBatch b;
  b.put_mappings = {Entry(1, 1, 1, 11)};
  this->CommitOk(b, /*sync=*/false);
  this->Reopen();
  auto v = this->store_->FindVersion(VolumeId(1), VolumeBlock(1), 1);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_EQ((*v)->value.block, PoolBlock(11));
}

// ---- MemMetadataStore's crash simulation ----

TEST(MemMetadataStoreTest, DropUnsyncedCommitsRevertsToLastSync) {
  MemMetadataStore store(TestSuperblock());
  store.SetDurableOnlyOnSync(true);
  MetaBatch a;
  a.put_mappings = {Entry(1, 0, 0, 10)};
  ASSERT_TRUE(store.Commit(a, /*sync=*/false).ok());
  MetaBatch b;
  b.put_mappings = {Entry(1, 1, 0, 11)};
  ASSERT_TRUE(store.Commit(b, /*sync=*/true).ok());  // makes a durable too
  MetaBatch c;
  c.put_mappings = {Entry(1, 2, 0, 12)};
  c.delete_mappings = {{VolumeId(1), VolumeBlock(0), 0}};
  ASSERT_TRUE(store.Commit(c, /*sync=*/false).ok());
  EXPECT_FALSE(store.FindVersion(VolumeId(1), VolumeBlock(0), 0)->has_value());

  store.DropUnsyncedCommits();
  EXPECT_TRUE(store.FindVersion(VolumeId(1), VolumeBlock(0), 0)->has_value());
  EXPECT_TRUE(store.FindVersion(VolumeId(1), VolumeBlock(1), 0)->has_value());
  EXPECT_FALSE(store.FindVersion(VolumeId(1), VolumeBlock(2), 0)->has_value());
}

TEST(MemMetadataStoreTest, FailNextCommitAppliesNothingOnce) {
  MemMetadataStore store(TestSuperblock());
  store.FailNextCommit();
  MetaBatch a;
  Superblock sb = TestSuperblock();
  sb.transaction_id = 9;
  a.superblock = sb;
  a.put_mappings = {Entry(1, 0, 0, 10)};
  a.refcounts = {{PoolBlock(10), 2}};
  Status s = store.Commit(a, true);
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_EQ(*store.ReadSuperblock(), TestSuperblock());
  EXPECT_FALSE(store.FindVersion(VolumeId(1), VolumeBlock(0), 0)->has_value());
  EXPECT_EQ(*store.GetRefcount(PoolBlock(10)), 0u);
  EXPECT_TRUE(store.Commit(a, true).ok());
  EXPECT_EQ(store.ReadSuperblock()->transaction_id, 9u);
}

}  // namespace
}  // namespace thinfs
