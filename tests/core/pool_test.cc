// Focused engine tests: one per DESIGN.md invariant, the I/O contract, and
// each bad input.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/util/engine_fixture.h"
#include "tests/util/pool_test_util.h"

namespace thinfs {
namespace {
namespace THINFS_TEST_FILE {  // unique per file in a unity build (tests/CMakeLists.txt)

using testing::EngineFixture;
using testing::Pattern;
using testing::ThreadNames;

constexpr uint64_t kBs = 4096;

constexpr auto& Open = testing::OpenOrFail;

TEST(PoolTest, UnprovisionedReadsZerosAndTakesNoSpace) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 1 << 20).ok());
  auto buf = f.ReadAll("v");
  EXPECT_EQ(buf, std::vector<std::byte>(1 << 20));
  EXPECT_EQ(f.pool->Stats().used_blocks, 0u);
  EXPECT_EQ(f.pool->GetDevice("v")->mapped_blocks, 0u);
}

TEST(PoolTest, UnalignedWritesAcrossBlocksRoundTrip) {
  for (uint64_t bs : {uint64_t{4096}, uint64_t{12288}}) {
    EngineFixture f(bs, 64);
    ASSERT_TRUE(f.pool->CreateDevice("v", 10 * bs).ok());
    auto v = Open(*f.pool, "v");
    std::vector<std::byte> model(10 * bs);
    struct W {
      uint64_t off, len;
    };
    for (W w : {W{1, 10}, W{bs - 3, 7}, W{2 * bs + 100, 3 * bs}, W{9 * bs, bs}, W{0, 1}}) {
      auto data = Pattern(w.len, static_cast<uint32_t>(w.off));
      ASSERT_OK(v->Write(w.off, data));
      std::memcpy(model.data() + w.off, data.data(), w.len);
      EXPECT_EQ(f.ReadAll("v"), model) << "bs " << bs << " after write at " << w.off;
    }
    // Short read at the end, zero-length read past it.
    std::vector<std::byte> tail(100);
    auto n = v->Read(10 * bs - 40, tail);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 40u);
    n = v->Read(10 * bs, tail);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 0u);
  }
}

TEST(PoolTest, GenericGeometryPathGivesSameResults) {
  PoolOptions o = EngineFixture::DefaultOptions();
  o.force_generic_geometry_for_testing = true;
  EngineFixture f(kBs, 64, o);
  EXPECT_FALSE(f.pool->geometry().fast_path());
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kBs).ok());
  auto v = Open(*f.pool, "v");
  auto data = Pattern(3 * kBs, 7);
  ASSERT_OK(v->Write(kBs / 2, data));
  auto all = f.ReadAll("v");
  EXPECT_EQ(std::memcmp(all.data() + kBs / 2, data.data(), data.size()), 0);
}

// Invariant 1: a snapshot writes a constant number of records, and reads of
// the origin do the same work however many snapshots exist.
TEST(PoolTest, Invariant1SnapshotIsConstantSize) {
  // Counts store lookups, so without the map cache (which would answer the
  // second read from memory); MapCacheAnswersRepeatedReads covers it.
  PoolOptions options = EngineFixture::DefaultOptions();
  options.map_cache_bytes = 0;
  EngineFixture f(kBs, 4096, options);
  for (uint64_t mapped : {uint64_t{10}, uint64_t{1000}}) {
    std::string name = "o" + std::to_string(mapped);
    ASSERT_TRUE(f.pool->CreateDevice(name, 2000 * kBs).ok());
    auto v = Open(*f.pool, name);
    for (uint64_t b = 0; b < mapped; ++b) ASSERT_OK(v->Write(b * kBs, Pattern(kBs, b)));
    ASSERT_OK(f.pool->Commit());
    ASSERT_TRUE(f.pool->CreateSnapshot(name, name + "-snap").ok());
    EXPECT_EQ(f.counting->last_batch_records.load(), 2u) << "origin with " << mapped << " blocks";
  }
  // Reads of the origin: the same number of store lookups with 0 and 100
  // snapshots.
  auto v = Open(*f.pool, "o10");
  std::vector<std::byte> buf(10 * kBs);
  ASSERT_OK(f.pool->Commit());
  uint64_t before = f.counting->finds.load();
  ASSERT_TRUE(v->Read(0, buf).ok());
  uint64_t with_one = f.counting->finds.load() - before;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(f.pool->CreateSnapshot("o10", "s" + std::to_string(i)).ok());
  }
  before = f.counting->finds.load();
  ASSERT_TRUE(v->Read(0, buf).ok());
  EXPECT_EQ(f.counting->finds.load() - before, with_one);
}

// The map cache answers repeated reads and in-place writes without the
// store, and every change of a block is seen at once: by the device that
// made it, by its snapshots (which keep the old contents) and after
// resize/clone changes of a whole device.
TEST(PoolTest, MapCacheAnswersRepeatedReadsAndSeesEveryChange) {
  EngineFixture f(kBs, 256);
  ASSERT_TRUE(f.pool->CreateDevice("o", 16 * kBs).ok());
  auto o = Open(*f.pool, "o");
  for (uint64_t b = 0; b < 8; ++b) ASSERT_OK(o->Write(b * kBs, Pattern(kBs, b)));
  ASSERT_OK(f.pool->Commit());
  std::vector<std::byte> buf(8 * kBs);
  ASSERT_TRUE(o->Read(0, buf).ok());  // fills
  uint64_t before = f.counting->finds.load();
  ASSERT_TRUE(o->Read(0, buf).ok());
  ASSERT_OK(o->Write(3 * kBs + 5, Pattern(7, 99)));  // in place
  EXPECT_EQ(f.counting->finds.load() - before, 0u) << "cached reads and in-place writes";

  // A snapshot keeps the old block; the origin's COW write is seen by both.
  ASSERT_TRUE(f.pool->CreateSnapshot("o", "s").ok());
  auto s = Open(*f.pool, "s");
  std::vector<std::byte> one(kBs);
  ASSERT_TRUE(s->Read(2 * kBs, one).ok());
  EXPECT_EQ(one, Pattern(kBs, 2));
  ASSERT_OK(o->Write(2 * kBs, Pattern(kBs, 42)));
  ASSERT_TRUE(o->Read(2 * kBs, one).ok());
  EXPECT_EQ(one, Pattern(kBs, 42));
  ASSERT_TRUE(s->Read(2 * kBs, one).ok());
  EXPECT_EQ(one, Pattern(kBs, 2));
  // Discard through the cache.
  ASSERT_OK(o->Discard(1 * kBs, kBs));
  ASSERT_TRUE(o->Read(1 * kBs, one).ok());
  EXPECT_EQ(one, std::vector<std::byte>(kBs));
  // Shrink and grow: the dropped tail reads zeros, in the snapshot too once
  // it is resized (a whole-device change, not a per-block edit).
  ASSERT_TRUE(s->Read(5 * kBs, one).ok());
  EXPECT_EQ(one, Pattern(kBs, 5));
  ASSERT_OK(f.pool->ResizeDevice("s", 4 * kBs));
  ASSERT_OK(f.pool->ResizeDevice("s", 16 * kBs));
  ASSERT_TRUE(s->Read(5 * kBs, one).ok());
  EXPECT_EQ(one, std::vector<std::byte>(kBs));
  ASSERT_TRUE(o->Read(5 * kBs, one).ok());
  EXPECT_EQ(one, Pattern(kBs, 5));

  // A clone onto an empty device changes what all its blocks resolve to
  // (a new parent, then a growing parent limit): reads cached before each
  // step must not survive it.
  ASSERT_TRUE(f.pool->CreateDevice("c", 16 * kBs).ok());
  auto c = Open(*f.pool, "c");
  std::vector<std::byte> all(16 * kBs);
  ASSERT_TRUE(c->Read(0, all).ok());  // caches "unmapped" everywhere
  const std::vector<std::byte> want = f.ReadAll("o");
  for (uint64_t off = 0; off < 16 * kBs; off += 6 * kBs) {
    ASSERT_OK(f.pool->ShareRange(o->id(), off, c->id(), off, std::min(6 * kBs, 16 * kBs - off)));
    ASSERT_TRUE(c->Read(0, all).ok());
    EXPECT_EQ(std::memcmp(all.data(), want.data(), std::min(off + 6 * kBs, 16 * kBs)), 0)
        << "after cloning up to " << off + 6 * kBs;
  }
  EXPECT_EQ(f.pool->GetDevice("c")->parent_name, "o");
}

// A read of several blocks first hints the data device with the pool
// blocks behind them, one hint per run of consecutive pool blocks and none
// for holes, before it reads any (lever 19); a one-block read hints
// nothing. The hint changes no result.
TEST(PoolTest, ReadsOfSeveralBlocksPrefetchTheirPoolBlocksFirst) {
  EngineFixture f(kBs, 256);
  ASSERT_TRUE(f.pool->CreateDevice("v", 16 * kBs).ok());
  auto v = Open(*f.pool, "v");
  // vblocks 0-3 on pool blocks 0-3; vblock 6 on 4, vblock 5 on 5; 4 a hole.
  ASSERT_OK(v->Write(0, Pattern(4 * kBs, 1)));
  ASSERT_OK(v->Write(6 * kBs, Pattern(kBs, 2)));
  ASSERT_OK(v->Write(5 * kBs, Pattern(kBs, 3)));
  testing::ForwardingBlockDevice& data = *f.data_forwarder;
  auto hints = [&] {
    std::lock_guard<std::mutex> l(data.prefetch_mu);
    auto out = data.prefetched;
    data.prefetched.clear();
    data.reads_before_prefetch.clear();
    return out;
  };
  hints();

  std::vector<std::byte> buf(8 * kBs);
  data.reads = 0;
  ASSERT_TRUE(v->Read(0, buf).ok());
  using Hints = std::vector<std::pair<uint64_t, uint64_t>>;
  {
    std::lock_guard<std::mutex> l(data.prefetch_mu);
    EXPECT_EQ(data.reads_before_prefetch, (std::vector<uint64_t>{0, 0, 0}))
        << "every hint comes before the first read";
  }
  EXPECT_EQ(hints(), (Hints{{0, 4}, {5, 1}, {4, 1}}));
  using Reads = std::vector<std::pair<uint64_t, size_t>>;
  auto reads = [&] {
    std::lock_guard<std::mutex> l(data.prefetch_mu);
    return std::exchange(data.prefetch_reads, {});
  };
  EXPECT_EQ(reads(), (Reads{{0, 8 * kBs}})) << "the read's own buffer is the scratch";
  std::vector<std::byte> want(8 * kBs);
  std::memcpy(want.data(), Pattern(4 * kBs, 1).data(), 4 * kBs);
  std::memcpy(want.data() + 5 * kBs, Pattern(kBs, 3).data(), kBs);
  std::memcpy(want.data() + 6 * kBs, Pattern(kBs, 2).data(), kBs);
  EXPECT_EQ(buf, want);

  // Unaligned, across two blocks: both hinted, as one run.
  std::vector<std::byte> two(kBs);
  ASSERT_TRUE(v->Read(kBs + 100, two).ok());
  EXPECT_EQ(hints(), (Hints{{1, 2}}));
  EXPECT_EQ(reads(), (Reads{{100, kBs}})) << "head: the read's offset into its first block";
  const std::vector<std::byte> head4 = Pattern(4 * kBs, 1);
  EXPECT_EQ(two, std::vector<std::byte>(head4.begin() + kBs + 100, head4.begin() + 2 * kBs + 100));
  // A hole first: the run starts at a later block, from its start.
  ASSERT_TRUE(v->Read(4 * kBs + 100, two).ok());
  EXPECT_EQ(hints(), (Hints{{5, 1}}));
  EXPECT_EQ(reads(), (Reads{{0, kBs}}));
  // Within one block, or all holes: no hint.
  ASSERT_TRUE(v->Read(2 * kBs, std::span(two).first(kBs)).ok());
  ASSERT_TRUE(v->Read(8 * kBs, buf).ok());
  EXPECT_EQ(hints(), Hints{});
}

// A read within one block may be read around (lever 44): the data device
// is told of it before the read, unless the block is a hole or the read
// goes on where the last one-block read of the device ended (a sequential
// reader, whom the host's readahead serves). Reads of several blocks take
// the prefetch path instead. The call changes no result.
TEST(PoolTest, ReadsWithinOneBlockAreReadAroundUnlessTheyGoOnInOrder) {
  constexpr uint64_t kBlock = 64 << 10;
  EngineFixture f(kBlock, 256);
  ASSERT_TRUE(f.pool->CreateDevice("v", 16 * kBlock).ok());
  ASSERT_TRUE(f.pool->CreateDevice("w", 16 * kBlock).ok());
  auto v = Open(*f.pool, "v");
  auto w = Open(*f.pool, "w");
  ASSERT_OK(v->Write(0, Pattern(4 * kBlock, 1)));  // pool blocks 0-3
  ASSERT_OK(w->Write(0, Pattern(kBlock, 2)));      // pool block 4
  testing::ForwardingBlockDevice& data = *f.data_forwarder;
  using Calls = std::vector<testing::ForwardingBlockDevice::ReadAroundCall>;
  auto calls = [&] {
    std::lock_guard<std::mutex> l(data.prefetch_mu);
    return std::exchange(data.read_arounds, {});
  };
  calls();
  const std::vector<std::byte> written = Pattern(4 * kBlock, 1);
  std::vector<std::byte> buf(4096);
  auto read = [&](Volume& vol, uint64_t offset, size_t len) {
    buf.resize(len);
    ASSERT_TRUE(vol.Read(offset, buf).ok());
  };
  auto expect_written = [&](uint64_t offset) {
    EXPECT_TRUE(std::equal(buf.begin(), buf.end(), written.begin() + static_cast<ptrdiff_t>(offset)))
        << "at " << offset;
  };

  read(*v, 2 * kBlock + 8192, 4096);
  expect_written(2 * kBlock + 8192);
  EXPECT_EQ(calls(), (Calls{{2, 8192, 4096}}));
  // In order after it: the host's readahead's, not read around.
  read(*v, 2 * kBlock + 12288, 4096);
  read(*v, 2 * kBlock + 16384, 8192);
  expect_written(2 * kBlock + 16384);
  EXPECT_EQ(calls(), Calls{});
  // Out of order again, and a read within one block of another device in
  // between does not break v's order.
  read(*v, 0, 4096);
  read(*w, 100, 4096);
  read(*v, 4096, 4096);
  expect_written(4096);
  read(*v, 3 * kBlock + 4096, 512);
  expect_written(3 * kBlock + 4096);
  EXPECT_EQ(calls(), (Calls{{0, 0, 4096}, {4, 100, 4096}, {3, 4096, 512}}));
  // A hole: nothing to read around.
  read(*v, 9 * kBlock, 4096);
  EXPECT_EQ(buf, std::vector<std::byte>(4096));
  // Several blocks: the prefetch path, not this one.
  read(*v, kBlock - 4096, 8192);
  expect_written(kBlock - 4096);
  read(*v, 0, 4 * kBlock);
  expect_written(0);
  EXPECT_EQ(calls(), Calls{});
}

// A reader that keeps its own cache (ReadCache::kReader: the volume opened
// O_DIRECT) has a read of several blocks that the host's cache does not
// hold read past it (lever 46): no prefetch hint and no read through a
// scratch buffer, only the probe, then ReadPieces with kBypass; kHeld where
// the probe finds the blocks cached. Reads within one block, and every read
// where the device cannot read past its cache, take the usual paths. What
// is read is the same every way: mapped blocks, holes, a snapshot's shared
// blocks and the origin's copied-on-write ones, some still owing their copy.
TEST(PoolTest, ReadsForAReaderWithItsOwnCacheGoPastTheHostsCache) {
  constexpr uint64_t kBlock = 64 << 10;
  EngineFixture f(kBlock, 256);
  ASSERT_TRUE(f.pool->CreateDevice("v", 16 * kBlock).ok());
  auto v = Open(*f.pool, "v");
  std::vector<std::byte> want(16 * kBlock);
  const std::vector<std::byte> first = Pattern(6 * kBlock, 1);
  std::copy(first.begin(), first.end(), want.begin());  // vblocks 6-15: holes
  ASSERT_OK(v->Write(0, first));
  ASSERT_OK(f.pool->Commit());
  ASSERT_TRUE(f.pool->CreateSnapshot("v", "s").ok());
  auto s = Open(*f.pool, "s");
  const std::vector<std::byte> snapped = want;
  // 4 KiB into vblocks 1 and 3: copy-on-write, the rest owed to the commit.
  for (uint64_t b : {1, 3}) {
    const std::vector<std::byte> part = Pattern(4096, 10 + b);
    ASSERT_OK(v->Write(b * kBlock + 8192, part));
    std::copy(part.begin(), part.end(), want.begin() + static_cast<ptrdiff_t>(b * kBlock + 8192));
  }
  testing::ForwardingBlockDevice& data = *f.data_forwarder;
  data.report_cold = true;
  auto taken = [&] {
    std::lock_guard<std::mutex> l(data.prefetch_mu);
    auto r = std::make_pair(std::exchange(data.piece_caches, {}), std::exchange(data.prefetched, {}));
    data.prefetched_ahead.clear();
    data.prefetch_reads.clear();
    return r;
  };
  using Cache = BlockDevice::Cache;
  using Caches = std::vector<Cache>;
  using Hints = std::vector<std::pair<uint64_t, uint64_t>>;
  std::vector<std::byte> buf(16 * kBlock);
  auto read = [&](Volume& vol, uint64_t offset, size_t len, ReadCache cache) {
    buf.assign(len, std::byte{0x5a});
    ASSERT_OK(vol.Read(offset, buf, cache).status());
  };
  auto expect = [&](const std::vector<std::byte>& of, uint64_t offset, const char* what) {
    EXPECT_TRUE(std::equal(buf.begin(), buf.end(), of.begin() + static_cast<ptrdiff_t>(offset)))
        << what << " at " << offset;
  };
  taken();
  // The device cannot read past its cache: kReader reads as kHost does.
  read(*v, 0, 16 * kBlock, ReadCache::kReader);
  expect(want, 0, "origin");
  EXPECT_EQ(taken().first, Caches{Cache::kUnknown});
  data.reads_past_cache = true;
  for (uint64_t offset : {uint64_t{0}, kBlock / 2, 5 * kBlock}) {
    read(*v, offset, 16 * kBlock - offset - kBlock, ReadCache::kReader);
    expect(want, offset, "origin");
    auto [caches, hints] = taken();
    EXPECT_EQ(caches, Caches{Cache::kBypass}) << offset;
    EXPECT_EQ(hints, Hints{}) << "a bypassing read hinted, at " << offset;
  }
  read(*s, 0, 8 * kBlock, ReadCache::kReader);
  expect(snapped, 0, "snapshot");
  EXPECT_EQ(taken().first, Caches{Cache::kBypass});
  // Cached: copied out of the host's cache as for any reader.
  data.report_cold = false;
  data.report_cached = true;
  read(*v, 0, 4 * kBlock, ReadCache::kReader);
  expect(want, 0, "origin");
  EXPECT_EQ(taken().first, Caches{Cache::kHeld});
  // The host's cache's reader, and a read within one block: as before.
  data.report_cached = false;
  data.report_cold = true;
  read(*v, 0, 4 * kBlock, ReadCache::kHost);
  expect(want, 0, "origin");
  auto [caches, hints] = taken();
  EXPECT_EQ(caches, Caches{Cache::kUnknown});
  EXPECT_FALSE(hints.empty()) << "a cold read for the host's cache was not hinted";
  read(*v, 3 * kBlock + 4096, 8192, ReadCache::kReader);
  expect(want, 3 * kBlock + 4096, "origin");
  EXPECT_EQ(taken().first, Caches{});
  ASSERT_OK(f.pool->Commit());
  read(*v, 0, 16 * kBlock, ReadCache::kReader);
  expect(want, 0, "origin after the commit");
  read(*s, 0, 16 * kBlock, ReadCache::kReader);
  expect(snapped, 0, "snapshot after the commit");
}

// A writer with no cache of its own (WriteCache::kWriter: the volume opened
// O_DIRECT) has the data of a write that continues one of its last few
// writes (a stream, a file written through a loop device) head for the
// disk at once (lever 51): StartWriteback of exactly the runs of pool
// blocks the write wrote through the data device. Nothing for the first
// write of a stream, a random write, the host cache's writers, whole-block
// zeros (which unmap), or a block that owes its copy (the copy writes it).
// Pieces of a stream may arrive out of order (a loop device's 1280 KiB
// request as 1024 + 256 KiB). What is written is the same every way.
TEST(PoolTest, StreamsOfAWriterWithoutACacheStartTheirWriteback) {
  constexpr uint64_t kBlock = 64 << 10;
  constexpr uint64_t kMiB = 1 << 20;
  EngineFixture f(kBlock, 512);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kMiB).ok());
  auto v = Open(*f.pool, "v");
  testing::ForwardingBlockDevice& data = *f.data_forwarder;
  data.record_writes = true;
  using Runs = std::vector<std::pair<uint64_t, uint64_t>>;
  struct Taken {
    Runs hints;                 // StartWriteback's runs
    Runs wrote;                 // the pool blocks written, as runs in order
    std::set<uint64_t> blocks;  // the same, as a set
  };
  // What happened since the last call.
  auto taken = [&] {
    std::lock_guard<std::mutex> l(data.prefetch_mu);
    std::lock_guard<std::mutex> w(data.writes_mu);
    Taken t;
    t.hints = std::exchange(data.written_back, {});
    for (const auto& io : data.writes) {
      if (!t.blocks.insert(io.block).second) continue;
      if (!t.wrote.empty() && t.wrote.back().first + t.wrote.back().second == io.block) {
        ++t.wrote.back().second;
      } else {
        t.wrote.emplace_back(io.block, 1);
      }
    }
    data.writes.clear();
    return t;
  };
  std::vector<std::byte> want(8 * kMiB);
  uint32_t seed = 1;
  auto write = [&](uint64_t offset, uint64_t len, WriteCache cache) {
    const std::vector<std::byte> bytes = Pattern(len, seed++);
    ASSERT_OK(v->Write(offset, bytes, cache));
    std::copy(bytes.begin(), bytes.end(), want.begin() + static_cast<ptrdiff_t>(offset));
  };
  // The host cache's writer: never hinted, however sequential.
  write(0, kMiB, WriteCache::kHost);
  write(kMiB, kMiB, WriteCache::kHost);
  EXPECT_EQ(taken().hints, Runs{});
  // A stream's first write is not hinted; one that continues it is.
  write(2 * kMiB, kMiB, WriteCache::kWriter);
  EXPECT_EQ(taken().hints, Runs{});
  write(3 * kMiB, kMiB / 4, WriteCache::kWriter);
  {
    Taken t = taken();
    EXPECT_EQ(t.hints, t.wrote);
    EXPECT_EQ(t.blocks.size(), 4u);
  }
  // The next request's halves out of order: its second half, first, does
  // not continue anything; its first half does, and so does the request
  // after it.
  write(4 * kMiB + kMiB / 4, kMiB / 4, WriteCache::kWriter);
  EXPECT_EQ(taken().hints, Runs{});
  for (uint64_t offset : {3 * kMiB + kMiB / 4, 4 * kMiB + kMiB / 2}) {
    write(offset, offset == 3 * kMiB + kMiB / 4 ? kMiB : kMiB / 2, WriteCache::kWriter);
    Taken t = taken();
    EXPECT_EQ(t.hints, t.wrote) << offset;
    EXPECT_FALSE(t.hints.empty()) << offset;
  }
  // Random writes: none continues another.
  for (uint64_t offset : {6 * kMiB, 5 * kMiB + 8192, 7 * kMiB + kBlock}) {
    write(offset, 4096, WriteCache::kWriter);
    EXPECT_EQ(taken().hints, Runs{}) << offset;
  }
  // Whole blocks of zeros that continue the stream (at 5 MiB) unmap:
  // nothing is written, nothing hinted.
  {
    const std::vector<std::byte> zeros(2 * kBlock);
    ASSERT_OK(v->Write(5 * kMiB, zeros, WriteCache::kWriter));
    std::fill_n(want.begin() + static_cast<ptrdiff_t>(5 * kMiB), zeros.size(), std::byte{0});
    Taken t = taken();
    EXPECT_EQ(t.hints, Runs{});
    EXPECT_EQ(t.wrote, Runs{});
  }
  // After a snapshot: partial writes copy on write and owe the rest of
  // their block to the commit, which writes it; such a block is not
  // hinted, nor written into in place while it owes. A whole block over a
  // shared one is a new block, written and hinted.
  ASSERT_OK(f.pool->Commit());
  ASSERT_TRUE(f.pool->CreateSnapshot("v", "s").ok());
  write(3 * kMiB - 4096, 4096, WriteCache::kWriter);  // starts a stream
  EXPECT_EQ(taken().hints, Runs{});
  write(3 * kMiB, 4096, WriteCache::kWriter);  // continues it: owed
  EXPECT_EQ(taken().hints, Runs{});
  write(3 * kMiB + 4096, 4096, WriteCache::kWriter);  // in place, owing
  EXPECT_EQ(taken().hints, Runs{});
  write(3 * kMiB + 8192, 2 * kBlock - 8192, WriteCache::kWriter);  // owing, then whole
  {
    Taken t = taken();
    ASSERT_EQ(t.hints.size(), 1u);
    EXPECT_EQ(t.hints[0].second, 1u);
    EXPECT_TRUE(t.blocks.count(t.hints[0].first)) << "hinted a block not written";
  }
  std::vector<std::byte> got(8 * kMiB);
  ASSERT_OK(v->Read(0, got).status());
  EXPECT_TRUE(got == want);
  ASSERT_OK(f.pool->Commit());
  ASSERT_OK(v->Read(0, got).status());
  EXPECT_TRUE(got == want) << "after the commit";
}

// The whole blocks of a stream of a writer with no cache of its own go
// past the host's cache, consecutive pool blocks in one write, new blocks
// and blocks overwritten in place alike; parts of a block, zeros and the
// writes that are not a stream go through it (docs/benchmarks.md, lever
// 52). A failed write maps nothing and gives its new blocks back.
TEST(PoolTest, WholeBlocksOfAStreamAreWrittenPastTheCacheInRuns) {
  constexpr uint64_t kBlock = 64 << 10;
  constexpr uint64_t kMiB = 1 << 20;
  EngineFixture f(kBlock, 512);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kMiB).ok());
  auto v = Open(*f.pool, "v");
  testing::ForwardingBlockDevice& data = *f.data_forwarder;
  data.record_writes = true;
  data.writes_past_cache = true;
  using Io = testing::ForwardingBlockDevice::WriteIo;
  using Ios = std::vector<Io>;
  // (writes through the cache, writes past it) since the last call.
  auto taken = [&] {
    std::lock_guard<std::mutex> l(data.writes_mu);
    return std::make_pair(std::exchange(data.writes, {}), std::exchange(data.past_cache_writes, {}));
  };
  std::vector<std::byte> want(8 * kMiB);
  uint32_t seed = 1;
  auto write = [&](uint64_t offset, uint64_t len, WriteCache cache) {
    const std::vector<std::byte> bytes = Pattern(len, seed++);
    ASSERT_OK(v->Write(offset, bytes, cache));
    std::copy(bytes.begin(), bytes.end(), want.begin() + static_cast<ptrdiff_t>(offset));
  };
  // The host cache's writer, and a stream's first write: all through it.
  write(0, kMiB + 4096, WriteCache::kHost);
  EXPECT_EQ(taken().second, Ios{});
  write(kMiB + 4096, kMiB - 4096, WriteCache::kWriter);
  EXPECT_EQ(taken().second, Ios{});
  // A stream: 16 new whole blocks in one write past the cache, then the
  // part of the 17th through the cache (a new block, written whole with
  // zeros around the part), on the next block of the same run.
  uint64_t provisions = f.pool->Stats().provisions;
  write(2 * kMiB, kMiB + 8192, WriteCache::kWriter);
  {
    auto [through, past] = taken();
    ASSERT_EQ(past.size(), 1u);
    EXPECT_EQ(past[0].offset, 0u);
    EXPECT_EQ(past[0].len, kMiB);
    ASSERT_EQ(through.size(), 1u);
    EXPECT_EQ(through[0].block, past[0].block + 16) << "the request's blocks out of order";
    EXPECT_EQ(through[0].len, kBlock);
  }
  EXPECT_EQ(f.pool->Stats().provisions - provisions, 17u);
  // Over its own blocks (it continues the write that ended at 2 MiB): in
  // place, past the cache, no new block.
  provisions = f.pool->Stats().provisions;
  uint64_t first_past = 0;
  {
    const auto& ios = f.pool->MappedBlockForTesting(v->id(), 2 * kMiB / kBlock);
    ASSERT_TRUE(ios.ok() && *ios);
    first_past = (*ios)->value;
  }
  write(2 * kMiB, kMiB, WriteCache::kWriter);
  {
    auto [through, past] = taken();
    EXPECT_EQ(through, Ios{});
    EXPECT_EQ(past, (Ios{Io{first_past, 0, kMiB}}));
  }
  EXPECT_EQ(f.pool->Stats().provisions, provisions);
  // Whole blocks of zeros that continue the stream unmap: nothing written.
  {
    const std::vector<std::byte> zeros(2 * kBlock);
    ASSERT_OK(v->Write(3 * kMiB, zeros, WriteCache::kWriter));
    std::fill_n(want.begin() + static_cast<ptrdiff_t>(3 * kMiB), zeros.size(), std::byte{0});
    auto [through, past] = taken();
    EXPECT_EQ(through, Ios{});
    EXPECT_EQ(past, Ios{});
  }
  // A write that fails maps nothing and gives its new blocks back.
  ASSERT_OK(f.pool->Commit());
  const uint64_t used = f.pool->Stats().used_blocks;
  data.during_past_write = [&] { f.data->FailNthIo(1); };
  const std::vector<std::byte> lost = Pattern(kMiB, 99);
  EXPECT_FALSE(v->Write(3 * kMiB + 2 * kBlock, lost, WriteCache::kWriter).ok());
  ASSERT_OK(f.pool->Commit());
  EXPECT_EQ(f.pool->Stats().used_blocks, used);
  taken();
  std::vector<std::byte> got(8 * kMiB);
  ASSERT_OK(v->Read(0, got).status());
  EXPECT_TRUE(got == want);
  // What a commit made durable reads back after a power loss.
  ASSERT_OK(f.pool->Commit());
  f.Crash();
  EXPECT_TRUE(f.ReadAll("v") == want) << "after a crash";
  f.CheckConsistency(/*exact_usage=*/false);
}

// A stream's new blocks are mapped only once their data are written past
// the cache: a read of them waits for the write, and a commit made while
// the data are being written does not map them, so that after a power loss
// the device never shows what the data area held before (here, the bytes
// of a deleted device).
TEST(PoolTest, AStreamsNewBlocksAreMappedOnlyOnceWritten) {
  constexpr uint64_t kBlock = 64 << 10;
  constexpr uint64_t kMiB = 1 << 20;
  EngineFixture f(kBlock, 512);
  ASSERT_TRUE(f.pool->CreateDevice("v", 4 * kMiB).ok());
  auto v = Open(*f.pool, "v");
  const std::vector<std::byte> stale(kBlock, std::byte{0xEE});
  for (uint64_t b = 0; b < 512; ++b) ASSERT_OK(f.data->Write(PoolBlock(b), 0, stale));
  ASSERT_OK(f.data->Sync());
  testing::ForwardingBlockDevice& data = *f.data_forwarder;
  data.writes_past_cache = true;
  ASSERT_OK(v->Write(0, Pattern(kMiB, 1), WriteCache::kWriter));  // starts the stream
  const std::vector<std::byte> bytes = Pattern(kMiB, 2);
  std::vector<std::byte> got(kMiB);
  std::atomic<bool> read_done{false};
  bool read_waited = false;
  std::thread reader;
  data.during_past_write = [&] {
    reader = std::thread([&] {
      EXPECT_OK(v->Read(kMiB, got).status());
      read_done.store(true);
    });
    std::thread committer([&] { EXPECT_OK(f.pool->Commit()); });
    committer.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    read_waited = !read_done.load();
  };
  ASSERT_OK(v->Write(kMiB, bytes, WriteCache::kWriter));
  ASSERT_TRUE(reader.joinable()) << "the write did not go past the cache";
  reader.join();
  EXPECT_TRUE(read_waited) << "a read of the blocks being written did not wait for them";
  EXPECT_TRUE(got == bytes) << "read " << static_cast<int>(got[0]) << " first";
  f.Crash();
  const std::vector<std::byte> after = f.ReadAll("v");
  ASSERT_EQ(after.size(), 4 * kMiB);
  EXPECT_TRUE(std::equal(after.begin(), after.begin() + kMiB, Pattern(kMiB, 1).begin()));
  EXPECT_TRUE(std::all_of(after.begin() + kMiB, after.begin() + 2 * kMiB,
                          [](std::byte x) { return x == std::byte{0}; }))
      << "the commit made during the write mapped its blocks: read "
      << static_cast<int>(after[kMiB]) << " first";
}

// A sequential reader whose blocks lie scattered in the data area gets
// readahead in the device's block order: a cold read of several runs that
// starts where the last read ended hints the next 4 MiB of the device (4
// blocks of 1 MiB here), and reads in order move that window on once they
// are within half of it of its end (docs/benchmarks.md, lever 22).
TEST(PoolReadAheadTest, ScatteredSequentialReadsHintTheDevicesNextBlocks) {
  constexpr uint64_t kMiB = 1 << 20;
  EngineFixture f(kMiB, 80);
  ASSERT_TRUE(f.pool->CreateDevice("v", 32 * kMiB).ok());
  ASSERT_TRUE(f.pool->CreateDevice("c", 8 * kMiB).ok());
  auto v = Open(*f.pool, "v");
  auto c = Open(*f.pool, "c");
  // vblock i < 16 on pool block 2i, vblock 16 + i on 2i + 1: no two
  // neighbours in the device are neighbours in the pool.
  for (uint64_t i = 0; i < 16; ++i) {
    ASSERT_OK(v->Write(i * kMiB, Pattern(kMiB, i)));
    ASSERT_OK(v->Write((16 + i) * kMiB, Pattern(kMiB, 16 + i)));
  }
  ASSERT_OK(c->Write(0, Pattern(8 * kMiB, 99)));  // pool blocks 32-39, in order
  ASSERT_OK(f.pool->Commit());
  testing::ForwardingBlockDevice& data = *f.data_forwarder;
  using Hints = std::vector<std::pair<uint64_t, uint64_t>>;
  auto ahead = [&] {
    std::lock_guard<std::mutex> l(data.prefetch_mu);
    return std::exchange(data.prefetched_ahead, {});
  };
  std::vector<std::byte> buf(2 * kMiB);
  auto read = [&](Volume& vol, uint64_t block) {
    EXPECT_TRUE(vol.Read(block * kMiB, buf).ok());
  };
  auto want = [&](uint64_t block) {
    std::vector<std::byte> w = Pattern(kMiB, block);
    std::vector<std::byte> w2 = Pattern(kMiB, block + 1);
    w.insert(w.end(), w2.begin(), w2.end());
    return w;
  };

  // A cache that holds everything: nothing read ahead.
  read(*v, 0);
  read(*v, 2);
  EXPECT_EQ(ahead(), Hints{});

  data.report_cold = true;
  read(*v, 0);  // not where the last read ended (block 4): no window yet
  EXPECT_EQ(ahead(), Hints{});
  read(*v, 2);  // in order, cold and scattered: starts one
  EXPECT_EQ(buf, want(2));
  EXPECT_EQ(ahead(), (Hints{{8, 1}, {10, 1}, {12, 1}, {14, 1}})) << "vblocks 4-7";
  read(*v, 4);  // in order, the window ends 2 blocks ahead: left alone
  EXPECT_EQ(ahead(), Hints{});
  read(*v, 6);  // within half a window of its end: moved on
  EXPECT_EQ(buf, want(6));
  EXPECT_EQ(ahead(), (Hints{{16, 1}, {18, 1}, {20, 1}, {22, 1}})) << "vblocks 8-11";

  // Out of order: the window is dropped, and a new one starts once the
  // reads are in order again, also behind the old window's end.
  read(*v, 0);
  EXPECT_EQ(ahead(), Hints{});
  read(*v, 2);
  EXPECT_EQ(ahead(), (Hints{{8, 1}, {10, 1}, {12, 1}, {14, 1}})) << "vblocks 4-7 again";
  read(*v, 20);
  EXPECT_EQ(ahead(), Hints{});
  read(*v, 22);
  EXPECT_EQ(buf, want(22));
  EXPECT_EQ(ahead(), (Hints{{17, 1}, {19, 1}, {21, 1}, {23, 1}})) << "vblocks 24-27";
  read(*v, 24);
  EXPECT_EQ(ahead(), Hints{});
  // Up to the device's end, not past it.
  read(*v, 26);
  EXPECT_EQ(ahead(), (Hints{{25, 1}, {27, 1}, {29, 1}, {31, 1}})) << "vblocks 28-31";
  read(*v, 28);
  read(*v, 30);
  EXPECT_EQ(buf, want(30));
  EXPECT_EQ(ahead(), Hints{});

  // A contiguous device: one run a read, the host's readahead serves it.
  read(*c, 0);
  read(*c, 2);
  EXPECT_EQ(ahead(), Hints{});
}

// Invariant 2: writing a shared block copies it; an unshared one is written
// in place.
TEST(PoolTest, Invariant2CowExactlyWhenShared) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("o", 4 * kBs).ok());
  auto o = Open(*f.pool, "o");
  auto a = Pattern(kBs, 1);
  ASSERT_OK(o->Write(0, a));
  EXPECT_EQ(f.pool->Stats().provisions, 1u);
  ASSERT_OK(o->Write(10, Pattern(100, 2)));  // in place
  EXPECT_EQ(f.pool->Stats().provisions, 1u);
  std::memcpy(a.data() + 10, Pattern(100, 2).data(), 100);
  ASSERT_TRUE(f.pool->CreateSnapshot("o", "s").ok());
  auto b = Pattern(100, 3);
  ASSERT_OK(o->Write(200, b));  // shared with s: copy
  EXPECT_EQ(f.pool->Stats().provisions, 2u);
  EXPECT_EQ(f.pool->Stats().cow_copies, 1u);
  ASSERT_OK(o->Write(300, b));  // now exclusive: in place
  EXPECT_EQ(f.pool->Stats().provisions, 2u);
  auto s_all = f.ReadAll("s");
  EXPECT_EQ(std::memcmp(s_all.data(), a.data(), kBs), 0) << "snapshot changed by origin write";
  auto o_all = f.ReadAll("o");
  EXPECT_EQ(std::memcmp(o_all.data() + 200, b.data(), 100), 0);
  // Writing the snapshot copies too, and leaves the origin alone.
  auto s = Open(*f.pool, "s");
  ASSERT_OK(s->Write(0, Pattern(kBs, 9)));
  EXPECT_EQ(f.ReadAll("o"), o_all);
  f.CheckConsistency(false);
}

// Invariant 3: a new block never shows another device's old bytes.
TEST(PoolTest, Invariant3NoStaleData) {
  EngineFixture f(kBs, 16);
  ASSERT_TRUE(f.pool->CreateDevice("a", 16 * kBs).ok());
  auto a = Open(*f.pool, "a");
  std::vector<std::byte> fill(16 * kBs, std::byte{0xAB});
  ASSERT_OK(a->Write(0, fill));
  EXPECT_EQ(f.pool->Stats().free_blocks, 0u);
  a.reset();
  ASSERT_OK(f.pool->DeleteDevice("a"));
  ASSERT_OK(f.pool->RunGcForTesting());
  EXPECT_EQ(f.pool->Stats().free_blocks, 16u);
  ASSERT_TRUE(f.pool->CreateDevice("b", 16 * kBs).ok());
  auto b = Open(*f.pool, "b");
  for (uint64_t blk = 0; blk < 16; ++blk) ASSERT_OK(b->Write(blk * kBs + 5, Pattern(3, 1)));
  auto all = f.ReadAll("b");
  for (uint64_t blk = 0; blk < 16; ++blk) {
    for (uint64_t i = 0; i < kBs; ++i) {
      if (i >= 5 && i < 8) continue;
      ASSERT_EQ(all[blk * kBs + i], std::byte{0}) << "stale byte in block " << blk;
    }
  }
}

// Lever 38: write requests that allocate at the same time each get their
// new blocks as one run of consecutive pool blocks. The device holds every
// thread's first data write until all four threads have taken their first
// block, so blocks taken one at a time would interleave (fails so without
// BlockRun).
TEST(PoolTest, ConcurrentWriteRequestsEachGetOneRunOfBlocks) {
  constexpr int kThreads = 4;
  constexpr uint64_t kPerRequest = 16;
  EngineFixture f(kBs, 1024);
  ASSERT_TRUE(f.pool->CreateDevice("v", kThreads * kPerRequest * kBs).ok());
  auto v = Open(*f.pool, "v");
  std::barrier gate(kThreads);
  f.data_forwarder->each_write = [&gate] {
    thread_local bool waited = false;
    if (!waited) {
      waited = true;
      gate.arrive_and_wait();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&v, t] {
      auto data = Pattern(kPerRequest * kBs, static_cast<uint32_t>(t + 1));
      EXPECT_OK(v->Write(static_cast<uint64_t>(t) * kPerRequest * kBs, data));
    });
  }
  for (auto& t : threads) t.join();
  f.data_forwarder->each_write = nullptr;
  for (int t = 0; t < kThreads; ++t) {
    const uint64_t first_vblock = static_cast<uint64_t>(t) * kPerRequest;
    auto first = f.pool->MappedBlockForTesting(v->id(), first_vblock);
    ASSERT_TRUE(first.ok() && *first);
    for (uint64_t i = 1; i < kPerRequest; ++i) {
      auto m = f.pool->MappedBlockForTesting(v->id(), first_vblock + i);
      ASSERT_TRUE(m.ok() && *m);
      EXPECT_EQ((*m)->value, (*first)->value + i) << "request " << t << ", block " << i;
    }
    std::vector<std::byte> got(kPerRequest * kBs);
    ASSERT_TRUE(v->Read(first_vblock * kBs, got).ok());
    EXPECT_EQ(got, Pattern(kPerRequest * kBs, static_cast<uint32_t>(t + 1)));
  }
  // No run's block is left over: the pool uses what the device maps.
  EXPECT_EQ(f.pool->Stats().used_blocks, kThreads * kPerRequest);
  ASSERT_OK(f.pool->Commit());
  f.CheckConsistency(/*exact_usage=*/true);
}

// A request whose later blocks need no new block (overwritten in place)
// gives the rest of its run back when it ends, and the next allocation
// starts where the unused tail began.
TEST(PoolTest, AWriteRequestGivesBackTheUnusedTailOfItsRun) {
  EngineFixture f(kBs, 1024);
  ASSERT_TRUE(f.pool->CreateDevice("v", 64 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(8 * kBs, Pattern(8 * kBs, 1)));  // blocks 8-15, in place below
  ASSERT_EQ(f.pool->Stats().used_blocks, 8u);
  // Blocks 0-7 new, 8-15 in place: the run of 16 taken at block 0 has 8 to spare.
  ASSERT_OK(v->Write(0, Pattern(16 * kBs, 2)));
  EXPECT_EQ(f.pool->Stats().used_blocks, 16u);
  for (uint64_t b = 0; b < 16; ++b) EXPECT_TRUE(f.space->IsAllocated(PoolBlock(b))) << b;
  for (uint64_t b = 16; b < 32; ++b) EXPECT_FALSE(f.space->IsAllocated(PoolBlock(b))) << b;
  ASSERT_OK(v->Write(40 * kBs, Pattern(kBs, 3)));
  auto m = f.pool->MappedBlockForTesting(v->id(), 40);
  ASSERT_TRUE(m.ok() && *m);
  EXPECT_EQ((*m)->value, 16u);
  EXPECT_EQ(f.ReadAll("v").size(), 64 * kBs);
  ASSERT_OK(f.pool->Commit());
  f.CheckConsistency(/*exact_usage=*/true);
}

// Runs are not taken near full, where one request's spare blocks could make
// another fail: concurrent requests fill a pool to its last block.
TEST(PoolTest, ConcurrentWriteRequestsFillThePoolToTheLastBlock) {
  constexpr uint64_t kBlocks = 512;
  EngineFixture f(kBs, kBlocks);
  ASSERT_TRUE(f.pool->CreateDevice("v", kBlocks * kBs).ok());
  auto v = Open(*f.pool, "v");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&v, t] {
      // Thread t writes requests t, t + 4, ... of 16 blocks each.
      for (uint64_t r = static_cast<uint64_t>(t); r < kBlocks / 16; r += 4) {
        EXPECT_OK(v->Write(r * 16 * kBs, Pattern(16 * kBs, static_cast<uint32_t>(r + 1))));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(f.pool->Stats().used_blocks, kBlocks);
  // Read back a request at a time: a read holds the stripe locks of all its
  // blocks, and ThreadSanitizer's deadlock detector allows a thread 64.
  std::vector<std::byte> got(16 * kBs);
  for (uint64_t r = 0; r < kBlocks / 16; ++r) {
    ASSERT_TRUE(v->Read(r * 16 * kBs, got).ok());
    EXPECT_EQ(got, Pattern(16 * kBs, static_cast<uint32_t>(r + 1))) << "request " << r;
  }
  ASSERT_OK(f.pool->Commit());
  f.CheckConsistency(/*exact_usage=*/true);
}

// Invariant 4: a freed block is reusable only after the commit that freed it.
TEST(PoolTest, Invariant4FreesWaitForCommit) {
  EngineFixture f(kBs, 8);
  ASSERT_TRUE(f.pool->CreateDevice("v", 4 * kBs).ok());
  auto v = Open(*f.pool, "v");
  auto data = Pattern(kBs, 4);
  ASSERT_OK(v->Write(0, data));
  ASSERT_OK(f.pool->Commit());
  auto m = f.pool->MappedBlockForTesting(v->id(), 0);
  ASSERT_TRUE(m.ok() && *m);
  PoolBlock blk = **m;
  ASSERT_OK(v->Discard(0, kBs));
  EXPECT_TRUE(f.space->IsAllocated(blk)) << "freed before the commit";
  // A crash now must bring the old mapping and its data back intact.
  f.Crash();
  EXPECT_EQ(std::memcmp(f.ReadAll("v").data(), data.data(), kBs), 0);
  v = Open(*f.pool, "v");
  ASSERT_OK(v->Discard(0, kBs));
  ASSERT_OK(f.pool->Commit());
  EXPECT_FALSE(f.space->IsAllocated(blk));
  EXPECT_EQ(f.ReadAll("v"), std::vector<std::byte>(4 * kBs));
}

// Invariant 5: after Flush, everything written before survives power loss.
TEST(PoolTest, Invariant5FlushIsDurable) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kBs).ok());
  auto v = Open(*f.pool, "v");
  auto first = Pattern(3 * kBs + 17, 5);
  ASSERT_OK(v->Write(100, first));
  ASSERT_OK(v->Flush());
  ASSERT_OK(v->Write(100, Pattern(kBs, 6)));  // in place, not flushed
  ASSERT_OK(v->Write(6 * kBs, Pattern(kBs, 7)));  // new block, not flushed
  v.reset();
  f.Crash();
  auto all = f.ReadAll("v");
  EXPECT_EQ(std::memcmp(all.data() + 100, first.data(), first.size()), 0);
  EXPECT_EQ(f.pool->GetDevice("v")->mapped_blocks, 4u);
  f.CheckConsistency(false);
}

// Invariant 6: after a crash the space map covers every mapped block.
TEST(PoolTest, Invariant6BitmapNeverUnderReports) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 32 * kBs).ok());
  auto v = Open(*f.pool, "v");
  for (int round = 0; round < 5; ++round) {
    for (uint64_t b = 0; b < 32; b += 2) ASSERT_OK(v->Write(b * kBs, Pattern(kBs, round)));
    ASSERT_OK(f.pool->Commit());
    ASSERT_OK(v->Discard(0, 16 * kBs));
    ASSERT_TRUE(f.pool->CreateSnapshot("v", "s" + std::to_string(round)).ok());
    for (uint64_t b = 1; b < 32; b += 4) ASSERT_OK(v->Write(b * kBs, Pattern(kBs, round + 9)));
    v.reset();
    f.Crash();
    f.CheckConsistency(false);
    v = Open(*f.pool, "v");
  }
}

// Invariant 7: a full pool fails writes that need a block, and only those.
TEST(PoolTest, Invariant7FullPoolIsAnError) {
  EngineFixture f(kBs, 4);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kBs).ok());
  auto v = Open(*f.pool, "v");
  auto data = Pattern(4 * kBs, 8);
  ASSERT_OK(v->Write(0, data));
  Status s = v->Write(4 * kBs, Pattern(kBs, 9));
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  // Reads and in-place overwrites still work; nothing written is lost.
  ASSERT_OK(v->Write(kBs, Pattern(kBs, 10)));
  std::memcpy(data.data() + kBs, Pattern(kBs, 10).data(), kBs);
  auto all = f.ReadAll("v");
  EXPECT_EQ(std::memcmp(all.data(), data.data(), 4 * kBs), 0);
  // Discarding makes room again (the free waits for the commit the engine
  // runs when it finds the pool full).
  ASSERT_OK(v->Discard(0, kBs));
  ASSERT_OK(v->Write(4 * kBs, Pattern(kBs, 9)));
}

TEST(PoolTest, NoSpaceTimeoutWaitsThenFails) {
  PoolOptions o = EngineFixture::DefaultOptions();
  o.no_space_timeout = std::chrono::milliseconds(300);
  EngineFixture f(kBs, 2, o);
  ASSERT_TRUE(f.pool->CreateDevice("v", 4 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(0, Pattern(2 * kBs, 1)));
  auto start = std::chrono::steady_clock::now();
  Status s = v->Write(2 * kBs, Pattern(kBs, 2));
  EXPECT_TRUE(s.IsNoSpace());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));
}

TEST(PoolTest, ZeroDetectionUnmaps) {
  EngineFixture f(kBs, 16);
  ASSERT_TRUE(f.pool->CreateDevice("v", 4 * kBs).ok());
  auto v = Open(*f.pool, "v");
  std::vector<std::byte> zeros(kBs);
  ASSERT_OK(v->Write(0, zeros));
  EXPECT_EQ(f.pool->Stats().provisions, 0u);
  ASSERT_OK(v->Write(kBs, Pattern(kBs, 1)));
  EXPECT_EQ(f.pool->GetDevice("v")->mapped_blocks, 1u);
  ASSERT_OK(v->Write(kBs, zeros));
  EXPECT_EQ(f.pool->GetDevice("v")->mapped_blocks, 0u);
  ASSERT_OK(f.pool->Commit());
  EXPECT_EQ(f.pool->Stats().used_blocks, 0u);

  PoolOptions o = EngineFixture::DefaultOptions();
  o.zero_detection = false;
  EngineFixture g(kBs, 16, o);
  ASSERT_TRUE(g.pool->CreateDevice("v", 4 * kBs).ok());
  auto w = Open(*g.pool, "v");
  ASSERT_OK(w->Write(0, zeros));
  EXPECT_EQ(g.pool->GetDevice("v")->mapped_blocks, 1u);
}

// The same for a writer with no cache of its own (WriteCache::kWriter),
// whose whole blocks are planned before they are written (WriteStream):
// the plan's zero check decides, for mapped and unmapped blocks alike, and
// with zero detection off, zeros are data.
TEST(PoolTest, ZeroDetectionUnmapsForAWriterWithoutACache) {
  for (bool detect : {true, false}) {
    SCOPED_TRACE(detect ? "zero detection on" : "zero detection off");
    PoolOptions o = EngineFixture::DefaultOptions();
    o.zero_detection = detect;
    EngineFixture f(kBs, 32, o);
    ASSERT_TRUE(f.pool->CreateDevice("v", 9 * kBs).ok());
    auto v = Open(*f.pool, "v");
    ASSERT_OK(v->Write(0, Pattern(4 * kBs, 1)));
    // Block 0 starts the stream; the rest continues it, over two mapped
    // blocks and four holes: data, zeros, data, zeros..., and data in the
    // first half of block 8 (a part of a block, which the plan leaves to
    // WriteBlock unchecked).
    std::vector<std::byte> want(9 * kBs);
    for (uint64_t b : {0u, 1u, 3u, 5u, 7u, 8u}) {
      const std::vector<std::byte> data = Pattern(b == 8 ? kBs / 2 : kBs, 10 + uint32_t(b));
      std::copy(data.begin(), data.end(), want.begin() + static_cast<ptrdiff_t>(b * kBs));
    }
    const std::span<const std::byte> bytes = std::span(want).first(8 * kBs + kBs / 2);
    ASSERT_OK(v->Write(0, bytes.first(kBs), WriteCache::kWriter));
    ASSERT_OK(v->Write(kBs, bytes.subspan(kBs), WriteCache::kWriter));
    {
      // Only a stream's write hints its runs to the disk (StartWriteback).
      std::lock_guard<std::mutex> l(f.data_forwarder->prefetch_mu);
      EXPECT_FALSE(f.data_forwarder->written_back.empty());
    }
    EXPECT_EQ(f.pool->GetDevice("v")->mapped_blocks, detect ? 6u : 9u);
    std::vector<std::byte> got(9 * kBs, std::byte{0xff});
    ASSERT_TRUE(v->Read(0, got).ok());
    EXPECT_TRUE(got == want);
    ASSERT_OK(f.pool->Commit());
    EXPECT_EQ(f.pool->Stats().used_blocks, detect ? 6u : 9u);
  }
}

TEST(PoolTest, FullBlockWriteNeverReadsOldBlock) {
  EngineFixture f(kBs, 16);
  ASSERT_TRUE(f.pool->CreateDevice("o", 4 * kBs).ok());
  auto o = Open(*f.pool, "o");
  ASSERT_OK(o->Write(0, Pattern(4 * kBs, 1)));
  ASSERT_TRUE(f.pool->CreateSnapshot("o", "s").ok());
  // A whole-block overwrite of a shared block: provision without copying.
  // Make the old block unreadable: the write must still succeed.
  f.data->FailNthIo(0);
  uint64_t cow = f.pool->Stats().cow_copies;
  ASSERT_OK(o->Write(kBs, Pattern(kBs, 2)));
  EXPECT_EQ(f.pool->Stats().cow_copies, cow);
  ASSERT_OK(o->Write(2 * kBs + 1, Pattern(10, 3)));
  EXPECT_EQ(f.pool->Stats().cow_copies, cow + 1);
}

TEST(PoolTest, DiscardAndSeek) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 16 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(3 * kBs, Pattern(2 * kBs, 1)));
  ASSERT_OK(v->Write(10 * kBs, Pattern(kBs, 2)));
  EXPECT_EQ(*v->SeekData(0), 3 * kBs);
  EXPECT_EQ(*v->SeekHole(3 * kBs), 5 * kBs);
  EXPECT_EQ(*v->SeekData(5 * kBs), 10 * kBs);
  EXPECT_EQ(*v->SeekHole(0), 0u);
  EXPECT_EQ(*v->SeekHole(10 * kBs + 5), 11 * kBs);
  EXPECT_TRUE(v->SeekData(11 * kBs).status().IsNotFound());
  // Discard with unaligned edges: whole blocks unmapped, edges zeroed.
  ASSERT_OK(v->Discard(3 * kBs + 100, 2 * kBs));
  auto all = f.ReadAll("v");
  auto p = Pattern(2 * kBs, 1);
  EXPECT_EQ(std::memcmp(all.data() + 3 * kBs, p.data(), 100), 0);
  for (uint64_t i = 3 * kBs + 100; i < 5 * kBs + 100; ++i) ASSERT_EQ(all[i], std::byte{0});
  EXPECT_EQ(f.pool->GetDevice("v")->mapped_blocks, 2u);  // 3 (partly zeroed) and 10
  ASSERT_OK(v->Discard(0, 16 * kBs));
  EXPECT_EQ(f.pool->GetDevice("v")->mapped_blocks, 0u);
  ASSERT_OK(f.pool->Commit());
  EXPECT_EQ(f.pool->Stats().used_blocks, 0u);
}

TEST(PoolTest, DiscardOfSnapshotOriginKeepsSnapshot) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("o", 8 * kBs).ok());
  auto o = Open(*f.pool, "o");
  auto data = Pattern(8 * kBs, 3);
  ASSERT_OK(o->Write(0, data));
  ASSERT_TRUE(f.pool->CreateSnapshot("o", "s").ok());
  ASSERT_OK(o->Discard(0, 8 * kBs));
  EXPECT_EQ(f.ReadAll("o"), std::vector<std::byte>(8 * kBs));
  EXPECT_EQ(f.ReadAll("s"), data);
  ASSERT_OK(o->Write(kBs, Pattern(kBs, 4)));
  ASSERT_OK(o->Discard(kBs, kBs));  // removes the new version, keeps hiding
  EXPECT_EQ(f.ReadAll("o"), std::vector<std::byte>(8 * kBs));
  ASSERT_OK(f.pool->RunGcForTesting());
  f.CheckConsistency(true);
}

TEST(PoolTest, DeleteOriginWithSnapshotsAndCollect) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("o", 8 * kBs).ok());
  auto o = Open(*f.pool, "o");
  auto data = Pattern(8 * kBs, 3);
  ASSERT_OK(o->Write(0, data));
  ASSERT_TRUE(f.pool->CreateSnapshot("o", "s1").ok());
  ASSERT_OK(o->Write(0, Pattern(4 * kBs, 4)));
  ASSERT_TRUE(f.pool->CreateSnapshot("o", "s2").ok());
  o.reset();
  ASSERT_OK(f.pool->DeleteDevice("o"));
  EXPECT_TRUE(f.pool->OpenVolume("o").status().IsNotFound());
  ASSERT_OK(f.pool->RunGcForTesting());
  EXPECT_EQ(f.ReadAll("s1"), data);
  f.CheckConsistency(true);
  EXPECT_EQ(f.pool->Stats().used_blocks, 12u);
  ASSERT_OK(f.pool->DeleteDevice("s1"));
  ASSERT_OK(f.pool->RunGcForTesting());
  f.CheckConsistency(true);
  EXPECT_EQ(f.pool->Stats().used_blocks, 8u);
  ASSERT_OK(f.pool->DeleteDevice("s2"));
  ASSERT_OK(f.pool->RunGcForTesting());
  EXPECT_EQ(f.pool->Stats().used_blocks, 0u);
  // Every record is gone once collected.
  auto recs = f.store->LoadDevices();
  ASSERT_TRUE(recs.ok());
  EXPECT_TRUE(recs->empty());
}

TEST(PoolTest, GcProgressSurvivesRestart) {
  EngineFixture f(kBs, 256);
  ASSERT_TRUE(f.pool->CreateDevice("v", 200 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(0, Pattern(200 * kBs, 1)));
  v.reset();
  ASSERT_OK(f.pool->DeleteDevice("v"));  // committed; collection pending
  f.Crash();
  ASSERT_OK(f.pool->RunGcForTesting());
  EXPECT_EQ(f.pool->Stats().used_blocks, 0u);
}

TEST(PoolTest, ShareRangeSharesAlignedBlocksAndCopiesEdges) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("a", 8 * kBs).ok());
  ASSERT_TRUE(f.pool->CreateDevice("b", 8 * kBs).ok());
  auto a = Open(*f.pool, "a");
  auto b = Open(*f.pool, "b");
  auto data = Pattern(8 * kBs, 1);
  ASSERT_OK(a->Write(0, data));
  uint64_t used = f.pool->Stats().used_blocks;
  ASSERT_OK(f.pool->ShareRange(a->id(), 100, b->id(), 100, 5 * kBs));
  // Blocks 1..4 shared, the edges (block 0 tail, block 5 head) copied.
  EXPECT_EQ(f.pool->Stats().used_blocks, used + 2);
  auto ball = f.ReadAll("b");
  EXPECT_EQ(std::memcmp(ball.data() + 100, data.data() + 100, 5 * kBs), 0);
  f.CheckConsistency(false);
  // Writes on either side stay on that side.
  ASSERT_OK(a->Write(2 * kBs, Pattern(10, 2)));
  ASSERT_OK(b->Write(3 * kBs, Pattern(10, 3)));
  EXPECT_EQ(std::memcmp(f.ReadAll("b").data() + 2 * kBs, data.data() + 2 * kBs, 10), 0);
  EXPECT_EQ(std::memcmp(f.ReadAll("a").data() + 3 * kBs, data.data() + 3 * kBs, 10), 0);
  auto usage = f.pool->ComputeUsage(b->id());
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->mapped_blocks, 6u);
  EXPECT_EQ(usage->shared_blocks, 2u);  // blocks 1 and 4 still shared
  f.CheckConsistency(false);
  a.reset();
  ASSERT_OK(f.pool->DeleteDevice("a"));
  ASSERT_OK(f.pool->RunGcForTesting());
  f.CheckConsistency(true);
}

TEST(PoolTest, WholeDeviceCopyOntoEmptyDeviceIsASnapshot) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("a", 16 * kBs).ok());
  ASSERT_TRUE(f.pool->CreateDevice("b", 16 * kBs).ok());
  auto a = Open(*f.pool, "a");
  ASSERT_OK(a->Write(0, Pattern(16 * kBs, 1)));
  ASSERT_OK(f.pool->Commit());
  uint64_t used = f.pool->Stats().used_blocks;
  ASSERT_OK(f.pool->ShareRange(a->id(), 0, f.pool->GetDevice("b")->id, 0, 16 * kBs));
  EXPECT_EQ(f.counting->last_batch_records.load(), 2u);
  EXPECT_EQ(f.pool->Stats().used_blocks, used);
  EXPECT_EQ(f.ReadAll("b"), f.ReadAll("a"));
  EXPECT_EQ(f.pool->GetDevice("b")->parent_name, "a");
}

// The kernel hands a large copy_file_range over in pieces that are not
// block aligned; a copy from offset 0 onto an empty device stays a clone.
TEST(PoolTest, ChunkedCopyFromZeroIsAClone) {
  EngineFixture f(kBs, 256);
  ASSERT_TRUE(f.pool->CreateDevice("a", 64 * kBs).ok());
  ASSERT_TRUE(f.pool->CreateDevice("b", 64 * kBs).ok());
  auto a = Open(*f.pool, "a");
  ASSERT_OK(a->Write(0, Pattern(64 * kBs, 1)));
  ASSERT_OK(f.pool->Commit());
  uint64_t used = f.pool->Stats().used_blocks;
  auto b = Open(*f.pool, "b");
  const uint64_t chunk = 13 * kBs + 100;
  uint64_t copies = 0;
  for (uint64_t off = 0; off < 64 * kBs; off += chunk) {
    ASSERT_OK(f.pool->ShareRange(a->id(), off, b->id(), off, std::min(chunk, 64 * kBs - off)));
    ++copies;
  }
  EXPECT_EQ(f.ReadAll("b"), f.ReadAll("a"));
  ASSERT_OK(f.pool->Commit());
  // Only the partial edge blocks were copied.
  EXPECT_LE(f.pool->Stats().used_blocks, used + copies);
  EXPECT_EQ(f.pool->GetDevice("b")->parent_name, "a");
  EXPECT_EQ(f.pool->GetDevice("b")->mapped_blocks, 64u);
  // Writes to either side stay on that side; the clone outlives the source.
  ASSERT_OK(b->Write(5, Pattern(10, 2)));
  EXPECT_EQ(std::memcmp(f.ReadAll("a").data() + 5, Pattern(64 * kBs, 1).data() + 5, 10), 0);
  a.reset();
  ASSERT_OK(f.pool->DeleteDevice("a"));
  ASSERT_OK(f.pool->RunGcForTesting());
  auto all = f.ReadAll("b");
  auto want = Pattern(64 * kBs, 1);
  std::memcpy(want.data() + 5, Pattern(10, 2).data(), 10);
  EXPECT_EQ(all, want);
  f.CheckConsistency(true);
}

// A source written between the pieces of a copy is copied as it is at each
// piece: the O(1) continuation is refused and the generic path takes over.
TEST(PoolTest, ChunkedCopyWithSourceChangingInBetween) {
  EngineFixture f(kBs, 256);
  ASSERT_TRUE(f.pool->CreateDevice("a", 32 * kBs).ok());
  ASSERT_TRUE(f.pool->CreateDevice("b", 32 * kBs).ok());
  auto a = Open(*f.pool, "a");
  auto want = Pattern(32 * kBs, 1);
  ASSERT_OK(a->Write(0, want));
  auto b = Open(*f.pool, "b");
  ASSERT_OK(f.pool->ShareRange(a->id(), 0, b->id(), 0, 10 * kBs + 7));
  ASSERT_OK(a->Write(20 * kBs, Pattern(kBs, 5)));
  std::memcpy(want.data() + 20 * kBs, Pattern(kBs, 5).data(), kBs);
  ASSERT_OK(f.pool->ShareRange(a->id(), 10 * kBs + 7, b->id(), 10 * kBs + 7, 22 * kBs - 7));
  EXPECT_EQ(f.ReadAll("b"), want);
  ASSERT_OK(f.pool->RunGcForTesting());
  f.CheckConsistency(true);
}

TEST(PoolTest, UsageSplitsExclusiveAndShared) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("o", 8 * kBs).ok());
  auto o = Open(*f.pool, "o");
  ASSERT_OK(o->Write(0, Pattern(8 * kBs, 1)));
  ASSERT_TRUE(f.pool->CreateSnapshot("o", "s").ok());
  ASSERT_OK(o->Write(0, Pattern(3 * kBs, 2)));  // o moves on for blocks 0-2
  auto su = f.pool->ComputeUsage(f.pool->GetDevice("s")->id);
  ASSERT_TRUE(su.ok());
  EXPECT_EQ(su->mapped_blocks, 8u);
  EXPECT_EQ(su->exclusive_blocks, 3u);  // only s still reads o's old blocks 0-2
  EXPECT_EQ(su->shared_blocks, 5u);
  auto ou = f.pool->ComputeUsage(o->id());
  ASSERT_TRUE(ou.ok());
  EXPECT_EQ(ou->exclusive_blocks, 3u);
  EXPECT_EQ(ou->shared_blocks, 5u);
  ASSERT_OK(f.pool->DeleteDevice("s"));
  ou = f.pool->ComputeUsage(o->id());
  ASSERT_TRUE(ou.ok());
  EXPECT_EQ(ou->exclusive_blocks, 8u);
}

TEST(PoolTest, LogsRecoverySlowCommitsAndKeepsCommitLatency) {
  auto messages = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  PoolOptions o = EngineFixture::DefaultOptions();
  o.slow_commit = std::chrono::milliseconds(-1);  // every commit is "slow"
  o.log = [messages, mu](int level, const std::string& m) {
    std::lock_guard<std::mutex> l(*mu);
    messages->push_back(std::to_string(level) + " " + m);
  };
  EngineFixture f(kBs, 64, o);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kBs).ok());
  auto v = Open(*f.pool, "v");
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK(v->Write(i * 100, Pattern(kBs, i)));
    ASSERT_OK(v->Flush());
  }
  PoolStats st = f.pool->Stats();
  EXPECT_GE(st.commits, 10u);
  EXPECT_LE(st.commit_p50_us, st.commit_p90_us);
  EXPECT_LE(st.commit_p90_us, st.commit_p99_us);
  EXPECT_LE(st.commit_p99_us, st.commit_max_us);
  auto has = [&](const std::string& needle) {
    std::lock_guard<std::mutex> l(*mu);
    for (const std::string& m : *messages) {
      if (m.find(needle) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("1 slow commit"));
  EXPECT_FALSE(has("recovery"));
  v.reset();
  f.Crash();
  EXPECT_TRUE(has("2 recovery: the pool was not closed cleanly"));
  f.store->FailNextCommit();
  v = Open(*f.pool, "v");
  // A new block, so that the commit has metadata to write: an overwrite in
  // place within the clock's tick of the device's times syncs only the data
  // and never reaches the store.
  ASSERT_OK(v->Write(5 * kBs, Pattern(kBs, 99)));
  EXPECT_FALSE(f.pool->Commit().ok());
  EXPECT_TRUE(has("0 commit failed"));
}

TEST(PoolTest, ConcurrentWritersProvisionABlockOnce) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 4 * kBs).ok());
  auto v = Open(*f.pool, "v");
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        EXPECT_OK(v->Write(static_cast<uint64_t>(t) * 16, Pattern(16, t)));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(f.pool->GetDevice("v")->mapped_blocks, 1u);
  ASSERT_OK(f.pool->Commit());
  EXPECT_EQ(f.pool->Stats().used_blocks, 1u);
  auto all = f.ReadAll("v");
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(std::memcmp(all.data() + t * 16, Pattern(16, t).data(), 16), 0);
  }
}

// The pool's background threads carry names (`top -H`, perf, gdb), and
// each is gone once the pool closes.
TEST(PoolTest, BackgroundThreadsAreNamedAndEndWithThePool) {
  auto count_named = [] {
    std::map<std::string, int> named;
    for (const auto& [tid, name] : ThreadNames(getpid())) {
      if (name.starts_with("thinfs-")) ++named[name];
    }
    return named;
  };
  ASSERT_EQ(count_named(), (std::map<std::string, int>{}));
  PoolOptions o = EngineFixture::DefaultOptions();
  o.commit_interval = std::chrono::milliseconds(1000);
  o.background_gc = true;
  o.background_copies = true;
  {
    EngineFixture f(kBs, 64, o);
    EXPECT_EQ(count_named(), (std::map<std::string, int>{
                                 {"thinfs-commit", 1}, {"thinfs-copier", 1}, {"thinfs-gc", 1}}));
  }
  EXPECT_EQ(count_named(), (std::map<std::string, int>{}));
}

TEST(PoolTest, ConcurrentIoSnapshotsAndCommits) {
  PoolOptions o = EngineFixture::DefaultOptions();
  o.commit_interval = std::chrono::milliseconds(5);
  o.background_gc = true;
  EngineFixture f(kBs, 4096, o);
  constexpr int kThreads = 4;
  constexpr uint64_t kBlocks = 64;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(f.pool->CreateDevice("v" + std::to_string(t), kBlocks * kBs).ok());
  }
  std::atomic<bool> stop{false};
  std::thread snapper([&] {
    int n = 0;
    while (!stop.load()) {
      std::string name = "snap" + std::to_string(n % 3);
      (void)f.pool->DeleteDevice(name);
      EXPECT_TRUE(f.pool->CreateSnapshot("v0", name).ok());
      ++n;
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto v = Open(*f.pool, "v" + std::to_string(t));
      std::vector<std::vector<std::byte>> model(kBlocks, std::vector<std::byte>(kBs));
      uint32_t x = 12345 + t;
      for (int i = 0; i < 1500; ++i) {
        x = x * 1103515245 + 12345;
        uint64_t b = (x >> 8) % kBlocks;
        if ((x & 7) == 0) {
          EXPECT_OK(v->Discard(b * kBs, kBs));
          std::fill(model[b].begin(), model[b].end(), std::byte{0});
        } else if ((x & 7) < 4) {
          auto d = Pattern(kBs, x);
          EXPECT_OK(v->Write(b * kBs, d));
          model[b] = d;
        } else {
          std::vector<std::byte> got(kBs);
          EXPECT_TRUE(v->Read(b * kBs, got).ok());
          EXPECT_EQ(got, model[b]) << "thread " << t << " block " << b;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  stop.store(true);
  snapper.join();
  ASSERT_OK(f.pool->RunGcForTesting());
  f.CheckConsistency(true);
}

// Streams of a writer with no cache of its own (lever 52: whole blocks
// planned, written past the cache and mapped after, with several stripes
// held) race discards, reads of several blocks, snapshots of the devices
// being written, commits every 5 ms and the collector. Each thread's
// device reads back as its model says, no snapshot changes after it is
// taken, and the metadata stays exact.
TEST(PoolTest, ConcurrentStreamsSnapshotsAndCommits) {
  PoolOptions o = EngineFixture::DefaultOptions();
  o.commit_interval = std::chrono::milliseconds(5);
  o.background_gc = true;
  constexpr uint64_t kBlock = 64 << 10;  // 4 KiB writes cover parts of one
  EngineFixture f(kBlock, 1024, o);
  f.data_forwarder->writes_past_cache = true;
  constexpr int kThreads = 4;
  constexpr uint64_t kBlocks = 32;
  constexpr uint64_t kSize = kBlocks * kBlock;
  constexpr uint64_t kPage = 4096;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(f.pool->CreateDevice("v" + std::to_string(t), kSize).ok());
  }
  std::atomic<bool> stop{false};
  // A snapshot never changes after it is taken, however its origin is
  // written: read whole twice, a moment apart.
  std::thread snapper([&] {
    std::vector<std::byte> first(kSize), again(kSize);
    for (int n = 0; !stop.load(); ++n) {
      const std::string name = "snap" + std::to_string(n % 3);
      (void)f.pool->DeleteDevice(name);
      EXPECT_TRUE(f.pool->CreateSnapshot("v" + std::to_string(n % 2), name).ok());
      auto snap = Open(*f.pool, name);
      EXPECT_TRUE(snap->Read(0, first).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      EXPECT_TRUE(snap->Read(0, again).ok());
      EXPECT_TRUE(first == again) << name << " of v" << n % 2 << " changed";
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto v = Open(*f.pool, "v" + std::to_string(t));
      std::vector<std::byte> model(kSize);
      std::mt19937_64 rng(77 + t);
      uint64_t at = 0;
      for (int i = 0; i < 600; ++i) {
        const uint64_t op = rng() % 8;
        // Mostly a stream: the next write starts where the last ended.
        if (rng() % 4 == 0 || at >= kSize) at = rng() % (kSize / kPage) * kPage;
        const uint64_t len = std::min<uint64_t>(
            kSize - at, (1 + rng() % (5 * kBlock / kPage)) * kPage);
        if (op == 0) {
          EXPECT_OK(v->Discard(at, len));
          std::fill_n(model.begin() + static_cast<ptrdiff_t>(at), len, std::byte{0});
        } else if (op < 6) {
          const std::vector<std::byte> d = Pattern(len, static_cast<uint32_t>(rng()));
          EXPECT_OK(v->Write(at, d, WriteCache::kWriter));
          std::copy(d.begin(), d.end(), model.begin() + static_cast<ptrdiff_t>(at));
          at += len;
        } else {
          std::vector<std::byte> got(len);
          EXPECT_TRUE(v->Read(at, got).ok());
          EXPECT_TRUE(std::equal(got.begin(), got.end(),
                                 model.begin() + static_cast<ptrdiff_t>(at)))
              << "thread " << t << " at " << at << " length " << len;
        }
      }
      std::vector<std::byte> all(kSize);
      EXPECT_TRUE(v->Read(0, all).ok());
      EXPECT_TRUE(all == model) << "thread " << t;
    });
  }
  for (auto& t : threads) t.join();
  stop.store(true);
  snapper.join();
  {
    std::lock_guard<std::mutex> l(f.data_forwarder->writes_mu);
    EXPECT_FALSE(f.data_forwarder->past_cache_writes.empty()) << "no stream went past the cache";
  }
  ASSERT_OK(f.pool->RunGcForTesting());
  f.CheckConsistency(true);
}

// A read of several blocks holds every block's stripe until its data is
// read: a block it resolved cannot be discarded, committed free and given
// to another device's write before the read copies it. Readers of many
// blocks at once race in-place rewrites, discards (each freeing a block,
// reused after the next commit), commits every millisecond and another
// device writing new blocks; every block a reader sees must be zeros or a
// version of that very block, never the other device's bytes.
TEST(PoolTest, ReadsOfManyBlocksNeverSeeABlockReusedUnderThem) {
  PoolOptions o = EngineFixture::DefaultOptions();
  o.commit_interval = std::chrono::milliseconds(1);
  constexpr uint64_t kBlocks = 48;
  EngineFixture f(kBs, 8 * kBlocks, o);
  ASSERT_TRUE(f.pool->CreateDevice("r", kBlocks * kBs).ok());
  ASSERT_TRUE(f.pool->CreateDevice("w", kBlocks * kBs).ok());
  // Every 8 bytes of a block of "r": (block << 32 | generation), never 0;
  // of "w": all ones.
  auto r_block = [](uint64_t b, uint32_t gen) {
    std::vector<std::byte> v(kBs);
    const uint64_t word = (b << 32) | gen;
    for (size_t i = 0; i < kBs; i += 8) std::memcpy(v.data() + i, &word, 8);
    return v;
  };
  const std::vector<std::byte> w_block(kBs, std::byte{0xff});
  auto r = Open(*f.pool, "r");
  auto w = Open(*f.pool, "w");
  for (uint64_t b = 0; b < kBlocks; ++b) ASSERT_OK(r->Write(b * kBs, r_block(b, 1)));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0};
  std::atomic<bool> bad{false};
  std::vector<std::thread> threads;
  // Rewrites in place and discards of "r".
  threads.emplace_back([&] {
    std::mt19937_64 rng(5);
    for (uint32_t gen = 2; !stop.load(); ++gen) {
      const uint64_t b = rng() % kBlocks;
      Status s = rng() % 3 == 0 ? r->Discard(b * kBs, kBs) : r->Write(b * kBs, r_block(b, gen));
      // Blocks freed wait for a commit: a full pool for a moment is fine.
      if (!s.ok() && !s.IsNoSpace()) {
        ADD_FAILURE() << "r: " << s.ToString();
        bad = true;
      }
    }
  });
  // "w" writes new blocks (discarding first, so each write provisions and
  // takes whatever block the allocator hands out, freed ones included).
  threads.emplace_back([&] {
    std::mt19937_64 rng(6);
    while (!stop.load()) {
      const uint64_t b = rng() % kBlocks;
      Status s = w->Discard(b * kBs, kBs);
      if (s.ok()) s = w->Write(b * kBs, w_block);
      if (!s.ok() && !s.IsNoSpace()) {
        ADD_FAILURE() << "w: " << s.ToString();
        bad = true;
      }
    }
  });
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(7 + t);
      std::vector<std::byte> buf(16 * kBs);
      while (!stop.load()) {
        const uint64_t first = rng() % (kBlocks - 16);
        const uint64_t n = 2 + rng() % 15;
        std::span<std::byte> span(buf.data(), n * kBs);
        if (Result<size_t> got = r->Read(first * kBs, span); !got.ok()) {
          ADD_FAILURE() << "read: " << got.status().ToString();
          bad = true;
        }
        for (uint64_t k = 0; k < n; ++k) {
          uint64_t word;
          std::memcpy(&word, buf.data() + k * kBs, 8);
          const bool zeros = std::all_of(buf.begin() + k * kBs, buf.begin() + (k + 1) * kBs,
                                         [](std::byte x) { return x == std::byte{0}; });
          const bool own = word >> 32 == first + k && static_cast<uint32_t>(word) != 0 &&
                           std::equal(buf.begin() + k * kBs, buf.begin() + (k + 1) * kBs,
                                      r_block(first + k, static_cast<uint32_t>(word)).begin());
          if (!zeros && !own) {
            ADD_FAILURE() << "block " << first + k << " read as another block's data: word "
                          << std::hex << word;
            bad = true;
            stop = true;
          }
        }
        reads.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_FALSE(bad.load());
  EXPECT_GT(reads.load(), 100u);
  ASSERT_OK(f.pool->Commit());
  f.CheckConsistency(true);
}

TEST(PoolTest, BadInputChangesNothing) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 4 * kBs).ok());
  uint64_t txid = f.pool->Stats().transaction_id;
  EXPECT_EQ(f.pool->CreateDevice("v", kBs).status().code(), Status::Code::kExists);
  EXPECT_TRUE(f.pool->CreateDevice("", kBs).status().IsInvalidArgument());
  EXPECT_TRUE(f.pool->CreateDevice(".hidden", kBs).status().IsInvalidArgument());
  EXPECT_TRUE(f.pool->CreateDevice("a/b", kBs).status().IsInvalidArgument());
  EXPECT_TRUE(f.pool->CreateDevice("..", kBs).status().IsInvalidArgument());
  EXPECT_TRUE(f.pool->CreateDevice(std::string("a\0b", 3), kBs).status().IsInvalidArgument());
  EXPECT_TRUE(f.pool->CreateDevice("tab\there", kBs).status().IsInvalidArgument());
  EXPECT_EQ(f.pool->CreateDevice(std::string(129, 'x'), kBs).status().code(),
            Status::Code::kNameTooLong);
  EXPECT_TRUE(f.pool->CreateDevice(std::string(128, 'x'), kBs).ok());
  txid = f.pool->Stats().transaction_id;
  EXPECT_TRUE(f.pool->CreateSnapshot("missing", "s").status().IsNotFound());
  EXPECT_EQ(f.pool->CreateSnapshot("v", "v").status().code(), Status::Code::kExists);
  EXPECT_TRUE(f.pool->DeleteDevice("missing").IsNotFound());
  EXPECT_TRUE(f.pool->ResizeDevice("missing", kBs).IsNotFound());
  EXPECT_TRUE(f.pool->RenameDevice("missing", "x").IsNotFound());
  EXPECT_EQ(f.pool->RenameDevice("v", std::string(128, 'x')).code(), Status::Code::kExists);
  EXPECT_TRUE(f.pool->RenameDevice("v", "bad/name").IsInvalidArgument());
  auto v = Open(*f.pool, "v");
  EXPECT_TRUE(v->Write(4 * kBs - 1, Pattern(2, 1)).IsInvalidArgument());
  EXPECT_TRUE(v->Write(5 * kBs, Pattern(1, 1)).IsInvalidArgument());
  EXPECT_EQ(f.pool->Stats().transaction_id, txid);
  EXPECT_EQ(f.pool->ListDevices().size(), 2u);
  EXPECT_EQ(f.pool->Stats().used_blocks, 0u);
}

TEST(PoolTest, ResizeShrinkUnmapsAndGrowReadsZeros) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(0, Pattern(8 * kBs, 1)));
  ASSERT_TRUE(f.pool->CreateSnapshot("v", "s").ok());
  ASSERT_OK(f.pool->ResizeDevice("v", 3 * kBs + 10));
  EXPECT_EQ(v->size(), 3 * kBs + 10);
  ASSERT_OK(f.pool->ResizeDevice("v", 8 * kBs));
  auto all = f.ReadAll("v");
  auto p = Pattern(8 * kBs, 1);
  EXPECT_EQ(std::memcmp(all.data(), p.data(), 3 * kBs + 10), 0);
  for (uint64_t i = 3 * kBs + 10; i < 8 * kBs; ++i) ASSERT_EQ(all[i], std::byte{0});
  EXPECT_EQ(f.ReadAll("s"), p);
  ASSERT_OK(f.pool->DeleteDevice("s"));
  ASSERT_OK(f.pool->RunGcForTesting());
  f.CheckConsistency(true);
  EXPECT_EQ(f.pool->Stats().used_blocks, 4u);
}

TEST(PoolTest, RenameAndReplace) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("a", kBs).ok());
  ASSERT_TRUE(f.pool->CreateDevice("b", kBs).ok());
  auto a = Open(*f.pool, "a");
  ASSERT_OK(a->Write(0, Pattern(kBs, 1)));
  ASSERT_OK(f.pool->RenameDevice("a", "c"));
  EXPECT_TRUE(f.pool->GetDevice("a").status().IsNotFound());
  ASSERT_OK(f.pool->RenameDevice("c", "b", /*replace=*/true));
  EXPECT_EQ(f.ReadAll("b"), Pattern(kBs, 1));
  EXPECT_EQ(f.pool->ListDevices().size(), 1u);
  f.CleanReopen();
  EXPECT_EQ(f.ReadAll("b"), Pattern(kBs, 1));
}

TEST(PoolTest, DetachedDeviceWorksUntilDeletedAndDiesWithACrash) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("a", 2 * kBs).ok());
  auto a = Open(*f.pool, "a");
  ASSERT_OK(f.pool->DetachName("a"));
  EXPECT_TRUE(f.pool->GetDevice("a").status().IsNotFound());
  ASSERT_OK(a->Write(0, Pattern(kBs, 1)));
  std::vector<std::byte> buf(kBs);
  ASSERT_TRUE(a->Read(0, buf).ok());
  EXPECT_EQ(buf, Pattern(kBs, 1));
  ASSERT_OK(f.pool->Commit());
  a.reset();
  f.Crash();  // the orphan is deleted at open
  ASSERT_OK(f.pool->RunGcForTesting());
  EXPECT_EQ(f.pool->Stats().used_blocks, 0u);
}

TEST(PoolTest, FailedCommitMakesThePoolReadOnly) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 2 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(0, Pattern(kBs, 1)));
  f.store->FailNextCommit();
  EXPECT_FALSE(f.pool->Commit().ok());
  EXPECT_EQ(v->Write(0, Pattern(kBs, 2)).code(), Status::Code::kReadOnly);
  EXPECT_TRUE(f.pool->Stats().read_only);
  std::vector<std::byte> buf(kBs);
  EXPECT_TRUE(v->Read(0, buf).ok());
}

TEST(PoolTest, CleanReopenKeepsEverything) {
  EngineFixture f(kBs, 64);
  ASSERT_TRUE(f.pool->CreateDevice("v", 8 * kBs).ok());
  auto v = Open(*f.pool, "v");
  ASSERT_OK(v->Write(7, Pattern(5 * kBs, 1)));
  ASSERT_TRUE(f.pool->CreateSnapshot("v", "s").ok());
  ASSERT_OK(v->Write(kBs, Pattern(kBs, 2)));
  auto before_v = f.ReadAll("v");
  auto before_s = f.ReadAll("s");
  v.reset();
  f.CleanReopen();
  EXPECT_TRUE(f.space->was_clean());
  EXPECT_EQ(f.ReadAll("v"), before_v);
  EXPECT_EQ(f.ReadAll("s"), before_s);
  EXPECT_EQ(f.pool->GetDevice("s")->parent_name, "v");
  f.CheckConsistency(false);
}

}  // namespace THINFS_TEST_FILE
}  // namespace
}  // namespace thinfs
