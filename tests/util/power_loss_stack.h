// The real pool stack (RocksDbStore, BitmapSpaceMap on a file, the data area
// as a FileBlockDevice) under layers that lose, at a "power cut", every
// write no sync made durable:
//   - RocksDB's files sit on meta::FaultInjectionFs (unsynced appends are
//     truncated, unsynced new files deleted);
//   - RollbackBlockDevice keeps the pre-image of every data block written
//     since the last Sync() and restores it at the cut; with torn writes,
//     each such block instead keeps its new contents, or only their first
//     half (a write torn in the middle), or is rolled back, chosen by a
//     seeded generator;
//   - SnapshotSpaceMap copies the bitmap file aside whenever the bitmap is
//     made durable (Sync, MarkDirty, MarkClean) and puts that copy back at
//     the cut, dropping every bit the kernel was never asked to write.
//     Sync only starts the header's write-back: at the cut the header is
//     the one of any Sync since the last MarkDirty or MarkClean, or theirs,
//     chosen by the seeded generator (a generation behind the metadata).
// Each layer can also fail its N-th sync, and the space map can switch the
// RocksDB file system off right after a successful sync: a cut in the
// middle of a commit, between the bitmap and the metadata write.
//
// Thread safety: for single-threaded tests (the pool runs without
// background threads).

#ifndef THINFS_TESTS_UTIL_POWER_LOSS_STACK_H_
#define THINFS_TESTS_UTIL_POWER_LOSS_STACK_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/block_device.h"
#include "core/pool.h"
#include "meta/bitmap_space_map.h"
#include "meta/fault_injection_env.h"
#include "meta/format.h"
#include "meta/pool_dir.h"
#include "meta/rocksdb_store.h"
#include "tests/util/forwarding.h"
#include "tests/util/pool_test_util.h"

namespace thinfs::testing {

class RollbackBlockDevice final : public BlockDevice {
 public:
  explicit RollbackBlockDevice(std::unique_ptr<FileBlockDevice> file) : f_(std::move(file)) {}

  Status Read(PoolBlock b, uint64_t o, std::span<std::byte> buf) override {
    return f_->Read(b, o, buf);
  }
  Status Write(PoolBlock b, uint64_t o, std::span<const std::byte> buf) override {
    THINFS_RETURN_IF_ERROR(SavePreImage(b.value));
    return f_->Write(b, o, buf);
  }
  Status Sync() override {
    ++syncs_;
    if (fail_sync_at_ != 0 && syncs_ == fail_sync_at_) {
      return Status::IOError("injected data sync failure");
    }
    THINFS_RETURN_IF_ERROR(f_->Sync());
    undo_.clear();
    return Status::Ok();
  }
  Status Discard(PoolBlock b, uint64_t n) override {
    for (uint64_t i = 0; i < n; ++i) THINFS_RETURN_IF_ERROR(SavePreImage(b.value + i));
    return f_->Discard(b, n);
  }
  const Geometry& geometry() const override { return f_->geometry(); }

  // Fails the sync that makes the count reach `n` (counting from now); 0:
  // never.
  void FailSyncAt(uint64_t n) { fail_sync_at_ = n == 0 ? 0 : syncs_ + n; }
  size_t unsynced_blocks() const { return undo_.size(); }

  // The cut. Returns how many blocks were torn.
  int PowerCut(std::mt19937_64* rng, bool torn) {
    int torn_blocks = 0;
    const uint64_t bs = geometry().block_size();
    for (auto& [b, old] : undo_) {
      uint64_t choice = torn ? (*rng)() % 3 : 0;
      if (choice == 1) continue;  // the new contents reached the disk
      if (choice == 2) {
        // Torn: the first half is new, the second half old.
        Status s = f_->Write(PoolBlock(b), bs / 2, std::span(old).subspan(bs / 2));
        EXPECT_TRUE(s.ok()) << s.ToString();
        ++torn_blocks;
        continue;
      }
      Status s = f_->Write(PoolBlock(b), 0, old);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    undo_.clear();
    fail_sync_at_ = 0;
    EXPECT_TRUE(f_->Sync().ok());
    return torn_blocks;
  }

 private:
  Status SavePreImage(uint64_t b) {
    if (undo_.count(b)) return Status::Ok();
    std::vector<std::byte> old(geometry().block_size());
    THINFS_RETURN_IF_ERROR(f_->Read(PoolBlock(b), 0, old));
    undo_.emplace(b, std::move(old));
    return Status::Ok();
  }

  std::unique_ptr<FileBlockDevice> f_;
  std::map<uint64_t, std::vector<std::byte>> undo_;  // block -> contents at last sync
  uint64_t syncs_ = 0;
  uint64_t fail_sync_at_ = 0;
};

class SnapshotSpaceMap final : public SpaceMap {
 public:
  SnapshotSpaceMap(std::string path, std::unique_ptr<meta::BitmapSpaceMap> b)
      : path_(std::move(path)), b_(std::move(b)) {
    Save();
  }

  Result<PoolBlock> Allocate() override { return b_->Allocate(); }
  Result<PoolBlock> AllocateRun(uint64_t max, uint64_t* count) override {
    return b_->AllocateRun(max, count);
  }
  void Unallocate(PoolBlock first, uint64_t count) override { b_->Unallocate(first, count); }
  void Free(PoolBlock b) override { b_->Free(b); }
  std::vector<PoolBlock> TakePendingFrees() override { return b_->TakePendingFrees(); }
  void Release(const std::vector<PoolBlock>& b) override { b_->Release(b); }
  Status Sync(uint64_t g) override {
    ++syncs_;
    if (fail_sync_at_ != 0 && syncs_ == fail_sync_at_) {
      return Status::IOError("injected bitmap sync failure");
    }
    THINFS_RETURN_IF_ERROR(b_->Sync(g));
    Save(/*header_durable=*/false);
    if (cut_metadata_after_sync_at_ != 0 && syncs_ == cut_metadata_after_sync_at_ &&
        after_sync_) {
      after_sync_();
    }
    return Status::Ok();
  }
  void MarkUsed(PoolBlock b) override { b_->MarkUsed(b); }
  void ClearAllForRebuild() override { b_->ClearAllForRebuild(); }
  bool was_clean() const override { return b_->was_clean(); }
  Status MarkDirty() override {
    THINFS_RETURN_IF_ERROR(b_->MarkDirty());
    Save();
    return Status::Ok();
  }
  Status MarkClean(uint64_t g) override {
    THINFS_RETURN_IF_ERROR(b_->MarkClean(g));
    Save();
    return Status::Ok();
  }
  Status Grow(uint64_t n) override { return b_->Grow(n); }
  bool IsAllocated(PoolBlock b) const override { return b_->IsAllocated(b); }
  uint64_t total_blocks() const override { return b_->total_blocks(); }
  uint64_t free_blocks() const override { return b_->free_blocks(); }

  void FailSyncAt(uint64_t n) { fail_sync_at_ = n == 0 ? 0 : syncs_ + n; }
  // Runs `fn` right after the n-th successful sync from now.
  void AfterSyncAt(uint64_t n, std::function<void()> fn) {
    cut_metadata_after_sync_at_ = syncs_ + n;
    after_sync_ = std::move(fn);
  }

  // The cut: the mapping goes away and the file is what was made durable,
  // under one of the headers that may have reached the disk. Returns true
  // when that header is older than the last Sync's.
  bool PowerCut(std::mt19937_64* rng) {
    b_.reset();
    std::error_code ec;
    std::filesystem::copy_file(path_ + ".durable", path_,
                               std::filesystem::copy_options::overwrite_existing, ec);
    EXPECT_FALSE(ec) << ec.message();
    if (headers_.size() < 2) return false;
    const size_t pick = (*rng)() % headers_.size();
    const std::vector<char>& h = headers_[pick];
    int fd = ::open(path_.c_str(), O_WRONLY);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::pwrite(fd, h.data(), h.size(), 0), static_cast<ssize_t>(h.size()));
    ::close(fd);
    return pick + 1 < headers_.size();
  }

 private:
  // Copies the file aside as durable. Its header counts as one of those a
  // cut may find; a durable one (MarkDirty, MarkClean) ends the choice.
  void Save(bool header_durable = true) {
    std::error_code ec;
    std::filesystem::copy_file(path_, path_ + ".durable",
                               std::filesystem::copy_options::overwrite_existing, ec);
    EXPECT_FALSE(ec) << ec.message();
    std::vector<char> header(meta::kBitmapHeaderSize);
    int fd = ::open(path_.c_str(), O_RDONLY);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::pread(fd, header.data(), header.size(), 0), static_cast<ssize_t>(header.size()));
    ::close(fd);
    if (header_durable) headers_.clear();
    headers_.push_back(std::move(header));
  }

  const std::string path_;
  std::unique_ptr<meta::BitmapSpaceMap> b_;
  uint64_t syncs_ = 0;
  uint64_t fail_sync_at_ = 0;
  uint64_t cut_metadata_after_sync_at_ = 0;
  std::function<void()> after_sync_;
  // Headers a cut may find, oldest first; the last is the file's own.
  std::vector<std::vector<char>> headers_;
};

// A pool in a temporary directory on the real stack above.
class PowerLossStack {
 public:
  PowerLossStack(uint64_t block_size, uint64_t blocks, uint64_t seed)
      : geometry_(block_size, blocks), rng_(seed), dir_(TmpfsOrTmp()), root_(dir_.path()) {
    // Durability is modelled by the layers, not the file system: tmpfs
    // (fsync is free there) when there is one.
    fs_ = meta::FaultInjectionFs::Create();
    store_options_.env_for_testing = fs_->env();
    Superblock sb;
    sb.block_size = block_size;
    sb.data_blocks = blocks;
    auto store = meta::RocksDbStore::Create(root_ + "/meta", sb, store_options_);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    auto bm = meta::BitmapSpaceMap::Create(root_ + "/bitmap", blocks, block_size);
    EXPECT_TRUE(bm.ok()) << bm.status().ToString();
    int fd = ::open((root_ + "/data").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(block_size * blocks)), 0);
    ::close(fd);
  }
  ~PowerLossStack() {
    if (pool) pool->AbandonForTesting();
    pool.reset();
    store_.reset();
    space_.reset();
    data_.reset();
    fs_.reset();
  }
  PowerLossStack(const PowerLossStack&) = delete;
  PowerLossStack& operator=(const PowerLossStack&) = delete;

  static PoolOptions Options() {
    PoolOptions o;
    o.commit_interval = std::chrono::milliseconds(0);
    o.background_gc = false;
    o.background_copies = false;  // every cut replays: no thread may write
    return o;
  }

  // Opens the parts (not the pool): the state a `thinfs check` after the
  // crash would see.
  void OpenParts() {
    auto store = meta::RocksDbStore::Open(root_ + "/meta", store_options_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    auto bm = meta::BitmapSpaceMap::Open(root_ + "/bitmap", geometry_.data_blocks(),
                                         geometry_.block_size(), /*read_only=*/false);
    ASSERT_TRUE(bm.ok()) << bm.status().ToString();
    // The bitmap's generation never runs ahead of the metadata by more
    // than the commit in flight (what OpenPoolFiles refuses otherwise).
    auto sb = store_->ReadSuperblock();
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    Status generation = meta::CheckBitmapGeneration(**bm, *sb, root_ + "/bitmap");
    ASSERT_TRUE(generation.ok()) << generation.ToString();
    space_ = std::make_unique<SnapshotSpaceMap>(root_ + "/bitmap", std::move(*bm));
    auto file = FileBlockDevice::Open(root_ + "/data", geometry_, false, false);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    data_ = std::make_unique<RollbackBlockDevice>(std::move(*file));
  }

  void OpenPool() {
    auto p = Pool::Open(std::make_unique<ForwardingBlockDevice>(data_.get()),
                        std::make_unique<ForwardingSpaceMap>(space_.get()),
                        std::make_unique<ForwardingMetadataStore>(store_.get()), Options());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pool = std::move(*p);
  }

  void Open() {
    OpenParts();
    if (::testing::Test::HasFatalFailure()) return;
    OpenPool();
  }

  // Power loss at this instant: nothing more reaches any file, the process
  // is gone, and every write not made durable is lost (torn: see above).
  // Leaves the parts closed; call Open() or OpenParts().
  int PowerCut(bool torn) {
    fs_->SetFilesystemActive(false);
    if (pool) pool->AbandonForTesting();
    pool.reset();
    store_.reset();
    int torn_blocks = data_->PowerCut(&rng_, torn);
    data_.reset();
    if (space_->PowerCut(&rng_)) ++lagging_header_cuts_;
    space_.reset();
    Status s = fs_->DropUnsyncedData();
    EXPECT_TRUE(s.ok()) << s.ToString();
    fs_->SetFilesystemActive(true);
    return torn_blocks;
  }

  // Switches the metadata file system off (every RocksDB write fails).
  void CutMetadataWrites() { fs_->SetFilesystemActive(false); }

  const Geometry& geometry() const { return geometry_; }
  RollbackBlockDevice* data() { return data_.get(); }
  SnapshotSpaceMap* space() { return space_.get(); }
  meta::RocksDbStore* store() { return store_.get(); }
  std::mt19937_64* rng() { return &rng_; }
  // Cuts that put back a bitmap header older than its last Sync's.
  uint64_t lagging_header_cuts() const { return lagging_header_cuts_; }

  std::unique_ptr<Pool> pool;

 private:
  const Geometry geometry_;
  std::mt19937_64 rng_;
  uint64_t lagging_header_cuts_ = 0;
  const TempDir dir_;  // removed after every member below has closed its files
  const std::string root_;
  std::unique_ptr<meta::FaultInjectionFs> fs_;
  meta::RocksDbOptions store_options_;
  std::unique_ptr<meta::RocksDbStore> store_;
  std::unique_ptr<SnapshotSpaceMap> space_;
  std::unique_ptr<RollbackBlockDevice> data_;
};

}  // namespace thinfs::testing

#endif  // THINFS_TESTS_UTIL_POWER_LOSS_STACK_H_
