// thinfs check over damaged pools built on disk, and thinfs check --repair:
// the damage is reported, repaired (exit 1), and a second check is clean.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "meta/bitmap_space_map.h"
#include "meta/format.h"
#include "meta/pool_dir.h"
#include "meta/rocksdb_store.h"
#include "tests/tools/json_parser.h"
#include "tests/util/cli_runner.h"
#include "tests/util/pool_test_util.h"

namespace thinfs {
namespace {

using testing::JsonParser;
using testing::JsonValue;
using testing::ReadFileOrDie;
using testing::TempDir;

using testing::CliRun;
using testing::Describe;
using testing::Thinfs;

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// A 16 MiB pool of 64 KiB blocks (256 blocks) with one device, 'vol'.
class CheckRepairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = tmp_.Sub("pool");
    CliRun r = Thinfs({"format", pool_, "--size", "16M"});
    ASSERT_EQ(r.exit_code, 0) << Describe(r);
  }

  // Commits `batch` (plus a device 1 'vol' at epoch 0 whose mapped_blocks
  // is `mapped`, as the engine counted it) straight into the store, and
  // marks `used` allocated in the bitmap.
  void Damage(MetaBatch batch, const std::vector<uint64_t>& used, uint64_t mapped = 0) {
    {
      auto store = meta::RocksDbStore::Open(pool_ + "/meta", meta::RocksDbOptions());
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      auto sb = (*store)->ReadSuperblock();
      ASSERT_TRUE(sb.ok());
      Superblock s = *sb;
      s.next_device_id = std::max<uint64_t>(s.next_device_id, 2);
      batch.superblock = s;
      DeviceRecord d;
      d.id = VolumeId(1);
      d.name = "vol";
      d.size = 16 * 65536;
      d.mapped_blocks = mapped;
      batch.put_devices.push_back(d);
      ASSERT_TRUE((*store)->Commit(batch, true).ok());
    }
    auto bm = meta::BitmapSpaceMap::Open(pool_ + "/bitmap", 256, 65536, false);
    ASSERT_TRUE(bm.ok()) << bm.status().ToString();
    ASSERT_TRUE((*bm)->MarkDirty().ok());
    for (uint64_t b : used) (*bm)->MarkUsed(PoolBlock(b));
    ASSERT_TRUE((*bm)->MarkClean(0).ok());
  }

  // Device 1's mapped_blocks as stored (what st_blocks of its file shows).
  uint64_t MappedBlocks() {
    auto store = meta::RocksDbStore::Open(pool_ + "/meta", meta::RocksDbOptions());
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (!store.ok()) return UINT64_MAX;
    auto devs = (*store)->LoadDevices();
    EXPECT_TRUE(devs.ok() && devs->size() == 1) << devs.status().ToString();
    return devs.ok() && devs->size() == 1 ? (*devs)[0].mapped_blocks : UINT64_MAX;
  }

  static MapEntry Entry(uint64_t vb, uint64_t block, uint8_t flags = 0) {
    return MapEntry{VolumeId(1), VolumeBlock(vb), 0, MapValue{PoolBlock(block), flags}};
  }

  TempDir tmp_;
  std::string pool_;
};

TEST_F(CheckRepairTest, ReportsRepairsAndReverifies) {
  MetaBatch b;
  b.put_mappings.push_back(Entry(0, 3));
  b.put_mappings.push_back(Entry(1, 999));  // outside the data area
  b.put_mappings.push_back(Entry(2, 7));    // free in the bitmap
  b.put_mappings.push_back(Entry(3, 8, MapValue::kMaybeShared));
  b.put_mappings.push_back(Entry(4, 8, MapValue::kMaybeShared));
  b.refcounts.emplace_back(PoolBlock(8), 5);  // two versions name it
  Damage(b, {3, 8, 40}, /*mapped=*/5);        // 40: a leak

  CliRun r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  EXPECT_TRUE(Has(r.out, "error: block map: device 1 vblock 1 epoch 0 maps pool block 999 "
                         "beyond the data area (256 blocks)"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "error: block map: device 1 vblock 2 epoch 0 maps pool block 7, which "
                         "the space map marks free"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "error: refcount of pool block 8 is 5 but 2 versions name the block"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "warning: 1 blocks are allocated in the space map but named by no "
                         "version (leaked, reclaimable): 40"))
      << r.out;
  // Once vblock 1 is a tombstone, 'vol' reads 4 blocks.
  EXPECT_TRUE(Has(r.out, "error: device 1 'vol': mapped_blocks is 5 but it reads 4 blocks from "
                         "the data area"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "4 errors left uncorrected")) << r.out;

  r = Thinfs({"check", pool_, "--repair", "--read-only"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Has(r.err, "exclude each other")) << r.err;

  r = Thinfs({"check", pool_, "--repair", "--json"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  std::string error;
  std::optional<JsonValue> v = JsonParser::Parse(r.out, &error);
  ASSERT_TRUE(v.has_value()) << error << "\n" << r.out;
  EXPECT_TRUE((*v)["clean"].boolean);
  EXPECT_TRUE((*v)["repair"].boolean);
  EXPECT_EQ((*v)["errors_corrected"].AsUint(), 4u);
  EXPECT_EQ((*v)["errors_left"].AsUint(), 0u);
  EXPECT_EQ((*v)["reclaimed_blocks"].AsUint(), 1u);
  EXPECT_EQ((*v)["changes"].array.size(), 5u) << r.out;
  bool found = false;
  for (const JsonValue& f : (*v)["findings"].array) {
    if (f["kind"].string != "mapping-outside-data-area") continue;
    found = true;
    EXPECT_EQ(f["device"].AsUint(), 1u);
    EXPECT_EQ(f["vblock"].AsUint(), 1u);
    EXPECT_EQ(f["epoch"].AsUint(), 0u);
    EXPECT_EQ(f["block"].AsUint(), 999u);
    EXPECT_TRUE(Has(f["repair"].string, "tombstone")) << f["repair"].string;
  }
  EXPECT_TRUE(found) << r.out;
  EXPECT_EQ(MappedBlocks(), 4u);

  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_FALSE(Has(r.out, "warning")) << r.out;
  EXPECT_TRUE(Has(r.out, ": clean")) << r.out;
  // The repaired pool opens, and the device reads what the repair left.
  r = Thinfs({"status", pool_});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
}

TEST_F(CheckRepairTest, AWrongMappedBlocksCountIsReportedAndSet) {
  MetaBatch b;
  b.put_mappings.push_back(Entry(0, 3));
  b.put_mappings.push_back(Entry(6, 4));
  Damage(b, {3, 4}, /*mapped=*/9);
  CliRun r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  EXPECT_TRUE(Has(r.out, "error: device 1 'vol': mapped_blocks is 9 but it reads 2 blocks from "
                         "the data area"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "1 errors left uncorrected")) << r.out;
  r = Thinfs({"check", pool_, "--json"});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  std::string error;
  std::optional<JsonValue> v = JsonParser::Parse(r.out, &error);
  ASSERT_TRUE(v.has_value()) << error << "\n" << r.out;
  ASSERT_EQ((*v)["findings"].array.size(), 1u) << r.out;
  EXPECT_EQ((*v)["findings"].array[0]["kind"].string, "device-mapped-blocks-wrong");
  EXPECT_EQ((*v)["findings"].array[0]["device"].AsUint(), 1u);
  EXPECT_EQ(MappedBlocks(), 9u) << "plain check changes nothing";

  r = Thinfs({"check", pool_, "--repair"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Has(r.out, "repaired: set the mapped_blocks of device 1 'vol' from 9 to 2")) << r.out;
  EXPECT_EQ(MappedBlocks(), 2u);
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_FALSE(Has(r.out, "warning")) << r.out;
}

// A repair that changes no mapping (here a stale refcount entry) commits
// the metadata all the same: the bitmap must follow it to the new
// transaction id, or the next check finds it stale.
TEST_F(CheckRepairTest, ARepairOfCountsOnlyLeavesTheBitmapCurrent) {
  MetaBatch b;
  b.put_mappings.push_back(Entry(0, 3));
  b.refcounts.emplace_back(PoolBlock(3), 2);  // one version names it
  Damage(b, {3}, /*mapped=*/1);
  CliRun r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  EXPECT_TRUE(Has(r.out, "error: refcount of pool block 3 is 2 but 1 version(s)")) << r.out;
  r = Thinfs({"check", pool_, "--repair"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_FALSE(Has(r.out, "stale")) << r.out;
}

TEST_F(CheckRepairTest, LeaksOnlyAreCleanAndRepairReclaimsThem) {
  MetaBatch b;
  b.put_mappings.push_back(Entry(0, 3));
  Damage(b, {3, 10, 11}, /*mapped=*/1);
  CliRun r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(Has(r.out, "warning: 2 blocks are allocated")) << r.out;
  r = Thinfs({"check", pool_, "--repair"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(Has(r.out, "repaired: reclaimed 2 leaked blocks")) << r.out;
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_FALSE(Has(r.out, "warning")) << r.out;
}

TEST_F(CheckRepairTest, DamagedBitmapIsRebuiltFromTheBlockMap) {
  MetaBatch b;
  b.put_mappings.push_back(Entry(0, 3));
  b.put_mappings.push_back(Entry(5, 9));
  Damage(b, {3, 9}, /*mapped=*/2);
  testing::FlipByteOrDie(pool_ + "/bitmap", testing::kBitmapHeaderFlipOffsetForTesting);
  CliRun r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  EXPECT_TRUE(Has(r.out, "checksum")) << r.out;
  r = Thinfs({"check", pool_, "--repair"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Has(r.out, "repaired: replaced the bitmap")) << r.out;
  EXPECT_TRUE(std::filesystem::exists(pool_ + "/bitmap.damaged"));
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  auto bm = meta::BitmapSpaceMap::Open(pool_ + "/bitmap", 256, 65536, true);
  ASSERT_TRUE(bm.ok()) << bm.status().ToString();
  EXPECT_TRUE((*bm)->IsAllocated(PoolBlock(3)));
  EXPECT_TRUE((*bm)->IsAllocated(PoolBlock(9)));
  EXPECT_EQ((*bm)->free_blocks(), 254u);
}

TEST_F(CheckRepairTest, UndecodableMapRecordsAreReportedAndRepairedAsHoles) {
  MetaBatch b;
  b.put_mappings.push_back(Entry(0, 3));
  b.put_mappings.push_back(Entry(5, 7));  // after the damage: free in the bitmap
  Damage(b, {3, 40}, /*mapped=*/2);       // 40: a leak
  std::string key(20, '\0');
  key[7] = 1;  // device 1, vblock 0
  for (int i = 16; i < 20; ++i) key[i] = static_cast<char>(0xff);  // ~epoch 0
  const std::string short_key = key.substr(0, 8) + "\x02\x02";  // sorts after vblock 0
  {
    auto store = meta::RocksDbStore::Open(pool_ + "/meta", meta::RocksDbOptions());
    ASSERT_TRUE(store.ok());
    auto raw = (*store)->GetRawForTesting(meta::dbformat::kMapCf, key);
    ASSERT_TRUE(raw.ok()) << raw.status().ToString();
    std::string bad = *raw;
    bad.back() = static_cast<char>(bad.back() ^ 0x5a);
    ASSERT_TRUE((*store)->PutRawForTesting(meta::dbformat::kMapCf, key, bad).ok());
    ASSERT_TRUE((*store)->PutRawForTesting(meta::dbformat::kMapCf, short_key, *raw).ok());
  }
  CliRun r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  EXPECT_TRUE(Has(r.out, "error: block map: device 1 vblock 0 epoch 0 cannot be decoded: ")) << r.out;
  EXPECT_TRUE(Has(r.out, "check mismatch")) << r.out;
  EXPECT_TRUE(Has(r.out, "error: block map: record with key 00000000000000010202 cannot be "
                         "decoded: Corruption: map key of 10 bytes"))
      << r.out;
  // What lies past the damage is still checked.
  EXPECT_TRUE(Has(r.out, "error: block map: device 1 vblock 5 epoch 0 maps pool block 7, which "
                         "the space map marks free"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "warning: 2 blocks are allocated in the space map but named by no "
                         "version (leaked, reclaimable): 3 40 (2 undecodable"))
      << r.out;
  EXPECT_TRUE(Has(r.out, ": 1 devices, 1 mappings (and 2 undecodable), 1 referenced blocks"))
      << r.out;
  // Counted as repair leaves the map: vblock 0 a tombstone.
  EXPECT_TRUE(Has(r.out, "error: device 1 'vol': mapped_blocks is 2 but it reads 1 blocks from "
                         "the data area (undecodable block-map records counted as the "
                         "tombstones repair makes them)"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "4 errors left uncorrected")) << r.out;

  r = Thinfs({"check", pool_, "--json"});
  EXPECT_EQ(r.exit_code, 4) << Describe(r);
  std::string error;
  std::optional<JsonValue> v = JsonParser::Parse(r.out, &error);
  ASSERT_TRUE(v.has_value()) << error << "\n" << r.out;
  EXPECT_EQ((*v)["undecodable_mappings"].AsUint(), 2u);
  EXPECT_EQ((*v)["mappings"].AsUint(), 1u);
  int undecodable = 0;
  for (const JsonValue& f : (*v)["findings"].array) {
    if (f["kind"].string == "mapping-undecodable") ++undecodable;
  }
  EXPECT_EQ(undecodable, 2) << r.out;

  r = Thinfs({"check", pool_, "--repair"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(Has(r.out, "repaired: replaced the undecodable version device 1 vblock 0 epoch 0 "
                         "by a tombstone: the block reads zeros there"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "repaired: deleted the block-map record with the malformed key "
                         "00000000000000010202"))
      << r.out;
  EXPECT_EQ(MappedBlocks(), 1u) << "vblock 0 reads zeros now";
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_FALSE(Has(r.out, "warning")) << r.out;
  auto bm = meta::BitmapSpaceMap::Open(pool_ + "/bitmap", 256, 65536, true);
  ASSERT_TRUE(bm.ok()) << bm.status().ToString();
  EXPECT_TRUE((*bm)->IsAllocated(PoolBlock(7)));
  EXPECT_FALSE((*bm)->IsAllocated(PoolBlock(3)));
  EXPECT_FALSE((*bm)->IsAllocated(PoolBlock(40)));
}

}  // namespace
}  // namespace thinfs
