// Simulated power loss over the real stack (issue 3): RocksDB on a
// fault-injecting file system, the bitmap file and the data file under
// layers that drop every write no sync made durable (tests/util/
// power_loss_stack.h). Random workloads over several devices (writes,
// discards, snapshots, deletes, resizes, renames, range shares, clones,
// commits, GC) are cut at random points:
//   - between operations (unsynced writes lost, or torn: each unsynced data
//     block rolled back, kept, or kept only in its first half);
//   - in the middle of a commit: the data sync fails, the bitmap sync
//     fails, or the metadata file system goes away right after the bitmap
//     sync (so the data is durable and the metadata is not).
// After every cut, before the pool opens, meta::CheckPool must find no
// error (leaks allowed); then the pool opens (recovery) and must show
// exactly the devices of the last commit, each with its committed content
// (a block written in place since then may show that write, whole or torn,
// but never anything else), and no data block may be visible to two
// devices unless it is shared (a refcount, or one version both read
// through their ancestry). Regularly, after GC, the pool must use exactly
// the blocks its devices see, with no leak left for check to find.
//
// Seeds: THINFS_POWERLOSS_SEEDS (default 6) from THINFS_POWERLOSS_SEED
// (default 1), THINFS_POWERLOSS_STEPS each (default 200): ~15 s in a debug
// build, under a minute with ASan. A failure prints
// its seed and step; rerun with THINFS_POWERLOSS_SEED=N
// THINFS_POWERLOSS_SEEDS=1 (THINFS_POWERLOSS_TRACE=1 logs every step).
// Soak: THINFS_POWERLOSS_SEEDS=500 THINFS_POWERLOSS_STEPS=1000.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "meta/pool_check.h"
#include "tests/util/engine_fixture.h"
#include "tests/util/power_loss_stack.h"

namespace thinfs {
namespace {

using testing::Pattern;
using testing::PowerLossStack;

uint64_t EnvOr(const char* name, uint64_t def) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): test setup
  return v ? std::strtoull(v, nullptr, 10) : def;
}

using Bytes = std::vector<std::byte>;

// Totals over all seeds, printed at the end.
struct Totals {
  uint64_t steps = 0, cuts = 0, torn_cuts = 0, torn_blocks = 0, mid_commit_cuts = 0, gc_checks = 0;
  // Cuts that found the bitmap header of an earlier commit than the last
  // one that synced the bitmap (the header's write-back is not waited for).
  uint64_t lagging_header_cuts = 0;
};

class PowerLossRun {
 public:
  PowerLossRun(uint64_t seed, Totals* totals)
      : seed_(seed), rng_(seed), s_(kBlockSize, kPoolBlocks, seed), totals_(totals) {}

  static constexpr uint64_t kBlockSize = 4096;
  static constexpr uint64_t kPoolBlocks = 2048;
  static constexpr uint64_t kMaxDeviceBlocks = 24;
  static constexpr size_t kMaxDevices = 6;

  void Run(uint64_t steps) {
    s_.Open();
    if (::testing::Test::HasFatalFailure()) return;
    Create("d0", 16 * kBlockSize);
    committed_ = model_;
    for (step_ = 0; step_ < steps; ++step_) {
      Step();
      if (::testing::Test::HasFatalFailure()) return;
      if (fault_hit_) {
        Cut(Rand(2) == 0);
        if (::testing::Test::HasFatalFailure()) return;
      }
      ++totals_->steps;
    }
    Cut(Rand(2) == 0);
    if (::testing::Test::HasFatalFailure()) return;
    GcAndCheckExact();
  }

 private:
  uint64_t Rand(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  Pool& pool() { return *s_.pool; }

  void Trace(const std::string& what) {
    if (trace_) {
      std::fprintf(stderr, "seed %llu step %llu: %s\n", static_cast<unsigned long long>(seed_),
                   static_cast<unsigned long long>(step_), what.c_str());
    }
  }

  std::string PickDevice() {
    auto it = model_.begin();
    std::advance(it, static_cast<long>(Rand(model_.size())));
    return it->first;
  }

  // An operation's status: OK, or (only once a fault is armed) the
  // injected failure, after which the power goes.
  bool Ok(const Status& s, const char* what) {
    if (s.ok()) return true;
    if (armed_) {
      Trace(std::string(what) + " failed as injected: " + s.ToString());
      fault_hit_ = true;
      return false;
    }
    ADD_FAILURE() << what << ": " << s.ToString() << " (seed " << seed_ << " step " << step_
                  << ")";
    return false;
  }

  // Records that block `b` of `name` may hold its current model contents
  // after a cut (it was written since the last commit).
  void Dirty(const std::string& name, uint64_t first, uint64_t end) {
    const Bytes& bytes = model_[name];
    for (uint64_t b = first; b < end && b * kBlockSize < bytes.size(); ++b) {
      Bytes img(kBlockSize);
      uint64_t n = std::min<uint64_t>(kBlockSize, bytes.size() - b * kBlockSize);
      std::memcpy(img.data(), bytes.data() + b * kBlockSize, n);
      dirty_[name][b].push_back(std::move(img));
    }
  }

  void Create(const std::string& name, uint64_t size) {
    if (!Ok(pool().CreateDevice(name, size).status(), "create")) return;
    model_[name] = Bytes(size);
  }

  void Step() {
    uint64_t commits_before = pool().Stats().commits;
    ASSERT_GT(pool().Stats().free_blocks, 256u)
        << "the pool would commit by itself when full; seed " << seed_;
    uint64_t op = Rand(100);
    std::string d = PickDevice();
    Bytes& bytes = model_[d];
    const uint64_t size = bytes.size();
    auto vol = pool().OpenVolume(d);
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    auto& v = *vol;
    if (op < 30 && size > 0) {
      uint64_t off, len;
      if (Rand(3) == 0) {
        off = Rand(size / kBlockSize) * kBlockSize;
        len = std::min<uint64_t>(size - off, (1 + Rand(3)) * kBlockSize);
      } else {
        off = Rand(size);
        len = 1 + Rand(std::min<uint64_t>(size - off, 3 * kBlockSize));
      }
      Bytes data = Rand(6) == 0 ? Bytes(len) : Pattern(len, static_cast<uint32_t>(rng_()));
      Trace("write " + d + " off " + std::to_string(off) + " len " + std::to_string(len));
      if (!Ok(v->Write(off, data), "write")) return;
      std::memcpy(bytes.data() + off, data.data(), len);
      Dirty(d, off / kBlockSize, (off + len + kBlockSize - 1) / kBlockSize);
    } else if (op < 38 && size > 0) {
      uint64_t off = Rand(size), len = 1 + Rand(size - off);
      Trace("discard " + d + " off " + std::to_string(off) + " len " + std::to_string(len));
      if (!Ok(v->Discard(off, len), "discard")) return;
      std::fill(bytes.begin() + static_cast<long>(off),
                bytes.begin() + static_cast<long>(off + len), std::byte{0});
      Dirty(d, off / kBlockSize, (off + len + kBlockSize - 1) / kBlockSize);
    } else if (op < 46) {
      if (model_.size() >= kMaxDevices) return;
      std::string name = "d" + std::to_string(++counter_);
      Trace("snapshot " + d + " -> " + name);
      if (!Ok(pool().CreateSnapshot(d, name).status(), "snapshot")) return;
      model_[name] = bytes;
    } else if (op < 51) {
      if (model_.size() <= 1) return;
      v.reset();
      Trace("delete " + d);
      if (!Ok(pool().DeleteDevice(d), "delete")) return;
      model_.erase(d);
      dirty_.erase(d);
    } else if (op < 55) {
      uint64_t nsize = Rand(kMaxDeviceBlocks * kBlockSize + 1);
      v.reset();
      Trace("resize " + d + " to " + std::to_string(nsize));
      if (nsize < size && nsize % kBlockSize != 0) {
        // Shrinking zeroes the tail of the new last block in place, before
        // the commit: a cut in that commit may keep the old size with that
        // tail zeroed (within the device only).
        Bytes shrunk = bytes;
        std::fill(shrunk.begin() + static_cast<long>(nsize), shrunk.end(), std::byte{0});
        std::swap(bytes, shrunk);
        Dirty(d, nsize / kBlockSize, nsize / kBlockSize + 1);
        std::swap(bytes, shrunk);
      }
      if (!Ok(pool().ResizeDevice(d, nsize), "resize")) return;
      bytes.resize(nsize);
    } else if (op < 58) {
      std::string name = "r" + std::to_string(++counter_);
      v.reset();
      Trace("rename " + d + " -> " + name);
      if (!Ok(pool().RenameDevice(d, name), "rename")) return;
      model_[name] = std::move(model_[d]);
      model_.erase(d);
      if (dirty_.count(d)) {
        dirty_[name] = std::move(dirty_[d]);
        dirty_.erase(d);
      }
    } else if (op < 66) {
      std::string d2 = PickDevice();
      Bytes& dst = model_[d2];
      if (size == 0 || dst.empty()) return;
      uint64_t soff = Rand(size);
      uint64_t doff = Rand(3) == 0 ? soff % dst.size() : Rand(dst.size());
      if (Rand(2) == 0) {
        soff -= soff % kBlockSize;
        doff -= doff % kBlockSize;
      }
      uint64_t len = 1 + Rand(std::min(size - soff, dst.size() - doff));
      if (d == d2 && soff < doff + len && doff < soff + len) return;
      auto dv = pool().OpenVolume(d2);
      ASSERT_TRUE(dv.ok());
      Trace("share " + d + "@" + std::to_string(soff) + " -> " + d2 + "@" +
            std::to_string(doff) + " len " + std::to_string(len));
      if (!Ok(pool().ShareRange(v->id(), soff, (*dv)->id(), doff, len), "share")) return;
      Bytes src(bytes.begin() + static_cast<long>(soff),
                bytes.begin() + static_cast<long>(soff + len));
      std::memcpy(dst.data() + doff, src.data(), len);
      Dirty(d2, doff / kBlockSize, (doff + len + kBlockSize - 1) / kBlockSize);
    } else if (op < 69) {
      if (model_.size() >= kMaxDevices) return;
      std::string name = "c" + std::to_string(++counter_);
      Trace("clone " + d + " -> " + name);
      Create(name, size);
      if (fault_hit_) return;
      NoteCommits(&commits_before);  // creating commits
      auto dv = pool().OpenVolume(name);
      ASSERT_TRUE(dv.ok());
      if (!Ok(pool().ShareRange(v->id(), 0, (*dv)->id(), 0, size), "clone")) return;
      model_[name] = bytes;
      Dirty(name, 0, (size + kBlockSize - 1) / kBlockSize);
    } else if (op < 77) {
      Trace("flush " + d);
      if (!Ok(v->Flush(), "flush")) return;
    } else if (op < 80) {
      v.reset();
      Trace("gc");
      if (!Ok(pool().RunGcForTesting(), "gc")) return;
    } else if (op < 88) {
      v.reset();
      Cut(Rand(2) == 0);
      return;
    } else if (op < 96 && !armed_) {
      Arm();
    }
    NoteCommits(&commits_before);
  }

  // If something committed since *before (explicitly, or inside an
  // operation), the model is the state a cut must come back to.
  void NoteCommits(uint64_t* before) {
    uint64_t now = pool().Stats().commits;
    if (now != *before) {
      committed_ = model_;
      dirty_.clear();
    }
    *before = now;
  }

  // Arms a fault in one of the next commits; the operation that meets it
  // fails and the power goes right then.
  void Arm() {
    armed_ = true;
    uint64_t n = 1 + Rand(3);
    switch (Rand(3)) {
      case 0:
        Trace("armed: data sync " + std::to_string(n) + " fails");
        s_.data()->FailSyncAt(n);
        break;
      case 1:
        Trace("armed: bitmap sync " + std::to_string(n) + " fails");
        s_.space()->FailSyncAt(n);
        break;
      default:
        Trace("armed: metadata lost after bitmap sync " + std::to_string(n));
        s_.space()->AfterSyncAt(n, [this] { s_.CutMetadataWrites(); });
        break;
    }
  }

  void Cut(bool torn) {
    ++totals_->cuts;
    if (fault_hit_) ++totals_->mid_commit_cuts;
    if (torn) ++totals_->torn_cuts;
    Trace(std::string("power cut") + (torn ? " (torn writes)" : "") +
          (fault_hit_ ? " after an injected failure" : ""));
    const uint64_t lagging = s_.lagging_header_cuts();
    totals_->torn_blocks += static_cast<uint64_t>(s_.PowerCut(torn));
    totals_->lagging_header_cuts += s_.lagging_header_cuts() - lagging;
    armed_ = false;
    fault_hit_ = false;
    s_.OpenParts();
    if (::testing::Test::HasFatalFailure()) return;
    // What `thinfs check` sees after the crash: no error, leaks allowed.
    Result<meta::CheckReport> r = meta::CheckPool(s_.store(), s_.space(), meta::CheckOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const meta::CheckFinding& f : r->findings) {
      if (f.severity == meta::CheckFinding::Severity::kError) {
        ADD_FAILURE() << "check after the cut: " << f.kind << ": " << f.message << " (seed "
                      << seed_ << " step " << step_ << ")";
      }
    }
    ASSERT_EQ(r->error_count, 0u);
    s_.OpenPool();
    if (::testing::Test::HasFatalFailure()) return;
    VerifyAgainstCommitted();
    model_ = committed_;
    dirty_.clear();
    if (::testing::Test::HasFatalFailure()) return;
    if (++cuts_ % 3 == 0) GcAndCheckExact();
  }

  // Whether `got` (a block read after the cut) is a state the block may
  // legitimately be in: its committed contents, or one left by a write
  // since (whole, or torn: each half from one of those).
  bool Acceptable(const std::string& name, uint64_t b, const Bytes& committed, const Bytes& got) {
    if (got == committed) return true;
    auto d = dirty_.find(name);
    if (d == dirty_.end()) return false;
    auto imgs = d->second.find(b);
    if (imgs == d->second.end()) return false;
    std::vector<const Bytes*> options{&committed};
    for (const Bytes& i : imgs->second) options.push_back(&i);
    const size_t half = kBlockSize / 2;
    for (size_t part = 0; part < 2; ++part) {
      size_t from = part * half, len = std::min(half, got.size() - std::min(got.size(), from));
      bool any = false;
      for (const Bytes* o : options) {
        if (std::memcmp(got.data() + from, o->data() + from, len) == 0) any = true;
      }
      if (!any) return false;
    }
    return true;
  }

  void VerifyAgainstCommitted() {
    std::vector<DeviceInfo> devs = pool().ListDevices();
    std::set<std::string> names;
    for (const DeviceInfo& i : devs) names.insert(i.name);
    std::set<std::string> want;
    for (const auto& [n, b] : committed_) want.insert(n);
    ASSERT_EQ(names, want) << "devices after the cut differ from the last commit; seed " << seed_
                           << " step " << step_;
    std::map<std::string, Bytes> actual = committed_;
    // Block -> every (device, vblock) that reads it.
    std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> seen;
    for (const DeviceInfo& info : devs) {
      const Bytes& c = committed_.at(info.name);
      ASSERT_EQ(info.size, c.size()) << info.name << " seed " << seed_ << " step " << step_;
      auto v = pool().OpenVolume(info.name);
      ASSERT_TRUE(v.ok());
      for (uint64_t b = 0; b * kBlockSize < c.size(); ++b) {
        Bytes got(kBlockSize), want_block(kBlockSize);
        uint64_t n = std::min<uint64_t>(kBlockSize, c.size() - b * kBlockSize);
        auto r = (*v)->Read(b * kBlockSize, std::span(got).first(n));
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        std::memcpy(want_block.data(), c.data() + b * kBlockSize, n);
        // What the block shows now is the state later cuts come back to.
        std::memcpy(actual[info.name].data() + b * kBlockSize, got.data(), n);
        if (!Acceptable(info.name, b, want_block, got)) {
          size_t i = 0;
          while (got[i] == want_block[i]) ++i;
          FAIL() << "device " << info.name << " block " << b << " differs from its last "
                 << "committed content at byte " << i << " after the cut; seed " << seed_
                 << " step " << step_;
        }
        auto m = pool().MappedBlockForTesting(info.id, b);
        ASSERT_TRUE(m.ok());
        if (*m) seen[(*m)->value].push_back({info.id.value, b});
      }
    }
    committed_ = actual;
    // No block visible to two devices unless shared.
    auto recs = s_.store()->LoadDevices();
    ASSERT_TRUE(recs.ok());
    std::map<uint64_t, uint64_t> parent;
    for (const DeviceRecord& r : *recs) {
      if (r.has_parent) parent[r.id.value] = r.parent.value;
    }
    auto ancestors = [&](uint64_t id) {
      std::set<uint64_t> out{id};
      for (auto it = parent.find(id); it != parent.end() && out.insert(it->second).second;
           it = parent.find(it->second)) {
      }
      return out;
    };
    for (const auto& [block, readers] : seen) {
      if (readers.size() < 2) continue;
      auto rc = s_.store()->GetRefcount(PoolBlock(block));
      ASSERT_TRUE(rc.ok());
      if (*rc >= 2) continue;
      std::set<uint64_t> common = ancestors(readers[0].first);
      for (const auto& [dev, vb] : readers) {
        std::set<uint64_t> a = ancestors(dev), keep;
        for (uint64_t x : common) {
          if (a.count(x)) keep.insert(x);
        }
        common = keep;
        EXPECT_EQ(vb, readers[0].second)
            << "pool block " << block << " is read at two vblocks without a refcount";
      }
      EXPECT_FALSE(common.empty()) << "pool block " << block << " is visible to unrelated devices "
                                   << readers[0].first << " and " << readers[1].first
                                   << " without a refcount; seed " << seed_ << " step " << step_;
    }
  }

  // After GC, the pool uses exactly what its devices see, and check finds
  // neither errors nor leaks.
  void GcAndCheckExact() {
    ++totals_->gc_checks;
    ASSERT_OK(pool().RunGcForTesting());
    committed_ = model_;
    dirty_.clear();
    std::set<uint64_t> visible;
    for (const DeviceInfo& d : pool().ListDevices()) {
      for (uint64_t b = 0; b * kBlockSize < d.size; ++b) {
        auto m = pool().MappedBlockForTesting(d.id, b);
        ASSERT_TRUE(m.ok());
        if (*m) visible.insert((*m)->value);
      }
    }
    EXPECT_EQ(pool().Stats().used_blocks, visible.size())
        << "used blocks differ from what devices see after GC; seed " << seed_ << " step "
        << step_;
    Result<meta::CheckReport> r =
        meta::CheckPool(pool().store(), pool().space_map(), meta::CheckOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->error_count, 0u);
    EXPECT_EQ(r->leaked_blocks, 0u) << "seed " << seed_ << " step " << step_;
    for (const meta::CheckFinding& f : r->findings) {
      if (f.severity == meta::CheckFinding::Severity::kError || f.kind == "leaked-blocks") {
        ADD_FAILURE() << f.kind << ": " << f.message;
      }
    }
  }

  const uint64_t seed_;
  std::mt19937_64 rng_;
  PowerLossStack s_;
  Totals* const totals_;
  std::map<std::string, Bytes> model_;
  std::map<std::string, Bytes> committed_;
  // Device -> block -> images written since the last commit.
  std::map<std::string, std::map<uint64_t, std::vector<Bytes>>> dirty_;
  bool armed_ = false;
  bool fault_hit_ = false;
  uint64_t counter_ = 0;
  uint64_t step_ = 0;
  uint64_t cuts_ = 0;
  const bool trace_ = EnvOr("THINFS_POWERLOSS_TRACE", 0) != 0;
};

TEST(PowerLossTest, CommittedStateSurvivesEveryCut) {
  const uint64_t first = EnvOr("THINFS_POWERLOSS_SEED", 1);
  const uint64_t seeds = EnvOr("THINFS_POWERLOSS_SEEDS", 6);
  const uint64_t steps = EnvOr("THINFS_POWERLOSS_STEPS", 200);
  Totals totals;
  for (uint64_t seed = first; seed < first + seeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun: THINFS_POWERLOSS_SEED=" +
                 std::to_string(seed) + " THINFS_POWERLOSS_SEEDS=1)");
    {
      PowerLossRun run(seed, &totals);
      run.Run(steps);
    }
    if (HasFailure()) {
      std::fprintf(stderr, "power-loss test failed with seed %llu\n",
                   static_cast<unsigned long long>(seed));
      return;
    }
  }
  std::fprintf(stderr,
               "power-loss: %llu seeds, %llu steps, %llu cuts (%llu torn, %llu torn blocks, "
               "%llu in the middle of a commit, %llu with a lagging bitmap header), %llu "
               "exact-accounting checks after GC\n",
               static_cast<unsigned long long>(seeds), static_cast<unsigned long long>(totals.steps),
               static_cast<unsigned long long>(totals.cuts),
               static_cast<unsigned long long>(totals.torn_cuts),
               static_cast<unsigned long long>(totals.torn_blocks),
               static_cast<unsigned long long>(totals.mid_commit_cuts),
               static_cast<unsigned long long>(totals.lagging_header_cuts),
               static_cast<unsigned long long>(totals.gc_checks));
  EXPECT_GT(totals.mid_commit_cuts, 0u);
  EXPECT_GT(totals.lagging_header_cuts, 0u);
  EXPECT_GT(totals.torn_blocks, 0u);
}

}  // namespace
}  // namespace thinfs
