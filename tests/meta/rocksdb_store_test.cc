// RocksDbStore specifics: corruption detection, open/create errors, the
// LOCK, read-only mode, checkpoints and the bytes per mapped block.

#include "meta/rocksdb_store.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <string>

#include "meta/fault_injection_env.h"
#include "meta/format.h"

namespace thinfs::meta {
namespace {

class RocksDbStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/thinfs_rocks_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/meta";
    sb_.transaction_id = 3;
    sb_.data_blocks = 1000;
    auto s = RocksDbStore::Create(dir_, sb_, RocksDbOptions());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(root_);
  }
  void Reopen() {
    store_.reset();
    auto s = RocksDbStore::Open(dir_, RocksDbOptions());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }

  std::string root_;
  std::string dir_;
  Superblock sb_;
  std::unique_ptr<RocksDbStore> store_;
};

std::string Be64(uint64_t v) {
  std::string k;
  for (int i = 7; i >= 0; --i) k.push_back(static_cast<char>(v >> (8 * i)));
  return k;
}

std::string MapKeyBytes(uint64_t dev, uint64_t vb, uint32_t epoch) {
  std::string k = Be64(dev) + Be64(vb);
  const uint32_t inv = ~epoch;
  for (int i = 3; i >= 0; --i) k.push_back(static_cast<char>(inv >> (8 * i)));
  return k;
}

// Flips each byte of the stored value in turn and expects `read` to report
// kCorruption whose message contains `where`; restores the value after.
template <typename ReadFn>
void ExpectEveryFlipDetected(RocksDbStore* store, const std::string& cf, const std::string& key,
                             const std::string& where, ReadFn read) {
  auto good = store->GetRawForTesting(cf, key);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  for (size_t i = 0; i < good->size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      std::string bad = *good;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      ASSERT_TRUE(store->PutRawForTesting(cf, key, bad).ok());
      Status s = read();
      EXPECT_EQ(s.code(), Status::Code::kCorruption)
          << cf << " byte " << i << " mask " << int{mask} << ": " << s.ToString();
      EXPECT_NE(s.message().find(where), std::string::npos) << s.ToString();
    }
  }
  // Truncated and extended values too.
  ASSERT_TRUE(store->PutRawForTesting(cf, key, good->substr(0, good->size() - 1)).ok());
  EXPECT_EQ(read().code(), Status::Code::kCorruption);
  ASSERT_TRUE(store->PutRawForTesting(cf, key, *good + "x").ok());
  EXPECT_EQ(read().code(), Status::Code::kCorruption);
  ASSERT_TRUE(store->PutRawForTesting(cf, key, *good).ok());
  EXPECT_TRUE(read().ok());
}

// A one-shot open (the CLI's) goes without what only a long-lived writer
// gains from: the map's memtable Bloom filter (3.2 MiB zeroed at open;
// never for read-only opens) and threads that open table files beside
// the opener (TableFilesOpenWithOneThreadPerCpu).
TEST_F(RocksDbStoreTest, OneShotOpensSkipTheLongLivedWritersExtras) {
  EXPECT_EQ(store_->MapMemtableBloomRatioForTesting(), 0.05) << "created, defaults";
  store_.reset();
  struct Case {
    const char* what;
    bool read_only;
    bool one_shot;
    double bloom;
  };
  const Case cases[] = {{"writer", false, false, 0.05},
                        {"one-shot writer", false, true, 0},
                        {"read-only", true, false, 0},
                        {"one-shot read-only", true, true, 0}};
  for (const Case& c : cases) {
    RocksDbOptions o;
    o.read_only = c.read_only;
    o.one_shot = c.one_shot;
    auto s = RocksDbStore::Open(dir_, o);
    ASSERT_TRUE(s.ok()) << c.what << ": " << s.status().ToString();
    EXPECT_EQ((*s)->MapMemtableBloomRatioForTesting(), c.bloom) << c.what;
  }
  RocksDbOptions o;
  o.one_shot = true;
  auto created = RocksDbStore::Create(root_ + "/meta2", sb_, o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ((*created)->MapMemtableBloomRatioForTesting(), 0.0) << "created one-shot";
  Reopen();
}

// The block map is LZ4 at every level, the bottom one included (lever 63:
// a lookup that misses the block cache decompresses a whole block). A map
// whose bottom level an older thinfs wrote in ZSTD reads the same, and its
// next full compaction writes LZ4.
TEST_F(RocksDbStoreTest, TheMapIsLz4AtEveryLevelAndOldZstdTablesStillRead) {
  constexpr uint64_t kBlocks = 20000;
  MetaBatch b;
  for (uint64_t i = 0; i < kBlocks; ++i) {
    b.put_mappings.push_back(
        MapEntry{VolumeId(1), VolumeBlock(i), 0, MapValue{PoolBlock((i * 7919) % 100003), 0}});
  }
  ASSERT_TRUE(store_->Commit(b, true).ok());
  store_.reset();
  auto expect_map = [&](RocksDbStore& store, const char* what) {
    for (uint64_t i = 0; i < kBlocks; i += 997) {
      auto v = store.FindVersion(VolumeId(1), VolumeBlock(i), 0);
      ASSERT_TRUE(v.ok()) << what << ": " << v.status().ToString();
      ASSERT_TRUE(v->has_value()) << what << ": block " << i;
      EXPECT_EQ((*v)->value.block, PoolBlock((i * 7919) % 100003)) << what;
    }
    EXPECT_FALSE(store.FindVersion(VolumeId(1), VolumeBlock(kBlocks), 0)->has_value()) << what;
  };
  auto compressions = [](RocksDbStore& store) {
    auto c = store.MapTableCompressionsForTesting();
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    std::set<std::string> names;
    if (c.ok()) names.insert(c->begin(), c->end());
    return names;
  };
  {
    RocksDbOptions old;
    old.map_bottom_compression_for_testing = "ZSTD";
    auto s = RocksDbStore::Open(dir_, old);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->CompactForTesting().ok());
    EXPECT_EQ(compressions(**s), std::set<std::string>{"ZSTD"}) << "written as before lever 63";
  }
  auto s = RocksDbStore::Open(dir_, RocksDbOptions());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->bottommost_compression(), "LZ4");
  expect_map(**s, "ZSTD tables");
  ASSERT_TRUE((*s)->CompactForTesting().ok());
  EXPECT_EQ(compressions(**s), std::set<std::string>{"LZ4"}) << "compacted again";
  expect_map(**s, "LZ4 tables");
  s->reset();
  Reopen();
}

// A long-lived open (the daemon's) opens table files from one thread per
// CPU the opener may run on, kMaxTableOpeningThreads at most, not
// RocksDB's 16 (lever 60); pinned to one CPU, from one. A one-shot open
// (the CLI's) always from one (lever 59).
TEST_F(RocksDbStoreTest, TableFilesOpenWithOneThreadPerCpu) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  const int want = std::min(CPU_COUNT(&all), RocksDbStore::kMaxTableOpeningThreads);
  EXPECT_EQ(store_->FileOpeningThreadsForTesting(), want) << "created";
  store_.reset();
  for (bool read_only : {false, true}) {
    for (bool one_shot : {false, true}) {
      RocksDbOptions o;
      o.read_only = read_only;
      o.one_shot = one_shot;
      auto s = RocksDbStore::Open(dir_, o);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      EXPECT_EQ((*s)->FileOpeningThreadsForTesting(), one_shot ? 1 : want)
          << "read_only " << read_only << ", one_shot " << one_shot;
    }
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &all)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
  auto pinned = RocksDbStore::Open(dir_, {});
  ASSERT_EQ(::sched_setaffinity(0, sizeof all, &all), 0);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  EXPECT_EQ((*pinned)->FileOpeningThreadsForTesting(), 1) << "pinned to one CPU";
  pinned->reset();
  RocksDbOptions o;
  o.one_shot = true;
  auto created = RocksDbStore::Create(root_ + "/meta2", sb_, o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ((*created)->FileOpeningThreadsForTesting(), 1) << "created one-shot";
}

TEST_F(RocksDbStoreTest, SuperblockCorruption) {
  ExpectEveryFlipDetected(store_.get(), dbformat::kSuperblockCf, dbformat::kSuperblockKey,
                          "superblock", [&] { return store_->ReadSuperblock().status(); });
  auto raw = store_->GetRawForTesting(dbformat::kSuperblockCf, dbformat::kSuperblockKey);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->size(), sizeof(dbformat::SuperblockValueV1));
  std::string bad = *raw;
  bad[20] ^= 0x10;
  ASSERT_TRUE(store_->PutRawForTesting(dbformat::kSuperblockCf, dbformat::kSuperblockKey, bad).ok());
  store_.reset();
  auto s = RocksDbStore::Open(dir_, RocksDbOptions());
  EXPECT_EQ(s.status().code(), Status::Code::kCorruption) << s.status().ToString();
}

TEST_F(RocksDbStoreTest, DeviceCorruption) {
  DeviceRecord d;
  d.id = VolumeId(5);
  d.name = "vol";
  d.has_parent = true;
  d.parent = VolumeId(2);
  MetaBatch b;
  b.put_devices = {d};
  ASSERT_TRUE(store_->Commit(b, false).ok());
  ExpectEveryFlipDetected(store_.get(), dbformat::kDevicesCf, Be64(5), "device record 5",
                          [&] { return store_->LoadDevices().status(); });
  // A valid value stored under another id is detected as well.
  auto raw = store_->GetRawForTesting(dbformat::kDevicesCf, Be64(5));
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(store_->PutRawForTesting(dbformat::kDevicesCf, Be64(6), *raw).ok());
  EXPECT_EQ(store_->LoadDevices().status().code(), Status::Code::kCorruption);
}

TEST_F(RocksDbStoreTest, MapValueCorruption) {
  MetaBatch b;
  b.put_mappings = {MapEntry{VolumeId(3), VolumeBlock(8), 2, MapValue{PoolBlock(300000), 0}}};
  ASSERT_TRUE(store_->Commit(b, false).ok());
  const std::string key = MapKeyBytes(3, 8, 2);
  auto raw = store_->GetRawForTesting(dbformat::kMapCf, key);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->size(), 3u + 1 + 2);  // varint(300000) + flags + check
  const std::string where = "device 3, vblock 8, epoch 2";
  ExpectEveryFlipDetected(store_.get(), dbformat::kMapCf, key, where, [&] {
    return store_->FindVersion(VolumeId(3), VolumeBlock(8), 5).status();
  });
  ExpectEveryFlipDetected(store_.get(), dbformat::kMapCf, key, where, [&] {
    return store_->ListVersions(VolumeId(3), VolumeBlock(8)).status();
  });
  ExpectEveryFlipDetected(store_.get(), dbformat::kMapCf, key, where, [&] {
    std::unique_ptr<MapIterator> it = store_->NewMapIterator();
    it->Seek(VolumeId(0), VolumeBlock(0));
    // A damaged entry must stop the iteration with kCorruption; an intact
    // one is yielded (and is then the only entry).
    return it->Valid() ? Status::Ok() : it->status();
  });
}

TEST_F(RocksDbStoreTest, RefcountCorruption) {
  MetaBatch b;
  b.refcounts = {{PoolBlock(77), 3}};
  ASSERT_TRUE(store_->Commit(b, false).ok());
  ExpectEveryFlipDetected(store_.get(), dbformat::kRefcountsCf, Be64(77),
                          "refcount of pool block 77",
                          [&] { return store_->GetRefcount(PoolBlock(77)).status(); });
  ExpectEveryFlipDetected(store_.get(), dbformat::kRefcountsCf, Be64(77), "pool block 77",
                          [&] { return store_->ListRefcounts().status(); });
}

TEST_F(RocksDbStoreTest, CreateOnExistingDatabaseIsExists) {
  auto s = RocksDbStore::Create(dir_, sb_, RocksDbOptions());
  EXPECT_EQ(s.status().code(), Status::Code::kExists) << s.status().ToString();
  store_.reset();
  s = RocksDbStore::Create(dir_, sb_, RocksDbOptions());
  EXPECT_EQ(s.status().code(), Status::Code::kExists) << s.status().ToString();
}

TEST_F(RocksDbStoreTest, OpenMissingIsNotFound) {
  auto s = RocksDbStore::Open(root_ + "/nothing", RocksDbOptions());
  EXPECT_EQ(s.status().code(), Status::Code::kNotFound) << s.status().ToString();
  std::filesystem::create_directory(root_ + "/empty");
  s = RocksDbStore::Open(root_ + "/empty", RocksDbOptions());
  EXPECT_EQ(s.status().code(), Status::Code::kNotFound) << s.status().ToString();
}

TEST_F(RocksDbStoreTest, SecondOpenIsBusy) {
  auto s = RocksDbStore::Open(dir_, RocksDbOptions());
  EXPECT_EQ(s.status().code(), Status::Code::kBusy) << s.status().ToString();
  // The first store is unaffected.
  EXPECT_TRUE(store_->ReadSuperblock().ok());
}

TEST_F(RocksDbStoreTest, ReadOnlyRefusesCommits) {
  MetaBatch b;
  b.put_mappings = {MapEntry{VolumeId(1), VolumeBlock(1), 0, MapValue{PoolBlock(1), 0}}};
  ASSERT_TRUE(store_->Commit(b, true).ok());
  store_.reset();
  RocksDbOptions ro;
  ro.read_only = true;
  auto s = RocksDbStore::Open(dir_, ro);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE((*s)->FindVersion(VolumeId(1), VolumeBlock(1), 0)->has_value());
  EXPECT_EQ((*s)->Commit(b, true).code(), Status::Code::kReadOnly);
  EXPECT_EQ(RocksDbStore::Create(root_ + "/x", sb_, ro).status().code(),
            Status::Code::kInvalidArgument);
}

TEST_F(RocksDbStoreTest, CheckpointOpensAsAStore) {
  MetaBatch b;
  b.put_mappings = {MapEntry{VolumeId(1), VolumeBlock(4), 0, MapValue{PoolBlock(9), 0}}};
  ASSERT_TRUE(store_->Commit(b, false).ok());  // unflushed, unsynced
  auto cp = store_->CheckpointTo(root_ + "/cp");
  ASSERT_TRUE(cp.ok()) << cp.status().ToString();
  EXPECT_EQ(*cp, root_ + "/cp");
  MetaBatch later;
  later.put_mappings = {MapEntry{VolumeId(1), VolumeBlock(5), 0, MapValue{PoolBlock(9), 0}}};
  ASSERT_TRUE(store_->Commit(later, false).ok());

  auto copy = RocksDbStore::Open(root_ + "/cp", RocksDbOptions());
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ(*(*copy)->ReadSuperblock(), sb_);
  EXPECT_TRUE((*copy)->FindVersion(VolumeId(1), VolumeBlock(4), 0)->has_value());
  EXPECT_FALSE((*copy)->FindVersion(VolumeId(1), VolumeBlock(5), 0)->has_value());
  EXPECT_EQ(store_->CheckpointTo(root_ + "/cp").status().code(), Status::Code::kExists);
}

// Writes kBlocks mappings of device 1 (sequential vblocks, epoch 0) in
// batches, compacts, and prints the map's bytes per mapped block.
// `pool_block(i)` chooses the pool block of vblock i.
template <typename PoolBlockFn>
double MeasureBytesPerBlock(RocksDbStore* store, const char* label, PoolBlockFn pool_block) {
  constexpr uint64_t kBlocks = 1000000;
  constexpr uint64_t kBatch = 10000;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t base = 0; base < kBlocks; base += kBatch) {
    MetaBatch b;
    b.put_mappings.reserve(kBatch);
    for (uint64_t i = base; i < base + kBatch; ++i) {
      b.put_mappings.push_back(
          MapEntry{VolumeId(1), VolumeBlock(i), 0, MapValue{PoolBlock(pool_block(i)), 0}});
    }
    EXPECT_TRUE(store->Commit(b, false).ok());
  }
  auto bytes = store->MapBytesOnDisk(/*compact=*/true);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  if (!bytes.ok()) return 1e9;
  const double per_block = static_cast<double>(*bytes) / kBlocks;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("map (%s pool blocks): %llu mapped blocks, %llu bytes on disk after compaction "
              "= %.2f B/block (bottommost compression %s, %.1f s)\n",
              label, static_cast<unsigned long long>(kBlocks),
              static_cast<unsigned long long>(*bytes), per_block,
              store->bottommost_compression().c_str(), secs);
  EXPECT_GT(*bytes, 0u);
  // Spot checks after compaction.
  auto v = store->FindVersion(VolumeId(1), VolumeBlock(123456), 0);
  EXPECT_TRUE(v.ok() && v->has_value());
  if (v.ok() && v->has_value()) {
    EXPECT_EQ((*v)->value.block, PoolBlock(pool_block(123456)));
  }
  EXPECT_FALSE(store->FindVersion(VolumeId(1), VolumeBlock(kBlocks), 0)->has_value());
  return per_block;
}

TEST_F(RocksDbStoreTest, BytesPerMappedBlockSequential) {
  const double per_block =
      MeasureBytesPerBlock(store_.get(), "sequential", [](uint64_t i) { return i; });
  RecordProperty("bytes_per_block", std::to_string(per_block));
  EXPECT_LE(per_block, 64.0);
}

// A fragmented pool: pool blocks scattered over 2^32 blocks (256 TiB of
// 64 KiB blocks), which defeats most of the compression.
TEST_F(RocksDbStoreTest, BytesPerMappedBlockScattered) {
  const double per_block = MeasureBytesPerBlock(store_.get(), "scattered", [](uint64_t i) {
    return (i * 0x9E3779B97F4A7C15ULL) >> 32;
  });
  RecordProperty("bytes_per_block", std::to_string(per_block));
  EXPECT_LE(per_block, 64.0);
}

// ---- crash consistency through FaultInjectionFs ----

class RocksDbCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/thinfs_crash_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/meta";
    fs_ = FaultInjectionFs::Create();
    opts_.env_for_testing = fs_->env();
    auto s = RocksDbStore::Create(dir_, Superblock(), opts_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void TearDown() override {
    store_.reset();
    fs_.reset();
    std::filesystem::remove_all(root_);
  }
  // Power loss: nothing more reaches the disk, the process goes away, and
  // whatever was not synced is lost.
  void CrashAndReopen() {
    fs_->SetFilesystemActive(false);
    store_.reset();
    Status d = fs_->DropUnsyncedData();
    ASSERT_TRUE(d.ok()) << d.ToString();
    fs_->SetFilesystemActive(true);
    auto s = RocksDbStore::Open(dir_, opts_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }

  // A batch touching every column family; `n` distinguishes batches.
  static MetaBatch Batch(uint64_t n) {
    MetaBatch b;
    Superblock sb;
    sb.transaction_id = n;
    b.superblock = sb;
    DeviceRecord d;
    d.id = VolumeId(n);
    d.name = "dev" + std::to_string(n);
    b.put_devices = {d};
    for (uint64_t i = 0; i < 100; ++i) {
      b.put_mappings.push_back(MapEntry{VolumeId(n), VolumeBlock(i), 0, MapValue{PoolBlock(i), 0}});
    }
    b.refcounts = {{PoolBlock(n), 2}};
    return b;
  }
  // How much of Batch(n) is visible: 0 (none) .. 103 (all).
  int Visible(uint64_t n) {
    int seen = 0;
    auto devs = store_->LoadDevices();
    EXPECT_TRUE(devs.ok()) << devs.status().ToString();
    for (const DeviceRecord& d : *devs) seen += d.id == VolumeId(n);
    for (uint64_t i = 0; i < 100; ++i) {
      auto v = store_->FindVersion(VolumeId(n), VolumeBlock(i), 0);
      EXPECT_TRUE(v.ok()) << v.status().ToString();
      seen += v.ok() && v->has_value();
    }
    seen += *store_->GetRefcount(PoolBlock(n)) == 2;
    seen += store_->ReadSuperblock()->transaction_id >= n;
    return seen;
  }

  std::string root_;
  std::string dir_;
  std::unique_ptr<FaultInjectionFs> fs_;
  RocksDbOptions opts_;
  std::unique_ptr<RocksDbStore> store_;
};

TEST_F(RocksDbCrashTest, SyncedCommitSurvivesUnsyncedIsLostWhole) {
  ASSERT_TRUE(store_->Commit(Batch(1), /*sync=*/true).ok());
  ASSERT_TRUE(store_->Commit(Batch(2), /*sync=*/false).ok());
  EXPECT_EQ(Visible(2), 103);
  CrashAndReopen();
  EXPECT_EQ(Visible(1), 103);
  const int unsynced = Visible(2);
  EXPECT_TRUE(unsynced == 0 || unsynced == 103) << unsynced << " of 103 records survived";
  // This file system drops exactly the unsynced bytes, so the WAL record of
  // batch 2 is gone.
  EXPECT_EQ(unsynced, 0);
  EXPECT_EQ(store_->ReadSuperblock()->transaction_id, 1u);
}

TEST_F(RocksDbCrashTest, LaterSyncCoversEarlierUnsyncedCommits) {
  ASSERT_TRUE(store_->Commit(Batch(1), /*sync=*/false).ok());
  ASSERT_TRUE(store_->Commit(Batch(2), /*sync=*/true).ok());
  ASSERT_TRUE(store_->Commit(Batch(3), /*sync=*/false).ok());
  CrashAndReopen();
  EXPECT_EQ(Visible(1), 103);
  EXPECT_EQ(Visible(2), 103);
  EXPECT_EQ(Visible(3), 0);
}

TEST_F(RocksDbCrashTest, SyncedCommitsSurviveFlushAndCrash) {
  ASSERT_TRUE(store_->Commit(Batch(1), /*sync=*/true).ok());
  ASSERT_TRUE(store_->CompactForTesting().ok());  // data now in SSTs, new WAL
  ASSERT_TRUE(store_->Commit(Batch(2), /*sync=*/true).ok());
  ASSERT_TRUE(store_->Commit(Batch(3), /*sync=*/false).ok());
  CrashAndReopen();
  EXPECT_EQ(Visible(1), 103);
  EXPECT_EQ(Visible(2), 103);
  EXPECT_EQ(Visible(3), 0);
}

TEST_F(RocksDbCrashTest, FailedCommitAppliesNothingAndIsSticky) {
  ASSERT_TRUE(store_->Commit(Batch(1), /*sync=*/true).ok());
  fs_->SetFilesystemActive(false);
  Status s = store_->Commit(Batch(2), /*sync=*/true);
  EXPECT_EQ(s.code(), Status::Code::kIOError) << s.ToString();
  fs_->SetFilesystemActive(true);
  EXPECT_EQ(Visible(2), 0);
  s = store_->Commit(Batch(3), /*sync=*/true);
  EXPECT_EQ(s.code(), Status::Code::kIOError) << s.ToString();
  CrashAndReopen();
  EXPECT_EQ(Visible(1), 103);
  EXPECT_EQ(Visible(2), 0);
  EXPECT_EQ(Visible(3), 0);
  EXPECT_TRUE(store_->Commit(Batch(4), /*sync=*/true).ok());
}

}  // namespace
}  // namespace thinfs::meta
