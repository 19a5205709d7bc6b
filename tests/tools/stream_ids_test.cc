// StreamGuids (tools/stream_ids.h): POOL/stream-guids as several receives
// into one pool write it.

#include "tools/stream_ids.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace thinfs::tools {
namespace {

class StreamGuidsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/thinfs-guids-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  static DeviceRecord Device(uint64_t id, uint32_t flags = 0) {
    DeviceRecord r;
    r.id = VolumeId(id);
    r.name = "d" + std::to_string(id);
    r.flags = flags;
    r.mtime_ns = static_cast<int64_t>(1000 + id);
    r.size = 1 << 20;
    return r;
  }
  // The entry a receive of device `r` records, with a guid made from `tag`.
  static ReceivedGuid Entry(const DeviceRecord& r, uint8_t tag) {
    ReceivedGuid e;
    e.guid.bytes[0] = tag;
    e.guid.bytes[15] = 0x5a;
    e.mtime_ns = r.mtime_ns;
    e.size = r.size;
    return e;
  }
  // The device `r` is recognised as the base of a stream with `tag`'s guid.
  bool Knows(const DeviceRecord& r, uint8_t tag) {
    Result<StreamGuids> g = StreamGuids::Load(root_);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    if (!g.ok()) return false;
    const std::string* modified = nullptr;
    const std::vector<DeviceRecord> devices{r};
    return g->FindByGuid(Entry(r, tag).guid, devices, &modified) != nullptr;
  }

  std::string root_;
};

// Two receives loaded the file before either recorded (the mounted case:
// they run at once). Whichever order they record in, both entries stay.
TEST_F(StreamGuidsTest, RecordsOfReceivesThatLoadedTheSameFileBothStay) {
  const DeviceRecord d5 = Device(5), d6 = Device(6);
  for (bool five_first : {true, false}) {
    std::filesystem::remove(root_ + "/stream-guids");
    Result<StreamGuids> a = StreamGuids::Load(root_);
    Result<StreamGuids> b = StreamGuids::Load(root_);
    ASSERT_TRUE(a.ok() && b.ok());
    // b created device 5 first, so a's list (read after it made 6) has both;
    // b read its list before 6 existed.
    if (five_first) {
      ASSERT_TRUE(b->Record(5, Entry(d5, 1), {d5}).ok());
      ASSERT_TRUE(a->Record(6, Entry(d6, 2), {d5, d6}).ok());
    } else {
      ASSERT_TRUE(a->Record(6, Entry(d6, 2), {d5, d6}).ok());
      ASSERT_TRUE(b->Record(5, Entry(d5, 1), {d5}).ok());
    }
    EXPECT_TRUE(Knows(d5, 1)) << "five first: " << five_first;
    EXPECT_TRUE(Knows(d6, 2)) << "five first: " << five_first;
  }
}

// Entries of devices that are gone (deleted, or hidden) are dropped; one
// above every listed id is kept (a device made after the list was read).
TEST_F(StreamGuidsTest, EntriesOfDevicesGoneAreDroppedNewerOnesKept) {
  const DeviceRecord d3 = Device(3), d4 = Device(4), d7 = Device(7), d9 = Device(9);
  Result<StreamGuids> g = StreamGuids::Load(root_);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(g->Record(3, Entry(d3, 3), {d3, d4}).ok());
  ASSERT_TRUE(g->Record(4, Entry(d4, 4), {d3, d4}).ok());
  ASSERT_TRUE(g->Record(9, Entry(d9, 9), {d3, d4, d9}).ok());
  // Device 3 was deleted, 4 hidden; 9 is not in this list but newer than 7.
  ASSERT_TRUE(g->Record(7, Entry(d7, 7), {Device(4, DeviceRecord::kHidden), d7}).ok());
  EXPECT_FALSE(Knows(d3, 3));
  EXPECT_FALSE(Knows(d4, 4));
  EXPECT_TRUE(Knows(d7, 7));
  EXPECT_TRUE(Knows(d9, 9));
}

// Receives recording at the same moment: every entry lands and the file
// stays well formed.
TEST_F(StreamGuidsTest, ConcurrentRecordsLoseNothing) {
  constexpr int kThreads = 8;
  std::vector<DeviceRecord> all;
  for (int i = 1; i <= kThreads; ++i) all.push_back(Device(static_cast<uint64_t>(i)));
  for (int round = 0; round < 5; ++round) {
    std::filesystem::remove(root_ + "/stream-guids");
    std::vector<std::thread> threads;
    for (int i = 1; i <= kThreads; ++i) {
      threads.emplace_back([&, i] {
        Result<StreamGuids> g = StreamGuids::Load(root_);
        ASSERT_TRUE(g.ok()) << g.status().ToString();
        Status s = g->Record(static_cast<uint64_t>(i),
                             Entry(all[static_cast<size_t>(i - 1)], static_cast<uint8_t>(i)), all);
        EXPECT_TRUE(s.ok()) << s.ToString();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 1; i <= kThreads; ++i) {
      EXPECT_TRUE(Knows(all[static_cast<size_t>(i - 1)], static_cast<uint8_t>(i)))
          << "round " << round << ": device " << i;
    }
  }
}

}  // namespace
}  // namespace thinfs::tools
