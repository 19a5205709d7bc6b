// Corruption through the CLI and the mount (issue 6): a pool with known
// data on two volumes and a snapshot is built through a real mount, then
// each test damages one part of it on disk, the way a bad disk or a stray
// write would: bits of the bitmap header and body, the superblock record,
// a device record, a map record, a byte inside an SST file, the MANIFEST,
// the WAL cut short. Also: a killed daemon's pool recovers at the next
// mount by itself and says so in the log.
// For each it asserts what docs/design.md ("Corruption and recovery")
// promises:
//   - `thinfs check POOL` exits 4 and names the damaged thing (file,
//     record, device, vblock);
//   - `thinfs check --repair POOL` fixes what can be fixed (the bitmap; a
//     map record it cannot decode becomes a hole) and lists what it cannot;
//   - `thinfs mount` either refuses, exit 2, with a message that names the
//     damage and the commands to run, leaving no mount and no daemon, or
//     mounts and serves every byte it serves correctly: a damaged record
//     reads as EIO (logged with the record), never as other data;
//   - nothing exits on a signal (the daemon runs under ASan in the ASan CI
//     pass).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "meta/format.h"
#include "meta/record_codec.h"
#include "meta/rocksdb_store.h"
#include "tests/util/e2e_util.h"

namespace thinfs::testing {
namespace {

constexpr uint64_t kBlock = 64 * 1024;
constexpr uint64_t kVolBytes = 16 * kBlock;

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

void FlipBits(const std::string& path, uint64_t offset, uint8_t mask) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, static_cast<off_t>(offset)), 1) << path;
  c = static_cast<char>(c ^ mask);
  ASSERT_EQ(pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1) << path;
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
}

class CorruptionTest : public E2eTest {
 protected:
  // Volume name -> the bytes it must serve.
  std::map<std::string, std::vector<char>> expected_;
  std::map<std::string, uint64_t> ids_;

  // 32 MiB pool of 64 KiB blocks: 'a' (16 blocks written), 'snap' (a
  // snapshot of 'a', then 'a' rewrites its first two blocks), 'b' (8
  // blocks written). Unmounted cleanly at the end.
  void SetUp() override {
    E2eTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    FormatPool("32M");
    ASSERT_EQ(MountForeground(), "");
    Write("a", 0, Pattern(1, 0, kVolBytes));
    Write("b", 0, Pattern(2, 0, kVolBytes / 2));
    ASSERT_EQ(truncate(Vol("b").c_str(), kVolBytes), 0) << strerror(errno);
    CommandResult snap = Thinfs({"snapshot", pool_, "a", "snap"});
    ASSERT_EQ(snap.exit_code, 0) << snap.output;
    Write("a", 0, Pattern(3, 0, 2 * kBlock));
    ASSERT_EQ(Unmount(), "");

    expected_["snap"] = Pattern(1, 0, kVolBytes);
    expected_["a"] = Pattern(1, 0, kVolBytes);
    std::vector<char> head = Pattern(3, 0, 2 * kBlock);
    std::copy(head.begin(), head.end(), expected_["a"].begin());
    expected_["b"] = Pattern(2, 0, kVolBytes / 2);
    expected_["b"].resize(kVolBytes, 0);

    {
      auto store = meta::RocksDbStore::Open(pool_ + "/meta", meta::RocksDbOptions());
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      auto devices = (*store)->LoadDevices();
      ASSERT_TRUE(devices.ok()) << devices.status().ToString();
      for (const DeviceRecord& d : *devices) ids_[d.name] = d.id.value;
      ASSERT_EQ(ids_.size(), 3u);
    }
    // The untouched pool checks clean: any finding below is the damage's.
    CommandResult check = Thinfs({"check", pool_});
    ASSERT_EQ(check.exit_code, 0) << check.output;
  }

  void Write(const std::string& name, uint64_t offset, const std::vector<char>& data) {
    int fd = open(Vol(name).c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0) << strerror(errno);
    ASSERT_EQ(pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset)),
              static_cast<ssize_t>(data.size()))
        << strerror(errno);
    ASSERT_EQ(fsync(fd), 0) << strerror(errno);
    close(fd);
  }

  // Mounts (daemon mode, the user's path) and expects a refusal: exit 2
  // (not a signal), a message naming each of `names` and the commands to
  // run, no mount and no daemon left.
  void ExpectMountRefused(const std::vector<std::string>& names) {
    CommandResult r = MountDaemon();
    EXPECT_EQ(r.exit_code, 2) << r.output;
    for (const std::string& n : names) EXPECT_TRUE(Has(r.output, n)) << n << "\n" << r.output;
    EXPECT_TRUE(Has(r.output, "thinfs check " + pool_)) << r.output;
    EXPECT_TRUE(Has(r.output, "thinfs check --repair " + pool_)) << r.output;
    EXPECT_FALSE(IsThinfsMounted(mnt_));
    EXPECT_TRUE(FindMountDaemons(pool_).empty());
  }

  // Mounts in the foreground and reads every volume back block by block:
  // each block must read as expected or fail with EIO, nothing else.
  // Returns the volumes' blocks that failed, as "name:block".
  std::vector<std::string> MountAndReadBack() {
    std::vector<std::string> failed;
    std::string err = MountForeground();
    EXPECT_EQ(err, "");
    if (!err.empty()) return {"<no mount>"};
    for (const auto& [name, want] : expected_) {
      int fd = open(Vol(name).c_str(), O_RDONLY);
      EXPECT_GE(fd, 0) << name << ": " << strerror(errno);
      if (fd < 0) {
        failed.push_back(name + ":open");
        continue;
      }
      struct stat st {};
      EXPECT_EQ(fstat(fd, &st), 0);
      EXPECT_EQ(static_cast<uint64_t>(st.st_size), want.size()) << name;
      std::vector<char> buf(kBlock);
      for (uint64_t b = 0; b < want.size() / kBlock; ++b) {
        ssize_t n = pread(fd, buf.data(), kBlock, static_cast<off_t>(b * kBlock));
        if (n < 0) {
          EXPECT_EQ(errno, EIO) << name << " block " << b << ": " << strerror(errno);
          failed.push_back(name + ":" + std::to_string(b));
          continue;
        }
        EXPECT_EQ(n, static_cast<ssize_t>(kBlock)) << name << " block " << b;
        EXPECT_TRUE(std::equal(buf.begin(), buf.end(), want.begin() + b * kBlock))
            << name << " block " << b << " served wrong data";
      }
      close(fd);
    }
    EXPECT_EQ(Unmount(), "");
    return failed;
  }

  // Flips bits at `offset` of the bitmap; check names the file and `why`,
  // the mount refuses, --repair rebuilds the bitmap from the block map and
  // every volume reads back.
  void ExpectBitmapDamageRepaired(uint64_t offset, const std::string& why) {
    FlipBits(pool_ + "/bitmap", offset, 0x08);
    CommandResult r = Thinfs({"check", pool_});
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_TRUE(Has(r.output, "error: bitmap " + pool_ + "/bitmap")) << r.output;
    EXPECT_TRUE(Has(r.output, why)) << r.output;
    ExpectMountRefused({"bitmap " + pool_ + "/bitmap", why});

    r = Thinfs({"check", "--repair", pool_});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Has(r.output, "repaired: replaced the bitmap")) << r.output;
    r = Thinfs({"check", pool_});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(MountAndReadBack(), std::vector<std::string>{});
  }

  // Damage repair cannot fix: check and check --repair exit 4 naming
  // `what`, and the mount refuses before and after the repair attempt.
  void ExpectReportedRefusedAndLeft(const std::string& what) {
    CommandResult r = Thinfs({"check", pool_});
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_TRUE(Has(r.output, what)) << r.output;
    ExpectMountRefused({what});
    r = Thinfs({"check", "--repair", pool_});
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_TRUE(Has(r.output, what)) << r.output;
    ExpectMountRefused({what});
  }

  // Replaces the raw value of `key` in column family `cf` by `edit(value)`.
  template <typename Edit>
  void EditRecord(const std::string& cf, const std::string& key, Edit edit) {
    auto store = meta::RocksDbStore::Open(pool_ + "/meta", meta::RocksDbOptions());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto raw = (*store)->GetRawForTesting(cf, key);
    ASSERT_TRUE(raw.ok()) << raw.status().ToString();
    std::string v = *raw;
    edit(v);
    ASSERT_TRUE((*store)->PutRawForTesting(cf, key, v).ok());
  }

  std::vector<char> ReadAll(const std::string& name, size_t size) {
    std::vector<char> out(size);
    int fd = open(Vol(name).c_str(), O_RDONLY);
    EXPECT_GE(fd, 0) << strerror(errno);
    if (fd < 0) return {};
    EXPECT_EQ(pread(fd, out.data(), size, 0), static_cast<ssize_t>(size)) << strerror(errno);
    close(fd);
    return out;
  }

  std::vector<std::string> MetaFiles(const std::string& prefix, const std::string& suffix) {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(pool_ + "/meta")) {
      std::string n = e.path().filename();
      if (n.rfind(prefix, 0) == 0 && n.size() >= suffix.size() &&
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) {
        out.push_back(e.path());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST_F(CorruptionTest, BitmapHeaderBitIsRepairedFromTheBlockMap) {
  // The low byte of the generation: covered by the header checksum only.
  ExpectBitmapDamageRepaired(32, "header checksum mismatch");
}

TEST_F(CorruptionTest, BitmapBodyBitIsRepairedFromTheBlockMap) {
  // Block 3's bit (in use by 'a' or 'b'): cleared, a clean header's body
  // checksum no longer matches.
  ExpectBitmapDamageRepaired(meta::kBitmapHeaderSize, "body checksum mismatch");
}

TEST_F(CorruptionTest, SuperblockRecordBitIsReportedAndRefused) {
  // A bit of data_blocks (offset 48 of SuperblockValueV1).
  EditRecord(meta::dbformat::kSuperblockCf, meta::dbformat::kSuperblockKey,
             [](std::string& v) { v[48] = static_cast<char>(v[48] ^ 0x10); });
  // Nothing trustworthy to rebuild it from.
  ExpectReportedRefusedAndLeft("superblock record: checksum mismatch");
}

TEST_F(CorruptionTest, DeviceRecordBitIsReportedAndRefused) {
  const uint64_t b = ids_["b"];
  // A bit of b's size (offset 16 of DeviceValueV1).
  EditRecord(meta::dbformat::kDevicesCf, meta::Id64Key(b),
             [](std::string& v) { v[16] = static_cast<char>(v[16] ^ 0x01); });
  const std::string what = "device record " + std::to_string(b) + ": checksum mismatch";
  ExpectReportedRefusedAndLeft(what);
}

TEST_F(CorruptionTest, MapRecordBitReadsAsEioUntilTheRepairMakesAHole) {
  // Block 5 of 'a', written before the snapshot: one version (epoch 0)
  // that 'snap' reads too.
  const uint64_t a = ids_["a"];
  auto store = meta::RocksDbStore::Open(pool_ + "/meta", meta::RocksDbOptions());
  ASSERT_TRUE(store.ok());
  auto versions = (*store)->ListVersions(VolumeId(a), VolumeBlock(5));
  ASSERT_TRUE(versions.ok()) << versions.status().ToString();
  ASSERT_EQ(versions->size(), 1u);
  const Epoch epoch = (*versions)[0].epoch;
  store->reset();
  const std::string key = meta::MapKey(VolumeId(a), VolumeBlock(5), epoch);
  // A bit of the pool block number: without the check this would serve
  // another block's data.
  EditRecord(meta::dbformat::kMapCf, key, [](std::string& v) { v[0] = static_cast<char>(v[0] ^ 0x02); });
  const std::string where = "device " + std::to_string(a) + " vblock 5 epoch " +
                            std::to_string(epoch);
  const std::string what = "map entry (device " + std::to_string(a) + ", vblock 5, epoch " +
                           std::to_string(epoch) + "): check mismatch";
  CommandResult r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(Has(r.output, "error: block map: " + where + " cannot be decoded")) << r.output;
  EXPECT_TRUE(Has(r.output, what)) << r.output;
  // Mounts (the map is read on demand): exactly block 5 of 'a' and of
  // 'snap' fail, with the record in the log and the command to run.
  EXPECT_EQ(MountAndReadBack(), (std::vector<std::string>{"a:5", "snap:5"}));
  EXPECT_TRUE(Has(Log(), what)) << Log();
  EXPECT_TRUE(Has(Log(), "thinfs check")) << Log();
  // The repair turns the version into a hole: both read zeros there, and
  // every other block still reads its data.
  r = Thinfs({"check", "--repair", pool_});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, "repaired: replaced the undecodable version " + where +
                                " by a tombstone"))
      << r.output;
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"a", "snap"}) {
    std::fill_n(expected_[name].begin() + 5 * kBlock, kBlock, 0);
  }
  EXPECT_EQ(MountAndReadBack(), std::vector<std::string>{});
}

TEST_F(CorruptionTest, BitmapAndMapRecordDamagedTogetherNeverFreesUsedBlocks) {
  // The repair replaces the damaged bitmap and rebuilds it from the block
  // map, which it reads past the damaged record (turned into a hole): the
  // new bitmap must hold every block the map still names (check proves
  // it: a named block free in the bitmap is an error) or a mount would
  // hand them out again and overwrite 'a' and 'b'.
  FlipBits(pool_ + "/bitmap", 32, 0x04);
  const uint64_t a = ids_["a"];
  EditRecord(meta::dbformat::kMapCf, meta::MapKey(VolumeId(a), VolumeBlock(7), 0),
             [](std::string& v) { v[0] = static_cast<char>(v[0] ^ 0x02); });
  CommandResult r = Thinfs({"check", "--repair", pool_});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, "repaired: replaced the bitmap")) << r.output;
  EXPECT_TRUE(Has(r.output, "repaired: replaced the undecodable version device " +
                                std::to_string(a) + " vblock 7 epoch 0 by a tombstone"))
      << r.output;
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(Has(r.output, "marks free")) << r.output;
  EXPECT_FALSE(Has(r.output, "warning")) << r.output;
  for (const char* name : {"a", "snap"}) {
    std::fill_n(expected_[name].begin() + 7 * kBlock, kBlock, 0);
  }
  EXPECT_EQ(MountAndReadBack(), std::vector<std::string>{});
}

TEST_F(CorruptionTest, SstByteFlipIsReportedNamingTheFile) {
  {
    // Flush everything into SST files (the clean unmount may have left
    // the last commits in the WAL only).
    auto store = meta::RocksDbStore::Open(pool_ + "/meta", meta::RocksDbOptions());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->CompactForTesting().ok());
  }
  // The largest SST holds the block map; its first data block starts at 0.
  std::vector<std::string> ssts = MetaFiles("", ".sst");
  ASSERT_FALSE(ssts.empty());
  std::string sst = *std::max_element(ssts.begin(), ssts.end(), [](const auto& x, const auto& y) {
    return std::filesystem::file_size(x) < std::filesystem::file_size(y);
  });
  FlipBits(sst, 40, 0xff);
  const std::string file = std::filesystem::path(sst).filename();
  CommandResult r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(Has(r.output, "block checksum mismatch")) << r.output;
  EXPECT_TRUE(Has(r.output, file)) << r.output;
  r = Thinfs({"check", "--repair", pool_});
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(Has(r.output, file)) << r.output;
  // The mount either refuses or serves the volumes, failing (EIO) what it
  // cannot read.
  CommandResult m = MountDaemon();
  if (m.exit_code == 0) {
    ASSERT_EQ(Unmount(), "");
    MountAndReadBack();
  } else {
    EXPECT_EQ(m.exit_code, 2) << m.output;
    EXPECT_TRUE(Has(m.output, file)) << m.output;
    EXPECT_TRUE(Has(m.output, "thinfs check --repair " + pool_)) << m.output;
    EXPECT_FALSE(IsThinfsMounted(mnt_));
  }
}

TEST_F(CorruptionTest, TruncatedWalIsNotSilentlyRolledBack) {
  // After a crash the last commits live only in RocksDB's WAL (a clean
  // close flushes them into SST files). A WAL cut short replays up to the
  // cut without complaint (point-in-time recovery), and the recovery would
  // rebuild the bitmap from an older block map: an older pool, silently.
  // The bitmap's generation (written by every commit) gives the loss away.
  ASSERT_EQ(MountForeground("commit_interval=0"), "");
  for (uint64_t i = 0; i < 8; ++i) {
    Write("b", kVolBytes / 2 + i * kBlock, Pattern(10 + i, 0, kBlock));  // a commit each
  }
  KillDaemonHard();
  std::vector<std::string> wals = MetaFiles("", ".log");
  ASSERT_FALSE(wals.empty());
  const std::string wal = wals.back();
  const uintmax_t size = std::filesystem::file_size(wal);
  ASSERT_GT(size, 0u);
  std::filesystem::resize_file(wal, size / 2);
  CommandResult r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(Has(r.output, "committed metadata is missing")) << r.output;
  ExpectMountRefused({"committed metadata is missing"});
  // Repair keeps the metadata as it is and rebuilds the bitmap to match:
  // the pool is consistent again, as of the last commit the WAL kept.
  r = Thinfs({"check", "--repair", pool_});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, "repaired: replaced the bitmap")) << r.output;
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // What was written before the lost commits is intact.
  expected_["b"].resize(kVolBytes / 2);
  expected_.erase("a");
  expected_.erase("snap");
  ASSERT_EQ(MountForeground(), "");
  EXPECT_EQ(ReadAll("b", kVolBytes / 2), expected_["b"]);
  ASSERT_EQ(Unmount(), "");
}

TEST_F(CorruptionTest, MissingManifestIsReportedAndRefused) {
  std::vector<std::string> manifests = MetaFiles("MANIFEST-", "");
  ASSERT_FALSE(manifests.empty());
  for (const std::string& m : manifests) std::filesystem::remove(m);
  CommandResult r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(Has(r.output, "a database file is missing")) << r.output;
  EXPECT_TRUE(Has(r.output, "MANIFEST")) << r.output;
  ExpectMountRefused({"a database file is missing", "MANIFEST"});
}

TEST_F(CorruptionTest, KilledDaemonRecoversByItselfAndSaysSo) {
  ASSERT_EQ(MountForeground(), "");
  Write("b", kVolBytes / 2, Pattern(4, 0, 2 * kBlock));
  std::copy_n(Pattern(4, 0, 2 * kBlock).begin(), 2 * kBlock, expected_["b"].begin() + kVolBytes / 2);
  KillDaemonHard();
  EXPECT_FALSE(IsThinfsMounted(mnt_));
  EXPECT_EQ(MountAndReadBack(), std::vector<std::string>{});
  EXPECT_TRUE(Has(Log(), "recovery: the pool was not closed cleanly; rebuilt the allocation bitmap"))
      << Log();
  CommandResult r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace thinfs::testing
