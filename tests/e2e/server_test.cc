// The FUSE adapter (fs/server.h) mounted in-process over an in-memory pool:
// every operation of the mount through real syscalls, without the CLI or
// the on-disk formats. tests/e2e/fuse_test.cc covers the daemon end to end.

#include "fs/server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/aio_abi.h>
#include <linux/falloc.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/mem_block_device.h"
#include "core/mem_metadata.h"
#include "core/mem_space_map.h"
#include "core/pool.h"
#include "fs/mount.h"
#include "tests/util/e2e_util.h"

namespace thinfs::fs {
namespace {

using thinfs::testing::CommandResult;
using thinfs::testing::Pattern;
using thinfs::testing::RunCommand;
using thinfs::testing::ShellQuote;

constexpr uint64_t kBlockSize = 64 * 1024;

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = thinfs::testing::FuseUnavailableReason();
    if (!why.empty()) {
      if (thinfs::testing::InCi()) FAIL() << "FUSE is required under CI: " << why;
      GTEST_SKIP() << "FUSE unavailable: " << why;
    }
    if (thinfs::testing::FuseIoUringUnderTest()) {
      why = thinfs::testing::SetFuseIoUring(true);
      if (!why.empty()) {
        if (thinfs::testing::InCi()) FAIL() << "FUSE over io_uring is required: " << why;
        GTEST_SKIP() << "FUSE over io_uring unavailable: " << why;
      }
    }
    char tmpl[] = "/tmp/thinfs-server-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    mnt_ = dir_ + "/mnt";
    ASSERT_EQ(mkdir(mnt_.c_str(), 0755), 0);
  }

  void TearDown() override {
    if (serving_) {
      CommandResult r = RunCommand("fusermount3 -u " + ShellQuote(mnt_));
      if (r.exit_code != 0) {
        ADD_FAILURE() << "fusermount3 -u: " << r.output;
        RunCommand("fusermount3 -u -z " + ShellQuote(mnt_));
      }
      serve_thread_.join();
      EXPECT_TRUE(serve_status_.ok()) << serve_status_.ToString();
      serving_ = false;
      if (uring_mode_ == UringMode::kOn) {
        EXPECT_GT(counts_.uring.load(), uring_before_test_)
            << "the test's requests did not go through io_uring";
      }
    }
    if (pool_) {
      Status s = pool_->Close();
      EXPECT_TRUE(s.ok()) << s.ToString();
      pool_.reset();
    }
    if (!dir_.empty()) RunCommand("rm -rf " + ShellQuote(dir_));
  }

  // Builds a pool of `blocks` data blocks and mounts it on mnt_.
  void Mount(uint64_t blocks = 4096) {
    Geometry g(kBlockSize, blocks);
    Superblock sb;
    sb.block_size = kBlockSize;
    sb.data_blocks = blocks;
    PoolOptions options;
    options.commit_interval = std::chrono::milliseconds(0);
    std::unique_ptr<BlockDevice> device =
        make_device_ ? make_device_(g) : std::make_unique<MemBlockDevice>(g);
    Result<std::unique_ptr<Pool>> pool =
        Pool::Open(std::move(device), std::make_unique<MemSpaceMap>(blocks),
                   std::make_unique<MemMetadataStore>(sb), options);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(*pool);
    auto ready = std::make_shared<std::promise<void>>();
    std::future<void> ready_future = ready->get_future();
    serving_ = true;
    // Serve reports readiness once, or returns without it on failure.
    auto once = std::make_shared<std::once_flag>();
    auto signal = [ready, once] { std::call_once(*once, [&] { ready->set_value(); }); };
    serve_thread_ = std::thread([this, signal] {
      serve_status_ = Serve(pool_.get(), Config(), signal);
      signal();
    });
    ASSERT_EQ(ready_future.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    ASSERT_TRUE(serve_status_.ok()) << serve_status_.ToString();
    struct stat st {};
    ASSERT_EQ(stat(mnt_.c_str(), &st), 0) << strerror(errno);
    if (uring_mode_ == UringMode::kOn) {
      // The rings register just after INIT; the test runs once they serve.
      // statfs always reaches the daemon.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (counts_.uring.load() == 0) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no request through io_uring";
        struct statvfs sv {};
        statvfs(mnt_.c_str(), &sv);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      // Serve reports ready only once the kernel holds every ring thread's
      // entry (fs/uring.h, OnSettled), since a burst that comes before is
      // served by fewer threads: one entry per thread of every queue.
      if (check_ring_entries_) {
        FuseTransportInfo t = CurrentFuseTransport();
        EXPECT_EQ(t.ring_entries_registered, t.ring_entries);
        EXPECT_EQ(t.ring_entries, t.queues * t.threads_per_queue);
      }
      uring_before_test_ = counts_.uring.load();
    }
  }

  ServeConfig Config() const {
    ServeConfig config;
    config.fsname = "thinfs:test";
    config.mountpoint = mnt_;
    config.root_uid = getuid();
    config.root_gid = getgid();
    config.counts = &counts_;
    config.page_cache = page_cache_;
    config.io_uring = uring_mode_;
    config.uring_threads = uring_threads_;
    config.readahead_bytes = readahead_bytes_;
    return config;
  }

  std::string Path(const std::string& name) const { return mnt_ + "/" + name; }

  // Creates `name` of `size` bytes through truncate(1) in the mount.
  void MakeFile(const std::string& name, uint64_t size) {
    CommandResult r =
        RunCommand("truncate -s " + std::to_string(size) + " " + ShellQuote(Path(name)));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  void WriteAt(const std::string& name, uint64_t offset, const std::vector<char>& data) {
    Fd fd(open(Path(name).c_str(), O_WRONLY));
    ASSERT_GE(fd.get(), 0) << strerror(errno);
    ASSERT_EQ(pwrite(fd.get(), data.data(), data.size(), static_cast<off_t>(offset)),
              static_cast<ssize_t>(data.size()))
        << strerror(errno);
  }

  std::vector<char> ReadAt(const std::string& name, uint64_t offset, size_t size) {
    std::vector<char> out(size);
    Fd fd(open(Path(name).c_str(), O_RDONLY));
    EXPECT_GE(fd.get(), 0) << strerror(errno);
    ssize_t n = pread(fd.get(), out.data(), size, static_cast<off_t>(offset));
    EXPECT_GE(n, 0) << strerror(errno);
    out.resize(n < 0 ? 0 : static_cast<size_t>(n));
    return out;
  }

  struct stat Stat(const std::string& name) {
    struct stat st {};
    EXPECT_EQ(stat(Path(name).c_str(), &st), 0) << name << ": " << strerror(errno);
    return st;
  }

  uint64_t UsedBlocks() {
    struct statvfs st {};
    EXPECT_EQ(statvfs(mnt_.c_str(), &st), 0);
    return st.f_blocks - st.f_bfree;
  }

  std::string dir_, mnt_;
  // Builds the pool's data device (default: a MemBlockDevice).
  std::function<std::unique_ptr<BlockDevice>(const Geometry&)> make_device_;
  std::unique_ptr<Pool> pool_;
  std::thread serve_thread_;
  Status serve_status_;
  mutable RequestCounts counts_;  // Config() is const
  bool page_cache_ = true;  // ServeConfig::page_cache of the next Mount()
  uint32_t readahead_bytes_ = 0;  // ServeConfig::readahead_bytes of the next Mount()
  bool serving_ = false;
  uint64_t uring_before_test_ = 0;  // counts_.uring once the rings served
  // With io_uring, Mount() also checks that the kernel holds every ring
  // entry once Serve reported ready (fs/uring.h, entries_registered()).
  bool check_ring_entries_ = true;
  unsigned uring_threads_ = ServeConfig{}.uring_threads;  // of the next Mount()
  // ServeConfig::io_uring of the next Mount(); kOn: Mount() returns once a
  // request came through a ring, and TearDown checks that the test's did.
  UringMode uring_mode_ =
      thinfs::testing::FuseIoUringUnderTest() ? UringMode::kOn : UringMode::kAuto;
};

TEST_F(ServerTest, RootListsDevicesWithStableInodes) {
  Mount();
  ASSERT_TRUE(pool_->CreateDevice("alpha", 1 << 20).ok());
  ASSERT_TRUE(pool_->CreateDevice("beta", 2 << 20).ok());
  MakeFile("gamma", 3 << 20);
  CommandResult ls = RunCommand("ls -1 " + ShellQuote(mnt_));
  EXPECT_EQ(ls.output, "alpha\nbeta\ngamma\n");
  Result<DeviceInfo> alpha = pool_->GetDevice("alpha");
  ASSERT_TRUE(alpha.ok());
  struct stat st = Stat("alpha");
  EXPECT_EQ(st.st_ino, alpha->id.value + 1);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 1 << 20);
  EXPECT_EQ(st.st_blksize, static_cast<blksize_t>(kBlockSize));
  EXPECT_EQ(st.st_blocks, 0);
  EXPECT_EQ(Stat("gamma").st_size, 3 << 20);
  struct stat root {};
  ASSERT_EQ(stat(mnt_.c_str(), &root), 0);
  EXPECT_EQ(root.st_ino, 1u);
  EXPECT_EQ(root.st_mode & 07777, 0755u);
}

// A write(2) must cost one FUSE request. The kernel looks up
// security.capability before every write (file_remove_privs); answering that
// getxattr with ENOTSUP made it ask again each time, doubling the round trips
// of 4 KiB writes. ENOSYS makes it remember that there are no xattrs.
TEST_F(ServerTest, WritesCostOneRequestEach) {
  Mount();
  MakeFile("v", 64 * kBlockSize);
  Fd fd(open(Path("v").c_str(), O_WRONLY));
  ASSERT_GE(fd.get(), 0);
  std::vector<char> buf(4096, 'w');
  constexpr int kWrites = 200;
  const uint64_t writes_before = counts_.write.load();
  const uint64_t xattr_before = counts_.xattr.load();
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_EQ(pwrite(fd.get(), buf.data(), buf.size(), (i * 7919 % 1024) * 4096),
              static_cast<ssize_t>(buf.size()));
  }
  EXPECT_EQ(counts_.write.load() - writes_before, static_cast<uint64_t>(kWrites));
  EXPECT_LE(counts_.xattr.load() - xattr_before, 1u) << "xattr round trips per write";
  // User-visible behaviour stays: no xattrs, EOPNOTSUPP (== ENOTSUP).
  errno = 0;
  char value[16];
  EXPECT_EQ(getxattr(Path("v").c_str(), "user.x", value, sizeof value), -1);
  EXPECT_EQ(errno, ENOTSUP);
}

TEST_F(ServerTest, UnalignedAndCrossBlockWritesReadBack) {
  Mount();
  MakeFile("v", 4 * kBlockSize);
  const uint64_t seed = 11;
  // Unaligned, inside one block; spanning a block boundary; a whole block.
  struct Piece {
    uint64_t offset;
    size_t size;
  } pieces[] = {{100, 333}, {kBlockSize - 7, 20}, {2 * kBlockSize, kBlockSize}, {3 * kBlockSize + 1, kBlockSize - 1}};
  for (const Piece& p : pieces) WriteAt("v", p.offset, Pattern(seed, p.offset, p.size));
  for (const Piece& p : pieces) {
    EXPECT_EQ(ReadAt("v", p.offset, p.size), Pattern(seed, p.offset, p.size)) << p.offset;
  }
  // Untouched bytes read as zeros (no stale data).
  std::vector<char> gap = ReadAt("v", 433, 100);
  EXPECT_EQ(gap, std::vector<char>(100, 0));
  // Reads are short at the end.
  EXPECT_EQ(ReadAt("v", 4 * kBlockSize - 10, 100).size(), 10u);
}

TEST_F(ServerTest, WritePastEndGrowsLikeAFile) {
  Mount();
  MakeFile("v", 0);
  WriteAt("v", 3 * kBlockSize + 5, Pattern(2, 0, 1000));
  EXPECT_EQ(Stat("v").st_size, static_cast<off_t>(3 * kBlockSize + 1005));
  EXPECT_EQ(ReadAt("v", 3 * kBlockSize + 5, 1000), Pattern(2, 0, 1000));
  Result<DeviceInfo> info = pool_->GetDevice("v");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size, 3 * kBlockSize + 1005);
}

// A 4 KiB-aligned buffer, as O_DIRECT wants.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size) {
    void* raw = nullptr;
    if (posix_memalign(&raw, 4096, size) == 0) data_ = static_cast<char*>(raw);
  }
  // Holds a copy of `bytes`.
  explicit AlignedBuffer(const std::vector<char>& bytes) : AlignedBuffer(bytes.size()) {
    if (data_ != nullptr) memcpy(data_, bytes.data(), bytes.size());
  }
  ~AlignedBuffer() { free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data() const { return data_; }

 private:
  char* data_ = nullptr;
};

TEST_F(ServerTest, DirectIoOpenWorks) {
  Mount();
  MakeFile("v", 8 * kBlockSize);
  const size_t size = 3 * kBlockSize;
  std::vector<char> want = Pattern(5, 4096, size);
  AlignedBuffer buf(want);
  ASSERT_NE(buf.data(), nullptr);
  {
    Fd fd(open(Path("v").c_str(), O_RDWR | O_DIRECT));
    ASSERT_GE(fd.get(), 0) << strerror(errno);
    ASSERT_EQ(pwrite(fd.get(), buf.data(), size, 4096), static_cast<ssize_t>(size))
        << strerror(errno);
    memset(buf.data(), 0, size);
    ASSERT_EQ(pread(fd.get(), buf.data(), size, 4096), static_cast<ssize_t>(size));
    EXPECT_EQ(memcmp(buf.data(), want.data(), size), 0);
  }
  // A buffered reader sees what the direct writer wrote.
  EXPECT_EQ(ReadAt("v", 4096, size), want);
}

// The mount does not ask for FUSE_CAP_AUTO_INVAL_DATA (docs/fuse.md), so the
// kernel keeps a volume file's pages until the kernel or the daemon drops
// them: every change of a file's contents other than a buffered write must
// drop the pages it changes. A reader holding a cached open, with the whole
// file in its page cache, must see each change at once, not after the
// attribute timeout.
TEST_F(ServerTest, CachedReadersSeeEveryChangeAtOnce) {
  Mount();
  const uint64_t size = 8 * kBlockSize;
  MakeFile("v", size);
  MakeFile("src", size);
  std::vector<char> want = Pattern(1, 0, size);
  WriteAt("v", 0, want);
  WriteAt("src", 0, Pattern(2, 0, size));
  // Every open comes first: an open without FOPEN_KEEP_CACHE (a direct-I/O
  // one, or a cached one after a direct one) drops the inode's pages itself,
  // which would hide a change that failed to.
  Fd direct(open(Path("v").c_str(), O_WRONLY | O_DIRECT));
  ASSERT_GE(direct.get(), 0) << strerror(errno);
  Fd fd(open(Path("v").c_str(), O_RDWR));
  ASSERT_GE(fd.get(), 0) << strerror(errno);
  Fd src(open(Path("src").c_str(), O_RDONLY));
  ASSERT_GE(src.get(), 0) << strerror(errno);
  Fd reader(open(Path("v").c_str(), O_RDONLY));
  ASSERT_GE(reader.get(), 0) << strerror(errno);
  auto read_all = [&] {
    std::vector<char> got(size);
    EXPECT_EQ(pread(reader.get(), got.data(), size, 0), static_cast<ssize_t>(size))
        << strerror(errno);
    return got;
  };
  // Fills the reader's pages; a second read costs no request, so the pages
  // are really there to go stale.
  ASSERT_EQ(read_all(), want);
  uint64_t reads = counts_.read.load();
  ASSERT_EQ(read_all(), want);
  ASSERT_EQ(counts_.read.load(), reads) << "the reader's pages are not cached";
  auto overwrite = [&](uint64_t off, const std::vector<char>& data) {
    std::copy(data.begin(), data.end(), want.begin() + static_cast<ptrdiff_t>(off));
  };
  // Linux 6.6+ drops the pages of each change below itself, so there the
  // content checks alone would pass without the daemon's drop; the count
  // shows that the daemon dropped them too. On Debian 12's 6.1 (the CI's
  // guest, scripts/kernel-vm.sh) the O_DIRECT write's content check fails
  // without it as well.
  uint64_t drops = counts_.invalidations.load();
  auto dropped_once = [&] {
    uint64_t now = counts_.invalidations.load();
    bool once = now == drops + 1;
    drops = now;
    return once;
  };

  // An O_DIRECT write (answered FOPEN_DIRECT_IO).
  {
    std::vector<char> data = Pattern(3, 0, 2 * 4096);
    AlignedBuffer buf(data);
    ASSERT_NE(buf.data(), nullptr);
    ASSERT_EQ(pwrite(direct.get(), buf.data(), data.size(), kBlockSize + 4096),
              static_cast<ssize_t>(data.size()))
        << strerror(errno);
    overwrite(kBlockSize + 4096, data);
  }
  EXPECT_EQ(read_all(), want) << "after an O_DIRECT write";
  EXPECT_TRUE(dropped_once()) << "after an O_DIRECT write";
  // A punched hole, edges and whole blocks.
  ASSERT_EQ(fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 2 * kBlockSize - 100,
                      kBlockSize + 200),
            0)
      << strerror(errno);
  overwrite(2 * kBlockSize - 100, std::vector<char>(kBlockSize + 200, 0));
  EXPECT_EQ(read_all(), want) << "after PUNCH_HOLE";
  EXPECT_TRUE(dropped_once()) << "after PUNCH_HOLE";
  // Zeroed ranges.
  ASSERT_EQ(fallocate(fd.get(), FALLOC_FL_ZERO_RANGE, 4 * kBlockSize + 10, kBlockSize), 0)
      << strerror(errno);
  overwrite(4 * kBlockSize + 10, std::vector<char>(kBlockSize, 0));
  EXPECT_EQ(read_all(), want) << "after ZERO_RANGE";
  EXPECT_TRUE(dropped_once()) << "after ZERO_RANGE";
  // Blocks shared from another file, and the unaligned edges copied.
  loff_t off_in = 5 * kBlockSize + 7, off_out = 5 * kBlockSize + 7;
  ASSERT_EQ(copy_file_range(src.get(), &off_in, fd.get(), &off_out, 2 * kBlockSize, 0),
            static_cast<ssize_t>(2 * kBlockSize))
      << strerror(errno);
  overwrite(5 * kBlockSize + 7, Pattern(2, 5 * kBlockSize + 7, 2 * kBlockSize));
  EXPECT_EQ(read_all(), want) << "after copy_file_range";
  EXPECT_TRUE(dropped_once()) << "after copy_file_range";
  // A shrink and a grow back: the cut-off tail reads as zeroes.
  ASSERT_EQ(ftruncate(fd.get(), static_cast<off_t>(size - kBlockSize / 2)), 0) << strerror(errno);
  ASSERT_EQ(ftruncate(fd.get(), static_cast<off_t>(size)), 0) << strerror(errno);
  overwrite(size - kBlockSize / 2, std::vector<char>(kBlockSize / 2, 0));
  EXPECT_EQ(read_all(), want) << "after a shrink and a grow";
  EXPECT_EQ(counts_.invalidations.load(), drops) << "after a shrink and a grow: the kernel's own";
  // A write through a shared mapping of another open shares the pages.
  {
    void* map = mmap(nullptr, kBlockSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    ASSERT_NE(map, MAP_FAILED) << strerror(errno);
    std::vector<char> data = Pattern(4, 0, 100);
    memcpy(static_cast<char*>(map) + 50, data.data(), data.size());
    ASSERT_EQ(msync(map, kBlockSize, MS_SYNC), 0) << strerror(errno);
    munmap(map, kBlockSize);
    overwrite(50, data);
  }
  EXPECT_EQ(read_all(), want) << "after a write through a shared mapping";
  EXPECT_EQ(counts_.invalidations.load(), drops) << "after a write through a shared mapping: the kernel's own";
  // Changes the kernel cannot see (the engine's own API, as a control
  // command uses it) stay unseen until the daemon drops the pages: proof
  // that the reader really reads its cache, and that NotifyRangeChanged
  // drops the range it names, and NotifyInodeChanged all of it.
  Result<std::shared_ptr<Volume>> vol = pool_->OpenVolume("v");
  ASSERT_TRUE(vol.ok()) << vol.status().ToString();
  std::vector<char> behind = Pattern(5, 0, 4096);
  for (uint64_t at : {3 * kBlockSize, 6 * kBlockSize}) {
    Status s = (*vol)->Write(at, std::as_bytes(std::span(behind)));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(read_all(), want) << "the old bytes: the reader's pages are cached";
  overwrite(3 * kBlockSize, behind);
  NotifyRangeChanged((*vol)->id(), 3 * kBlockSize, 4096);
  EXPECT_EQ(read_all(), want) << "after NotifyRangeChanged of block 3's first page only";
  overwrite(6 * kBlockSize, behind);
  NotifyInodeChanged((*vol)->id());
  EXPECT_EQ(read_all(), want) << "after NotifyInodeChanged";
}

// A MemBlockDevice whose reads (or writes), once armed, wait at a gate
// until `want` of them are inside at once (then all pass) or a deadline
// passes; it records the most it saw inside together.
class GateBlockDevice final : public BlockDevice {
 public:
  enum class Op { kRead, kWrite };

  explicit GateBlockDevice(const Geometry& g) : mem_(g) {}

  void Arm(int want, std::chrono::seconds deadline, Op op = Op::kRead) {
    std::lock_guard<std::mutex> l(mu_);
    want_ = want;
    op_ = op;
    deadline_ = std::chrono::steady_clock::now() + deadline;
    open_ = false;
  }
  int max_inside() {
    std::lock_guard<std::mutex> l(mu_);
    return max_inside_;
  }
  // Lets everyone through now.
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }

  Status Read(PoolBlock block, uint64_t offset, std::span<std::byte> buf) override {
    Pass(Op::kRead);
    return mem_.Read(block, offset, buf);
  }
  Status Write(PoolBlock block, uint64_t offset, std::span<const std::byte> buf) override {
    Pass(Op::kWrite);
    return mem_.Write(block, offset, buf);
  }
  Status Sync() override { return mem_.Sync(); }
  Status Discard(PoolBlock block, uint64_t count) override { return mem_.Discard(block, count); }
  const Geometry& geometry() const override { return mem_.geometry(); }

 private:
  void Pass(Op op) {
    std::unique_lock<std::mutex> l(mu_);
    if (op != op_) return;
    ++inside_;
    max_inside_ = std::max(max_inside_, inside_);
    if (inside_ >= want_) open_ = true;
    cv_.notify_all();
    cv_.wait_until(l, deadline_, [this] { return open_; });
    open_ = true;  // past the deadline: let everyone through
    --inside_;
  }

  MemBlockDevice mem_;
  std::mutex mu_;
  std::condition_variable cv_;
  int inside_ = 0;
  int max_inside_ = 0;
  int want_ = 0;  // 0: not armed, everything passes
  Op op_ = Op::kRead;
  bool open_ = true;
  std::chrono::steady_clock::time_point deadline_;
};

// Mounts over a GateBlockDevice.
class GatedServerTest : public ServerTest {
 protected:
  void MountOverGate(GateBlockDevice** gate) {
    make_device_ = [gate](const Geometry& g) {
      auto d = std::make_unique<GateBlockDevice>(g);
      *gate = d.get();
      return d;
    };
    Mount();
    ASSERT_NE(*gate, nullptr);
  }

  // Mounts over the gate a file "v" of `writers` mapped blocks (so that each
  // write below is one overwrite in place), opens it with `open_flags`, and
  // has `writers` threads each write `size` bytes of Pattern(seed + i) at
  // i * kBlockSize + skew, with the gate armed for that many writes. Checks
  // every write and what each block reads back; *inside gets the most
  // writes the gate saw inside at once.
  void WriteFromThreadsAtOnce(int writers, int open_flags, size_t size, uint64_t skew, int seed,
                              int* inside) {
    GateBlockDevice* gate = nullptr;
    ASSERT_NO_FATAL_FAILURE(MountOverGate(&gate));
    MakeFile("v", writers * kBlockSize);
    WriteAt("v", 0, Pattern(1, 0, writers * kBlockSize));
    Fd fd(open(Path("v").c_str(), open_flags));
    ASSERT_GE(fd.get(), 0) << strerror(errno);
    std::vector<std::unique_ptr<AlignedBuffer>> bufs;
    for (int i = 0; i < writers; ++i) {
      bufs.push_back(std::make_unique<AlignedBuffer>(Pattern(seed + i, 0, size)));
      ASSERT_NE(bufs.back()->data(), nullptr);
    }
    // Generous: the gate opens as soon as all are in; the deadline only
    // bounds a failing run.
    gate->Arm(writers, std::chrono::seconds(5), GateBlockDevice::Op::kWrite);
    std::vector<ssize_t> written(writers, -1);
    std::vector<int> errors(writers, 0);
    std::vector<std::thread> threads;
    for (int i = 0; i < writers; ++i) {
      threads.emplace_back([&, i] {
        written[i] = pwrite(fd.get(), bufs[i]->data(), size,
                            static_cast<off_t>(i * kBlockSize + skew));
        errors[i] = errno;
      });
    }
    for (std::thread& t : threads) t.join();
    *inside = gate->max_inside();
    for (int i = 0; i < writers; ++i) {
      EXPECT_EQ(written[i], static_cast<ssize_t>(size))
          << "writer " << i << ": " << strerror(errors[i]);
      std::vector<char> want = Pattern(1, i * kBlockSize, kBlockSize);
      std::vector<char> data = Pattern(seed + i, 0, size);
      std::copy(data.begin(), data.end(), want.begin() + static_cast<ptrdiff_t>(skew));
      EXPECT_EQ(ReadAt("v", i * kBlockSize, kBlockSize), want) << "block " << i;
    }
  }
};

// A loop device with direct I/O (losetup --direct-io=on) keeps many
// asynchronous requests in flight; the daemon must serve them at once, not
// ten at a time (libfuse's default max_threads), and not one at a time
// behind a pool-wide lock. 32 concurrent O_DIRECT reads (Linux AIO, each its
// own FUSE request) must all reach the data device together.
TEST_F(GatedServerTest, ServesManyDirectIoRequestsAtOnce) {
  constexpr int kReads = 32;
  // The default thread limit serves a queue depth of 32 through /dev/fuse.
  // Over io_uring one caller's requests all go to its CPU's queue, whose
  // threads (uring_threads=N, default 16: lever 36) bound them: 32 here.
  ASSERT_GE(ServeConfig{}.max_threads, static_cast<unsigned>(kReads));
  uring_threads_ = kReads;
  GateBlockDevice* gate = nullptr;
  ASSERT_NO_FATAL_FAILURE(MountOverGate(&gate));
  MakeFile("v", kReads * kBlockSize);
  for (int i = 0; i < kReads; ++i) WriteAt("v", i * kBlockSize, Pattern(9, i * kBlockSize, 4096));

  Fd fd(open(Path("v").c_str(), O_RDONLY | O_DIRECT));
  ASSERT_GE(fd.get(), 0) << strerror(errno);
  aio_context_t ctx = 0;
  ASSERT_EQ(syscall(SYS_io_setup, kReads, &ctx), 0) << strerror(errno);
  std::unique_ptr<aio_context_t, void (*)(aio_context_t*)> ctx_guard(
      &ctx, [](aio_context_t* c) { syscall(SYS_io_destroy, *c); });
  AlignedBuffer bufs(kReads * 4096);
  ASSERT_NE(bufs.data(), nullptr);
  std::vector<iocb> cbs(kReads);
  std::vector<iocb*> ptrs(kReads);
  for (int i = 0; i < kReads; ++i) {
    cbs[i] = iocb{};
    cbs[i].aio_fildes = static_cast<uint32_t>(fd.get());
    cbs[i].aio_lio_opcode = IOCB_CMD_PREAD;
    cbs[i].aio_buf = reinterpret_cast<uint64_t>(bufs.data() + i * 4096);
    cbs[i].aio_nbytes = 4096;
    cbs[i].aio_offset = static_cast<int64_t>(i * kBlockSize);
    ptrs[i] = &cbs[i];
  }
  // Generous: the gate opens as soon as all are in; the deadline only
  // bounds a failing run.
  gate->Arm(kReads, std::chrono::seconds(10));
  ASSERT_EQ(syscall(SYS_io_submit, ctx, kReads, ptrs.data()), kReads) << strerror(errno);
  std::vector<io_event> events(kReads);
  int done = 0;
  while (done < kReads) {
    long n = syscall(SYS_io_getevents, ctx, 1, kReads - done, events.data() + done, nullptr);
    ASSERT_GT(n, 0) << strerror(errno);
    done += static_cast<int>(n);
  }
  for (const io_event& e : events) EXPECT_EQ(e.res, 4096);
  for (int i = 0; i < kReads; ++i) {
    std::vector<char> got(bufs.data() + i * 4096, bufs.data() + (i + 1) * 4096);
    EXPECT_EQ(got, Pattern(9, i * kBlockSize, 4096)) << "read " << i;
  }
  EXPECT_EQ(gate->max_inside(), kReads) << "direct-I/O reads served at once";
}

// Threads writing one volume file with O_DIRECT (qemu cache=none with
// aio=threads, fio --direct=1 --numjobs=4) must reach the daemon together.
// Unless the open's reply says FOPEN_PARALLEL_DIRECT_WRITES, the kernel
// holds the inode lock across each direct write's round trip and they take
// turns: the gate then sees one write at a time.
TEST_F(GatedServerTest, DirectWritesFromManyThreadsRunAtOnce) {
  constexpr int kWriters = 4;
  int inside = 0;
  ASSERT_NO_FATAL_FAILURE(WriteFromThreadsAtOnce(kWriters, O_RDWR | O_DIRECT, 4096,
                                                 /*skew=*/0, /*seed=*/20, &inside));
  EXPECT_EQ(inside, kWriters) << "direct writes to one file served at once";
}

// Now that direct writes to one file run in parallel, several of them land
// in the same 64 KiB block at once: while it is being provisioned, and after
// a snapshot while it is being copied on write. Four threads write
// interleaved 4 KiB pages of every block; nothing may be lost or zeroed, and
// the snapshot keeps the first round's bytes.
TEST_F(ServerTest, ParallelDirectWritesIntoTheSameBlocksLoseNothing) {
  constexpr int kWriters = 4;
  constexpr uint64_t kBlocks = 16;
  constexpr uint64_t kPage = 4096;
  constexpr uint64_t kPagesPerBlock = kBlockSize / kPage;
  const uint64_t size = kBlocks * kBlockSize;
  Mount();
  MakeFile("v", size);
  // Page p of the file belongs to writer p % kWriters, written with seed
  // round * 10 + writer.
  auto expected = [&](int round) {
    std::vector<char> out(size);
    for (uint64_t p = 0; p < size / kPage; ++p) {
      std::vector<char> page = Pattern(round * 10 + static_cast<int>(p % kWriters), p * kPage, kPage);
      memcpy(out.data() + p * kPage, page.data(), kPage);
    }
    return out;
  };
  auto write_round = [&](int round) {
    std::vector<std::thread> writers;
    std::atomic<int> ready{0};
    std::atomic<int> failures{0};
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        int fd = open(Path("v").c_str(), O_WRONLY | O_DIRECT);
        AlignedBuffer buf(kPage);
        if (fd < 0 || buf.data() == nullptr) {
          failures.fetch_add(1);
          if (fd >= 0) close(fd);
          return;
        }
        ready.fetch_add(1);
        while (ready.load() < kWriters) std::this_thread::yield();
        // Every writer goes through the blocks in the same order, so the
        // four writes into a block arrive together.
        for (uint64_t b = 0; b < kBlocks; ++b) {
          for (uint64_t j = 0; j < kPagesPerBlock / kWriters; ++j) {
            uint64_t p = b * kPagesPerBlock + j * kWriters + static_cast<uint64_t>(w);
            std::vector<char> page = Pattern(round * 10 + w, p * kPage, kPage);
            memcpy(buf.data(), page.data(), kPage);
            if (pwrite(fd, buf.data(), kPage, static_cast<off_t>(p * kPage)) !=
                static_cast<ssize_t>(kPage)) {
              failures.fetch_add(1);
            }
          }
        }
        close(fd);
      });
    }
    for (std::thread& t : writers) t.join();
    EXPECT_EQ(failures.load(), 0) << "round " << round;
  };

  write_round(1);
  EXPECT_EQ(ReadAt("v", 0, size), expected(1)) << "fresh blocks";
  EXPECT_EQ(UsedBlocks(), kBlocks);
  ASSERT_TRUE(pool_->CreateSnapshot("v", "s").ok());
  write_round(2);
  EXPECT_EQ(ReadAt("v", 0, size), expected(2)) << "copied on write";
  EXPECT_EQ(ReadAt("s", 0, size), expected(1)) << "the snapshot";
  EXPECT_EQ(UsedBlocks(), 2 * kBlocks);
  ASSERT_TRUE(pool_->Commit().ok());
  EXPECT_EQ(ReadAt("v", 0, size), expected(2)) << "after the commit";
}

// A direct write races a cached reader of the same pages: the write spans
// blocks 0 and 1 and waits at the gate inside block 0 while the reader
// fills its page of block 1 with the old bytes. Without AUTO_INVAL_DATA the
// daemon drops the pages a direct write changed once the write is in the
// pool (PagesChanged), and counts it. Linux before 6.6 (Debian 12 has 6.1)
// drops nothing itself, so there only the daemon keeps the reader right and
// the content check fails without it (shown in the CI's 6.1 guest,
// scripts/kernel-vm.sh); 6.6+ drops the pages before and after the write as
// well, so there the count is what fails if the daemon's drop goes missing.
// A write with no cached open of the device drops nothing at once; the next
// cached open keeps no pages instead.
TEST_F(GatedServerTest, DirectWriteDropsPagesAReaderFilledWhileItRan) {
  GateBlockDevice* gate = nullptr;
  ASSERT_NO_FATAL_FAILURE(MountOverGate(&gate));
  MakeFile("v", 2 * kBlockSize);
  WriteAt("v", 0, Pattern(1, 0, 2 * kBlockSize));
  Fd direct(open(Path("v").c_str(), O_WRONLY | O_DIRECT));
  ASSERT_GE(direct.get(), 0) << strerror(errno);
  const size_t size = 2 * 4096;
  const uint64_t at = kBlockSize - 4096;
  std::vector<char> new_bytes = Pattern(2, 0, size);
  AlignedBuffer buf(new_bytes);
  ASSERT_NE(buf.data(), nullptr);
  std::vector<char> got(4096);
  {
    Fd reader(open(Path("v").c_str(), O_RDONLY));
    ASSERT_GE(reader.get(), 0) << strerror(errno);
    // One write at a time never fills the gate: it waits for Release.
    gate->Arm(2, std::chrono::seconds(20), GateBlockDevice::Op::kWrite);
    ssize_t written = -1;
    std::thread writer([&] { written = pwrite(direct.get(), buf.data(), size, at); });
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (gate->max_inside() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(gate->max_inside(), 1) << "the write never reached the pool";
    uint64_t reads = counts_.read.load();
    EXPECT_EQ(pread(reader.get(), got.data(), 4096, kBlockSize), 4096);
    EXPECT_EQ(counts_.read.load(), reads + 1) << "block 1's page was cached";
    EXPECT_EQ(got, Pattern(1, kBlockSize, 4096)) << "block 1 was written early";
    uint64_t invalidations = counts_.invalidations.load();
    gate->Release();
    writer.join();
    ASSERT_EQ(written, static_cast<ssize_t>(size)) << strerror(errno);
    EXPECT_EQ(counts_.invalidations.load(), invalidations + 1);
    EXPECT_EQ(pread(reader.get(), got.data(), 4096, kBlockSize), 4096);
    EXPECT_EQ(got, Pattern(2, 4096, 4096)) << "the reader kept block 1's old bytes";
    // Its pages are cached again ...
    reads = counts_.read.load();
    EXPECT_EQ(pread(reader.get(), got.data(), 4096, kBlockSize), 4096);
    EXPECT_EQ(counts_.read.load(), reads);
  }
  // ... and outlive the last cached open. A direct write now drops nothing
  // (no cached open reads the pages), so the next open must not keep them.
  // The reader's RELEASE reaches the daemon after close(2) returned: wait
  // until only the direct handle is open there.
  auto released = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (counts_.open_files.load() != 1 && std::chrono::steady_clock::now() < released) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(counts_.open_files.load(), 1) << "the daemon never saw the reader's close";
  new_bytes = Pattern(3, 0, size);
  memcpy(buf.data(), new_bytes.data(), size);
  uint64_t invalidations = counts_.invalidations.load();
  ASSERT_EQ(pwrite(direct.get(), buf.data(), size, at), static_cast<ssize_t>(size));
  EXPECT_EQ(counts_.invalidations.load(), invalidations);
  EXPECT_EQ(ReadAt("v", at, size), new_bytes);
  EXPECT_EQ(ReadAt("v", 0, 4096), Pattern(1, 0, 4096));
}

// -o page_cache=off: every open is direct I/O, so plain (buffered) writes
// from several threads reach the daemon at once too, which with the page
// cache they cannot (the kernel holds the inode lock across a write-through).
TEST_F(GatedServerTest, PageCacheOffServesBufferedWritesAtOnce) {
  constexpr int kWriters = 4;
  page_cache_ = false;
  int inside = 0;
  ASSERT_NO_FATAL_FAILURE(WriteFromThreadsAtOnce(kWriters, O_RDWR, 100, /*skew=*/7,
                                                 /*seed=*/30, &inside));
  EXPECT_EQ(inside, kWriters) << "buffered writes to one file served at once";
}

// With the page cache off, unaligned I/O of any size works as before, every
// read is a request (nothing is cached in the kernel, so nothing can go
// stale), a shared mapping is refused (the kernel cannot keep one coherent
// without FUSE_DIRECT_IO_ALLOW_MMAP, which libfuse 3.14 cannot ask for) and
// a private one still reads the file.
TEST_F(ServerTest, PageCacheOffReadsEveryTimeAndRefusesSharedMappings) {
  page_cache_ = false;
  Mount();
  MakeFile("v", 4 * kBlockSize);
  WriteAt("v", 3, Pattern(2, 0, kBlockSize + 10));
  EXPECT_EQ(ReadAt("v", 3, kBlockSize + 10), Pattern(2, 0, kBlockSize + 10));
  Fd fd(open(Path("v").c_str(), O_RDWR));
  ASSERT_GE(fd.get(), 0) << strerror(errno);
  char buf[10];
  for (int i = 0; i < 3; ++i) {
    uint64_t before = counts_.read.load();
    ASSERT_EQ(pread(fd.get(), buf, sizeof(buf), 3), static_cast<ssize_t>(sizeof(buf)));
    EXPECT_EQ(counts_.read.load(), before + 1) << "read " << i << " was not a request";
    EXPECT_EQ(std::vector<char>(buf, buf + sizeof(buf)), Pattern(2, 0, sizeof(buf)));
  }
  errno = 0;
  void* shared = mmap(nullptr, kBlockSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  EXPECT_EQ(shared, MAP_FAILED);
  EXPECT_EQ(errno, ENODEV);
  if (shared != MAP_FAILED) munmap(shared, kBlockSize);
  void* priv = mmap(nullptr, kBlockSize, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  ASSERT_NE(priv, MAP_FAILED) << strerror(errno);
  EXPECT_EQ(std::vector<char>(static_cast<char*>(priv) + 3, static_cast<char*>(priv) + 13),
            Pattern(2, 0, 10));
  munmap(priv, kBlockSize);
}

// ServeConfig::readahead_bytes (mount option readahead=SIZE) sets the
// mount's readahead window, which sizes the read requests of a sequential
// reader. Each test mounts, writes kSize bytes, drops the file's pages,
// reads it back 64 KiB at a time and counts the read requests. Setting the
// window writes sysfs, which needs root.
class ReadaheadServerTest : public ServerTest {
 protected:
  static constexpr uint64_t kSize = 16 << 20;

  void SetUp() override {
    ServerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (geteuid() != 0) {
      if (thinfs::testing::InCi()) FAIL() << "CI runs as root";
      GTEST_SKIP() << "a mount's readahead window can only be set by root";
    }
  }

  // Read requests of a cold sequential read of the whole file, which must
  // read back what was written.
  uint64_t ColdSequentialReadRequests() {
    MakeFile("v", kSize);
    const std::vector<char> want = Pattern(11, 0, kSize);
    WriteAt("v", 0, want);
    Fd fd(open(Path("v").c_str(), O_RDONLY));
    EXPECT_GE(fd.get(), 0) << strerror(errno);
    // The write left its pages cached (clean: FUSE writes through).
    EXPECT_EQ(posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED), 0);
    const uint64_t before = counts_.read.load();
    std::vector<char> got(kSize);
    constexpr size_t kChunk = 64 * 1024;
    for (uint64_t off = 0; off < kSize; off += kChunk) {
      EXPECT_EQ(read(fd.get(), got.data() + off, kChunk), static_cast<ssize_t>(kChunk))
          << "at " << off << ": " << strerror(errno);
    }
    const uint64_t requests = counts_.read.load() - before;
    EXPECT_TRUE(got == want) << "the file read back differs from what was written";
    return requests;
  }
};

// 1 MiB: the kernel ramps its window up to 1 MiB requests, about 16 for
// 16 MiB and a few more while it ramps up.
TEST_F(ReadaheadServerTest, AMegabyteWindowReadsInMegabyteRequests) {
  readahead_bytes_ = 1 << 20;
  Mount();
  EXPECT_EQ(thinfs::testing::MountReadaheadKib(mnt_), 1024);
  const uint64_t requests = ColdSequentialReadRequests();
  EXPECT_GE(requests, kSize / (1 << 20));
  EXPECT_LE(requests, 40u);
}

// 0 leaves the kernel's 128 KiB: at least 128 requests for 16 MiB.
TEST_F(ReadaheadServerTest, NoWindowKeepsTheKernelsDefault) {
  readahead_bytes_ = 0;
  Mount();
  EXPECT_EQ(thinfs::testing::MountReadaheadKib(mnt_), 128);
  EXPECT_GE(ColdSequentialReadRequests(), kSize / (128 << 10));
}

TEST_F(ServerTest, SeekDataAndHoleFollowTheBlockMap) {
  Mount();
  MakeFile("v", 10 * kBlockSize);
  WriteAt("v", 2 * kBlockSize + 10, Pattern(3, 0, 100));
  WriteAt("v", 5 * kBlockSize, Pattern(3, 0, 2 * kBlockSize));
  Fd fd(open(Path("v").c_str(), O_RDONLY));
  ASSERT_GE(fd.get(), 0);
  EXPECT_EQ(lseek(fd.get(), 0, SEEK_DATA), static_cast<off_t>(2 * kBlockSize));
  EXPECT_EQ(lseek(fd.get(), 2 * kBlockSize + 50, SEEK_DATA),
            static_cast<off_t>(2 * kBlockSize + 50));
  EXPECT_EQ(lseek(fd.get(), 2 * kBlockSize, SEEK_HOLE), static_cast<off_t>(3 * kBlockSize));
  EXPECT_EQ(lseek(fd.get(), 3 * kBlockSize, SEEK_DATA), static_cast<off_t>(5 * kBlockSize));
  EXPECT_EQ(lseek(fd.get(), 5 * kBlockSize, SEEK_HOLE), static_cast<off_t>(7 * kBlockSize));
  EXPECT_EQ(lseek(fd.get(), 0, SEEK_HOLE), 0);
  errno = 0;
  EXPECT_EQ(lseek(fd.get(), 7 * kBlockSize, SEEK_DATA), -1);
  EXPECT_EQ(errno, ENXIO);
  errno = 0;
  EXPECT_EQ(lseek(fd.get(), 10 * kBlockSize, SEEK_HOLE), -1);
  EXPECT_EQ(errno, ENXIO);
}

TEST_F(ServerTest, StBlocksAndDuCountMappedBlocks) {
  Mount();
  MakeFile("v", 16 * kBlockSize);
  WriteAt("v", 0, Pattern(4, 0, 10));                   // 1 block
  WriteAt("v", 7 * kBlockSize, Pattern(4, 0, 2 * kBlockSize));  // 2 blocks
  struct stat st = Stat("v");
  EXPECT_EQ(st.st_blocks, static_cast<blkcnt_t>(3 * kBlockSize / 512));
  CommandResult du = RunCommand("du -B1 " + ShellQuote(Path("v")));
  ASSERT_EQ(du.exit_code, 0) << du.output;
  EXPECT_EQ(std::stoull(du.output), 3 * kBlockSize);
  CommandResult apparent = RunCommand("du -B1 --apparent-size " + ShellQuote(Path("v")));
  EXPECT_EQ(std::stoull(apparent.output), 16 * kBlockSize);
}

TEST_F(ServerTest, StatfsReportsThePool) {
  Mount(1000);
  struct statvfs st {};
  ASSERT_EQ(statvfs(mnt_.c_str(), &st), 0);
  EXPECT_EQ(st.f_frsize, kBlockSize);
  EXPECT_EQ(st.f_bsize, kBlockSize);
  EXPECT_EQ(st.f_blocks, 1000u);
  EXPECT_EQ(st.f_bfree, 1000u);
  EXPECT_EQ(st.f_bavail, 1000u);
  EXPECT_EQ(st.f_namemax, 128u);
  MakeFile("v", 10 * kBlockSize);
  WriteAt("v", 0, Pattern(6, 0, 4 * kBlockSize));
  ASSERT_EQ(statvfs(mnt_.c_str(), &st), 0);
  EXPECT_EQ(st.f_blocks - st.f_bfree, 4u);
  CommandResult df = RunCommand("df -B" + std::to_string(kBlockSize) + " --output=size,used " +
                                ShellQuote(mnt_) + " | tail -1");
  EXPECT_EQ(df.output.find("1000"), df.output.find_first_not_of(' ')) << df.output;
}

TEST_F(ServerTest, FallocatePunchZeroAndPreallocate) {
  Mount();
  MakeFile("v", 8 * kBlockSize);
  WriteAt("v", 0, Pattern(7, 0, 8 * kBlockSize));
  uint64_t used = UsedBlocks();
  ASSERT_EQ(used, 8u);
  Fd fd(open(Path("v").c_str(), O_RDWR));
  ASSERT_GE(fd.get(), 0);
  // Punch blocks 1-2 plus 100 bytes either side: whole blocks unmapped,
  // edges zeroed.
  ASSERT_EQ(fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kBlockSize - 100,
                      2 * kBlockSize + 200),
            0)
      << strerror(errno);
  // Freed blocks return to the pool once the change is committed.
  ASSERT_EQ(fsync(fd.get()), 0);
  EXPECT_EQ(UsedBlocks(), 6u);
  std::vector<char> got = ReadAt("v", kBlockSize - 100, 2 * kBlockSize + 200);
  EXPECT_EQ(got, std::vector<char>(2 * kBlockSize + 200, 0));
  EXPECT_EQ(ReadAt("v", kBlockSize - 101, 1), Pattern(7, kBlockSize - 101, 1));
  EXPECT_EQ(ReadAt("v", 3 * kBlockSize + 100, 1), Pattern(7, 3 * kBlockSize + 100, 1));
  // ZERO_RANGE over block 5 unmaps it.
  ASSERT_EQ(fallocate(fd.get(), FALLOC_FL_ZERO_RANGE, 5 * kBlockSize, kBlockSize), 0)
      << strerror(errno);
  EXPECT_EQ(ReadAt("v", 5 * kBlockSize, kBlockSize), std::vector<char>(kBlockSize, 0));
  ASSERT_EQ(fsync(fd.get()), 0);
  EXPECT_EQ(UsedBlocks(), 5u);
  // Plain fallocate past the end provisions and grows.
  ASSERT_EQ(fallocate(fd.get(), 0, 8 * kBlockSize, 2 * kBlockSize), 0) << strerror(errno);
  EXPECT_EQ(Stat("v").st_size, static_cast<off_t>(10 * kBlockSize));
  EXPECT_EQ(UsedBlocks(), 7u);
  // KEEP_SIZE preallocation does not grow.
  ASSERT_EQ(fallocate(fd.get(), FALLOC_FL_KEEP_SIZE, 10 * kBlockSize, kBlockSize), 0);
  EXPECT_EQ(Stat("v").st_size, static_cast<off_t>(10 * kBlockSize));
  // Anything else is refused.
  errno = 0;
  EXPECT_EQ(fallocate(fd.get(), FALLOC_FL_COLLAPSE_RANGE, 0, kBlockSize), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(ServerTest, CpReflinkAutoSharesBlocks) {
  Mount();
  const uint64_t size = 64 * kBlockSize;
  MakeFile("orig", size);
  WriteAt("orig", 0, Pattern(8, 0, size));
  uint64_t used = UsedBlocks();
  ASSERT_EQ(used, 64u);
  CommandResult cp = RunCommand("cp --reflink=auto --sparse=never " + ShellQuote(Path("orig")) +
                                " " + ShellQuote(Path("clone")));
  ASSERT_EQ(cp.exit_code, 0) << cp.output;
  EXPECT_EQ(UsedBlocks(), used) << "copy_file_range should share, not copy";
  EXPECT_EQ(Stat("clone").st_size, static_cast<off_t>(size));
  CommandResult cmp = RunCommand("cmp " + ShellQuote(Path("orig")) + " " + ShellQuote(Path("clone")));
  EXPECT_EQ(cmp.exit_code, 0) << cmp.output;
  // Writing the clone copies on write; the original keeps its bytes.
  WriteAt("clone", 10, Pattern(9, 0, 100));
  EXPECT_EQ(ReadAt("clone", 10, 100), Pattern(9, 0, 100));
  EXPECT_EQ(ReadAt("orig", 0, size), Pattern(8, 0, size));
  EXPECT_EQ(UsedBlocks(), used + 1);
}

TEST_F(ServerTest, CopyFileRangeUnalignedAndPastSourceEnd) {
  Mount();
  MakeFile("src", 4 * kBlockSize);
  WriteAt("src", 0, Pattern(10, 0, 4 * kBlockSize));
  MakeFile("dst", 0);
  Fd in(open(Path("src").c_str(), O_RDONLY));
  Fd out(open(Path("dst").c_str(), O_WRONLY));
  ASSERT_GE(in.get(), 0);
  ASSERT_GE(out.get(), 0);
  loff_t off_in = 1000, off_out = 77;
  // Asks for more than the source holds: clipped at its end.
  ssize_t n = copy_file_range(in.get(), &off_in, out.get(), &off_out, 10 * kBlockSize, 0);
  ASSERT_EQ(n, static_cast<ssize_t>(4 * kBlockSize - 1000)) << strerror(errno);
  EXPECT_EQ(Stat("dst").st_size, static_cast<off_t>(77 + 4 * kBlockSize - 1000));
  EXPECT_EQ(ReadAt("dst", 77, 4 * kBlockSize - 1000), Pattern(10, 1000, 4 * kBlockSize - 1000));
  EXPECT_EQ(ReadAt("dst", 0, 77), std::vector<char>(77, 0));
}

TEST_F(ServerTest, BadNamesAreRefused) {
  Mount();
  errno = 0;
  EXPECT_EQ(open(Path(".hidden").c_str(), O_CREAT | O_WRONLY, 0644), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(open(Path("bad name").c_str(), O_CREAT | O_WRONLY, 0644), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  std::string long_name(129, 'x');
  EXPECT_EQ(open(Path(long_name).c_str(), O_CREAT | O_WRONLY, 0644), -1);
  EXPECT_EQ(errno, ENAMETOOLONG);
  errno = 0;
  // A '/' makes a path into a missing directory: ENOENT from the lookup.
  EXPECT_EQ(open(Path("a/b").c_str(), O_CREAT | O_WRONLY, 0644), -1);
  EXPECT_NE(errno, 0);
  std::string ok_name(128, 'y');
  Fd fd(open(Path(ok_name).c_str(), O_CREAT | O_WRONLY, 0644));
  EXPECT_GE(fd.get(), 0) << strerror(errno);
}

TEST_F(ServerTest, DirectoriesLinksAndSpecialFilesArePermissionErrors) {
  Mount();
  MakeFile("v", kBlockSize);
  errno = 0;
  EXPECT_EQ(mkdir(Path("d").c_str(), 0755), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(symlink("v", Path("s").c_str()), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(link(Path("v").c_str(), Path("h").c_str()), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(mkfifo(Path("f").c_str(), 0644), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(setxattr(Path("v").c_str(), "user.x", "1", 1, 0), -1);
  EXPECT_EQ(errno, ENOTSUP);
}

// A direct write that fails part way (the pool fills between its two
// blocks) has still changed the first block: a cached reader must see what
// the pool holds, so the daemon drops the range after a failure too.
TEST_F(ServerTest, DirectWriteFailingPartWayDropsPagesToo) {
  Mount(4);
  MakeFile("fill", 3 * kBlockSize);
  WriteAt("fill", 0, Pattern(1, 0, 3 * kBlockSize));
  MakeFile("v", 2 * kBlockSize);  // two holes, one free block
  Fd direct(open(Path("v").c_str(), O_WRONLY | O_DIRECT));
  ASSERT_GE(direct.get(), 0) << strerror(errno);
  Fd reader(open(Path("v").c_str(), O_RDONLY));
  ASSERT_GE(reader.get(), 0) << strerror(errno);
  const size_t size = 2 * 4096;
  const uint64_t at = kBlockSize - 4096;
  std::vector<char> got(size);
  ASSERT_EQ(pread(reader.get(), got.data(), size, at), static_cast<ssize_t>(size));
  ASSERT_EQ(got, std::vector<char>(size, 0));
  std::vector<char> data = Pattern(2, 0, size);
  AlignedBuffer buf(data);
  ASSERT_NE(buf.data(), nullptr);
  uint64_t drops = counts_.invalidations.load();
  errno = 0;
  EXPECT_EQ(pwrite(direct.get(), buf.data(), size, at), -1);
  EXPECT_EQ(errno, ENOSPC);
  EXPECT_EQ(counts_.invalidations.load(), drops + 1) << "no drop after the failed write";
  // Block 0 took its half; block 1 found no space and stays a hole.
  std::vector<char> want(size, 0);
  std::copy(data.begin(), data.begin() + 4096, want.begin());
  ASSERT_EQ(pread(reader.get(), got.data(), size, at), static_cast<ssize_t>(size));
  EXPECT_EQ(got, want);
}

TEST_F(ServerTest, FullPoolGivesEnospcAndKeepsEarlierData) {
  Mount(16);
  MakeFile("v", 64 * kBlockSize);
  Fd fd(open(Path("v").c_str(), O_WRONLY));
  ASSERT_GE(fd.get(), 0);
  int failed_errno = 0;
  uint64_t written_blocks = 0;
  for (uint64_t b = 0; b < 64; ++b) {
    std::vector<char> data = Pattern(12, b * kBlockSize, kBlockSize);
    if (pwrite(fd.get(), data.data(), data.size(), static_cast<off_t>(b * kBlockSize)) < 0) {
      failed_errno = errno;
      break;
    }
    written_blocks++;
  }
  EXPECT_EQ(failed_errno, ENOSPC);
  EXPECT_EQ(written_blocks, 16u);
  EXPECT_EQ(ReadAt("v", 0, 16 * kBlockSize), Pattern(12, 0, 16 * kBlockSize));
  // Overwrites of mapped, unshared blocks still work when full.
  WriteAt("v", 0, Pattern(13, 0, kBlockSize));
  EXPECT_EQ(ReadAt("v", 0, kBlockSize), Pattern(13, 0, kBlockSize));
}

TEST_F(ServerTest, UnlinkWhileOpenKeepsWorkingUntilLastClose) {
  Mount();
  MakeFile("v", 4 * kBlockSize);
  WriteAt("v", 0, Pattern(14, 0, 2 * kBlockSize));
  uint64_t used = UsedBlocks();
  {
    Fd fd(open(Path("v").c_str(), O_RDWR));
    ASSERT_GE(fd.get(), 0);
    ASSERT_EQ(unlink(Path("v").c_str()), 0) << strerror(errno);
    EXPECT_NE(access(Path("v").c_str(), F_OK), 0);
    std::vector<char> more = Pattern(14, 2 * kBlockSize, kBlockSize);
    ASSERT_EQ(pwrite(fd.get(), more.data(), more.size(), 2 * kBlockSize),
              static_cast<ssize_t>(more.size()));
    std::vector<char> back(3 * kBlockSize);
    ASSERT_EQ(pread(fd.get(), back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    EXPECT_EQ(back, Pattern(14, 0, 3 * kBlockSize));
    // A new device may take the name meanwhile.
    MakeFile("v", kBlockSize);
  }
  // close(2) does not wait for FUSE's RELEASE: poll until the last close
  // has deleted the unlinked device and its 3 blocks are free again.
  EXPECT_EQ(used, 2u);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (UsedBlocks() != 0 && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(pool_->RunGcForTesting().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(UsedBlocks(), 0u);
  EXPECT_EQ(Stat("v").st_size, static_cast<off_t>(kBlockSize));
}

TEST_F(ServerTest, UnlinkAndRename) {
  Mount();
  MakeFile("a", kBlockSize);
  MakeFile("b", 2 * kBlockSize);
  ASSERT_EQ(rename(Path("a").c_str(), Path("c").c_str()), 0) << strerror(errno);
  EXPECT_EQ(Stat("c").st_size, static_cast<off_t>(kBlockSize));
  EXPECT_TRUE(pool_->GetDevice("c").ok());
  // rename(2) replaces an existing target.
  ASSERT_EQ(rename(Path("c").c_str(), Path("b").c_str()), 0) << strerror(errno);
  EXPECT_EQ(Stat("b").st_size, static_cast<off_t>(kBlockSize));
  MakeFile("d", kBlockSize);
  EXPECT_EQ(renameat2(AT_FDCWD, Path("d").c_str(), AT_FDCWD, Path("b").c_str(), RENAME_NOREPLACE),
            -1);
  EXPECT_EQ(errno, EEXIST);
  EXPECT_EQ(renameat2(AT_FDCWD, Path("d").c_str(), AT_FDCWD, Path("b").c_str(), RENAME_EXCHANGE),
            -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(unlink(Path("b").c_str()), 0);
  EXPECT_FALSE(pool_->GetDevice("b").ok());
  errno = 0;
  EXPECT_EQ(unlink(Path("b").c_str()), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(ServerTest, ModeOwnerAndTimesAreStored) {
  Mount();
  MakeFile("v", kBlockSize);
  ASSERT_EQ(chmod(Path("v").c_str(), 0600), 0);
  ASSERT_EQ(chown(Path("v").c_str(), 1234, 5678), 0) << strerror(errno);
  timespec times[2] = {{1000, 5}, {2000, 7}};
  ASSERT_EQ(utimensat(AT_FDCWD, Path("v").c_str(), times, 0), 0);
  Result<DeviceInfo> info = pool_->GetDevice("v");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->mode & 07777, 0600u);
  EXPECT_EQ(info->uid, 1234u);
  EXPECT_EQ(info->gid, 5678u);
  EXPECT_EQ(info->mtime_ns, 2000'000'000'007);
  struct stat st = Stat("v");
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_mtim.tv_sec, 2000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 7);
  // Truncate resizes the device.
  ASSERT_EQ(truncate(Path("v").c_str(), 5 * kBlockSize), 0);
  EXPECT_EQ(pool_->GetDevice("v")->size, 5 * kBlockSize);
}

TEST_F(ServerTest, FsyncCommitsThePool) {
  Mount();
  MakeFile("v", kBlockSize);
  uint64_t before = pool_->Stats().transaction_id;
  Fd fd(open(Path("v").c_str(), O_WRONLY));
  ASSERT_GE(fd.get(), 0);
  std::vector<char> data = Pattern(15, 0, 100);
  ASSERT_EQ(pwrite(fd.get(), data.data(), data.size(), 0), 100);
  ASSERT_EQ(fsync(fd.get()), 0);
  EXPECT_GT(pool_->Stats().transaction_id, before);
}

// FUSE over io_uring (fs/uring.h), whatever THINFS_TEST_FUSE_IO_URING says:
// the kernel's knob on, the mount asks for the rings, Mount() returns once
// they serve and TearDown checks that the test's requests went through them.
class UringServerTest : public ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    std::string why = thinfs::testing::SetFuseIoUring(true);
    if (!why.empty()) {
      if (thinfs::testing::InCi()) FAIL() << "FUSE over io_uring is required under CI: " << why;
      GTEST_SKIP() << "FUSE over io_uring unavailable: " << why;
    }
    uring_mode_ = UringMode::kOn;
  }
  void TearDown() override {
    ServerTest::TearDown();
    UringTransport::SetRegisterDelayForTesting(std::chrono::milliseconds(0));
    UringTransport::SetInitHookForTesting(nullptr);
  }

  // Holds back every ring thread but each queue's pinned one by `delay`
  // before it registers (UringTransport::SetRegisterDelayForTesting), for
  // the test's Mount(), which then leaves the ring entries to the test.
  void DelayRegistration(std::chrono::milliseconds delay) {
    UringTransport::SetRegisterDelayForTesting(delay);
    check_ring_entries_ = false;
  }

  // Mounts with io_uring=auto and `hook` as the transport's INIT hook (it
  // turns the kernel's knob on or off), writes and reads back a block, and
  // checks that the mount was ready within kSettleTimeout and that every
  // request went through /dev/fuse. Returns what the daemon logged.
  std::string MountThroughDevFuseWith(std::function<void(UringTransport::InitStage)> hook) {
    uring_mode_ = UringMode::kAuto;  // Mount() must not wait for a ring request
    check_ring_entries_ = false;
    UringTransport::SetInitHookForTesting(std::move(hook));
    ::testing::internal::CaptureStderr();
    const auto mounted = std::chrono::steady_clock::now();
    Mount();
    const auto ready = std::chrono::steady_clock::now();
    MakeFile("v", kBlockSize);
    std::vector<char> data = thinfs::testing::Pattern(3, 0, 4096);
    WriteAt("v", 4096, data);
    EXPECT_EQ(ReadAt("v", 4096, 4096), data);
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_LT(ready - mounted, UringTransport::kSettleTimeout) << log;
    EXPECT_FALSE(CurrentFuseTransport().io_uring);
    EXPECT_EQ(counts_.uring.load(), 0u);
    return log;
  }

  // For an INIT hook: the knob off just before the reply that asks for the
  // rings is written and back on just after, so that the kernel reads the
  // reply with the knob off (no io_uring for the connection) and the
  // daemon's look after the reply finds it on (entries offered).
  static void KnobOffWhileTheKernelReadsTheReply(UringTransport::InitStage stage) {
    if (stage == UringTransport::InitStage::kReplyAsksForRings) {
      EXPECT_EQ(thinfs::testing::SetFuseIoUring(false), "");
    } else if (stage == UringTransport::InitStage::kReplyWritten) {
      EXPECT_EQ(thinfs::testing::SetFuseIoUring(true), "");
    }
  }

  // MountThroughDevFuseWith the knob turned off at `stage`; checks that the
  // daemon logged "FUSE requests through /dev/fuse (`why`)" and made no
  // ring entry.
  void ExpectNoRingsWithTheKnobOffAt(UringTransport::InitStage stage, const std::string& why) {
    const std::string log = MountThroughDevFuseWith([stage](UringTransport::InitStage now) {
      if (now == stage) {
        EXPECT_EQ(thinfs::testing::SetFuseIoUring(false), "");
      }
    });
    EXPECT_NE(log.find("FUSE requests through /dev/fuse (" + why + ")"), std::string::npos) << log;
    EXPECT_EQ(log.find("ring entr"), std::string::npos) << log;  // none made
  }
};

// Ring threads that register late (a loaded machine): Serve reports the
// mount ready only once the kernel holds every entry (the daemon's count
// of them, fs/uring.h), since a burst that comes before is served by
// fewer threads (the CI failure of 2026-12-07, docs/fuse.md).
TEST_F(UringServerTest, TheMountIsReadyOnceEveryRingEntryIsRegistered) {
  constexpr auto kDelay = std::chrono::seconds(2);
  static_assert(kDelay < UringTransport::kSettleTimeout);
  DelayRegistration(kDelay);
  const auto mounted = std::chrono::steady_clock::now();
  Mount();  // returns once Serve reports ready
  const auto ready = std::chrono::steady_clock::now();
  FuseTransportInfo t = CurrentFuseTransport();
  ASSERT_TRUE(t.io_uring);
  EXPECT_EQ(t.ring_entries, t.queues * t.threads_per_queue);
  EXPECT_EQ(t.ring_entries_registered, t.ring_entries);
  EXPECT_GE(ready - mounted, kDelay);
  EXPECT_LT(ready - mounted, UringTransport::kSettleTimeout);
  MakeFile("v", kBlockSize);
  EXPECT_EQ(ReadAt("v", 0, 4096), std::vector<char>(4096, 0));
}

// An entry that does not register within kSettleTimeout does not hold the
// mount back for good: it is reported ready, served by the entries in,
// and the count says how many those are.
TEST_F(UringServerTest, EntriesThatNeverRegisterDoNotHoldTheMountBack) {
  constexpr auto kDelay = UringTransport::kSettleTimeout + std::chrono::seconds(2);
  DelayRegistration(kDelay);
  const auto mounted = std::chrono::steady_clock::now();
  Mount();
  const auto ready = std::chrono::steady_clock::now();
  EXPECT_GE(ready - mounted, UringTransport::kSettleTimeout);
  ASSERT_LT(ready - mounted, kDelay) << "too slow to see it";
  FuseTransportInfo t = CurrentFuseTransport();
  ASSERT_TRUE(t.io_uring);
  // Only each queue's pinned thread has registered.
  EXPECT_EQ(t.ring_entries_registered, t.queues);
  EXPECT_LT(t.ring_entries_registered, t.ring_entries);
  MakeFile("v", kBlockSize);
  EXPECT_EQ(ReadAt("v", 0, 4096), std::vector<char>(4096, 0));
}

// The kernel's knob off while the kernel reads our INIT reply asking for
// the rings: the connection gets no io_uring. A test that puts the knob
// back while another mounts does this (the fresh-clone failure of
// 2026-12-07: every registration failed with EOPNOTSUPP, the mount waited
// kSettleTimeout for entries that could never register, and a test
// unmounted it first). The daemon sees the knob off once the reply is
// written and offers no entry: the mount is ready at once, through
// /dev/fuse.
TEST_F(UringServerTest, AKnobOffWhileTheKernelReadsTheReplyIsHeeded) {
  ExpectNoRingsWithTheKnobOffAt(
      UringTransport::InitStage::kReplyAsksForRings,
      "the kernel's knob enable_uring went off while the kernel read our INIT reply");
}

// The same with the knob back on when the reply is written and off again
// when the ring threads register (three flips in a mount's first
// milliseconds): every registration fails with EOPNOTSUPP. The mount does
// not wait for the entries: it is ready at once, through /dev/fuse.
TEST_F(UringServerTest, EntriesTheKernelRefusesDoNotHoldTheMountBack) {
  const std::string log = MountThroughDevFuseWith([](UringTransport::InitStage stage) {
    KnobOffWhileTheKernelReadsTheReply(stage);
    if (stage == UringTransport::InitStage::kRegistering) {
      EXPECT_EQ(thinfs::testing::SetFuseIoUring(false), "");
    }
  });
  // The rings were asked for and refused, every one of them.
  EXPECT_NE(log.find("FUSE over io_uring: the kernel refused a ring entry of this mount: " +
                     std::string(strerror(EOPNOTSUPP))),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(" ring entries; requests go through /dev/fuse"), std::string::npos) << log;
}

// The knob turned off after the kernel offered the rings and before our
// reply is built: the reply does not ask for them.
TEST_F(UringServerTest, AKnobTurnedOffAfterTheOfferIsHeeded) {
  ExpectNoRingsWithTheKnobOffAt(UringTransport::InitStage::kInitRead,
                                "the kernel's knob enable_uring went off after its offer");
}

// The hazard the two tests above leave (docs/fuse.md, "The knob changing
// under a mount"): the knob off while the kernel reads the INIT reply (no
// io_uring for the connection) and back on when the daemon looks after it.
// Linux 6.18 then takes the ring entries and routes requests to them, and
// refuses their replies once the knob is off again. The daemon commits a
// refused reply again until the knob is back on: the request waits, logged,
// and completes then; without that it would wait for good. Later kernels
// refuse such entries at once, and requests go through /dev/fuse.
TEST_F(UringServerTest, ARefusedReplyIsCommittedAgainOnceTheKnobIsBack) {
  uring_mode_ = UringMode::kAuto;
  check_ring_entries_ = false;
  UringTransport::SetInitHookForTesting(KnobOffWhileTheKernelReadsTheReply);
  ::testing::internal::CaptureStderr();
  Mount();
  MakeFile("v", kBlockSize);
  std::vector<char> data = thinfs::testing::Pattern(5, 0, 4096);
  WriteAt("v", 0, data);
  if (counts_.uring.load() == 0) {
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("ring entries; requests go through /dev/fuse"), std::string::npos) << log;
    GTEST_SKIP() << "this kernel refuses ring entries on a connection without io_uring, so the "
                    "hazard cannot arise here";
  }
  const uint64_t uring_before = counts_.uring.load();
  const dev_t connection = Stat("v").st_dev;  // while the daemon can still reply

  // A read whose reply the kernel refuses: it waits while the knob is off.
  // (Opened first: the open would wait too.)
  Fd fd(open(Path("v").c_str(), O_RDONLY | O_DIRECT));
  ASSERT_GE(fd.get(), 0) << strerror(errno);
  ASSERT_EQ(thinfs::testing::SetFuseIoUring(false), "");
  char* buf = nullptr;
  ASSERT_EQ(posix_memalign(reinterpret_cast<void**>(&buf), 4096, 4096), 0);
  std::unique_ptr<char, decltype(&std::free)> owner(buf, &std::free);
  auto read = std::async(std::launch::async, [&] { return pread(fd.get(), buf, 4096, 0); });
  const bool waited = read.wait_for(std::chrono::seconds(1)) == std::future_status::timeout;
  // Back on: the next commit goes through.
  ASSERT_EQ(thinfs::testing::SetFuseIoUring(true), "");
  const bool completed = read.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!completed) {
    // Aborts the connection, which ends the read (ENOTCONN) before the
    // future's destructor waits for it.
    // (fusectl, mounted here if it is not: a test unmounts it only if it
    // mounted it.)
    const bool had_fusectl = RunCommand("mountpoint -q /sys/fs/fuse/connections").exit_code == 0;
    if (!had_fusectl) RunCommand("mount -t fusectl none /sys/fs/fuse/connections");
    RunCommand("echo 1 > /sys/fs/fuse/connections/" + std::to_string(minor(connection)) + "/abort");
    if (!had_fusectl) RunCommand("umount /sys/fs/fuse/connections");
    const std::string log = ::testing::internal::GetCapturedStderr();
    FAIL() << "the read never completed once the knob was back on\n" << log;
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(waited) << "the read did not wait for the knob: " << log;
  ASSERT_EQ(read.get(), 4096) << log;
  EXPECT_EQ(std::vector<char>(buf, buf + 4096), data);
  EXPECT_GT(counts_.uring.load(), uring_before);
  EXPECT_NE(log.find("the kernel refused our reply (" + std::string(strerror(EOPNOTSUPP)) + ")"),
            std::string::npos)
      << log;
}

// Requests of every shape a ring carries: 1 MiB direct writes and reads
// (max_write, a ring entry's whole payload buffer), unaligned buffered ones
// across blocks, names in the payload (create, rename, unlink), and error
// replies.
TEST_F(UringServerTest, EveryKindOfRequestRoundTripsThroughTheRings) {
  Mount();
  const uint64_t before = counts_.uring.load();
  constexpr size_t kMiB = 1 << 20;
  MakeFile("v", 16 * kMiB);
  std::vector<char> data = thinfs::testing::Pattern(7, 0, 8 * kMiB);
  {
    Fd fd(open(Path("v").c_str(), O_RDWR | O_DIRECT));
    ASSERT_GE(fd.get(), 0) << strerror(errno);
    AlignedBuffer buf(kMiB);
    ASSERT_NE(buf.data(), nullptr);
    for (size_t off = 0; off < data.size(); off += kMiB) {
      memcpy(buf.data(), data.data() + off, kMiB);
      ASSERT_EQ(pwrite(fd.get(), buf.data(), kMiB, static_cast<off_t>(off)),
                static_cast<ssize_t>(kMiB))
          << strerror(errno);
    }
    for (size_t off = 0; off < data.size(); off += kMiB) {
      memset(buf.data(), 0, kMiB);
      ASSERT_EQ(pread(fd.get(), buf.data(), kMiB, static_cast<off_t>(off)),
                static_cast<ssize_t>(kMiB))
          << strerror(errno);
      ASSERT_EQ(memcmp(buf.data(), data.data() + off, kMiB), 0) << "at " << off;
    }
  }
  std::vector<char> odd = thinfs::testing::Pattern(9, 0, 3 * kBlockSize + 17);
  WriteAt("v", 5 * kBlockSize - 5, odd);
  EXPECT_EQ(ReadAt("v", 5 * kBlockSize - 5, odd.size()), odd);

  {
    Fd created(open(Path("a-new-name").c_str(), O_CREAT | O_WRONLY, 0640));
    ASSERT_GE(created.get(), 0) << strerror(errno);
  }
  ASSERT_EQ(rename(Path("a-new-name").c_str(), Path("renamed").c_str()), 0) << strerror(errno);
  EXPECT_EQ(Stat("renamed").st_mode & 07777, 0640u);
  ASSERT_EQ(unlink(Path("renamed").c_str()), 0) << strerror(errno);
  struct stat st {};
  errno = 0;
  EXPECT_EQ(stat(Path("renamed").c_str(), &st), -1);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(RunCommand("ls -1 " + ShellQuote(mnt_)).output, "v\n");
  // 16 direct requests alone; the rest (lookups, getattrs, ...) vary.
  EXPECT_GE(counts_.uring.load() - before, 16u);
}

// Clients on every CPU at once, several per CPU: every queue and several
// ring threads of each serve, and each caller gets its own reply (each
// thread checks at once what it wrote, in a region of its own).
TEST_F(UringServerTest, ConcurrentClientsOnEveryCpuGetTheirOwnReplies) {
  Mount();
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  constexpr unsigned kPerCpu = 3;
  constexpr int kRounds = 300;
  constexpr size_t kIo = 4096;
  const unsigned clients = cpus * kPerCpu;
  MakeFile("v", clients * 2 * kBlockSize);
  const uint64_t before = counts_.uring.load();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (unsigned c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(c % cpus, &set);
      sched_setaffinity(0, sizeof set, &set);  // best effort: a cpuset may forbid it
      Fd fd(open(Path("v").c_str(), O_RDWR | O_DIRECT));
      AlignedBuffer out(kIo), in(kIo);
      if (fd.get() < 0 || out.data() == nullptr || in.data() == nullptr) {
        failures.fetch_add(1);
        return;
      }
      const uint64_t region = c * 2 * kBlockSize;
      for (int r = 0; r < kRounds; ++r) {
        uint64_t off = region + (static_cast<uint64_t>(r) * 7 % 32) * kIo;
        thinfs::testing::FillPattern(c * 1000 + r, off, out.data(), kIo);
        if (pwrite(fd.get(), out.data(), kIo, static_cast<off_t>(off)) !=
                static_cast<ssize_t>(kIo) ||
            pread(fd.get(), in.data(), kIo, static_cast<off_t>(off)) !=
                static_cast<ssize_t>(kIo) ||
            memcmp(in.data(), out.data(), kIo) != 0) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(counts_.uring.load() - before, 2u * clients * kRounds);
}

// io_uring=off leaves libfuse's I/O alone: with the kernel offering the
// rings, no request comes through one.
TEST_F(UringServerTest, OffServesEverythingThroughDevFuse) {
  uring_mode_ = UringMode::kOff;
  Mount();
  MakeFile("v", 4 * kBlockSize);
  std::vector<char> data = thinfs::testing::Pattern(3, 0, kBlockSize + 100);
  WriteAt("v", 10, data);
  EXPECT_EQ(ReadAt("v", 10, data.size()), data);
  EXPECT_GT(counts_.write.load(), 0u);
  EXPECT_EQ(counts_.uring.load(), 0u);
}

}  // namespace
}  // namespace thinfs::fs
