// thinfs diff and send on a mounted pool (metadata from a daemon
// checkpoint, data read through the mount), received into another pool;
// receive into a mounted pool is refused with the pool unchanged.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
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

  // Receive into the mounted pool: refused, nothing created.
  r = Thinfs({"receive", pool_, "copy", "-i", f1});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("receive needs an unmounted pool"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(Vol("copy")));

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

}  // namespace
}  // namespace thinfs::testing
