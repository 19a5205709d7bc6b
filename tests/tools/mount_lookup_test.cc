#include "tools/mount_lookup.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace thinfs::tools {
namespace {

const char* kTable =
    "22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "95 22 0:45 / /srv/vols rw,nosuid,nodev,relatime shared:60 - fuse.thinfs thinfs:/srv/pool "
    "rw,user_id=0,group_id=0,default_permissions\n"
    "96 22 0:46 / /mnt/my\\040vols rw,nosuid,nodev - fuse.thinfs thinfs:/srv/my\\040pool rw\n"
    "97 22 0:47 / /mnt/other rw - fuse.sshfs thinfs:/srv/fake rw\n";

TEST(MountLookupTest, FindsTheMountOfThePool) {
  EXPECT_EQ(FindThinfsMount(kTable, "/srv/pool"), std::optional<std::string>("/srv/vols"));
}

TEST(MountLookupTest, DecodesOctalEscapes) {
  EXPECT_EQ(UnescapeMountField("a\\040b\\011c\\134d"), "a b\tc\\d");
  EXPECT_EQ(UnescapeMountField("end\\04"), "end\\04");
  EXPECT_EQ(FindThinfsMount(kTable, "/srv/my pool"), std::optional<std::string>("/mnt/my vols"));
}

TEST(MountLookupTest, NoneOrSeveralMatchesAreNotAnAnswer) {
  EXPECT_EQ(FindThinfsMount(kTable, "/srv/pool2"), std::nullopt);
  EXPECT_EQ(FindThinfsMount(kTable, "/srv"), std::nullopt);
  // Another file system type with the same source does not count.
  EXPECT_EQ(FindThinfsMount(kTable, "/srv/fake"), std::nullopt);
  // A killed daemon's mount next to the live one: only the daemon knows.
  std::string twice = std::string(kTable) +
                      "98 22 0:48 / /srv/vols2 rw - fuse.thinfs thinfs:/srv/pool rw\n";
  EXPECT_EQ(FindThinfsMount(twice, "/srv/pool"), std::nullopt);
  EXPECT_EQ(FindThinfsMount("", "/srv/pool"), std::nullopt);
  EXPECT_EQ(FindThinfsMount("garbage\n1 2 3\n", "/srv/pool"), std::nullopt);
}

}  // namespace
}  // namespace thinfs::tools
