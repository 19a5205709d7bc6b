// MapCache: hits, misses, and the two generations that keep it from ever
// answering with something older than the block map.

#include "core/map_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace thinfs {
namespace {

TEST(MapCacheTest, HitAfterFillMissForOtherKeysAndGenerations) {
  MapCache<int> cache(64);
  EXPECT_EQ(cache.capacity(), 64u);
  EXPECT_EQ(MapCache<int>(100).capacity(), 64u) << "rounded down: never more memory than asked";
  int v = 0;
  MapCache<int>::Ticket t;
  EXPECT_FALSE(cache.Lookup(1, 10, 0, &v, &t));
  cache.Fill(t, 1, 10, 0, 7);
  ASSERT_TRUE(cache.Lookup(1, 10, 0, &v, &t));
  EXPECT_EQ(v, 7);
  EXPECT_FALSE(cache.Lookup(2, 10, 0, &v, &t)) << "other device";
  EXPECT_FALSE(cache.Lookup(1, 11, 0, &v, &t)) << "other block";
  EXPECT_FALSE(cache.Lookup(1, 10, 1, &v, &t)) << "device generation moved";
  EXPECT_EQ(cache.hits(), 1u);
}

TEST(MapCacheTest, InvalidateDropsTheEntry) {
  MapCache<int> cache(64);
  int v = 0;
  MapCache<int>::Ticket t;
  ASSERT_FALSE(cache.Lookup(3, 4, 0, &v, &t));
  cache.Fill(t, 3, 4, 0, 1);
  cache.Invalidate(3, 4);
  EXPECT_FALSE(cache.Lookup(3, 4, 0, &v, &t));
}

// The race the tickets exist for: a reader resolves the old answer, the
// writer edits and invalidates, then the reader fills. The fill must lose.
TEST(MapCacheTest, FillAfterARacingInvalidateIsRefused) {
  MapCache<int> cache(64);
  int v = 0;
  MapCache<int>::Ticket t;
  ASSERT_FALSE(cache.Lookup(5, 6, 0, &v, &t));
  cache.Invalidate(5, 6);   // the writer's edit lands
  cache.Fill(t, 5, 6, 0, 1);  // the reader's stale answer
  MapCache<int>::Ticket t2;
  EXPECT_FALSE(cache.Lookup(5, 6, 0, &v, &t2));
  cache.Fill(t2, 5, 6, 0, 2);
  ASSERT_TRUE(cache.Lookup(5, 6, 0, &v, &t2));
  EXPECT_EQ(v, 2);
}

TEST(MapCacheTest, DisabledCacheNeverHits) {
  MapCache<int> cache(0);
  EXPECT_FALSE(cache.enabled());
  int v = 0;
  MapCache<int>::Ticket t;
  EXPECT_FALSE(cache.Lookup(1, 1, 0, &v, &t));
  cache.Fill(t, 1, 1, 0, 1);
  cache.Invalidate(1, 1);
  EXPECT_FALSE(cache.Lookup(1, 1, 0, &v, &t));
}

// Readers and a writer hammer a few keys. The writer bumps a per-key
// version in the "map", invalidates, then publishes the version as done
// (the engine's write returning). Readers resolve by reading the map and
// fill. No lookup that starts after a change was done may see an older
// version.
TEST(MapCacheTest, ConcurrentReadersNeverSeeOlderThanTheMap) {
  MapCache<uint64_t> cache(16);  // fewer slots than keys: keys collide
  constexpr uint64_t kKeys = 32;
  std::vector<std::atomic<uint64_t>> map(kKeys);
  std::vector<std::atomic<uint64_t>> done(kKeys);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> violations{0};
  std::thread writer([&] {
    for (int i = 0; i < 20000; ++i) {
      uint64_t k = static_cast<uint64_t>(i) % kKeys;
      uint64_t now = map[k].fetch_add(1) + 1;
      cache.Invalidate(1, k);
      done[k].store(now);
      std::this_thread::yield();  // let readers fill and hit in between
    }
    stop = true;
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      uint64_t k = static_cast<uint64_t>(r);
      while (!stop.load()) {
        k = (k * 7 + 3) % kKeys;
        uint64_t floor = done[k].load();
        uint64_t v = 0;
        MapCache<uint64_t>::Ticket t;
        if (cache.Lookup(1, k, 0, &v, &t)) {
          if (v < floor) violations.fetch_add(1);
        } else {
          cache.Fill(t, 1, k, 0, map[k].load());
        }
      }
    });
  }
  writer.join();
  for (auto& t : readers) t.join();
  EXPECT_EQ(violations.load(), 0u);
  EXPECT_GT(cache.hits(), 0u);
}

}  // namespace
}  // namespace thinfs
