// thinfs diff and send on a mounted pool (metadata from a daemon
// checkpoint, data read through the mount), received into another pool;
// thinfs receive into a mounted pool (control socket and mounted files):
// full and incremental, onto bases received mounted or unmounted, failed
// streams leaving nothing, --force over an open device, and a receive
// while another device of the pool is being written.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "core/pool.h"
#include "meta/pool_dir.h"
#include "tests/tools/json_parser.h"
#include "tests/util/e2e_util.h"

namespace thinfs::testing {
namespace {

class SendE2eTest : public E2eTest {
 protected:
  void WriteAt(const std::string& name, uint64_t seed, uint64_t offset, size_t size) {
    const std::vector<char> data = Pattern(seed, offset, size);
    int fd = ::open(Vol(name).c_str(), O_WRONLY);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ASSERT_EQ(::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset)),
              static_cast<ssize_t>(data.size()));
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
  }

  std::vector<char> ReadMounted(const std::string& name) {
    std::vector<char> out(4 << 20);
    int fd = ::open(Vol(name).c_str(), O_RDONLY);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    ssize_t n = ::pread(fd, out.data(), out.size(), 0);
    EXPECT_GE(n, 0);
    out.resize(n < 0 ? 0 : static_cast<size_t>(n));
    ::close(fd);
    return out;
  }

  void Punch(const std::string& name, uint64_t offset, uint64_t length) {
    int fd = ::open(Vol(name).c_str(), O_WRONLY);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ASSERT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          static_cast<off_t>(offset), static_cast<off_t>(length)),
              0)
        << std::strerror(errno);
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
  }

  // The names in the mount and the pool's devices by `thinfs list`, which
  // must agree; a receive's temporary device would show in both.
  std::vector<std::string> Devices() {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(mnt_)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    CommandResult r = Thinfs({"list", pool_, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<std::string> listed;
    for (const JsonValue& d : ParseJson(r.output).array) listed.push_back(d["name"].string);
    std::sort(listed.begin(), listed.end());
    EXPECT_EQ(names, listed);
    return names;
  }

  // Unmounts, then `thinfs check` must find the pool clean.
  void UnmountAndCheck() {
    ASSERT_EQ(Unmount(), "");
    CommandResult r = Thinfs({"check", pool_});
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }

  // No checkpoint directory a command left in the pool directory.
  void ExpectNoCheckpointLeft() {
    for (const auto& e : std::filesystem::directory_iterator(pool_)) {
      const std::string f = e.path().filename().string();
      EXPECT_TRUE(f.rfind(".send-", 0) != 0 && f.rfind(".receive-", 0) != 0)
          << "checkpoint left behind: " << e.path();
    }
  }

  // The bytes of `name` in the unmounted pool `dir`, read through the engine.
  std::vector<char> ReadOffline(const std::string& dir, const std::string& name) {
    std::vector<char> out;
    auto files = meta::OpenPoolFiles(dir, {});
    EXPECT_TRUE(files.ok()) << files.status().ToString();
    if (!files.ok()) return out;
    PoolOptions o;
    o.commit_interval = std::chrono::milliseconds(0);
    auto pool = Pool::Open(std::move(files->data), std::move(files->bitmap),
                           std::move(files->store), o);
    EXPECT_TRUE(pool.ok());
    if (!pool.ok()) return out;
    {
      auto vol = (*pool)->OpenVolume(name);
      EXPECT_TRUE(vol.ok()) << vol.status().ToString();
      if (vol.ok()) {
        out.resize((*vol)->size());
        auto n = (*vol)->Read(0, std::as_writable_bytes(std::span<char>(out)));
        EXPECT_TRUE(n.ok());
      }
    }
    EXPECT_TRUE((*pool)->Close().ok());
    return out;
  }
};

TEST_F(SendE2eTest, DiffAndSendWhileMountedReceiveElsewhere) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");
  ASSERT_EQ(Thinfs({"create", pool_, "vol", "--size", "2M"}).exit_code, 0);
  WriteAt("vol", 1, 0, 3 * 65536 + 100);
  WriteAt("vol", 2, 1 << 20, 65536);
  ASSERT_EQ(Thinfs({"snapshot", pool_, "vol", "s1"}).exit_code, 0);
  WriteAt("vol", 3, 512 << 10, 2 * 65536);
  ASSERT_EQ(Thinfs({"snapshot", pool_, "vol", "s2"}).exit_code, 0);

  CommandResult r = Thinfs({"diff", pool_, "s1", "s2", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  JsonValue v = ParseJson(r.output);
  ASSERT_EQ(v["ranges"].array.size(), 1u) << r.output;
  EXPECT_EQ(v["ranges"].array[0]["kind"].string, "right_only");
  EXPECT_EQ(v["ranges"].array[0]["offset"].AsUint(), 512u << 10);
  EXPECT_EQ(v["differ_bytes"].AsUint(), 2u * 65536);

  const std::string f1 = dir_ + "/s1.stream", f2 = dir_ + "/s2.stream";
  r = Thinfs({"send", pool_, "s1", "-o", f1});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Thinfs({"send", pool_, "s2", "--from", "s1", "-o", f2});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(std::filesystem::file_size(f2), 3u * 65536) << "only the change is sent";
  for (const auto& e : std::filesystem::directory_iterator(pool_)) {
    EXPECT_NE(e.path().filename().string().rfind(".send-", 0), 0u)
        << "checkpoint left behind: " << e.path();
  }

  // Receive into the mounted pool itself: the copy reads the same bytes.
  r = Thinfs({"receive", pool_, "copy", "-i", f1});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadMounted("copy"), ReadMounted("s1"));

  const std::string other = dir_ + "/other";
  r = Thinfs({"format", other, "--size", "64M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(Thinfs({"receive", other, "s1", "-i", f1}).exit_code, 0);
  r = Thinfs({"receive", other, "s2", "-i", f2});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadOffline(other, "s1"), ReadMounted("s1"));
  EXPECT_EQ(ReadOffline(other, "s2"), ReadMounted("s2"));
  EXPECT_EQ(Unmount(), "");
}

// An incremental chain received alternately into the mounted and the
// unmounted pool: each base's recorded identity (mtime and size) must match
// what the other mode sees. The chain carries a resize and a punched hole.
TEST_F(SendE2eTest, ReceiveIncrementalsMountedAndUnmountedAlternately) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");
  ASSERT_EQ(Thinfs({"create", pool_, "vol", "--size", "2M"}).exit_code, 0);
  WriteAt("vol", 1, 0, 5 * 65536 + 100);
  WriteAt("vol", 2, 1 << 20, 3 * 65536);
  ASSERT_EQ(Thinfs({"snapshot", pool_, "vol", "s1"}).exit_code, 0);
  WriteAt("vol", 3, 512 << 10, 2 * 65536);
  ASSERT_EQ(Thinfs({"snapshot", pool_, "vol", "s2"}).exit_code, 0);
  Punch("vol", 65536, 3 * 65536);  // mapped in s2: HOLE records in s3's stream
  ASSERT_EQ(Thinfs({"resize", pool_, "vol", "--size", "3M"}).exit_code, 0);
  WriteAt("vol", 4, (2 << 20) + 4096, 65536);
  ASSERT_EQ(Thinfs({"snapshot", pool_, "vol", "s3"}).exit_code, 0);
  WriteAt("vol", 5, 0, 65536);
  ASSERT_EQ(Thinfs({"snapshot", pool_, "vol", "s4"}).exit_code, 0);

  const std::string f1 = dir_ + "/1", f2 = dir_ + "/2", f3 = dir_ + "/3", f4 = dir_ + "/4";
  ASSERT_EQ(Thinfs({"send", pool_, "s1", "-o", f1}).exit_code, 0);
  ASSERT_EQ(Thinfs({"send", pool_, "s2", "--from", "s1", "-o", f2}).exit_code, 0);
  CommandResult r = Thinfs({"send", pool_, "s3", "--from", "s2", "-o", f3, "-v"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find(" 196608 hole bytes"), std::string::npos) << r.output;
  ASSERT_EQ(Thinfs({"send", pool_, "s4", "--from", "s3", "-o", f4}).exit_code, 0);

  // Mounted: the full stream.
  r = Thinfs({"receive", pool_, "r1", "-i", f1, "-v"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadMounted("r1"), ReadMounted("s1"));
  ExpectNoCheckpointLeft();
  ASSERT_EQ(Unmount(), "");

  // Unmounted, onto the base received mounted.
  r = Thinfs({"receive", pool_, "r2", "-i", f2, "-v"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("on top of r1"), std::string::npos) << r.output;
  EXPECT_EQ(ReadOffline(pool_, "r2"), ReadOffline(pool_, "s2"));

  // Mounted, onto the base received unmounted: a resize and holes.
  ASSERT_EQ(MountForeground(), "");
  r = Thinfs({"receive", pool_, "r3", "-i", f3, "-v"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("on top of r2"), std::string::npos) << r.output;
  EXPECT_EQ(std::filesystem::file_size(Vol("r3")), 3u << 20);
  EXPECT_EQ(ReadMounted("r3"), ReadMounted("s3"));
  EXPECT_NE(ReadMounted("r3"), ReadMounted("r2"));
  ExpectNoCheckpointLeft();
  ASSERT_EQ(Unmount(), "");

  // Unmounted again, onto the base received mounted.
  r = Thinfs({"receive", pool_, "r4", "-i", f4, "-v"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("on top of r3"), std::string::npos) << r.output;
  EXPECT_EQ(ReadOffline(pool_, "r4"), ReadOffline(pool_, "s4"));
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// A corrupted or truncated stream received into a mounted pool exits 2 and
// leaves no device, no temporary device and no checkpoint.
TEST_F(SendE2eTest, FailedReceiveIntoMountedPoolLeavesNothing) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");
  ASSERT_EQ(Thinfs({"create", pool_, "vol", "--size", "2M"}).exit_code, 0);
  WriteAt("vol", 1, 0, 8 * 65536);
  const std::string good = dir_ + "/good";
  ASSERT_EQ(Thinfs({"send", pool_, "vol", "-o", good}).exit_code, 0);
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 6u * 65536);
  const std::vector<std::string> before = Devices();

  std::string flipped = bytes;
  flipped[bytes.size() - 2 * 65536] ^= 0x20;  // inside the data of a later record
  const std::string corrupt = dir_ + "/corrupt", cut = dir_ + "/cut";
  std::ofstream(corrupt, std::ios::binary) << flipped;
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 3 * 65536);

  for (const std::string& f : {corrupt, cut}) {
    CommandResult r = Thinfs({"receive", pool_, "copy", "-i", f});
    EXPECT_EQ(r.exit_code, 2) << f << ": " << r.output;
    EXPECT_NE(r.output.find("stream byte"), std::string::npos) << r.output;
    EXPECT_EQ(Devices(), before) << f;
    ExpectNoCheckpointLeft();
  }
  // The same name receives fine afterwards.
  CommandResult r = Thinfs({"receive", pool_, "copy", "-i", good});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadMounted("copy"), ReadMounted("vol"));
  UnmountAndCheck();
}

// Receive over an existing name in a mounted pool: refused without --force;
// with it, a descriptor open on the old device keeps reading the old data
// (the rename detaches it, as rename(2) in the mount does), new opens see
// the received data.
TEST_F(SendE2eTest, ForceReceiveIntoMountedPoolOverAnOpenDevice) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");
  ASSERT_EQ(Thinfs({"create", pool_, "a", "--size", "1M"}).exit_code, 0);
  ASSERT_EQ(Thinfs({"create", pool_, "b", "--size", "1M"}).exit_code, 0);
  WriteAt("a", 1, 0, 1 << 20);
  WriteAt("b", 2, 0, 1 << 20);
  const std::string fa = dir_ + "/a", fb = dir_ + "/b";
  ASSERT_EQ(Thinfs({"send", pool_, "a", "-o", fa}).exit_code, 0);
  ASSERT_EQ(Thinfs({"send", pool_, "b", "-o", fb}).exit_code, 0);
  ASSERT_EQ(Thinfs({"receive", pool_, "t", "-i", fa}).exit_code, 0);
  const std::vector<char> old_data = ReadMounted("a");

  CommandResult r = Thinfs({"receive", pool_, "t", "-i", fb});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("exists (use --force"), std::string::npos) << r.output;

  int fd = ::open(Vol("t").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  r = Thinfs({"receive", pool_, "t", "-i", fb, "--force"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<char> through_old(1 << 20);
  EXPECT_EQ(::pread(fd, through_old.data(), through_old.size(), 0),
            static_cast<ssize_t>(through_old.size()));
  ::close(fd);
  EXPECT_EQ(through_old, old_data);
  EXPECT_EQ(ReadMounted("t"), ReadMounted("b"));
  const std::vector<std::string> names = Devices();
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "t"}));
  UnmountAndCheck();
}

// A receive into a mounted pool while another device of it is being
// written: both devices hold their data afterwards and check is clean.
TEST_F(SendE2eTest, ReceiveIntoMountedPoolWhileAnotherDeviceIsWritten) {
  FormatPool("128M");
  ASSERT_EQ(MountForeground(), "");
  ASSERT_EQ(Thinfs({"create", pool_, "src", "--size", "4M"}).exit_code, 0);
  WriteAt("src", 7, 0, 4 << 20);
  const std::string f = dir_ + "/src";
  ASSERT_EQ(Thinfs({"send", pool_, "src", "-o", f}).exit_code, 0);
  ASSERT_EQ(Thinfs({"create", pool_, "busy", "--size", "4M"}).exit_code, 0);

  // The writer rewrites `busy` with a new pattern each round until the
  // receive is done, and at least twice.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rounds{0};
  std::string writer_error;
  std::thread writer([&] {
    int fd = ::open(Vol("busy").c_str(), O_WRONLY);
    if (fd < 0) {
      writer_error = std::string("open: ") + std::strerror(errno);
      return;
    }
    while (!stop.load() || rounds.load() < 2) {
      const uint64_t seed = 100 + rounds.load();
      const std::vector<char> data = Pattern(seed, 0, 4 << 20);
      for (size_t off = 0; off < data.size(); off += 256 << 10) {
        if (::pwrite(fd, data.data() + off, 256 << 10, static_cast<off_t>(off)) != 256 << 10) {
          writer_error = std::string("pwrite: ") + std::strerror(errno);
          ::close(fd);
          return;
        }
      }
      if (::fsync(fd) != 0) writer_error = std::string("fsync: ") + std::strerror(errno);
      rounds.fetch_add(1);
    }
    ::close(fd);
  });
  CommandResult r = Thinfs({"receive", pool_, "copy", "-i", f});
  stop.store(true);
  writer.join();
  ASSERT_EQ(writer_error, "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadMounted("copy"), ReadMounted("src"));
  EXPECT_EQ(ReadMounted("busy"), Pattern(100 + rounds.load() - 1, 0, 4 << 20));
  UnmountAndCheck();
  EXPECT_EQ(ReadOffline(pool_, "copy"), Pattern(7, 0, 4 << 20));
  EXPECT_EQ(ReadOffline(pool_, "busy"), Pattern(100 + rounds.load() - 1, 0, 4 << 20));
}

}  // namespace
}  // namespace thinfs::testing
