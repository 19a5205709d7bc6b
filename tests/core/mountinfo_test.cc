#include "core/mountinfo.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "tests/util/pool_test_util.h"

namespace thinfs {
namespace {

const char* kTable =
    "22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "95 22 0:45 / /srv/vols rw,nosuid,nodev,relatime shared:60 - fuse.thinfs thinfs:/srv/pool "
    "rw,user_id=0,group_id=0,default_permissions\n"
    "96 22 0:46 / /mnt/my\\040vols rw,nosuid,nodev - fuse.thinfs thinfs:/srv/my\\040pool rw\n"
    "97 22 0:47 / /mnt/other rw - fuse.sshfs thinfs:/srv/fake rw\n"
    "98 22 0:48 / /mnt/plain rw - thinfs thinfs:/srv/plain rw\n";

std::optional<std::string> Find(std::string_view table, std::string_view pool_root) {
  return FindThinfsMount(ParseMountInfo(table), pool_root);
}

TEST(MountInfoTest, DecodesOctalEscapes) {
  EXPECT_EQ(UnescapeMountField("a\\040b\\011c\\012d\\134e"), "a b\tc\nd\\e");
  EXPECT_EQ(UnescapeMountField(""), "");
  EXPECT_EQ(UnescapeMountField("/plain/path"), "/plain/path");
  // An escaped backslash followed by digits is a backslash and the digits,
  // not a second escape.
  EXPECT_EQ(UnescapeMountField("x\\134040"), "x\\040");
  EXPECT_EQ(UnescapeMountField("\\040\\040"), "  ");
  // Not an escape: kept as written.
  EXPECT_EQ(UnescapeMountField("end\\04"), "end\\04");
  EXPECT_EQ(UnescapeMountField("end\\"), "end\\");
  EXPECT_EQ(UnescapeMountField("a\\400b"), "a\\400b");  // above \377
  EXPECT_EQ(UnescapeMountField("a\\080b"), "a\\080b");  // 8 is not octal
}

TEST(MountInfoTest, ParsesEveryFieldAndOptionalFields) {
  std::optional<MountInfoEntry> e = ParseMountInfoLine(
      "36 35 98:0 /mnt1 /mnt/par\\040ent rw,noatime shared:2 master:1 propagate_from:7 "
      "unbindable - ext3 /dev/ro\\011ot rw,errors=continue");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->device, "98:0");
  EXPECT_EQ(e->root, "/mnt1");
  EXPECT_EQ(e->mountpoint, "/mnt/par ent");
  EXPECT_EQ(e->options, "rw,noatime");
  EXPECT_EQ(e->optional_fields,
            (std::vector<std::string>{"shared:2", "master:1", "propagate_from:7", "unbindable"}));
  EXPECT_EQ(e->fstype, "ext3");
  EXPECT_EQ(e->source, "/dev/ro\tot");
  EXPECT_EQ(e->super_options, "rw,errors=continue");
}

TEST(MountInfoTest, NoOptionalFields) {
  std::optional<MountInfoEntry> e =
      ParseMountInfoLine("96 22 0:46 / /mnt/v rw,nosuid - fuse.thinfs thinfs:/srv/p rw");
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->optional_fields.empty());
  EXPECT_EQ(e->device, "0:46");
  EXPECT_EQ(e->mountpoint, "/mnt/v");
  EXPECT_EQ(e->fstype, "fuse.thinfs");
  EXPECT_EQ(e->source, "thinfs:/srv/p");
}

TEST(MountInfoTest, SeparatorIsLookedForAfterTheFixedFields) {
  // A root and a mountpoint named "-" are paths, not the separator.
  std::optional<MountInfoEntry> e = ParseMountInfoLine("1 2 0:1 - - rw shared:3 - tmpfs tmp rw");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->root, "-");
  EXPECT_EQ(e->mountpoint, "-");
  EXPECT_EQ(e->optional_fields, std::vector<std::string>{"shared:3"});
  EXPECT_EQ(e->fstype, "tmpfs");
  EXPECT_EQ(e->source, "tmp");
}

TEST(MountInfoTest, MalformedLinesAreRejected) {
  EXPECT_FALSE(ParseMountInfoLine("").has_value());
  EXPECT_FALSE(ParseMountInfoLine("garbage").has_value());
  EXPECT_FALSE(ParseMountInfoLine("1 2 3").has_value());
  // No separator.
  EXPECT_FALSE(ParseMountInfoLine("1 2 0:1 / /m rw shared:1 ext4 /dev/x rw").has_value());
  // Separator but no source.
  EXPECT_FALSE(ParseMountInfoLine("1 2 0:1 / /m rw - ext4").has_value());
  // Separator too early: fewer than six fields before it.
  EXPECT_FALSE(ParseMountInfoLine("1 2 0:1 / - ext4 /dev/x rw").has_value());
  // Missing super-block options are tolerated.
  std::optional<MountInfoEntry> e = ParseMountInfoLine("1 2 0:1 / /m rw - ext4 /dev/x");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->source, "/dev/x");
  EXPECT_EQ(e->super_options, "");
}

TEST(MountInfoTest, ParsesATableSkippingMalformedLines) {
  std::vector<MountInfoEntry> all = ParseMountInfo(kTable);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0].mountpoint, "/");
  EXPECT_EQ(all[2].mountpoint, "/mnt/my vols");
  EXPECT_EQ(all[4].fstype, "thinfs");

  std::vector<MountInfoEntry> some =
      ParseMountInfo("\ngarbage\n1 2 0:1 / /a\\012b rw - ext4 /dev/x rw\n\n"
                     "3 4 0:2 / /c rw - ext4 /dev/y rw");  // no final newline
  ASSERT_EQ(some.size(), 2u);
  EXPECT_EQ(some[0].mountpoint, "/a\nb");  // an escaped newline is no line end
  EXPECT_EQ(some[1].mountpoint, "/c");
  EXPECT_TRUE(ParseMountInfo("").empty());
}

TEST(MountInfoTest, FindsTheMountOfThePool) {
  EXPECT_EQ(Find(kTable, "/srv/pool"), std::optional<std::string>("/srv/vols"));
  EXPECT_EQ(ThinfsMountSource("/srv/pool"), "thinfs:/srv/pool");
}

TEST(MountInfoTest, FindsAPoolAndMountWithSpaces) {
  EXPECT_EQ(Find(kTable, "/srv/my pool"), std::optional<std::string>("/mnt/my vols"));
  // The escaped spelling is not the pool's name.
  EXPECT_EQ(Find(kTable, "/srv/my\\040pool"), std::nullopt);
}

TEST(MountInfoTest, OnlyFuseThinfsCounts) {
  // Other file system types with a thinfs: source do not count.
  EXPECT_EQ(Find(kTable, "/srv/fake"), std::nullopt);   // fuse.sshfs
  EXPECT_EQ(Find(kTable, "/srv/plain"), std::nullopt);  // "thinfs", not fuse.thinfs
}

TEST(MountInfoTest, NoneOrSeveralMatchesAreNotAnAnswer) {
  EXPECT_EQ(Find(kTable, "/srv/pool2"), std::nullopt);
  EXPECT_EQ(Find(kTable, "/srv"), std::nullopt);
  // A killed daemon's mount next to the live one: only the daemon knows.
  std::string twice =
      std::string(kTable) + "99 22 0:49 / /srv/vols2 rw - fuse.thinfs thinfs:/srv/pool rw\n";
  EXPECT_EQ(Find(twice, "/srv/pool"), std::nullopt);
  EXPECT_EQ(Find("", "/srv/pool"), std::nullopt);
  EXPECT_EQ(Find("garbage\n1 2 3\n", "/srv/pool"), std::nullopt);
}

TEST(MountInfoTest, FindsThePoolMountedOnAMountpoint) {
  const std::vector<MountInfoEntry> m = ParseMountInfo(kTable);
  EXPECT_EQ(ThinfsPoolOnMountpoint(m, "/srv/vols"), "/srv/pool");
  EXPECT_EQ(ThinfsPoolOnMountpoint(m, "/mnt/my vols"), "/srv/my pool");
  EXPECT_EQ(ThinfsPoolOnMountpoint(m, "/mnt/other"), std::nullopt) << "not fuse.thinfs";
  EXPECT_EQ(ThinfsPoolOnMountpoint(m, "/mnt/plain"), std::nullopt) << "not fuse.thinfs";
  EXPECT_EQ(ThinfsPoolOnMountpoint(m, "/"), std::nullopt);
  EXPECT_EQ(ThinfsPoolOnMountpoint(m, "/srv"), std::nullopt) << "a parent, not the mount point";
  // Stacked: the last mount on a point is the one it shows.
  const std::string over = std::string(kTable) + "99 95 0:49 / /srv/vols rw - tmpfs none rw\n";
  EXPECT_EQ(ThinfsPoolOnMountpoint(ParseMountInfo(over), "/srv/vols"), std::nullopt);
  const std::string under = "95 22 0:49 / /srv/vols rw - tmpfs none rw\n"
                            "96 95 0:45 / /srv/vols rw - fuse.thinfs thinfs:/srv/pool rw\n";
  EXPECT_EQ(ThinfsPoolOnMountpoint(ParseMountInfo(under), "/srv/vols"), "/srv/pool");
}

TEST(MountInfoTest, ReadsAFileLongerThanOneRead) {
  // More than the reader's 16 KiB buffer, so that lines straddle reads.
  std::string text;
  const int kLines = 1000;
  for (int i = 0; i < kLines; ++i) {
    text += std::to_string(i) + " 1 0:1 / /mnt/m\\040" + std::to_string(i) +
            " rw shared:1 - ext4 /dev/x rw\n";
  }
  ASSERT_GT(text.size(), 16384u);
  testing::TempDir dir;
  testing::WriteFileOrDie(dir.Sub("mountinfo"), text);
  Result<std::vector<MountInfoEntry>> read = ReadMountInfo(dir.Sub("mountinfo"));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->size(), static_cast<size_t>(kLines));
  for (int i = 0; i < kLines; ++i) {
    EXPECT_EQ((*read)[i].mountpoint, "/mnt/m " + std::to_string(i));
  }
}

TEST(MountInfoTest, MissingFileIsNotFound) {
  testing::TempDir dir;
  Result<std::vector<MountInfoEntry>> read = ReadMountInfo(dir.Sub("missing"));
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(read.status().IsNotFound()) << read.status().ToString();
}

}  // namespace
}  // namespace thinfs
