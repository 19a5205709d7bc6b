#include "meta/pool_dir.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "meta/bitmap_space_map.h"
#include "tests/util/pool_test_util.h"

namespace thinfs::meta {
namespace {

using thinfs::testing::FlipByteOrDie;
using thinfs::testing::kBitmapHeaderFlipOffsetForTesting;
using thinfs::testing::ReadFileOrDie;
using thinfs::testing::TempDir;
using thinfs::testing::TreeDigest;
using thinfs::testing::WriteFileOrDie;

constexpr uint64_t kMiB = 1 << 20;

bool PathExists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

FormatOptions Opts(uint64_t size, uint64_t block_size = kDefaultBlockSize) {
  FormatOptions o;
  o.size = size;
  o.block_size = block_size;
  return o;
}

TEST(PoolPathsTest, LaysOutThePool) {
  PoolPaths p = PoolPaths::For("/srv/pool//");
  EXPECT_EQ(p.root, "/srv/pool");
  EXPECT_EQ(p.data, "/srv/pool/data");
  EXPECT_EQ(p.meta, "/srv/pool/meta");
  EXPECT_EQ(p.bitmap, "/srv/pool/bitmap");
  EXPECT_EQ(p.lock, "/srv/pool/lock");
  EXPECT_EQ(p.control_socket, "/srv/pool/control.sock");
}

TEST(PoolDirTest, FormatThenOpen) {
  TempDir tmp;
  const std::string root = tmp.Sub("pool");
  ASSERT_TRUE(FormatPool(root, Opts(64 * kMiB)).ok());

  struct stat st;
  ASSERT_EQ(::stat((root + "/data").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 64 * kMiB);
  EXPECT_EQ(st.st_blocks, 0) << "the data file must start sparse";
  EXPECT_TRUE(LooksLikePool(root));

  Result<PoolFiles> f = OpenPoolFiles(root, OpenOptions());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const Superblock& sb = f->superblock;
  EXPECT_EQ(sb.magic, kSuperblockMagic);
  EXPECT_EQ(sb.format_version, kFormatVersion);
  EXPECT_EQ(sb.block_size, kDefaultBlockSize);
  EXPECT_EQ(sb.data_blocks, 64 * kMiB / kDefaultBlockSize);
  EXPECT_EQ(sb.transaction_id, 0u);
  EXPECT_EQ(sb.next_device_id, 1u);
  EXPECT_GT(sb.created_ns, 0);
  EXPECT_EQ(sb.uuid[6] >> 4, 4) << "RFC 4122 version 4";
  EXPECT_EQ(sb.uuid[8] >> 6, 2) << "RFC 4122 variant";
  EXPECT_EQ(f->bitmap->total_blocks(), sb.data_blocks);
  EXPECT_EQ(f->bitmap->free_blocks(), sb.data_blocks);
  EXPECT_TRUE(f->bitmap->was_clean());
  EXPECT_EQ(f->data->geometry().data_blocks(), sb.data_blocks);
  EXPECT_TRUE(f->data->geometry().fast_path());
  Result<std::vector<DeviceRecord>> devices = f->store->LoadDevices();
  ASSERT_TRUE(devices.ok());
  EXPECT_TRUE(devices->empty());
  EXPECT_EQ(ReadFileOrDie(root + "/lock"), std::to_string(::getpid()) + "\n");
}

TEST(PoolDirTest, NonPowerOfTwoBlockSizeRoundsDownToWholeBlocks) {
  TempDir tmp;
  const std::string root = tmp.Sub("pool");
  ASSERT_TRUE(FormatPool(root, Opts(10 * kMiB + 5000, 12 * 1024)).ok());
  Result<PoolFiles> f = OpenPoolFiles(root, OpenOptions());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->superblock.block_size, 12u * 1024);
  EXPECT_EQ(f->superblock.data_blocks, (10 * kMiB + 5000) / (12 * 1024));
  EXPECT_FALSE(f->data->geometry().fast_path());
  struct stat st;
  ASSERT_EQ(::stat((root + "/data").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), f->superblock.data_blocks * 12 * 1024);
}

TEST(PoolDirTest, FormatsIntoAnExistingEmptyDirectory) {
  TempDir tmp;
  ASSERT_TRUE(FormatPool(tmp.path(), Opts(kMiB)).ok());
  EXPECT_TRUE(OpenPoolFiles(tmp.path(), OpenOptions()).ok());
}

TEST(PoolDirTest, InvalidArgumentsTouchNothing) {
  TempDir tmp;
  const std::string root = tmp.Sub("pool");
  struct Case {
    FormatOptions options;
    const char* expect;
  };
  const Case cases[] = {
      {Opts(0), "size must not be zero"},
      {Opts(4096), "smaller than one block"},
      {Opts(kMiB, 5000), "multiple of 4 KiB"},
      {Opts(kMiB, 0), "must not be zero"},
      {Opts(uint64_t{4} << 30, uint64_t{2} << 30), "at most 1 GiB"},
  };
  for (const Case& c : cases) {
    Status s = FormatPool(root, c.options);
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s.message();
    EXPECT_FALSE(PathExists(root));
  }
}

TEST(PoolDirTest, DataOnAnExistingFile) {
  TempDir tmp;
  const std::string file = tmp.Sub("backing");
  WriteFileOrDie(file, "");
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(8 * kMiB)), 0);
  const std::string root = tmp.Sub("pool");

  FormatOptions too_big = Opts(16 * kMiB);
  too_big.data_path = file;
  Status s = FormatPool(root, too_big);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("exceeds"), std::string::npos) << s.message();
  EXPECT_FALSE(PathExists(root));

  FormatOptions dir = Opts(kMiB);
  dir.data_path = tmp.path();
  s = FormatPool(root, dir);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("not a block device or regular file"), std::string::npos);

  FormatOptions missing = Opts(kMiB);
  missing.data_path = tmp.Sub("nope");
  s = FormatPool(root, missing);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_FALSE(PathExists(root));

  FormatOptions ok = Opts(8 * kMiB);
  ok.data_path = file;
  ASSERT_TRUE(FormatPool(root, ok).ok());
  struct stat st;
  ASSERT_EQ(::lstat((root + "/data").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  Result<PoolFiles> f = OpenPoolFiles(root, OpenOptions());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->superblock.data_blocks, 8 * kMiB / kDefaultBlockSize);
}

TEST(PoolDirTest, ExistingPoolIsRefusedAndUnchanged) {
  TempDir tmp;
  const std::string root = tmp.Sub("pool");
  ASSERT_TRUE(FormatPool(root, Opts(4 * kMiB)).ok());
  const auto before = TreeDigest(root);

  Status s = FormatPool(root, Opts(8 * kMiB));
  EXPECT_EQ(s.code(), Status::Code::kExists) << s.ToString();
  EXPECT_NE(s.message().find("already a thinfs pool"), std::string::npos) << s.message();
  // Invalid arguments are refused before the pool is even looked at.
  EXPECT_TRUE(FormatPool(root, Opts(8 * kMiB, 5000)).IsInvalidArgument());
  EXPECT_EQ(TreeDigest(root), before);
}

TEST(PoolDirTest, LockedPoolIsNeverReformatted) {
  TempDir tmp;
  const std::string root = tmp.Sub("pool");
  ASSERT_TRUE(FormatPool(root, Opts(4 * kMiB)).ok());
  Result<PoolLock> held = PoolLock::Acquire(root + "/lock");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  const auto before = TreeDigest(root);

  FormatOptions force = Opts(8 * kMiB);
  force.force = true;
  Status s = FormatPool(root, force);
  EXPECT_EQ(s.code(), Status::Code::kBusy) << s.ToString();
  EXPECT_NE(s.message().find("in use by process " + std::to_string(::getpid())),
            std::string::npos)
      << s.message();
  EXPECT_EQ(TreeDigest(root), before);
}

TEST(PoolDirTest, ForceReformatsAnUnlockedPool) {
  TempDir tmp;
  const std::string root = tmp.Sub("pool");
  ASSERT_TRUE(FormatPool(root, Opts(4 * kMiB)).ok());
  Superblock old;
  {
    Result<PoolFiles> f = OpenPoolFiles(root, OpenOptions());
    ASSERT_TRUE(f.ok());
    old = f->superblock;
  }
  WriteFileOrDie(root + "/control.sock", "stale");
  FormatOptions force = Opts(8 * kMiB, 4096);
  force.force = true;
  ASSERT_TRUE(FormatPool(root, force).ok());
  EXPECT_FALSE(PathExists(root + "/control.sock"));
  Result<PoolFiles> f = OpenPoolFiles(root, OpenOptions());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->superblock.block_size, 4096u);
  EXPECT_EQ(f->superblock.data_blocks, 2048u);
  EXPECT_NE(std::memcmp(f->superblock.uuid, old.uuid, sizeof old.uuid), 0);
}

TEST(PoolDirTest, NonEmptyNonPoolDirectory) {
  TempDir tmp;
  WriteFileOrDie(tmp.Sub("precious"), "keep me");
  const auto before = TreeDigest(tmp.path());
  Status s = FormatPool(tmp.path(), Opts(kMiB));
  EXPECT_EQ(s.code(), Status::Code::kExists) << s.ToString();
  EXPECT_NE(s.message().find("not empty"), std::string::npos) << s.message();
  EXPECT_EQ(TreeDigest(tmp.path()), before);

  FormatOptions force = Opts(kMiB);
  force.force = true;
  ASSERT_TRUE(FormatPool(tmp.path(), force).ok());
  EXPECT_EQ(ReadFileOrDie(tmp.Sub("precious")), "keep me");
  EXPECT_TRUE(OpenPoolFiles(tmp.path(), OpenOptions()).ok());
}

TEST(PoolDirTest, PathThatIsAFile) {
  TempDir tmp;
  WriteFileOrDie(tmp.Sub("file"), "x");
  FormatOptions force = Opts(kMiB);
  force.force = true;
  Status s = FormatPool(tmp.Sub("file"), force);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("not a directory"), std::string::npos);
  // Its parent is a file: even root cannot create the directory.
  s = FormatPool(tmp.Sub("file/pool"), Opts(kMiB));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("file/pool"), std::string::npos) << s.message();
  EXPECT_EQ(ReadFileOrDie(tmp.Sub("file")), "x");
}

TEST(PoolDirTest, UnwritableLocation) {
  // /proc refuses mkdir even to root.
  Status s = FormatPool("/proc/thinfs-pool-test", Opts(kMiB));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("create pool directory /proc/thinfs-pool-test"), std::string::npos)
      << s.message();
}

// Runs `fn` in a child process and returns its exit status.
template <typename Fn>
int InChild(Fn fn) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(fn());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(PoolDirTest, FailureMidwayRemovesWhatItCreated) {
  TempDir tmp;
  const std::string root = tmp.Sub("pool");
  // The 64 MiB ftruncate of pool/data exceeds the child's file size limit.
  int rc = InChild([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {kMiB, kMiB};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 99;
    Status s = FormatPool(root, Opts(64 * kMiB));
    return s.ok() ? 0 : (s.message().find("data") != std::string::npos ? 1 : 2);
  });
  EXPECT_EQ(rc, 1);
  EXPECT_FALSE(PathExists(root));

  // Later: a 64 GiB --data file at 4 KiB blocks needs a 2 MiB bitmap.
  const std::string backing = tmp.Sub("backing");
  WriteFileOrDie(backing, "");
  ASSERT_EQ(::truncate(backing.c_str(), static_cast<off_t>(uint64_t{64} << 30)), 0);
  rc = InChild([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {kMiB, kMiB};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 99;
    FormatOptions o = Opts(uint64_t{64} << 30, 4096);
    o.data_path = backing;
    Status s = FormatPool(root, o);
    return s.ok() ? 0 : (s.message().find("bitmap") != std::string::npos ? 1 : 2);
  });
  EXPECT_EQ(rc, 1);
  EXPECT_FALSE(PathExists(root));
  struct stat st;
  ASSERT_EQ(::stat(backing.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), uint64_t{64} << 30);
}

TEST(PoolLockTest, ExclusionAcrossProcesses) {
  TempDir tmp;
  const std::string lock_path = tmp.Sub("lock");
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    bool ok = false;
    {
      Result<PoolLock> lock = PoolLock::Acquire(lock_path);
      ok = lock.ok();
      char c = ok ? 'y' : 'n';
      (void)!::write(ready[1], &c, 1);
      (void)!::read(release[0], &c, 1);
    }  // released here: _exit runs no destructors
    ::_exit(ok ? 0 : 1);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');

  Result<PoolLock> busy = PoolLock::Acquire(lock_path);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), Status::Code::kBusy);
  EXPECT_EQ(busy.status().message(),
            "pool " + tmp.path() + " is in use by process " + std::to_string(child));

  ASSERT_EQ(::write(release[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(ReadFileOrDie(lock_path), "") << "a released lock forgets its PID";

  Result<PoolLock> mine = PoolLock::Acquire(lock_path);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  EXPECT_EQ(ReadFileOrDie(lock_path), std::to_string(::getpid()) + "\n");
  for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
}

TEST(PoolLockTest, KilledHolderReleasesTheLock) {
  TempDir tmp;
  const std::string lock_path = tmp.Sub("lock");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Result<PoolLock> lock = PoolLock::Acquire(lock_path);
    (void)!::write(ready[1], lock.ok() ? "y" : "n", 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  EXPECT_EQ(PoolLock::Acquire(lock_path).status().code(), Status::Code::kBusy);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(PoolLock::Acquire(lock_path).ok());
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(PoolLockTest, MoveTransfersOwnership) {
  TempDir tmp;
  const std::string lock_path = tmp.Sub("lock");
  Result<PoolLock> a = PoolLock::Acquire(lock_path);
  ASSERT_TRUE(a.ok());
  PoolLock moved = std::move(*a);
  EXPECT_TRUE(moved.held());
  EXPECT_FALSE(a->held());  // NOLINT(bugprone-use-after-move): tested on purpose
  EXPECT_FALSE(PoolLock::Acquire(lock_path).ok());
  moved = PoolLock();
  EXPECT_TRUE(PoolLock::Acquire(lock_path).ok());
}

// The window a bitmap's generation may take against the superblock's
// transaction id t. A commit writes t + 1 into the header before its
// metadata and does not wait for the header's write-back, so after a crash
// a dirty bitmap may be anywhere behind the metadata, or one commit ahead;
// never further ahead (the metadata lost committed transactions). A clean
// close syncs the header: exactly t.
TEST(CheckBitmapGenerationTest, DirtyMayLagOrLeadByOneCleanMustMatch) {
  TempDir tmp;
  const std::string path = tmp.Sub("bitmap");
  Superblock sb;
  sb.transaction_id = 10;
  {
    auto m = BitmapSpaceMap::Create(path, 64, kDefaultBlockSize);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_TRUE((*m)->MarkDirty().ok());
  }
  for (uint64_t g : {uint64_t{1}, uint64_t{9}, uint64_t{10}, uint64_t{11}, uint64_t{12}}) {
    {
      auto m = BitmapSpaceMap::Open(path, 64, kDefaultBlockSize, /*read_only=*/false);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      ASSERT_TRUE((*m)->Sync(g).ok());
    }  // a crash: no MarkClean
    auto m = BitmapSpaceMap::Open(path, 64, kDefaultBlockSize, /*read_only=*/true);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_FALSE((*m)->was_clean());
    Status s = CheckBitmapGeneration(**m, sb, path);
    if (g <= 11) {
      EXPECT_TRUE(s.ok()) << "generation " << g << ": " << s.ToString();
    } else {
      EXPECT_TRUE(s.IsCorruption()) << "generation " << g;
      EXPECT_NE(s.message().find("committed metadata is missing"), std::string::npos)
          << s.ToString();
    }
  }
  {
    auto m = BitmapSpaceMap::Open(path, 64, kDefaultBlockSize, /*read_only=*/false);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_TRUE((*m)->MarkClean(10).ok());
  }
  for (uint64_t t : {uint64_t{9}, uint64_t{10}, uint64_t{11}}) {
    auto m = BitmapSpaceMap::Open(path, 64, kDefaultBlockSize, /*read_only=*/true);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_TRUE((*m)->was_clean());
    sb.transaction_id = t;
    Status s = CheckBitmapGeneration(**m, sb, path);
    if (t == 10) {
      EXPECT_TRUE(s.ok()) << s.ToString();
    } else {
      EXPECT_TRUE(s.IsCorruption()) << "clean at 10, metadata at " << t;
    }
  }
}

TEST(OpenPoolFilesTest, MissingOrNotAPool) {
  TempDir tmp;
  Result<PoolFiles> f = OpenPoolFiles(tmp.Sub("nope"), OpenOptions());
  EXPECT_TRUE(f.status().IsNotFound());
  EXPECT_NE(f.status().message().find("does not exist"), std::string::npos);
  f = OpenPoolFiles(tmp.path(), OpenOptions());
  EXPECT_TRUE(f.status().IsNotFound());
  EXPECT_NE(f.status().message().find("not a thinfs pool"), std::string::npos);
  EXPECT_FALSE(PathExists(tmp.Sub("lock"))) << "nothing created in a non-pool";
}

TEST(OpenPoolFilesTest, LockedPoolIsBusy) {
  TempDir tmp;
  ASSERT_TRUE(FormatPool(tmp.path(), Opts(kMiB)).ok());
  Result<PoolFiles> first = OpenPoolFiles(tmp.path(), OpenOptions());
  ASSERT_TRUE(first.ok());
  Result<PoolFiles> second = OpenPoolFiles(tmp.path(), OpenOptions());
  EXPECT_EQ(second.status().code(), Status::Code::kBusy) << second.status().ToString();
}

TEST(OpenPoolFilesTest, TruncatedDataArea) {
  TempDir tmp;
  ASSERT_TRUE(FormatPool(tmp.path(), Opts(4 * kMiB)).ok());
  ASSERT_EQ(::truncate(tmp.Sub("data").c_str(), static_cast<off_t>(kMiB)), 0);
  Result<PoolFiles> f = OpenPoolFiles(tmp.path(), OpenOptions());
  EXPECT_TRUE(f.status().IsCorruption()) << f.status().ToString();
  EXPECT_NE(f.status().message().find("data area"), std::string::npos);
  EXPECT_NE(f.status().message().find("holds 1048576 bytes"), std::string::npos);
}

TEST(OpenPoolFilesTest, MissingBitmap) {
  TempDir tmp;
  ASSERT_TRUE(FormatPool(tmp.path(), Opts(kMiB)).ok());
  ASSERT_EQ(::unlink(tmp.Sub("bitmap").c_str()), 0);
  Result<PoolFiles> f = OpenPoolFiles(tmp.path(), OpenOptions());
  EXPECT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("bitmap " + tmp.Sub("bitmap")), std::string::npos)
      << f.status().ToString();
}

TEST(OpenPoolFilesTest, CorruptBitmapHeader) {
  TempDir tmp;
  ASSERT_TRUE(FormatPool(tmp.path(), Opts(kMiB)).ok());
  FlipByteOrDie(tmp.Sub("bitmap"), kBitmapHeaderFlipOffsetForTesting);
  Result<PoolFiles> f = OpenPoolFiles(tmp.path(), OpenOptions());
  EXPECT_TRUE(f.status().IsCorruption()) << f.status().ToString();
  EXPECT_NE(f.status().message().find("bitmap"), std::string::npos);
  EXPECT_NE(f.status().message().find("checksum"), std::string::npos) << f.status().message();
}

}  // namespace
}  // namespace thinfs::meta
