// meta::CheckPool over hand-built metadata: each kind of damage is
// reported precisely, repair fixes what it can, and a second check is
// clean. Plus: a pool the engine built is clean.

#include "meta/pool_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>

#include "core/mem_metadata.h"
#include "core/mem_space_map.h"
#include "meta/format.h"
#include "meta/record_codec.h"
#include "meta/rocksdb_store.h"
#include "tests/util/engine_fixture.h"
#include "tests/util/pool_test_util.h"

namespace thinfs {
namespace {
namespace THINFS_TEST_FILE {  // unique per file in a unity build (tests/CMakeLists.txt)

using meta::CheckFinding;
using meta::CheckOptions;
using meta::CheckPool;
using meta::CheckReport;

constexpr uint64_t kBlocks = 64;

class PoolCheckTest : public ::testing::Test {
 protected:
  PoolCheckTest() : space_(kBlocks) { store_ = std::make_unique<MemMetadataStore>(TestSuperblock()); }

  static Superblock TestSuperblock() {
    Superblock sb;
    sb.block_size = 4096;
    sb.data_blocks = kBlocks;
    sb.next_device_id = 10;
    sb.transaction_id = 5;
    return sb;
  }

  DeviceRecord Device(uint64_t id, const std::string& name, Epoch epoch) {
    DeviceRecord d;
    d.id = VolumeId(id);
    d.name = name;
    d.size = 16 * 4096;
    d.epoch = epoch;
    return d;
  }
  void Put(const DeviceRecord& d) {
    MetaBatch b;
    b.put_devices.push_back(d);
    ASSERT_OK(store_->Commit(b, true));
  }
  // A version naming `block`, which is marked used in the space map unless
  // `allocate` is false.
  void Map(uint64_t dev, uint64_t vb, Epoch e, uint64_t block, uint8_t flags = 0,
           bool allocate = true) {
    MetaBatch b;
    b.put_mappings.push_back(MapEntry{VolumeId(dev), VolumeBlock(vb), e, {PoolBlock(block), flags}});
    ASSERT_OK(store_->Commit(b, true));
    if (allocate && block < kBlocks) space_.MarkUsed(PoolBlock(block));
  }
  void Refcount(uint64_t block, uint32_t n) {
    MetaBatch b;
    b.refcounts.emplace_back(PoolBlock(block), n);
    ASSERT_OK(store_->Commit(b, true));
  }
  // Device `dev`'s record.
  DeviceRecord Load(uint64_t dev) {
    Result<std::vector<DeviceRecord>> devs = store_->LoadDevices();
    EXPECT_TRUE(devs.ok()) << devs.status().ToString();
    if (devs.ok()) {
      for (const DeviceRecord& d : *devs) {
        if (d.id.value == dev) return d;
      }
    }
    ADD_FAILURE() << "no device " << dev;
    return DeviceRecord();
  }
  uint64_t MappedBlocks(uint64_t dev) { return Load(dev).mapped_blocks; }
  // Adds `n` to device `dev`'s mapped_blocks, as the engine does when a
  // version it installs makes one more block read from the data area.
  void AddMapped(uint64_t dev, uint64_t n) {
    DeviceRecord d = Load(dev);
    d.mapped_blocks += n;
    Put(d);
  }

  // A consistent pool: origin 1 at epoch 1 with snapshot 2 reading it at
  // epoch 0, and device 3 sharing block 5 with the origin's block 1.
  // Mapped blocks: the origin reads vblocks 0 and 1, the snapshot vblock 0
  // (epoch 0 of the origin; its own vblock 3 is a tombstone), device 3
  // vblock 2.
  void BuildHealthy() {
    DeviceRecord origin = Device(1, "origin", 1);
    origin.mapped_blocks = 2;
    Put(origin);
    DeviceRecord snap = Device(2, "snap", 0);
    snap.has_parent = true;
    snap.parent = VolumeId(1);
    snap.parent_epoch = 0;
    snap.mapped_blocks = 1;
    Put(snap);
    DeviceRecord copy = Device(3, "copy", 0);
    copy.mapped_blocks = 1;
    Put(copy);
    Map(1, 0, 0, 4);
    Map(1, 0, 1, 7);
    Map(1, 1, 1, 5, MapValue::kMaybeShared);
    Map(3, 2, 0, 5, MapValue::kMaybeShared);
    Refcount(5, 2);
    Map(2, 3, 0, 0, MapValue::kTombstone, /*allocate=*/false);
  }

  CheckReport Check(bool repair = false) {
    CheckOptions o;
    o.repair = repair;
    o.max_map_entries_in_memory = max_map_entries_in_memory_;
    Result<CheckReport> r = CheckPool(store_.get(), &space_, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : CheckReport();
  }

  static const CheckFinding* Find(const CheckReport& r, const std::string& kind) {
    for (const CheckFinding& f : r.findings) {
      if (f.kind == kind) return &f;
    }
    return nullptr;
  }
  // The device-mapped-blocks-wrong finding is about `device` and its
  // message holds `text`. Call through ASSERT_NO_FATAL_FAILURE.
  static void ExpectCountFinding(const CheckReport& r, uint64_t device,
                                 const std::string& text) {
    const CheckFinding* count = Find(r, "device-mapped-blocks-wrong");
    ASSERT_NE(count, nullptr) << Dump(r);
    EXPECT_EQ(count->device, device);
    EXPECT_NE(count->message.find(text), std::string::npos) << count->message;
  }
  static std::string Dump(const CheckReport& r) {
    std::string s;
    for (const CheckFinding& f : r.findings) {
      s += (f.severity == CheckFinding::Severity::kError ? "error " : "warning ") + f.kind + ": " +
           f.message + (f.repair.empty() ? "" : " [repair: " + f.repair + "]") + "\n";
    }
    for (const CheckFinding& f : r.remaining) s += "remaining " + f.kind + ": " + f.message + "\n";
    return s;
  }

  // Repairs, expects every error corrected, then a clean check with no
  // findings at all.
  void RepairAndExpectClean() {
    CheckReport fixed = Check(/*repair=*/true);
    EXPECT_EQ(fixed.errors_left, 0u) << Dump(fixed);
    EXPECT_EQ(fixed.errors_corrected, fixed.error_count) << Dump(fixed);
    EXPECT_FALSE(fixed.changes.empty());
    CheckReport again = Check();
    EXPECT_EQ(again.error_count, 0u) << Dump(again);
    EXPECT_EQ(again.warning_count, 0u) << Dump(again);
  }

  MemSpaceMap space_;
  std::unique_ptr<MetadataStore> store_;
  size_t max_map_entries_in_memory_ = CheckOptions().max_map_entries_in_memory;
};

TEST_F(PoolCheckTest, HealthyPoolIsClean) {
  BuildHealthy();
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 0u) << Dump(r);
  EXPECT_EQ(r.warning_count, 0u) << Dump(r);
  EXPECT_EQ(r.devices, 3u);
  EXPECT_EQ(r.mappings, 5u);
  EXPECT_EQ(r.referenced_blocks, 3u);
  EXPECT_EQ(r.shared_blocks, 1u);
  EXPECT_EQ(r.refcount_entries, 1u);
  EXPECT_TRUE(r.clean());
  // Repair of a clean pool changes nothing.
  CheckReport rep = Check(true);
  EXPECT_TRUE(rep.changes.empty()) << Dump(rep);
  EXPECT_EQ(rep.errors_corrected, 0u);
}

TEST_F(PoolCheckTest, MappingOutsideTheDataArea) {
  BuildHealthy();
  Map(3, 9, 0, kBlocks + 3);
  AddMapped(3, 1);  // the engine counted it when it installed the version
  CheckReport r = Check();
  // The version, and the count that assumes the tombstone repair makes.
  EXPECT_EQ(r.error_count, 2u) << Dump(r);
  ASSERT_NO_FATAL_FAILURE(
      ExpectCountFinding(r, 3, "device 3 'copy': mapped_blocks is 2 but it reads 1 blocks"));
  const CheckFinding* f = Find(r, "mapping-outside-data-area");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->device, 3u);
  EXPECT_EQ(f->vblock, 9u);
  EXPECT_EQ(f->epoch, 0u);
  EXPECT_EQ(f->block, kBlocks + 3);
  EXPECT_NE(f->message.find("device 3 vblock 9 epoch 0 maps pool block 67 beyond the data area"),
            std::string::npos)
      << f->message;
  EXPECT_FALSE(r.clean());
  RepairAndExpectClean();
  auto v = store_->FindVersion(VolumeId(3), VolumeBlock(9), 0);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_TRUE((*v)->value.tombstone()) << "the block reads zeros, not an older version";
  EXPECT_EQ(MappedBlocks(3), 1u) << "the tombstone reads zeros: one block fewer";
  EXPECT_EQ(MappedBlocks(1), 2u);
  EXPECT_EQ(MappedBlocks(2), 1u);
}

// The count that changes is that of the devices reading the version: here
// not its owner (which reads a newer one) but the snapshot below it.
TEST_F(PoolCheckTest, ATombstoneInAnOldEpochLowersTheSnapshotsCount) {
  BuildHealthy();
  Map(1, 5, 0, kBlocks + 1);  // read by the snapshot (origin epoch 0)...
  Map(1, 5, 1, 9);            // ...while the origin reads its epoch-1 version
  AddMapped(1, 1);
  AddMapped(2, 1);
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 2u) << Dump(r);
  ASSERT_NE(Find(r, "mapping-outside-data-area"), nullptr) << Dump(r);
  ASSERT_NO_FATAL_FAILURE(ExpectCountFinding(r, 2, "mapped_blocks is 2 but it reads 1 blocks"));
  RepairAndExpectClean();
  EXPECT_EQ(MappedBlocks(1), 3u);
  EXPECT_EQ(MappedBlocks(2), 1u);
}

// Only the counter is wrong: check reports it, repair sets it, and the
// other devices are left alone.
TEST_F(PoolCheckTest, WrongMappedBlocksCounter) {
  BuildHealthy();
  DeviceRecord origin = Load(1);
  origin.mapped_blocks = 7;
  Put(origin);
  DeviceRecord copy = Load(3);
  copy.mapped_blocks = 0;
  Put(copy);
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 2u) << Dump(r);
  EXPECT_FALSE(r.clean());
  std::vector<const CheckFinding*> counts;
  for (const CheckFinding& f : r.findings) {
    if (f.kind == "device-mapped-blocks-wrong") counts.push_back(&f);
  }
  ASSERT_EQ(counts.size(), 2u) << Dump(r);
  EXPECT_EQ(counts[0]->device, 1u);
  EXPECT_EQ(counts[0]->severity, CheckFinding::Severity::kError);
  EXPECT_NE(counts[0]->message.find("device 1 'origin': mapped_blocks is 7 but it reads 2 blocks"),
            std::string::npos)
      << counts[0]->message;
  EXPECT_EQ(counts[1]->device, 3u);
  EXPECT_NE(counts[1]->message.find("mapped_blocks is 0 but it reads 1 blocks"), std::string::npos)
      << counts[1]->message;
  EXPECT_EQ(MappedBlocks(1), 7u) << "plain check changes nothing";
  RepairAndExpectClean();
  EXPECT_EQ(MappedBlocks(1), 2u);
  EXPECT_EQ(MappedBlocks(2), 1u);
  EXPECT_EQ(MappedBlocks(3), 1u);
}

// Hidden devices are not counted: the collector drops the versions no
// child reads without recounting, and nothing reads their count.
TEST_F(PoolCheckTest, HiddenDevicesCountsAreNotChecked) {
  BuildHealthy();
  DeviceRecord origin = Load(1);
  origin.name.clear();
  origin.flags = DeviceRecord::kHidden;
  origin.mapped_blocks = 40;
  Put(origin);
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 0u) << Dump(r);
  EXPECT_EQ(r.warning_count, 0u) << Dump(r);
}

TEST_F(PoolCheckTest, MappedBlockFreeInTheSpaceMap) {
  BuildHealthy();
  Map(3, 4, 0, 20, 0, /*allocate=*/false);
  AddMapped(3, 1);
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 1u) << Dump(r);
  const CheckFinding* f = Find(r, "block-not-allocated");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->device, 3u);
  EXPECT_EQ(f->vblock, 4u);
  EXPECT_EQ(f->block, 20u);
  RepairAndExpectClean();
  EXPECT_TRUE(space_.IsAllocated(PoolBlock(20)));
}

TEST_F(PoolCheckTest, LeaksAreWarningsAndRepairReclaimsThem) {
  BuildHealthy();
  space_.MarkUsed(PoolBlock(30));
  space_.MarkUsed(PoolBlock(31));
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 0u) << Dump(r);
  EXPECT_TRUE(r.clean());
  EXPECT_EQ(r.leaked_blocks, 2u);
  const CheckFinding* f = Find(r, "leaked-blocks");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->severity, CheckFinding::Severity::kWarning);
  EXPECT_NE(f->message.find("30 31"), std::string::npos) << f->message;
  const uint64_t free_before = space_.free_blocks();
  CheckReport fixed = Check(true);
  EXPECT_EQ(fixed.reclaimed_blocks, 2u);
  EXPECT_EQ(fixed.errors_corrected, 0u);
  EXPECT_EQ(space_.free_blocks(), free_before + 2);
  EXPECT_FALSE(space_.IsAllocated(PoolBlock(30)));
  EXPECT_TRUE(space_.IsAllocated(PoolBlock(4)));
  EXPECT_EQ(Check().warning_count, 0u);
}

TEST_F(PoolCheckTest, WrongRefcount) {
  BuildHealthy();
  Refcount(5, 3);
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 1u) << Dump(r);
  const CheckFinding* f = Find(r, "refcount-wrong");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->block, 5u);
  EXPECT_NE(f->message.find("is 3 but 2 versions"), std::string::npos) << f->message;
  RepairAndExpectClean();
  EXPECT_EQ(*store_->GetRefcount(PoolBlock(5)), 2u);
}

TEST_F(PoolCheckTest, StaleRefcountEntries) {
  BuildHealthy();
  Refcount(4, 2);   // named by one version
  Refcount(40, 5);  // named by none
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 2u) << Dump(r);
  int stale = 0;
  for (const CheckFinding& f : r.findings) stale += f.kind == "refcount-stale";
  EXPECT_EQ(stale, 2) << Dump(r);
  RepairAndExpectClean();
  auto rc = store_->ListRefcounts();
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(rc->size(), 1u);
}

TEST_F(PoolCheckTest, RefcountOutsideTheDataArea) {
  BuildHealthy();
  Refcount(kBlocks + 1, 2);
  CheckReport r = Check();
  const CheckFinding* f = Find(r, "refcount-outside-data-area");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->block, kBlocks + 1);
  RepairAndExpectClean();
}

TEST_F(PoolCheckTest, BlockMappedTwiceWithoutACount) {
  BuildHealthy();
  // Device 3's own, current-epoch version names the origin's block 7.
  Map(3, 6, 0, 7);
  AddMapped(3, 1);
  CheckReport r = Check();
  const CheckFinding* f = Find(r, "block-double-mapped");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->block, 7u);
  EXPECT_NE(f->message.find("device 1 vblock 0 epoch 1"), std::string::npos) << f->message;
  EXPECT_NE(f->message.find("device 3 vblock 6 epoch 0"), std::string::npos) << f->message;
  // Both are current-epoch versions without the flag: in-place writes.
  int unflagged = 0;
  for (const CheckFinding& g : r.findings) unflagged += g.kind == "shared-version-not-flagged";
  EXPECT_EQ(unflagged, 2) << Dump(r);
  RepairAndExpectClean();
  EXPECT_EQ(*store_->GetRefcount(PoolBlock(7)), 2u);
  auto v = store_->FindVersion(VolumeId(3), VolumeBlock(6), 0);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_TRUE((*v)->value.flags & MapValue::kMaybeShared);
}

TEST_F(PoolCheckTest, OldEpochVersionsOfASharedBlockNeedNoFlag) {
  BuildHealthy();
  // Origin's epoch-0 version (block 4) is also named by device 3, flagged,
  // with a count: the origin never writes epoch 0 in place.
  Map(3, 7, 0, 4, MapValue::kMaybeShared);
  AddMapped(3, 1);
  Refcount(4, 2);
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 0u) << Dump(r);
}

TEST_F(PoolCheckTest, VersionsOfMissingDevicesAndFutureEpochs) {
  BuildHealthy();
  Map(8, 0, 0, 11);  // no device 8
  Map(3, 1, 4, 12);  // device 3 is at epoch 0
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 2u) << Dump(r);
  const CheckFinding* a = Find(r, "mapping-without-device");
  ASSERT_NE(a, nullptr) << Dump(r);
  EXPECT_EQ(a->device, 8u);
  EXPECT_EQ(a->block, 11u);
  const CheckFinding* b = Find(r, "mapping-future-epoch");
  ASSERT_NE(b, nullptr) << Dump(r);
  EXPECT_EQ(b->device, 3u);
  EXPECT_EQ(b->epoch, 4u);
  CheckReport fixed = Check(true);
  EXPECT_EQ(fixed.errors_left, 0u) << Dump(fixed);
  // The dropped versions' blocks are reclaimed with the rebuild.
  EXPECT_FALSE(space_.IsAllocated(PoolBlock(11)));
  EXPECT_FALSE(space_.IsAllocated(PoolBlock(12)));
  EXPECT_EQ(Check().error_count, 0u);
}

TEST_F(PoolCheckTest, DeviceTableDamageIsReportedAndLeft) {
  BuildHealthy();
  DeviceRecord orphan = Device(4, "orphan", 0);
  orphan.has_parent = true;
  orphan.parent = VolumeId(99);  // missing
  Put(orphan);
  DeviceRecord future = Device(5, "future", 0);
  future.has_parent = true;
  future.parent = VolumeId(1);
  future.parent_epoch = 1;  // origin is at epoch 1
  Put(future);
  DeviceRecord a = Device(6, "a", 1), b = Device(7, "b", 1);
  a.has_parent = b.has_parent = true;
  a.parent = VolumeId(7);
  b.parent = VolumeId(6);
  Put(a);
  Put(b);
  Put(Device(8, "origin", 0));  // duplicate name
  Put(Device(9, ".bad", 0));
  CheckReport r = Check();
  for (const char* kind : {"device-parent-missing", "device-parent-epoch", "device-ancestry-cycle",
                           "device-duplicate-name", "device-bad-name"}) {
    EXPECT_NE(Find(r, kind), nullptr) << kind << "\n" << Dump(r);
  }
  EXPECT_EQ(Find(r, "device-parent-missing")->device, 4u);
  EXPECT_EQ(Find(r, "device-parent-epoch")->device, 5u);
  EXPECT_EQ(Find(r, "device-duplicate-name")->device, 8u);
  EXPECT_EQ(Find(r, "device-bad-name")->device, 9u);
  int cycles = 0;
  for (const CheckFinding& f : r.findings) cycles += f.kind == "device-ancestry-cycle";
  EXPECT_EQ(cycles, 2) << Dump(r);
  // Nothing here can be repaired safely: left, and said so.
  CheckReport fixed = Check(true);
  EXPECT_EQ(fixed.errors_corrected, 0u) << Dump(fixed);
  EXPECT_EQ(fixed.errors_left, r.error_count);
  EXPECT_FALSE(fixed.remaining.empty());
}

TEST_F(PoolCheckTest, LiveChildOfADeletingDevice) {
  BuildHealthy();
  DeviceRecord origin = Device(1, "", 1);
  origin.flags = DeviceRecord::kDeleting | DeviceRecord::kHidden;
  Put(origin);
  CheckReport r = Check();
  const CheckFinding* f = Find(r, "device-reads-deleting-parent");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->device, 2u);
  // The deleting device's versions are flagged as awaiting the collector.
  const CheckFinding* w = Find(r, "device-deleting");
  ASSERT_NE(w, nullptr) << Dump(r);
  EXPECT_EQ(w->device, 1u);
  EXPECT_NE(w->message.find("3 versions"), std::string::npos) << w->message;
}

TEST_F(PoolCheckTest, HiddenDeviceWithoutChildrenIsMarkedForCollection) {
  BuildHealthy();
  DeviceRecord copy = Device(3, "", 0);
  copy.flags = DeviceRecord::kHidden;
  Put(copy);
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 0u) << Dump(r);
  const CheckFinding* f = Find(r, "hidden-device-without-children");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->device, 3u);
  CheckReport fixed = Check(true);
  EXPECT_FALSE(fixed.changes.empty());
  auto devs = store_->LoadDevices();
  ASSERT_TRUE(devs.ok());
  auto it = std::find_if(devs->begin(), devs->end(), [](auto& d) { return d.id.value == 3; });
  ASSERT_NE(it, devs->end());
  EXPECT_TRUE(it->flags & DeviceRecord::kDeleting);
}

TEST_F(PoolCheckTest, DeviceIdBeyondNextDeviceId) {
  BuildHealthy();
  Put(Device(12, "late", 0));
  CheckReport r = Check();
  const CheckFinding* f = Find(r, "device-id-out-of-range");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->device, 12u);
  RepairAndExpectClean();
  EXPECT_EQ(store_->ReadSuperblock()->next_device_id, 13u);
}

TEST_F(PoolCheckTest, RepairBumpsTheTransactionAndLeavesTheSpaceMapClean) {
  BuildHealthy();
  Map(3, 4, 0, 20, 0, /*allocate=*/false);
  AddMapped(3, 1);
  ASSERT_OK(space_.MarkDirty());
  CheckReport fixed = Check(true);
  EXPECT_EQ(fixed.errors_left, 0u) << Dump(fixed);
  space_.DropUnsynced();  // the repair is durable
  EXPECT_TRUE(space_.was_clean());
  EXPECT_TRUE(space_.IsAllocated(PoolBlock(20)));
}

TEST_F(PoolCheckTest, WithoutASpaceMapTheMapIsStillChecked) {
  BuildHealthy();
  Map(3, 9, 0, kBlocks + 3);
  Result<CheckReport> r = CheckPool(store_.get(), nullptr, CheckOptions());
  ASSERT_TRUE(r.ok());
  EXPECT_NE(Find(*r, "mapping-outside-data-area"), nullptr);
}

// The same checks over a RocksDB store, where records can be damaged below
// the codec: a value that fails its check, a key of the wrong size.
class PoolCheckDamagedMapTest : public PoolCheckTest {
 protected:
  PoolCheckDamagedMapTest() {
    auto s = meta::RocksDbStore::Create(tmp_.Sub("meta"), TestSuperblock(), meta::RocksDbOptions());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return;
    rocks_ = s->get();
    store_ = std::move(*s);
  }
  ~PoolCheckDamagedMapTest() override { store_.reset(); }  // before tmp_ goes

  void SetUp() override { ASSERT_NE(rocks_, nullptr); }

  // Flips a bit of the stored check of version (dev, vb, e).
  void DamageValue(uint64_t dev, uint64_t vb, Epoch e) {
    const std::string key = meta::MapKey(VolumeId(dev), VolumeBlock(vb), e);
    Result<std::string> raw = rocks_->GetRawForTesting(meta::dbformat::kMapCf, key);
    ASSERT_TRUE(raw.ok()) << raw.status().ToString();
    std::string bad = *raw;
    bad.back() = static_cast<char>(bad.back() ^ 0x10);
    ASSERT_OK(rocks_->PutRawForTesting(meta::dbformat::kMapCf, key, bad));
  }
  // A record under a key of the wrong size: device `dev`'s 8 bytes plus 4.
  std::string PutMalformedKey(uint64_t dev) {
    std::string key = meta::Id64Key(dev) + std::string(4, '\x01');
    EXPECT_OK(rocks_->PutRawForTesting(meta::dbformat::kMapCf, key, std::string("\x09\x00\x00\x00", 4)));
    return key;
  }
  // Entries the strict (engine) iterator yields before it stops, and its status.
  std::pair<std::vector<MapEntry>, Status> StrictWalk() {
    std::vector<MapEntry> seen;
    std::unique_ptr<MapIterator> it = store_->NewMapIterator();
    for (it->Seek(VolumeId(0), VolumeBlock(0)); it->Valid(); it->Next()) seen.push_back(it->entry());
    return {seen, it->status()};
  }

  testing::TempDir tmp_;
  meta::RocksDbStore* rocks_ = nullptr;
};

TEST_F(PoolCheckDamagedMapTest, EveryDamagedRecordIsReportedAndTheWalkGoesOn) {
  BuildHealthy();
  Map(1, 2, 1, 9);
  AddMapped(1, 1);
  DamageValue(1, 2, 1);
  const std::string bad_key = PutMalformedKey(2);
  // Damage that sorts after both records: found only if the walk goes on.
  Map(3, 4, 0, 20, 0, /*allocate=*/false);  // block-not-allocated
  AddMapped(3, 1);
  Refcount(5, 3);                           // refcount-wrong (2 versions)
  space_.MarkUsed(PoolBlock(30));           // a leak

  CheckReport r = Check();
  // The four, and the origin's count once the damaged version reads zeros.
  EXPECT_EQ(r.error_count, 5u) << Dump(r);
  EXPECT_EQ(r.undecodable_mappings, 2u);
  EXPECT_EQ(r.mappings, 6u);
  std::vector<const CheckFinding*> damaged;
  for (const CheckFinding& f : r.findings) {
    if (f.kind == "mapping-undecodable") damaged.push_back(&f);
  }
  ASSERT_EQ(damaged.size(), 2u) << Dump(r);
  EXPECT_EQ(damaged[0]->severity, CheckFinding::Severity::kError);
  EXPECT_EQ(damaged[0]->device, 1u);
  EXPECT_EQ(damaged[0]->vblock, 2u);
  EXPECT_EQ(damaged[0]->epoch, 1u);
  EXPECT_FALSE(damaged[0]->block.has_value()) << "its block is unknown";
  EXPECT_NE(damaged[0]->message.find("device 1 vblock 2 epoch 1 cannot be decoded"),
            std::string::npos) << damaged[0]->message;
  EXPECT_NE(damaged[0]->message.find("check mismatch"), std::string::npos) << damaged[0]->message;
  EXPECT_FALSE(damaged[1]->device.has_value());
  EXPECT_NE(damaged[1]->message.find("key 000000000000000201010101 cannot be decoded"),
            std::string::npos) << damaged[1]->message;
  EXPECT_NE(damaged[1]->message.find("map key of 12 bytes"), std::string::npos)
      << damaged[1]->message;

  const CheckFinding* f = Find(r, "block-not-allocated");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->device, 3u);
  EXPECT_EQ(f->block, 20u);
  f = Find(r, "refcount-wrong");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_NE(f->message.find("2 undecodable block-map records were skipped"), std::string::npos)
      << f->message;
  f = Find(r, "leaked-blocks");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_NE(f->message.find(": 9 30 ("), std::string::npos) << f->message;
  ASSERT_NO_FATAL_FAILURE(
      ExpectCountFinding(r, 1,
                         "mapped_blocks is 3 but it reads 2 blocks from the data area "
                         "(undecodable block-map records counted as the tombstones"));
  EXPECT_EQ(Find(r, "block-map-unreadable"), nullptr) << Dump(r);

  // Plain check changes nothing.
  EXPECT_TRUE(rocks_->GetRawForTesting(meta::dbformat::kMapCf, bad_key).ok());
  EXPECT_TRUE(space_.IsAllocated(PoolBlock(9)));
  EXPECT_FALSE(space_.IsAllocated(PoolBlock(20)));
  EXPECT_EQ(*store_->GetRefcount(PoolBlock(5)), 3u);

  CheckReport fixed = Check(/*repair=*/true);
  EXPECT_EQ(fixed.errors_left, 0u) << Dump(fixed);
  EXPECT_EQ(fixed.errors_corrected, 5u) << Dump(fixed);
  const CheckFinding* g = Find(fixed, "mapping-undecodable");
  ASSERT_NE(g, nullptr);
  EXPECT_NE(g->repair.find("by a tombstone"), std::string::npos) << g->repair;
  // The version reads zeros now; the malformed record is gone; the blocks
  // only the skipped records named are free again, the rest still used.
  auto v = store_->FindVersion(VolumeId(1), VolumeBlock(2), 1);
  ASSERT_TRUE(v.ok() && v->has_value()) << v.status().ToString();
  EXPECT_TRUE((*v)->value.tombstone());
  EXPECT_TRUE(rocks_->GetRawForTesting(meta::dbformat::kMapCf, bad_key).status().IsNotFound());
  EXPECT_FALSE(space_.IsAllocated(PoolBlock(9)));
  EXPECT_FALSE(space_.IsAllocated(PoolBlock(30)));
  for (uint64_t b : {4, 5, 7, 20}) EXPECT_TRUE(space_.IsAllocated(PoolBlock(b))) << b;
  EXPECT_EQ(*store_->GetRefcount(PoolBlock(5)), 2u);
  EXPECT_EQ(MappedBlocks(1), 2u) << "the tombstone reads zeros: one block fewer";
  EXPECT_EQ(MappedBlocks(3), 2u);
  CheckReport again = Check();
  EXPECT_EQ(again.error_count, 0u) << Dump(again);
  EXPECT_EQ(again.warning_count, 0u) << Dump(again);
  EXPECT_EQ(again.undecodable_mappings, 0u);
  EXPECT_TRUE(StrictWalk().second.ok());
}

// The tombstone repair puts in place of an undecodable version hides the
// older version below it: the count must be taken with the tombstone, not
// with the skipped record's older version showing through.
TEST_F(PoolCheckDamagedMapTest, AnUndecodableNewerVersionHidesTheOlderOneInTheCount) {
  BuildHealthy();
  DamageValue(1, 0, 1);  // the origin's vblock 0 at epoch 1 (epoch 0 below)
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 2u) << Dump(r);
  ASSERT_NE(Find(r, "mapping-undecodable"), nullptr) << Dump(r);
  ASSERT_NO_FATAL_FAILURE(ExpectCountFinding(r, 1, "mapped_blocks is 2 but it reads 1 blocks"));
  CheckReport fixed = Check(/*repair=*/true);
  EXPECT_EQ(fixed.errors_left, 0u) << Dump(fixed);
  EXPECT_EQ(MappedBlocks(1), 1u);
  EXPECT_EQ(MappedBlocks(2), 1u) << "the snapshot still reads epoch 0";
  EXPECT_EQ(Check().error_count, 0u);
}

// The same counts through the store's iterators instead of a copy of the
// map in memory (what a map of more than 4M entries gets).
TEST_F(PoolCheckDamagedMapTest, CountsThroughStoreIteratorsAgree) {
  max_map_entries_in_memory_ = 0;
  BuildHealthy();
  Map(1, 2, 1, 9);
  AddMapped(1, 1);
  DamageValue(1, 2, 1);
  DamageValue(1, 0, 1);  // hides epoch 0 of vblock 0 once a tombstone
  Map(1, 5, 0, kBlocks + 1);  // read by the snapshot, outside the data area
  Map(1, 5, 1, 10);
  AddMapped(1, 1);
  AddMapped(2, 1);
  CheckReport r = Check();
  std::vector<std::pair<uint64_t, std::string>> counts;
  for (const CheckFinding& f : r.findings) {
    if (f.kind == "device-mapped-blocks-wrong") counts.emplace_back(*f.device, f.message);
  }
  ASSERT_EQ(counts.size(), 2u) << Dump(r);
  EXPECT_EQ(counts[0].first, 1u);
  EXPECT_NE(counts[0].second.find("mapped_blocks is 4 but it reads 2 blocks"), std::string::npos)
      << counts[0].second;
  EXPECT_EQ(counts[1].first, 2u);
  EXPECT_NE(counts[1].second.find("mapped_blocks is 2 but it reads 1 blocks"), std::string::npos)
      << counts[1].second;
  CheckReport fixed = Check(/*repair=*/true);
  EXPECT_EQ(fixed.errors_left, 0u) << Dump(fixed);
  EXPECT_EQ(MappedBlocks(1), 2u);
  EXPECT_EQ(MappedBlocks(2), 1u);
  EXPECT_EQ(MappedBlocks(3), 1u);
  EXPECT_EQ(Check().error_count, 0u);
}

TEST_F(PoolCheckDamagedMapTest, TheEngineStillStopsAtADamagedRecord) {
  BuildHealthy();
  Map(1, 2, 1, 9);
  DamageValue(1, 2, 1);
  auto [seen, status] = StrictWalk();
  EXPECT_TRUE(status.IsCorruption()) << status.ToString();
  EXPECT_EQ(seen.size(), 3u);  // device 1's versions before vblock 2
  auto v = store_->FindVersion(VolumeId(1), VolumeBlock(2), 1);
  EXPECT_TRUE(v.status().IsCorruption()) << v.status().ToString();
  // A malformed key first in the map: the strict walk yields nothing.
  PutMalformedKey(0);
  std::tie(seen, status) = StrictWalk();
  EXPECT_TRUE(status.IsCorruption()) << status.ToString();
  EXPECT_TRUE(seen.empty());
  // One that sorts before MapKey(0, 0, ...): the strict Seek passes it.
  ASSERT_OK(rocks_->PutRawForTesting(meta::dbformat::kMapCf, std::string(3, '\0'), "x"));
  // The lenient walk sees everything else and the three records.
  int damaged = 0;
  std::unique_ptr<MapIterator> it =
      store_->NewMapIteratorSkippingDamaged([&](const DamagedMapRecord&) { ++damaged; });
  size_t n = 0;
  for (it->Seek(VolumeId(0), VolumeBlock(0)); it->Valid(); it->Next()) ++n;
  EXPECT_OK(it->status());
  EXPECT_EQ(n, 5u);
  EXPECT_EQ(damaged, 3);
}

TEST_F(PoolCheckDamagedMapTest, AnUnreadableVersionOfAMissingDeviceIsDropped) {
  BuildHealthy();
  Map(8, 0, 0, 11);  // no device 8
  DamageValue(8, 0, 0);
  CheckReport r = Check();
  EXPECT_EQ(r.error_count, 1u) << Dump(r);
  ASSERT_NE(Find(r, "mapping-undecodable"), nullptr) << Dump(r);
  CheckReport fixed = Check(/*repair=*/true);
  EXPECT_NE(Find(fixed, "mapping-undecodable")->repair.find("dropped"), std::string::npos)
      << Dump(fixed);
  EXPECT_EQ(fixed.errors_left, 0u) << Dump(fixed);
  auto versions = store_->ListVersions(VolumeId(8), VolumeBlock(0));
  ASSERT_TRUE(versions.ok()) << versions.status().ToString();
  EXPECT_TRUE(versions->empty());
  EXPECT_FALSE(space_.IsAllocated(PoolBlock(11)));
  EXPECT_EQ(Check().error_count, 0u);
}

TEST_F(PoolCheckDamagedMapTest, ManyDamagedRecordsAreCountedAndListedUpToTheCap) {
  BuildHealthy();
  constexpr uint64_t kDamaged = 40;
  for (uint64_t vb = 0; vb < kDamaged; ++vb) {
    Map(3, 100 + vb, 0, 0, MapValue::kTombstone, /*allocate=*/false);
    DamageValue(3, 100 + vb, 0);
  }
  CheckOptions o;
  o.max_listed = 10;
  Result<CheckReport> r = CheckPool(store_.get(), &space_, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->error_count, kDamaged);
  EXPECT_EQ(r->undecodable_mappings, kDamaged);
  EXPECT_EQ(r->findings.size(), 10u);
  o.repair = true;
  r = CheckPool(store_.get(), &space_, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->errors_corrected, kDamaged);
  EXPECT_EQ(r->changes.size(), 10u);
  EXPECT_EQ(r->errors_left, 0u);
  EXPECT_EQ(Check().error_count, 0u);
}

TEST(PoolCheckEngineTest, WhatTheEngineBuildsIsClean) {
  testing::EngineFixture f(4096, 256);
  ASSERT_TRUE(f.pool->CreateDevice("a", 64 * 4096).ok());
  auto a = f.pool->OpenVolume("a");
  ASSERT_TRUE(a.ok());
  for (uint64_t b = 0; b < 32; ++b) {
    ASSERT_OK((*a)->Write(b * 4096, testing::Pattern(4096, static_cast<uint32_t>(b))));
  }
  ASSERT_TRUE(f.pool->CreateSnapshot("a", "s").ok());
  ASSERT_OK((*a)->Write(100, testing::Pattern(9000, 7)));
  ASSERT_TRUE(f.pool->CreateDevice("c", 64 * 4096).ok());
  auto c = f.pool->OpenVolume("c");
  ASSERT_TRUE(c.ok());
  ASSERT_OK(f.pool->ShareRange((*a)->id(), 8 * 4096, (*c)->id(), 16 * 4096, 8 * 4096));
  ASSERT_OK((*a)->Discard(20 * 4096, 4 * 4096));
  ASSERT_OK(f.pool->Commit());
  a->reset();
  ASSERT_OK(f.pool->DeleteDevice("a"));
  ASSERT_OK(f.pool->Commit());
  Result<CheckReport> r = CheckPool(f.store.get(), f.space.get(), CheckOptions());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->error_count, 0u);
  for (const CheckFinding& g : r->findings) ADD_FAILURE() << g.kind << ": " << g.message;
  EXPECT_GT(r->shared_blocks, 0u);
}

// A copy_file_range onto an empty device that covers part of the source
// (the kernel sends a large one in pieces): the clone path's counts must
// be exact at every step, not only once the whole device is covered.
TEST(PoolCheckEngineTest, APartialCloneCountsWhatItReads) {
  testing::EngineFixture f(4096, 256);
  ASSERT_TRUE(f.pool->CreateDevice("src", 32 * 4096).ok());
  ASSERT_TRUE(f.pool->CreateDevice("dst", 32 * 4096).ok());
  auto src = f.pool->OpenVolume("src");
  ASSERT_TRUE(src.ok());
  // Blocks 0-3 and 12-15 mapped: the first half holds holes.
  for (uint64_t b : {0, 1, 2, 3, 12, 13, 14, 15}) {
    ASSERT_OK((*src)->Write(b * 4096, testing::Pattern(4096, static_cast<uint32_t>(b + 1))));
  }
  ASSERT_OK(f.pool->Commit());
  const VolumeId s = (*src)->id(), d = f.pool->GetDevice("dst")->id;
  for (uint64_t end : {8, 16, 32}) {
    const uint64_t from = end == 8 ? 0 : end / 2;
    ASSERT_OK(f.pool->ShareRange(s, from * 4096, d, from * 4096, (end - from) * 4096));
    ASSERT_OK(f.pool->Commit());
    EXPECT_EQ(f.pool->GetDevice("dst")->mapped_blocks, end == 8 ? 4u : 8u) << "copied to " << end;
    Result<CheckReport> r = CheckPool(f.store.get(), f.space.get(), CheckOptions());
    ASSERT_TRUE(r.ok());
    for (const CheckFinding& g : r->findings) {
      ADD_FAILURE() << "copied to block " << end << ": " << g.kind << ": " << g.message;
    }
  }
  // Pieces that end inside a block (the kernel's are 2 GiB less a page):
  // dst copies the edge blocks, then the next piece covers them.
  ASSERT_TRUE(f.pool->CreateDevice("odd", 32 * 4096).ok());
  const VolumeId o = f.pool->GetDevice("odd")->id;
  const uint64_t cuts[] = {0, 2 * 4096 + 100, 13 * 4096 + 7, 14 * 4096 + 1, 32 * 4096};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    ASSERT_OK(f.pool->ShareRange(s, cuts[i], o, cuts[i], cuts[i + 1] - cuts[i]));
    ASSERT_OK(f.pool->Commit());
    Result<CheckReport> r = CheckPool(f.store.get(), f.space.get(), CheckOptions());
    ASSERT_TRUE(r.ok());
    for (const CheckFinding& g : r->findings) {
      ADD_FAILURE() << "copied to byte " << cuts[i + 1] << ": " << g.kind << ": " << g.message;
    }
  }
  EXPECT_EQ(f.pool->GetDevice("odd")->mapped_blocks, 8u);
}

}  // namespace THINFS_TEST_FILE
}  // namespace
}  // namespace thinfs
