#include "core/pool.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "core/deferred_copy.h"
#include "core/map_cache.h"
#include "core/mapping_walk.h"
#include "core/mutex.h"
#include "core/transaction.h"
#include "core/zeros.h"

namespace thinfs {

namespace {

int64_t ClockNs(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

int64_t NowNs() { return ClockNs(CLOCK_REALTIME); }

// The real-time clock at its last tick (CLOCK_REALTIME_COARSE): never later
// than NowNs(), and less than one tick (1-4 ms) earlier.
int64_t TickNs() { return ClockNs(CLOCK_REALTIME_COARSE); }

// Adds `block` to `runs`: it lengthens the last run when it is that run's
// next block, else starts a run.
void AppendToRuns(std::vector<BlockDevice::Run>* runs, PoolBlock block) {
  if (!runs->empty() && block.value == runs->back().first.value + runs->back().count) {
    ++runs->back().count;
  } else {
    runs->push_back(BlockDevice::Run{block, 1});
  }
}

struct BlockKey {
  uint64_t dev = 0;
  uint64_t vblock = 0;
  auto operator<=>(const BlockKey&) const = default;
};

// Uncommitted edits of one (device, vblock): epoch -> value, or nullopt for
// "this version is deleted". Newest epoch first, epochs unique.
using Edits = std::vector<std::pair<Epoch, std::optional<MapValue>>>;

void SetEditIn(Edits* edits, Epoch epoch, std::optional<MapValue> value) {
  for (auto& e : *edits) {
    if (e.first == epoch) {
      e.second = value;
      return;
    }
  }
  edits->emplace_back(epoch, value);
  std::sort(edits->begin(), edits->end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
}

constexpr size_t kOverlayShards = 64;
constexpr size_t kStripes = 4096;

// Several stripes held at once: shared for a read of several blocks,
// exclusively for a stream's write (Pool::Impl::WriteStream). Taken in
// address order, as the clone path takes its two exclusively (a writer
// otherwise holds one), so no cycle of waits forms; each stripe once.
// Clang's analysis does not follow a runtime set of locks: the scope does.
class HeldStripes {
 public:
  enum class Mode { kShared, kExclusive };
  HeldStripes(std::vector<SharedMutex*> stripes, Mode mode) NO_THREAD_SAFETY_ANALYSIS
      : stripes_(std::move(stripes)),
        mode_(mode) {
    std::sort(stripes_.begin(), stripes_.end());
    stripes_.erase(std::unique(stripes_.begin(), stripes_.end()), stripes_.end());
    for (SharedMutex* m : stripes_) {
      if (mode_ == Mode::kShared) {
        m->LockShared();
      } else {
        m->Lock();
      }
    }
  }
  ~HeldStripes() NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = stripes_.rbegin(); it != stripes_.rend(); ++it) {
      if (mode_ == Mode::kShared) {
        (*it)->UnlockShared();
      } else {
        (*it)->Unlock();
      }
    }
  }
  // Releases every stripe held but those in `keep`.
  void Keep(std::vector<SharedMutex*> keep) NO_THREAD_SAFETY_ANALYSIS {
    std::sort(keep.begin(), keep.end());
    std::vector<SharedMutex*> kept;
    for (SharedMutex* m : stripes_) {
      if (std::binary_search(keep.begin(), keep.end(), m)) {
        kept.push_back(m);
      } else if (mode_ == Mode::kShared) {
        m->UnlockShared();
      } else {
        m->Unlock();
      }
    }
    stripes_ = std::move(kept);
  }
  HeldStripes(const HeldStripes&) = delete;
  HeldStripes& operator=(const HeldStripes&) = delete;

 private:
  std::vector<SharedMutex*> stripes_;
  const Mode mode_;
};
// How far ahead of a sequential reader of scattered blocks the engine hints
// (PrefetchBlocks): half the host's read_ahead_kb on the test VM's disk.
constexpr uint64_t kReadAheadBytes = 4 << 20;
// How long the background copier lets owed copies gather before it makes
// them (docs/benchmarks.md, lever 24): long enough for a batch in source
// order, short against the 1 s commit interval.
constexpr std::chrono::milliseconds kCopyAheadDelay{20};
// Memory for owed copies that hold their written sectors until the copy
// writes the block whole (core/deferred_copy.h; docs/benchmarks.md, lever
// 31): 1024 buffers at 64 KiB blocks, none at blocks above 64 MiB. Beyond
// it owed copies write through.
constexpr uint64_t kHeldCopyBytes = uint64_t{64} << 20;
// How long it waits after a copy failed before it tries again (the commit
// that fails on it stops the pool's writes first, most likely).
constexpr std::chrono::milliseconds kCopierRetryDelay{1000};
// A write request takes the new blocks it needs as one run of consecutive
// pool blocks (docs/benchmarks.md, lever 38), at most this many, and only
// while the pool has at least kRunFreeFactor times the run plus
// kRunFreeMargin blocks free: a run's unused tail is held until its request
// ends, and near full no request may go short for another's surplus.
constexpr uint64_t kMaxRunBlocks = 1024;
constexpr uint64_t kRunFreeFactor = 4;
constexpr uint64_t kRunFreeMargin = 256;

size_t HashKey(uint64_t dev, uint64_t vblock) {
  uint64_t h = dev * 0x9E3779B97F4A7C15ULL ^ (vblock + 0x632BE59BD9B4E019ULL);
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 32;
  return static_cast<size_t>(h);
}

// What a (device, block) resolves to after walking the parent chain.
struct Resolved {
  bool found = false;     // some version (possibly a tombstone) answers
  VolumeId owner;         // device owning the answering version
  Epoch epoch = 0;
  MapValue value;
  bool mapped() const { return found && !value.tombstone(); }
};

}  // namespace

// In-memory state of one device.
struct VolumeState {
  explicit VolumeState(const DeviceRecord& r)
      : id(r.id), epoch(r.epoch), size(r.size), mapped(static_cast<int64_t>(r.mapped_blocks)),
        mtime_ns(r.mtime_ns), ctime_ns(r.ctime_ns), atime_ns(r.atime_ns), rec(r) {}

  const VolumeId id;

  // Held shared by I/O, exclusively by operations that change the device's
  // epoch, parent or size or remove it (snapshot, resize, delete). Ordered
  // before the stripe locks.
  SharedMutex io_mu;

  // Constant while io_mu is held (changed only with io_mu held exclusively
  // and the pool's devices_mu_).
  std::shared_ptr<VolumeState> parent;
  Epoch parent_epoch = 0;
  // Blocks >= parent_limit do not fall through to the parent.
  std::atomic<uint64_t> parent_limit{UINT64_MAX};
  // Bumped by every change of content; a partial whole-device clone is
  // extended in O(1) only while neither side changed.
  std::atomic<uint64_t> write_gen{0};
  // Bumped, with io_mu held exclusively, by every change that alters how
  // many blocks resolve at once (parent, parent_limit, size): entries of the
  // map cache made before no longer match.
  std::atomic<uint64_t> map_gen{0};
  // Readahead in the device's block order for a sequential reader whose
  // blocks lie scattered in the data area (Pool::Impl::PrefetchBlocks):
  // where the last multi-block read ended, and the end of the blocks hinted
  // ahead of it (0: no window).
  Mutex ra_mu;
  uint64_t ra_next GUARDED_BY(ra_mu) = 0;
  uint64_t ra_end GUARDED_BY(ra_mu) = 0;
  // Where the last read within one block ended: a read of one block that
  // starts there is a sequential reader's, which the host's readahead
  // serves, and is not read around (Pool::Impl::ReadBlock). Only a hint.
  std::atomic<uint64_t> single_next{UINT64_MAX};
  // Where the last few writes of a writer with no cache of its own
  // (WriteCache::kWriter) ended. A write that starts at one of them
  // continues a stream, whose data heads for the disk at once
  // (Volume::Write, lever 51); a random write's waits in the host's cache
  // for the commit, which writes it back with its neighbours. Several,
  // because a loop device's request reaches the daemon as concurrent FUSE
  // writes (1280 KiB as 1024 + 256 KiB) that arrive in either order. Only
  // a hint.
  static constexpr size_t kWriteEnds = 4;
  std::array<std::atomic<uint64_t>, kWriteEnds> write_ends{UINT64_MAX, UINT64_MAX, UINT64_MAX,
                                                           UINT64_MAX};
  std::atomic<uint32_t> write_end_next{0};

  // Records a kWriter write of [offset, end) and returns whether it starts
  // where one of the last kWriteEnds ended.
  bool ContinuesWrite(uint64_t offset, uint64_t end) {
    bool continues = false;
    for (const std::atomic<uint64_t>& e : write_ends) {
      continues = continues || e.load(std::memory_order_relaxed) == offset;
    }
    write_ends[write_end_next.fetch_add(1, std::memory_order_relaxed) % kWriteEnds].store(
        end, std::memory_order_relaxed);
    return continues;
  }

  // The partial clone this device is (see Pool::ShareRange).
  const VolumeState* clone_src = nullptr;  // guarded by io_mu
  uint64_t clone_src_gen = 0;
  uint64_t clone_dst_gen = 0;
  uint64_t clone_dst_end = 0;  // bytes cloned so far, from offset 0

  // Atomics: read on the I/O path without the pool's device lock.
  std::atomic<Epoch> epoch;          // changed under io_mu exclusive
  std::atomic<uint64_t> size;        // changed under io_mu exclusive
  std::atomic<int64_t> mapped;       // changed under swap_mu_ shared
  std::atomic<bool> dirty{false};    // record must be written at next commit
  // A write moved mtime/ctime and nothing else: every commit but an
  // fdatasync's (CommitKind::kDataSync) writes the record for it.
  std::atomic<bool> times_dirty{false};
  std::atomic<bool> gone{false};     // deleted: I/O fails with kNotFound
  std::atomic<int64_t> mtime_ns;
  std::atomic<int64_t> ctime_ns;
  std::atomic<int64_t> atime_ns;

  // Guarded by Pool::Impl::devices_mu_.
  DeviceRecord rec;
  std::vector<VolumeState*> children;

  bool live() const {
    return (rec.flags & (DeviceRecord::kHidden | DeviceRecord::kDeleting)) == 0;
  }

  // Builds the record to persist. Caller holds devices_mu_.
  DeviceRecord Snapshot() const {
    DeviceRecord r = rec;
    r.epoch = epoch.load();
    r.size = size.load();
    r.mapped_blocks = static_cast<uint64_t>(std::max<int64_t>(0, mapped.load()));
    r.mtime_ns = mtime_ns.load();
    r.ctime_ns = ctime_ns.load();
    r.atime_ns = atime_ns.load();
    r.has_parent = parent != nullptr;
    r.parent = parent ? parent->id : VolumeId();
    r.parent_epoch = parent_epoch;
    r.parent_limit = parent_limit.load();
    return r;
  }

  // A write sets mtime and ctime to now, to the clock's tick, as the kernel
  // does for a file (its timestamps are the coarse clock's). Times set
  // within the current tick stand, and the record stays clean: an fsync
  // after overwrites in place then has no metadata to commit, only the data
  // to sync (docs/benchmarks.md, lever 26). Times outside [tick, now], a
  // future mtime from utimensat among them, are replaced as before. The
  // times are stored before the flag: a commit that takes the flag
  // records them.
  void TouchForWrite() {
    const int64_t tick = TickNs();
    const int64_t now = NowNs();
    const int64_t m = mtime_ns.load(std::memory_order_relaxed);
    const int64_t c = ctime_ns.load(std::memory_order_relaxed);
    if (m >= tick && m <= now && c >= tick && c <= now) return;
    mtime_ns.store(now);
    ctime_ns.store(now);
    times_dirty.store(true);
  }
};

struct Pool::Impl {
  Impl(std::unique_ptr<BlockDevice> d, std::unique_ptr<SpaceMap> s,
       std::unique_ptr<MetadataStore> m, const PoolOptions& o)
      : data(std::move(d)),
        space(std::move(s)),
        store(std::move(m)),
        options(o),
        geometry(data->geometry().block_size(), data->geometry().data_blocks(),
                 o.force_generic_geometry_for_testing),
        map_cache(o.map_cache_bytes / MapCache<Resolved>::EntryBytes()),
        copies(data.get(), geometry.block_size(),
               o.read_only ? 0 : o.deferred_copy_bytes / geometry.block_size(),
               kHeldCopyBytes / geometry.block_size()) {}

  // ---- Constant after construction ----
  std::unique_ptr<BlockDevice> data;
  std::unique_ptr<SpaceMap> space;
  std::unique_ptr<MetadataStore> store;
  const PoolOptions options;
  const Geometry geometry;
  // What (device, block) resolves to, in front of Resolve (see
  // core/map_cache.h): SetEdit invalidates, VolumeState::map_gen expires.
  MapCache<Resolved> map_cache;
  // Copy-on-write copies owed to the next commit (core/deferred_copy.h).
  // Every data-area read and in-place write of a mapped block goes
  // through it; Commit() completes the copies before its data sync.
  DeferredCopies copies;

  // ---- Commit ----
  // Serialises commits. Outermost lock.
  Mutex commit_mu;
  // Held shared by every metadata change (overlay edit + frees + counters),
  // exclusively for the commit's cut.
  SharedMutex swap_mu;
  Superblock superblock;  // guarded by commit_mu
  std::atomic<uint64_t> transaction_id{0};
  // A data write completed since the last data sync began: set after the
  // write, exchanged by Commit, which skips the data sync when it is clear.
  std::atomic<bool> data_dirty{false};
  // Of those, a write of new data: into a block whose mapping is not
  // committed yet (provisioning, copy-on-write, an owed copy). A commit must
  // sync the data before writing such a mapping, or a crash could leave it
  // pointing at stale data. Set with data_dirty, after the write and before
  // the mapping is installed. An overwrite in place sets only data_dirty:
  // without sync_overwrites the periodic commit leaves that to fsync.
  std::atomic<bool> new_data{false};

  // Records a completed data write for the next commit: only after the
  // write, since Commit syncs the data only when it finds the flags set. A
  // write of new data (a block whose mapping is not committed yet) must
  // also be recorded before that mapping is installed.
  void NoteDataWritten(bool new_block) {
    data_dirty.store(true, std::memory_order_relaxed);
    if (new_block) new_data.store(true, std::memory_order_relaxed);
  }
  std::atomic<bool> failed{false};      // sticky: commit or I/O failed
  std::string failure;                  // guarded by commit_mu

  // ---- Overlay of uncommitted block-map and refcount edits ----
  struct Shard {
    Mutex mu;
    std::map<BlockKey, Edits> active GUARDED_BY(mu);
    std::map<BlockKey, Edits> frozen GUARDED_BY(mu);
  };
  std::array<Shard, kOverlayShards> shards;
  std::atomic<int64_t> overlay_keys{0};  // active + frozen keys; 0 skips lookups

  Mutex refcount_mu;  // after swap_mu, shard mutexes
  std::unordered_map<uint64_t, uint32_t> refcount_active GUARDED_BY(refcount_mu);
  std::unordered_map<uint64_t, uint32_t> refcount_frozen GUARDED_BY(refcount_mu);

  // ---- Per-block locks (dm-thin's bio prison, striped) ----
  std::array<SharedMutex, kStripes> stripes;

  // ---- Devices ----
  mutable Mutex devices_mu;
  std::map<uint64_t, std::shared_ptr<VolumeState>> devices GUARDED_BY(devices_mu);
  std::map<std::string, uint64_t> names GUARDED_BY(devices_mu);
  std::vector<VolumeId> deleted_records GUARDED_BY(devices_mu);  // to delete at commit
  uint64_t next_device_id GUARDED_BY(devices_mu) = 1;

  // ---- Garbage collection ----
  Mutex gc_mu;
  CondVar gc_cv{&gc_mu};
  std::set<BlockKey> gc_candidates GUARDED_BY(gc_mu);
  std::set<uint64_t> gc_devices GUARDED_BY(gc_mu);
  bool gc_stop GUARDED_BY(gc_mu) = false;
  // Serialises collector passes (background thread vs RunGcForTesting).
  Mutex gc_run_mu;

  // ---- Periodic commit ----
  Mutex timer_mu;
  CondVar timer_cv{&timer_mu};
  bool timer_stop GUARDED_BY(timer_mu) = false;

  // Space waiters (no_space_timeout).
  Mutex space_mu;
  CondVar space_cv{&space_mu};
  // Blocks of the data area: the superblock's data_blocks (Grow raises it
  // under commit_mu); atomic so that readers take no lock.
  std::atomic<uint64_t> data_blocks{0};
  // Low-water state: set by the allocation that crossed the mark, cleared
  // when free space rises above it; atomic so exactly one crossing reports.
  std::atomic<bool> below_low_water{false};

  // ---- Background copies (PoolOptions::background_copies) ----
  Mutex copier_mu;
  CondVar copier_cv{&copier_mu};
  bool copier_stop GUARDED_BY(copier_mu) = false;

  std::thread commit_thread;
  std::thread gc_thread;
  std::thread copier_thread;
  bool closed = false;

  // ---- Commit latency: a ring of the last kLatencySamples commits ----
  static constexpr size_t kLatencySamples = 1024;
  mutable Mutex latency_mu;
  std::vector<uint64_t> latency_us GUARDED_BY(latency_mu);
  size_t latency_next GUARDED_BY(latency_mu) = 0;

  void Log(int level, const std::string& message) const {
    if (options.log) options.log(level, message);
  }

  // The space fields of PoolStats, without taking any engine lock.
  PoolStats SpaceStats() const {
    PoolStats s;
    s.block_size = geometry.block_size();
    s.data_blocks = data_blocks.load();
    // A space map larger than the superblock (read-only open of a pool
    // whose grow was interrupted) counts its extra blocks as free.
    const uint64_t used = space->total_blocks() - space->free_blocks();
    s.used_blocks = std::min(used, s.data_blocks);
    s.free_blocks = s.data_blocks - s.used_blocks;
    s.low_water_blocks = options.low_water_blocks;
    s.below_low_water = below_low_water.load();
    return s;
  }

  // Reports a fall below the low-water mark once, and re-arms above it.
  void CheckLowWater() {
    if (options.low_water_blocks == 0 || options.read_only) return;
    const uint64_t free = space->free_blocks();
    if (free < options.low_water_blocks) {
      if (below_low_water.exchange(true)) return;
      PoolStats s = SpaceStats();
      Log(1, "pool free space below the low-water mark: " + std::to_string(s.free_blocks) +
                 " of " + std::to_string(s.data_blocks) + " blocks free (mark " +
                 std::to_string(options.low_water_blocks) + ")");
      if (options.on_low_water) options.on_low_water(s);
    } else if (free > options.low_water_blocks) {
      below_low_water.store(false);
    }
  }

  // ---- Counters (relaxed; statistics only) ----
  std::atomic<uint64_t> n_reads{0}, n_writes{0}, n_provisions{0}, n_cow{0}, n_discards{0},
      n_commits{0}, n_data_syncs{0};

  // ------------------------------------------------------------------------
  SharedMutex& Stripe(VolumeId dev, uint64_t b) {
    return stripes[HashKey(dev.value, b) % kStripes];
  }
  // The stripes of blocks [first, end) of vol, for HeldStripes.
  std::vector<SharedMutex*> StripesOf(const VolumeState& vol, uint64_t first, uint64_t end) {
    std::vector<SharedMutex*> stripes;
    stripes.reserve(end - first);
    for (uint64_t b = first; b < end; ++b) stripes.push_back(&Stripe(vol.id, b));
    return stripes;
  }

  Shard& ShardOf(uint64_t dev, uint64_t b) { return shards[HashKey(dev, b) % kOverlayShards]; }

  Status CheckWritable() const {
    if (options.read_only) return Status::ReadOnly("pool is mounted read-only");
    if (failed.load()) return Status::ReadOnly("pool stopped writing after an error; run thinfs check");
    return Status::Ok();
  }

  // Overlay edits of (dev, b), active overriding frozen.
  Edits OverlayEdits(uint64_t dev, uint64_t b) {
    Edits out;
    if (overlay_keys.load(std::memory_order_acquire) == 0) return out;
    Shard& s = ShardOf(dev, b);
    MutexLock l(&s.mu);
    auto fit = s.frozen.find({dev, b});
    if (fit != s.frozen.end()) out = fit->second;
    auto ait = s.active.find({dev, b});
    if (ait != s.active.end()) {
      for (const auto& e : ait->second) SetEditIn(&out, e.first, e.second);
    }
    return out;
  }

  // REQUIRES: swap_mu held shared.
  void SetEdit(VolumeId dev, uint64_t b, Epoch epoch, std::optional<MapValue> value) {
    {
      Shard& s = ShardOf(dev.value, b);
      MutexLock l(&s.mu);
      auto [it, inserted] = s.active.try_emplace(BlockKey{dev.value, b});
      if (inserted) overlay_keys.fetch_add(1, std::memory_order_release);
      SetEditIn(&it->second, epoch, value);
    }
    // After the edit is visible: a resolve that raced with it cannot fill.
    // Only (dev, b) itself needs it: versions a descendant reads through
    // are never edited while the descendant can reach them (snapshots see
    // older epochs only; GC drops a version only once nothing reaches it).
    map_cache.Invalidate(dev.value, b);
  }

  // Resolve through the map cache. Also answers "own version" questions: a
  // device's own version, when it has one, is what it resolves to.
  Result<Resolved> CachedResolve(const VolumeState& vol, uint64_t b) {
    const uint64_t gen = vol.map_gen.load(std::memory_order_acquire);
    Resolved r;
    MapCache<Resolved>::Ticket ticket;
    if (map_cache.Lookup(vol.id.value, b, gen, &r, &ticket)) return r;
    THINFS_ASSIGN_OR_RETURN(r, Resolve(vol, b));
    map_cache.Fill(ticket, vol.id.value, b, gen, r);
    return r;
  }

  // Newest own version of (dev, b) with epoch <= max_epoch.
  Result<std::optional<Version>> FindOwn(VolumeId dev, uint64_t b, Epoch max_epoch) {
    Edits edits = OverlayEdits(dev.value, b);
    std::optional<Version> best;
    for (const auto& e : edits) {
      if (e.first <= max_epoch && e.second) {
        best = Version{e.first, *e.second};
        break;
      }
    }
    // The store's newest version not overridden by the overlay.
    Epoch bound = max_epoch;
    while (true) {
      if (best && bound < best->epoch) break;
      THINFS_ASSIGN_OR_RETURN(std::optional<Version> v,
                              store->FindVersion(dev, VolumeBlock(b), bound));
      if (!v) break;
      bool overridden = std::any_of(edits.begin(), edits.end(),
                                    [&](const auto& e) { return e.first == v->epoch; });
      if (!overridden) {
        if (!best || v->epoch > best->epoch) best = v;
        break;
      }
      if (v->epoch == 0) break;
      bound = v->epoch - 1;
    }
    return best;
  }

  // Every own version of (dev, b), newest first.
  Result<std::vector<Version>> ListOwn(VolumeId dev, uint64_t b) {
    Edits edits = OverlayEdits(dev.value, b);
    THINFS_ASSIGN_OR_RETURN(std::vector<Version> stored, store->ListVersions(dev, VolumeBlock(b)));
    std::map<Epoch, std::optional<MapValue>, std::greater<>> merged;
    for (const auto& v : stored) merged[v.epoch] = v.value;
    for (const auto& e : edits) merged[e.first] = e.second;
    std::vector<Version> out;
    for (const auto& [ep, val] : merged) {
      if (val) out.push_back(Version{ep, *val});
    }
    return out;
  }

  // Walks the chain from `vol` at its current epoch.
  // REQUIRES: vol.io_mu held (parent pointers stable).
  Result<Resolved> Resolve(const VolumeState& vol, uint64_t b) {
    return ResolveFrom(&vol, vol.epoch.load(), b);
  }
  Result<Resolved> ResolveFrom(const VolumeState* st, Epoch e, uint64_t b) {
    while (st != nullptr) {
      THINFS_ASSIGN_OR_RETURN(std::optional<Version> v, FindOwn(st->id, b, e));
      if (v) return Resolved{true, st->id, v->epoch, v->value};
      if (b >= st->parent_limit.load()) break;
      e = st->parent_epoch;
      st = st->parent.get();
    }
    return Resolved{};
  }
  // What vol would read at b without its own versions.
  Result<Resolved> ResolveParent(const VolumeState& vol, uint64_t b) {
    if (b >= vol.parent_limit.load()) return Resolved{};
    return ResolveFrom(vol.parent.get(), vol.parent_epoch, b);
  }

  // ---- Refcounts ----
  // REQUIRES: refcount_mu held. Absent means 1 (or 0 when unreferenced).
  Result<uint32_t> RefcountLocked(PoolBlock p) REQUIRES(refcount_mu) {
    auto it = refcount_active.find(p.value);
    if (it != refcount_active.end()) return it->second;
    it = refcount_frozen.find(p.value);
    if (it != refcount_frozen.end()) return it->second;
    THINFS_ASSIGN_OR_RETURN(uint32_t n, store->GetRefcount(p));
    return n;
  }

  Result<uint32_t> Refcount(PoolBlock p) {
    MutexLock l(&refcount_mu);
    return RefcountLocked(p);
  }

  // The count that decides whether a block may be overwritten in place:
  // the largest of the uncommitted, committing and committed counts. A
  // dropped reference, like a free, counts only once its commit is durable:
  // until then a crash brings it back, and it must still read the block's
  // old contents (a write in place would show through another device).
  Result<uint32_t> RefcountForInPlaceWrite(PoolBlock p) {
    MutexLock l(&refcount_mu);
    uint32_t n = 0;
    if (auto it = refcount_active.find(p.value); it != refcount_active.end()) n = it->second;
    if (auto it = refcount_frozen.find(p.value); it != refcount_frozen.end()) {
      n = std::max(n, it->second);
    }
    THINFS_ASSIGN_OR_RETURN(uint32_t stored, store->GetRefcount(p));
    return std::max(n, stored);
  }

  // Drops one reference to `p`: decrements a shared block's count, or
  // queues the block to be freed by the next commit.
  // REQUIRES: swap_mu held shared.
  Status ReleaseBlock(PoolBlock p) {
    MutexLock l(&refcount_mu);
    THINFS_ASSIGN_OR_RETURN(uint32_t rc, RefcountLocked(p));
    if (rc >= 2) {
      refcount_active[p.value] = rc - 1;
    } else {
      copies.Drop(p);
      space->Free(p);
    }
    return Status::Ok();
  }

  // REQUIRES: swap_mu held shared.
  Status AddReference(PoolBlock p) {
    MutexLock l(&refcount_mu);
    THINFS_ASSIGN_OR_RETURN(uint32_t rc, RefcountLocked(p));
    refcount_active[p.value] = std::max<uint32_t>(rc, 1) + 1;
    return Status::Ok();
  }

  // Whether a child of `vol` reads `vol` at an epoch in [from, to).
  bool ChildInRange(const VolumeState& vol, Epoch from, Epoch to) {
    MutexLock l(&devices_mu);
    for (const VolumeState* c : vol.children) {
      if (c->parent_epoch >= from && c->parent_epoch < to) return true;
    }
    return false;
  }

  void AddGcCandidate(VolumeId dev, uint64_t b) {
    MutexLock l(&gc_mu);
    gc_candidates.insert({dev.value, b});
  }
  void ScheduleGc(uint64_t dev) {
    MutexLock l(&gc_mu);
    gc_devices.insert(dev);
    gc_cv.Signal();
  }

  // ---- Allocation ----
  Result<PoolBlock> AllocateBlock() {
    Result<PoolBlock> p = AllocateBlockOrWait();
    if (p.ok()) CheckLowWater();
    return p;
  }

  // The new blocks of one write request (lever 38). Blocks taken one at a
  // time interleave when several requests allocate at once, as a loop
  // device's or the kernel's write-back requests do, and a volume written
  // front to back then lies in runs of one or two blocks. The unused tail
  // goes back when the request ends.
  class BlockRun {
   public:
    explicit BlockRun(Impl* pool) : pool_(pool) {}
    ~BlockRun() {
      if (left_ > 0) pool_->space->Unallocate(PoolBlock(next_), left_);
    }
    BlockRun(const BlockRun&) = delete;
    BlockRun& operator=(const BlockRun&) = delete;

    // A new block for the write of a block that `blocks_left` blocks of the
    // request (itself included) follow.
    Result<PoolBlock> Take(uint64_t blocks_left) {
      if (left_ > 0) {
        --left_;
        return PoolBlock(next_++);
      }
      const uint64_t want = std::min(blocks_left, kMaxRunBlocks);
      if (want < 2 || pool_->space->free_blocks() < kRunFreeFactor * want + kRunFreeMargin) {
        return pool_->AllocateBlock();
      }
      uint64_t n = 0;
      Result<PoolBlock> first = pool_->space->AllocateRun(want, &n);
      if (!first.ok()) {
        // Full after all (others took blocks meanwhile): the single
        // allocation commits and waits as it always does.
        if (first.status().IsNoSpace()) return pool_->AllocateBlock();
        return first.status();
      }
      pool_->CheckLowWater();
      next_ = first->value + 1;
      left_ = n - 1;
      return *first;
    }

   private:
    Impl* const pool_;
    uint64_t next_ = 0;
    uint64_t left_ = 0;
  };

  Result<PoolBlock> AllocateBlockOrWait() {
    Result<PoolBlock> p = space->Allocate();
    if (p.ok() || !p.status().IsNoSpace()) return p;
    // Blocks freed but waiting for a commit would satisfy us: commit now.
    Status s = Commit();
    if (!s.ok()) return s;
    p = space->Allocate();
    if (p.ok() || !p.status().IsNoSpace() || options.no_space_timeout.count() == 0) {
      if (!p.ok() && p.status().IsNoSpace()) {
        return Status::NoSpace("pool is full (" + std::to_string(data_blocks.load()) +
                               " blocks in use)");
      }
      return p;
    }
    auto deadline = std::chrono::steady_clock::now() + options.no_space_timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        MutexLock l(&space_mu);
        space_cv.WaitFor(std::chrono::milliseconds(100));
      }
      p = space->Allocate();
      if (p.ok() || !p.status().IsNoSpace()) return p;
    }
    return Status::NoSpace("pool is full and no space appeared within the timeout");
  }

  // ---- Block operations (hold vol.io_mu shared and the block's stripe) ----

  // After replacing or shadowing `own` (a version of vol at b older than the
  // current epoch), frees it when no child can see it.
  // REQUIRES: swap_mu held shared.
  Status DropSuperseded(VolumeState& vol, uint64_t b, const Version& own, Epoch current) {
    if (ChildInRange(vol, own.epoch, current)) {
      // A child may still read it, unless it has its own copy: let the
      // collector decide.
      AddGcCandidate(vol.id, b);
      return Status::Ok();
    }
    SetEdit(vol.id, b, own.epoch, std::nullopt);
    if (!own.value.tombstone()) return ReleaseBlock(own.value.block);
    return Status::Ok();
  }

  // Installs `value` as vol's version of b at the current epoch, releasing
  // what it replaces. `was_mapped`: b read from the data area before.
  // REQUIRES: the stripe of (vol, b) held exclusively.
  Status InstallVersion(VolumeState& vol, uint64_t b, Epoch e, const std::optional<Version>& own,
                        const Resolved& before, std::optional<MapValue> value) {
    ReaderLock swap(&swap_mu);
    SetEdit(vol.id, b, e, value);
    if (own && own->epoch == e) {
      if (!own->value.tombstone()) THINFS_RETURN_IF_ERROR(ReleaseBlock(own->value.block));
    } else if (own) {
      THINFS_RETURN_IF_ERROR(DropSuperseded(vol, b, *own, e));
    } else if (before.found) {
      // An ancestor's version may have lost its last reader.
      AddGcCandidate(before.owner, b);
    }
    bool now_mapped = value && !value->tombstone();
    if (now_mapped != before.mapped()) vol.mapped.fetch_add(now_mapped ? 1 : -1);
    vol.dirty.store(true);
    return Status::Ok();
  }

  // Makes block b of vol read as zeros.
  // REQUIRES: the stripe of (vol, b) held exclusively.
  Status DiscardBlockLocked(VolumeState& vol, uint64_t b) {
    Epoch e = vol.epoch.load();
    THINFS_ASSIGN_OR_RETURN(std::optional<Version> own, FindOwn(vol.id, b, e));
    Resolved before;
    if (own) {
      before = Resolved{true, vol.id, own->epoch, own->value};
    } else {
      THINFS_ASSIGN_OR_RETURN(before, ResolveParent(vol, b));
    }
    if (!before.mapped()) return Status::Ok();
    n_discards.fetch_add(1, std::memory_order_relaxed);
    if (own && own->epoch == e) {
      // Would something older show through once the version is gone?
      Resolved below;
      std::optional<Version> older;
      if (e > 0) {
        THINFS_ASSIGN_OR_RETURN(older, FindOwn(vol.id, b, e - 1));
      }
      if (older) {
        below = Resolved{true, vol.id, older->epoch, older->value};
      } else {
        THINFS_ASSIGN_OR_RETURN(below, ResolveParent(vol, b));
      }
      std::optional<MapValue> value;
      if (below.mapped()) value = MapValue{PoolBlock(), MapValue::kTombstone};
      ReaderLock swap(&swap_mu);
      SetEdit(vol.id, b, e, value);
      THINFS_RETURN_IF_ERROR(ReleaseBlock(own->value.block));
      vol.mapped.fetch_sub(1);
      vol.dirty.store(true);
      return Status::Ok();
    }
    return InstallVersion(vol, b, e, own, before, MapValue{PoolBlock(), MapValue::kTombstone});
  }

  // Writes `buf` at `off` inside block b of vol. A new block comes from
  // `run` when given: the write of a request's block that `blocks_left`
  // blocks of the request (b included) follow. `wrote`, when given, is set
  // to the pool block the bytes went to through the data device, and left
  // alone where none did (zeros that unmap or change nothing, a copy owed
  // to the commit).
  Status WriteBlock(VolumeState& vol, uint64_t b, uint64_t off, std::span<const std::byte> buf,
                    BlockRun* run = nullptr, uint64_t blocks_left = 1,
                    std::optional<PoolBlock>* wrote = nullptr) {
    WriterLock stripe(&Stripe(vol.id, b));
    return WriteBlockLocked(vol, b, off, buf, run, blocks_left, wrote);
  }

  // What a write at epoch e finds of block b of vol.
  struct WriteTarget {
    Resolved resolved;  // what vol resolves to
    // The newest own version at or below e, when vol resolves to one
    // (versions above e do not exist; a snapshot raises e before any).
    std::optional<Version> own;
    // own is at e, maps a block, and nobody else reads that block: the
    // write goes into it in place.
    bool in_place = false;
  };
  // REQUIRES: vol.io_mu held shared; the stripe of (vol, b) exclusively.
  Result<WriteTarget> FindWriteTarget(VolumeState& vol, uint64_t b, Epoch e) {
    WriteTarget t;
    THINFS_ASSIGN_OR_RETURN(t.resolved, CachedResolve(vol, b));
    if (t.resolved.found && t.resolved.owner == vol.id) {
      t.own = Version{t.resolved.epoch, t.resolved.value};
    }
    if (t.own && t.own->epoch == e && !t.own->value.tombstone()) {
      t.in_place = true;
      if (t.own->value.flags & MapValue::kMaybeShared) {
        THINFS_ASSIGN_OR_RETURN(uint32_t rc, RefcountForInPlaceWrite(t.own->value.block));
        t.in_place = rc <= 1;
      }
    }
    return t;
  }

  // WriteBlock with the stripe of (vol, b) held exclusively by the caller.
  // `zeros_found`: what a zero check of buf by the caller found, if it made
  // one (WriteStream's plan), so that a block of zeros is not read twice.
  Status WriteBlockLocked(VolumeState& vol, uint64_t b, uint64_t off,
                          std::span<const std::byte> buf, BlockRun* run, uint64_t blocks_left,
                          std::optional<PoolBlock>* wrote,
                          std::optional<bool> zeros_found = std::nullopt) {
    const uint64_t bs = geometry.block_size();
    const bool whole = off == 0 && buf.size() == bs;
    Epoch e = vol.epoch.load();
    THINFS_ASSIGN_OR_RETURN(const WriteTarget target, FindWriteTarget(vol, b, e));
    const std::optional<Version>& own = target.own;
    const bool zeros = options.zero_detection && (zeros_found ? *zeros_found : IsAllZero(buf));
    if (target.in_place) {
      if (zeros && whole) return DiscardBlockLocked(vol, b);
      // A block that owes its copy may keep the bytes in memory until
      // the copy writes it whole.
      if (wrote != nullptr && !copies.Owes(own->value.block)) *wrote = own->value.block;
      Status s = copies.Write(own->value.block, off, buf);
      NoteDataWritten(/*new_block=*/false);
      return s;
    }
    // Without an own version, vol resolves to what its parent shows.
    const Resolved& before = target.resolved;
    if (zeros && (whole || !before.mapped())) {
      // Zeros over a block that reads as zeros change nothing; a whole
      // block of zeros unmaps.
      if (whole) return DiscardBlockLocked(vol, b);
      return Status::Ok();
    }
    THINFS_ASSIGN_OR_RETURN(PoolBlock p, run ? run->Take(blocks_left) : AllocateBlock());
    n_provisions.fetch_add(1, std::memory_order_relaxed);
    Status s;
    bool owed = false;
    if (whole) {
      // dm-thin's overwrite optimisation: never read what is overwritten.
      s = data->Write(p, 0, buf);
    } else if (before.mapped() && copies.HasRoom() && !copies.Owes(before.value.block)) {
      // Copy-on-write with the copy owed to the next commit: only the
      // written bytes now (a source that itself owes a copy is copied at
      // once below, so that owed copies never chain).
      n_cow.fetch_add(1, std::memory_order_relaxed);
      owed = true;
      s = copies.Start(p, before.value.block, off, buf);
      if (copies.size() * 2 >= copies.capacity()) WakeCommitter();
      WakeCopier();
    } else if (before.mapped() && data->SharesCopies() && !copies.Owes(before.value.block)) {
      // Copy-on-write now, where the copy shares data (a reflink): the
      // bytes around the write are shared with the old block, never read.
      n_cow.fetch_add(1, std::memory_order_relaxed);
      const PoolBlock from = before.value.block;
      s = off == 0 ? Status::Ok() : data->Copy(from, p, 0, off);
      if (s.ok() && off + buf.size() < bs) {
        s = data->Copy(from, p, off + buf.size(), bs - off - buf.size());
      }
      if (s.ok()) s = data->Write(p, off, buf);
    } else {
      std::vector<std::byte> block(bs);
      if (before.mapped()) {
        n_cow.fetch_add(1, std::memory_order_relaxed);
        s = copies.Read(before.value.block, 0, block);
      }
      if (s.ok()) {
        std::memcpy(block.data() + off, buf.data(), buf.size());
        s = data->Write(p, 0, block);
      }
    }
    if (!s.ok()) {
      ReaderLock swap(&swap_mu);
      space->Free(p);
      return s;
    }
    NoteDataWritten(/*new_block=*/true);
    if (wrote != nullptr && !owed) *wrote = p;
    return InstallVersion(vol, b, e, own, before, MapValue{p, 0});
  }

  // How WriteStream writes one whole block of a stream.
  struct StreamBlock {
    enum Kind {
      kAsWrite,  // at once, as WriteBlock writes it
      kInPlace,  // over `block`, the volume's own and no one else's
      kNew,      // to the new `block`, then mapped
    };
    Kind kind = kAsWrite;
    // kAsWrite: what the plan's zero check found, if it made one.
    std::optional<bool> zeros;
    PoolBlock block;
    // kNew: what InstallVersion needs, as WriteBlock found it.
    Epoch epoch = 0;
    std::optional<Version> own;
    Resolved before;
  };

  // WriteStream's plan for `buf` at `off` in block b of vol: the choices
  // WriteBlockLocked makes, up to the data write. A kNew block is taken
  // from `run`. Parts of a block, zeros and blocks that owe their copy
  // are kAsWrite.
  // REQUIRES: vol.io_mu held shared; the stripe of (vol, b) exclusively.
  Result<StreamBlock> PlanStreamBlock(VolumeState& vol, uint64_t b, uint64_t off,
                                      std::span<const std::byte> buf, BlockRun* run,
                                      uint64_t blocks_left) {
    StreamBlock plan;
    if (off != 0 || buf.size() != geometry.block_size()) return plan;
    if (options.zero_detection) {
      plan.zeros = IsAllZero(buf);
      if (*plan.zeros) return plan;
    }
    const Epoch e = vol.epoch.load();
    THINFS_ASSIGN_OR_RETURN(WriteTarget target, FindWriteTarget(vol, b, e));
    if (target.in_place) {
      if (copies.Owes(target.own->value.block)) return plan;
      plan.kind = StreamBlock::kInPlace;
      plan.block = target.own->value.block;
      return plan;
    }
    THINFS_ASSIGN_OR_RETURN(plan.block, run->Take(blocks_left));
    n_provisions.fetch_add(1, std::memory_order_relaxed);
    plan.kind = StreamBlock::kNew;
    plan.epoch = e;
    plan.own = std::move(target.own);
    plan.before = target.resolved;
    return plan;
  }

  // Volume::Write of a stream of a writer with no cache of its own
  // (WriteCache::kWriter): its whole blocks, new or overwritten in place,
  // are written together, consecutive pool blocks in one write, past the
  // host's cache where the data device can (BlockDevice::WritePastCache,
  // docs/benchmarks.md, lever 52), and only then mapped; the stripes of
  // those blocks are held throughout, so nobody reads a new block before
  // its data are written, or frees one a write is still writing. The rest
  // (parts of a block at the request's ends, zeros, owed copies) is
  // written first, as Volume::Write writes it, and its stripes released.
  // What went through the host's cache is added to `written`, for
  // StartWriteback.
  // REQUIRES: vol.io_mu held shared; the request inside the volume.
  Status WriteStream(VolumeState& vol, uint64_t offset, std::span<const std::byte> buf,
                     std::vector<BlockDevice::Run>* written) {
    const uint64_t bs = geometry.block_size();
    const uint64_t first = geometry.BlockOf(offset);
    const uint64_t end = geometry.BlocksFor(offset + buf.size());
    HeldStripes held(StripesOf(vol, first, end), HeldStripes::Mode::kExclusive);
    BlockRun run(this);

    // The whole blocks to write together: where each piece of buf goes.
    struct Piece {
      uint64_t b;
      std::span<const std::byte> buf;
      StreamBlock how;
    };
    std::vector<Piece> pieces;
    pieces.reserve(end - first);
    // New blocks not (yet) mapped go back to the free space on a failure.
    auto free_unmapped = [&](size_t from) {
      ReaderLock swap(&swap_mu);
      for (size_t i = from; i < pieces.size(); ++i) {
        if (pieces[i].how.kind == StreamBlock::kNew) space->Free(pieces[i].how.block);
      }
    };
    for (size_t done = 0; done < buf.size();) {
      const uint64_t pos = offset + done;
      const uint64_t b = geometry.BlockOf(pos);
      const uint64_t off = geometry.OffsetInBlock(pos);
      const size_t n = static_cast<size_t>(std::min<uint64_t>(bs - off, buf.size() - done));
      const std::span<const std::byte> piece = buf.subspan(done, n);
      done += n;
      Result<StreamBlock> how = PlanStreamBlock(vol, b, off, piece, &run, end - b);
      Status s = how.status();
      if (s.ok() && how->kind == StreamBlock::kAsWrite) {
        std::optional<PoolBlock> wrote;
        s = WriteBlockLocked(vol, b, off, piece, &run, end - b, &wrote, how->zeros);
        if (wrote) AppendToRuns(written, *wrote);
      } else if (s.ok()) {
        pieces.push_back(Piece{b, piece, *how});
      }
      if (!s.ok()) {
        free_unmapped(0);
        return s;
      }
    }
    // What is left to write holds its stripes; the others are done.
    std::vector<SharedMutex*> keep;
    keep.reserve(pieces.size());
    for (const Piece& piece : pieces) keep.push_back(&Stripe(vol.id, piece.b));
    held.Keep(std::move(keep));

    // The data, each run of consecutive pool blocks in one write.
    for (size_t i = 0; i < pieces.size();) {
      size_t j = i + 1;
      while (j < pieces.size() && pieces[j].b == pieces[j - 1].b + 1 &&
             pieces[j].how.block.value == pieces[j - 1].how.block.value + 1) {
        ++j;  // buf's pieces of consecutive blocks are consecutive too
      }
      const std::span<const std::byte> bytes(pieces[i].buf.data(), (j - i) * bs);
      Result<bool> past = data->WritePastCache(pieces[i].how.block, 0, bytes);
      Status s = past.status();
      // Where it cannot, through the host's cache as WriteBlock writes.
      for (size_t k = i; s.ok() && !*past && k < j; ++k) {
        s = data->Write(pieces[k].how.block, 0, pieces[k].buf);
        if (s.ok()) AppendToRuns(written, pieces[k].how.block);
      }
      if (!s.ok()) {
        free_unmapped(0);
        return s;
      }
      i = j;
    }

    // Then the map.
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& piece = pieces[i];
      if (piece.how.kind == StreamBlock::kInPlace) {
        NoteDataWritten(/*new_block=*/false);
        continue;
      }
      NoteDataWritten(/*new_block=*/true);
      Status s = InstallVersion(vol, piece.b, piece.how.epoch, piece.how.own, piece.how.before,
                                MapValue{piece.how.block, 0});
      if (!s.ok()) {
        free_unmapped(i + 1);
        return s;
      }
    }
    return Status::Ok();
  }

  // Reads `buf` from `off` into block b of vol. `around`: a read the data
  // device may read around (BlockDevice::ReadAround: the rest of the
  // block's window comes into the host's cache with it, lever 44).
  Status ReadBlock(VolumeState& vol, uint64_t b, uint64_t off, std::span<std::byte> buf,
                   bool around = false) {
    ReaderLock stripe(&Stripe(vol.id, b));
    THINFS_ASSIGN_OR_RETURN(Resolved r, CachedResolve(vol, b));
    if (!r.mapped()) {
      std::memset(buf.data(), 0, buf.size());
      return Status::Ok();
    }
    return copies.Read(r.value.block, off, buf, around);
  }

  // Reads `buf` from `offset` of vol, several blocks: every block's stripe
  // is held shared from its resolve until the data is read, as ReadBlock
  // holds one, and each run of consecutive pool blocks is read as one piece
  // (one pread for a file, lever 34, or when `cached`, PrefetchBlocks'
  // finding, one copy out of the file's mapping, lever 35:
  // docs/benchmarks.md). A block that owes its copy is read through
  // `copies` on its own. `cache`: what the caller's probe found
  // (BlockDevice::ReadPieces); kBypass, for a reader with its own cache
  // (ReadCache::kReader), is probed here instead: kHeld where the host's
  // cache holds the end of the last mapped block (RunsCached, lever 46).
  Status ReadBlocks(VolumeState& vol, uint64_t offset, std::span<std::byte> buf,
                    BlockDevice::Cache cache) {
    const uint64_t first = geometry.BlockOf(offset);
    const uint64_t last = geometry.BlocksFor(offset + buf.size());
    HeldStripes held(StripesOf(vol, first, last), HeldStripes::Mode::kShared);

    std::vector<BlockDevice::ReadPiece> pieces, owed;
    pieces.reserve(last - first);
    std::optional<PoolBlock> last_mapped;
    const uint64_t bs = geometry.block_size();
    size_t done = 0;
    while (done < buf.size()) {
      const uint64_t pos = offset + done;
      const uint64_t b = geometry.BlockOf(pos);
      const uint64_t off = geometry.OffsetInBlock(pos);
      const size_t n = static_cast<size_t>(std::min<uint64_t>(bs - off, buf.size() - done));
      std::span<std::byte> out = buf.subspan(done, n);
      done += n;
      THINFS_ASSIGN_OR_RETURN(const Resolved r, CachedResolve(vol, b));
      if (!r.mapped()) {
        std::memset(out.data(), 0, out.size());
        continue;
      }
      const PoolBlock pb = r.value.block;
      last_mapped = pb;
      // Under the stripe a mapped block cannot start owing a copy (only a
      // new block does, before it is mapped), so one that owes none now is
      // read straight from the data device.
      if (copies.Owes(pb)) {
        owed.push_back(BlockDevice::ReadPiece{pb, off, out});
        continue;
      }
      if (!pieces.empty()) {
        BlockDevice::ReadPiece& prev = pieces.back();
        const bool next_block =
            off == 0 && geometry.BytesOf(pb.value) ==
                            geometry.BytesOf(prev.block.value) + prev.offset + prev.buf.size();
        if (next_block && prev.buf.data() + prev.buf.size() == out.data()) {
          prev.buf = std::span<std::byte>(prev.buf.data(), prev.buf.size() + out.size());
          continue;
        }
      }
      pieces.push_back(BlockDevice::ReadPiece{pb, off, out});
    }
    // Probed before the owed copies are read, which may cache that page.
    if (cache == BlockDevice::Cache::kBypass && last_mapped) {
      const BlockDevice::Run tail{*last_mapped, 1};
      if (data->RunsCached({&tail, 1})) cache = BlockDevice::Cache::kHeld;
    }
    for (const BlockDevice::ReadPiece& o : owed) {
      THINFS_RETURN_IF_ERROR(copies.Read(o.block, o.offset, o.buf));
    }
    return data->ReadPieces(pieces, cache);
  }

  // Asks the data device to start reading the pool blocks that vblocks
  // [first, last) of `vol` read from, one hint per run of consecutive pool
  // blocks, so that a read of several blocks waits for one batch of I/O
  // rather than for each block in turn (docs/benchmarks.md, lever 19). Only
  // a hint: a block that a write moves meanwhile is read from where it is.
  // One run is read through `scratch` (BlockDevice::PrefetchForRead), which
  // the caller overwrites; `head` is the read's offset into block `first`.
  //
  // The host's readahead follows the data area's order, which is the
  // device's only where its blocks are contiguous. So a sequential reader
  // whose read found several runs, not cached, also starts a window of
  // kReadAheadBytes of the device's next blocks, hinted run by run, and
  // moves it on while it reads on in order (docs/benchmarks.md, lever 22).
  // REQUIRES: vol.io_mu held.
  // Returns whether the data device's probe found the blocks cached (no
  // hint was needed): then ReadBlocks may copy them out of its mapping.
  bool PrefetchBlocks(VolumeState& vol, uint64_t first, uint64_t last, uint64_t head,
                      std::span<std::byte> scratch) {
    bool first_mapped = false;
    std::vector<BlockDevice::Run> runs = PoolRuns(vol, first, last, &first_mapped);
    const bool cold = data->PrefetchForRead(runs, first_mapped ? head : 0, scratch);
    const uint64_t window = std::max<uint64_t>(2, kReadAheadBytes / geometry.block_size());
    uint64_t from = 0, to = 0;
    {
      MutexLock l(&vol.ra_mu);
      // In order: this read starts where the last one ended, or within a
      // read's length of it (requests of one reader may arrive on several
      // threads, slightly out of order).
      const uint64_t len = last - first;
      const bool in_order = first + len >= vol.ra_next && first <= vol.ra_next + len;
      vol.ra_next = in_order ? std::max(vol.ra_next, last) : last;
      if (!in_order) vol.ra_end = 0;
      const bool start = cold && runs.size() > 1;
      if (in_order && (start || vol.ra_end > first) && vol.ra_end < last + window / 2) {
        from = std::max(last, vol.ra_end);
        to = last + window;
        vol.ra_end = to;
      }
    }
    to = std::min(to, geometry.BlocksFor(vol.size.load()));
    if (from < to) {
      for (const BlockDevice::Run& r : PoolRuns(vol, from, to, nullptr)) {
        data->Prefetch(r.first, r.count);
      }
    }
    return !cold;
  }

  // The runs of consecutive pool blocks that vblocks [first, last) of `vol`
  // resolve to, holes left out; *first_mapped: whether vblock `first` is
  // mapped. REQUIRES: vol.io_mu held.
  std::vector<BlockDevice::Run> PoolRuns(VolumeState& vol, uint64_t first, uint64_t last,
                                         bool* first_mapped) {
    std::vector<BlockDevice::Run> runs;
    for (uint64_t b = first; b < last; ++b) {
      Result<Resolved> r = [&] {
        ReaderLock stripe(&Stripe(vol.id, b));
        return CachedResolve(vol, b);
      }();
      if (!r.ok() || !r->mapped()) continue;
      if (b == first && first_mapped != nullptr) *first_mapped = true;
      AppendToRuns(&runs, r->value.block);
    }
    return runs;
  }

  // Next block >= b that has a version in vol's chain (a candidate for
  // being mapped), or nullopt.
  // REQUIRES: vol.io_mu held.
  Result<std::optional<uint64_t>> NextCandidate(const VolumeState& vol, uint64_t b) {
    // The overlay is read before the store: an edit leaves the overlay only
    // after it is in the store, so one of the two always shows it (the
    // other order can miss an edit a commit moves in between).
    std::vector<std::pair<const VolumeState*, uint64_t>> chain;  // device, limit
    uint64_t limit = UINT64_MAX;  // blocks of this ancestor that are reachable
    for (const VolumeState* st = &vol; st != nullptr && b < limit; st = st->parent.get()) {
      chain.emplace_back(st, limit);
      limit = std::min(limit, st->parent_limit.load());
    }
    std::optional<uint64_t> best;
    auto consider = [&](uint64_t k, uint64_t lim) {
      if (k < lim && (!best || k < *best)) best = k;
    };
    if (overlay_keys.load() != 0) {
      for (Shard& s : shards) {
        MutexLock l(&s.mu);
        for (const auto& [st, lim] : chain) {
          for (auto* m : {&s.active, &s.frozen}) {
            auto i = m->lower_bound(BlockKey{st->id.value, b});
            if (i != m->end() && i->first.dev == st->id.value) consider(i->first.vblock, lim);
          }
        }
      }
    }
    auto it = store->NewMapIterator();
    for (const auto& [st, lim] : chain) {
      it->Seek(st->id, VolumeBlock(b));
      THINFS_RETURN_IF_ERROR(it->status());
      if (it->Valid() && it->entry().device == st->id) consider(it->entry().vblock.value, lim);
    }
    return best;
  }

  // Runs `fn(b)` for every block in [first, last) that has a version in the
  // chain, in order.
  template <typename Fn>
  Status ForEachCandidate(const VolumeState& vol, uint64_t first, uint64_t last, Fn fn) {
    uint64_t b = first;
    while (b < last) {
      THINFS_ASSIGN_OR_RETURN(std::optional<uint64_t> next, NextCandidate(vol, b));
      if (!next || *next >= last) break;
      THINFS_RETURN_IF_ERROR(fn(*next));
      b = *next + 1;
    }
    return Status::Ok();
  }

  // ---- Commit ----
  // kExplicit (fsync, snapshot, unmount, management operations, Commit()):
  // syncs every data write before it. kDataSync (fdatasync): the same, but
  // a device record whose only change is a write's new times is left to
  // the next other commit, as fdatasync(2) leaves a file's timestamps
  // (lever 26). kPeriodic (the committer thread): the
  // same with sync_overwrites (the default); without, it syncs the data only
  // when the commit has new data to make reachable.
  enum class CommitKind { kExplicit, kDataSync, kPeriodic };
  Status Commit(CommitKind kind = CommitKind::kExplicit) EXCLUDES(swap_mu) {
    MutexLock c(&commit_mu);
    if (options.read_only) return Status::Ok();
    if (failed.load()) return Status::ReadOnly("pool stopped writing after an error: " + failure);
    MetaBatch batch;
    std::vector<PoolBlock> frees;
    bool any_overlay = false;
    {
      WriterLock swap(&swap_mu);
      for (Shard& s : shards) {
        MutexLock l(&s.mu);
        THINFS_CHECK(s.frozen.empty());
        if (!s.active.empty()) {
          any_overlay = true;
          s.frozen.swap(s.active);
        }
      }
      {
        MutexLock l(&refcount_mu);
        THINFS_CHECK(refcount_frozen.empty());
        refcount_frozen.swap(refcount_active);
        for (const auto& [p, n] : refcount_frozen) batch.refcounts.emplace_back(PoolBlock(p), n);
      }
      frees = space->TakePendingFrees();
      {
        MutexLock d(&devices_mu);
        for (auto& [id, st] : devices) {
          bool put = st->dirty.exchange(false);
          // A record written anyway carries the times too.
          if (put || kind != CommitKind::kDataSync) put |= st->times_dirty.exchange(false);
          if (put) batch.put_devices.push_back(st->Snapshot());
        }
        batch.delete_devices = std::move(deleted_records);
        deleted_records.clear();
        superblock.next_device_id = next_device_id;
      }
    }
    using Clock = std::chrono::steady_clock;
    // A commit's latency starts here: the owed copies are part of what an
    // fsync waits for.
    const Clock::time_point t_copies = Clock::now();
    uint64_t copies_made = 0;
    // Owed copy-on-write copies, before the data sync: every mapping this
    // commit writes points at a complete block. (A copy is owed only by a
    // write whose edit is in this commit or the next.)
    // New data (these copies too) must be synced; overwrites in place a
    // periodic commit syncs only with sync_overwrites. One data sync covers
    // both.
    bool must_sync = new_data.exchange(false);
    if (copies.size() != 0) {
      Status cs = copies.CompleteAll(&copies_made);
      if (!cs.ok()) {
        failure = cs.ToString();
        failed.store(true);
        Log(0, "commit failed, the pool stops writing until 'thinfs check': " + failure);
        return cs;
      }
      must_sync = true;
    }
    bool data_written = false;
    if (must_sync || kind != CommitKind::kPeriodic || options.sync_overwrites) {
      data_written = data_dirty.exchange(false) || must_sync;
    }
    // Nothing for the metadata to record: no mapping, refcount, device
    // record or free since the last commit. Overwrites in place (whose
    // device times stand within a clock tick: VolumeState::TouchForWrite)
    // then need only the data sync; the bitmap and the WAL are left alone
    // and the transaction id stays (lever 26).
    const bool metadata = any_overlay || !batch.empty() || !frees.empty();
    if (!metadata && !data_written) return Status::Ok();

    for (Shard& s : shards) {
      MutexLock l(&s.mu);
      for (const auto& [k, edits] : s.frozen) {
        for (const auto& [ep, val] : edits) {
          if (val) {
            batch.put_mappings.push_back(MapEntry{VolumeId(k.dev), VolumeBlock(k.vblock), ep, *val});
          } else {
            batch.delete_mappings.push_back({VolumeId(k.dev), VolumeBlock(k.vblock), ep});
          }
        }
      }
    }
    const Clock::time_point t0 = Clock::now();
    // No data write since the last data sync: nothing to flush (a snapshot,
    // a rename, a commit after fsync). data_dirty is set after each write.
    Status s = Status::Ok();
    if (data_written) {
      s = data->Sync();
      n_data_syncs.fetch_add(1, std::memory_order_relaxed);
    }
    const Clock::time_point t1 = Clock::now();
    if (s.ok() && metadata) s = space->Sync(superblock.transaction_id + 1);
    const Clock::time_point t2 = Clock::now();
    if (s.ok() && metadata) {
      superblock.transaction_id++;
      batch.superblock = superblock;
      s = store->Commit(batch, /*sync=*/true);
      if (!s.ok()) superblock.transaction_id--;
    }
    const Clock::time_point t3 = Clock::now();
    if (!s.ok()) {
      // Keep the frozen edits readable so that memory stays consistent, but
      // stop changing anything: the on-disk state is the last commit.
      failure = s.ToString();
      failed.store(true);
      Log(0, "commit failed, the pool stops writing until 'thinfs check': " + failure);
      return s;
    }
    auto us = [](Clock::duration d) {
      return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
    };
    {
      MutexLock l(&latency_mu);
      if (latency_us.size() < kLatencySamples) {
        latency_us.push_back(us(t3 - t_copies));
      } else {
        latency_us[latency_next] = us(t3 - t_copies);
      }
      latency_next = (latency_next + 1) % kLatencySamples;
    }
    if (t3 - t_copies > options.slow_commit) {
      Log(1, "slow commit " + std::to_string(superblock.transaction_id) + ": " +
                 std::to_string(us(t3 - t_copies) / 1000) + " ms (" +
                 std::to_string(copies_made) + " owed copies " +
                 std::to_string(us(t0 - t_copies) / 1000) + " ms, data sync " +
                 std::to_string(us(t1 - t0) / 1000) + " ms, bitmap " +
                 std::to_string(us(t2 - t1) / 1000) + " ms, metadata " +
                 std::to_string(us(t3 - t2) / 1000) + " ms; " +
                 std::to_string(batch.put_mappings.size() + batch.delete_mappings.size()) +
                 " mapping changes)");
    }
    transaction_id.store(superblock.transaction_id);
    for (Shard& sh : shards) {
      MutexLock l(&sh.mu);
      overlay_keys.fetch_sub(static_cast<int64_t>(sh.frozen.size()));
      sh.frozen.clear();
    }
    {
      MutexLock l(&refcount_mu);
      refcount_frozen.clear();
    }
    space->Release(frees);
    if (!frees.empty()) {
      space_cv.SignalAll();
      CheckLowWater();
    }
    n_commits.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }

  // Asks the periodic committer to commit now (when it runs).
  void WakeCommitter() {
    MutexLock l(&timer_mu);
    timer_cv.Signal();
  }

  // Tells the background copier that copies are owed (when it runs). Every
  // owed copy signals: a wake-up only when the table stops being empty
  // could be missed by two writers starting copies at once.
  void WakeCopier() {
    MutexLock l(&copier_mu);
    copier_cv.Signal();
  }

  // The background copier: once copies are owed, waits kCopyAheadDelay for
  // more to gather, then makes every copy owed, in source order, as a
  // commit would (DeferredCopies::CompleteAll; the two may run at once,
  // and each copy is made once). It neither syncs nor commits: the next
  // commit's data sync covers these writes like its own copies. A copy
  // that fails stays owed, and the commit that tries it again reports it;
  // the copier tries again only after kCopierRetryDelay, and not at all
  // once the pool has stopped writing.
  void CopierLoop() {
    while (true) {
      {
        MutexLock l(&copier_mu);
        while (!copier_stop && (copies.size() == 0 || failed.load())) copier_cv.Wait();
        if (!CopierSleep(kCopyAheadDelay)) return;
      }
      if (copies.CompleteAll().ok()) continue;
      MutexLock l(&copier_mu);
      if (!CopierSleep(kCopierRetryDelay)) return;
    }
  }

  // Sleeps for `d` or until the stop, whatever signals come meanwhile;
  // false on the stop.
  bool CopierSleep(std::chrono::milliseconds d) REQUIRES(copier_mu) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point until = Clock::now() + d;
    while (!copier_stop && Clock::now() < until) copier_cv.WaitFor(until - Clock::now());
    return !copier_stop;
  }

  void CommitLoop() {
    while (true) {
      {
        MutexLock l(&timer_mu);
        if (timer_stop) return;
        timer_cv.WaitFor(options.commit_interval);
        if (timer_stop) return;
      }
      Status s = Commit(CommitKind::kPeriodic);
      (void)s;  // Failure is sticky and reported by the next writer.
    }
  }

  // ---- Garbage collection ----

  // Whether any live reader reaches through `c` to its parent at block b.
  // REQUIRES: devices_mu held (tree stable); reads versions from the store.
  Result<bool> ReachesParent(const VolumeState& c, uint64_t b) REQUIRES(devices_mu) {
    if (b >= c.parent_limit.load()) return false;
    THINFS_ASSIGN_OR_RETURN(std::vector<Version> own, ListOwn(c.id, b));
    if (own.empty() && c.live()) return true;
    Epoch min_own = own.empty() ? std::numeric_limits<Epoch>::max() : own.back().epoch;
    for (const VolumeState* g : c.children) {
      if (!own.empty() && g->parent_epoch >= min_own) continue;
      THINFS_ASSIGN_OR_RETURN(bool r, ReachesParent(*g, b));
      if (r) return true;
    }
    return false;
  }

  // How many live devices (counting stops at 2) read block b through `c`
  // to c's parent.
  // REQUIRES: devices_mu held.
  Result<int> ReadersThrough(const VolumeState& c, uint64_t b) REQUIRES(devices_mu) {
    if (b >= c.parent_limit.load()) return 0;
    THINFS_ASSIGN_OR_RETURN(std::vector<Version> own, ListOwn(c.id, b));
    int n = own.empty() && c.live() && !c.gone.load() ? 1 : 0;
    Epoch min_own = own.empty() ? std::numeric_limits<Epoch>::max() : own.back().epoch;
    for (const VolumeState* g : c.children) {
      if (n >= 2) break;
      if (!own.empty() && g->parent_epoch >= min_own) continue;
      THINFS_ASSIGN_OR_RETURN(int m, ReadersThrough(*g, b));
      n += m;
    }
    return std::min(n, 2);
  }

  // Removes the versions of (vol, b) that no live device can see.
  // Returns how many were removed.
  Result<int> CollectBlock(VolumeState& vol, uint64_t b) {
    WriterLock stripe(&Stripe(vol.id, b));
    THINFS_ASSIGN_OR_RETURN(std::vector<Version> versions, ListOwn(vol.id, b));
    std::vector<Version> garbage;
    {
      // The tree is read under devices_mu; the edits are made after it is
      // released (swap_mu is ordered before devices_mu).
      MutexLock d(&devices_mu);
      const bool deleting = vol.rec.flags & DeviceRecord::kDeleting;
      for (size_t i = 0; i < versions.size(); ++i) {
        const Version& v = versions[i];
        Epoch next = i == 0 ? std::numeric_limits<Epoch>::max() : versions[i - 1].epoch;
        bool needed = false;
        if (!deleting) {
          if (i == 0 && vol.live() && !vol.gone.load()) {
            needed = true;
          } else {
            for (const VolumeState* c : vol.children) {
              if (c->parent_epoch < v.epoch || c->parent_epoch >= next) continue;
              THINFS_ASSIGN_OR_RETURN(bool r, ReachesParent(*c, b));
              if (r) {
                needed = true;
                break;
              }
            }
          }
        }
        if (!needed) garbage.push_back(v);
      }
    }
    if (garbage.empty()) return 0;
    ReaderLock swap(&swap_mu);
    for (const Version& v : garbage) {
      SetEdit(vol.id, b, v.epoch, std::nullopt);
      if (!v.value.tombstone()) THINFS_RETURN_IF_ERROR(ReleaseBlock(v.value.block));
    }
    return static_cast<int>(garbage.size());
  }

  std::shared_ptr<VolumeState> FindById(uint64_t id) {
    MutexLock d(&devices_mu);
    auto it = devices.find(id);
    return it == devices.end() ? nullptr : it->second;
  }

  // One pass over a device: every version checked. For a deleting device,
  // removes everything and then the record.
  Status CollectDevice(uint64_t id) {
    std::shared_ptr<VolumeState> vol = FindById(id);
    if (!vol) return Status::Ok();
    // Make the overlay's edits of this device visible to the store iterator.
    THINFS_RETURN_IF_ERROR(Commit());
    uint64_t b = 0;
    while (true) {
      std::vector<uint64_t> blocks;
      {
        auto it = store->NewMapIterator();
        it->Seek(vol->id, VolumeBlock(b));
        while (it->Valid() && it->entry().device == vol->id && blocks.size() < 256) {
          uint64_t vb = it->entry().vblock.value;
          if (blocks.empty() || blocks.back() != vb) blocks.push_back(vb);
          it->Next();
        }
        THINFS_RETURN_IF_ERROR(it->status());
      }
      if (blocks.empty()) break;
      for (uint64_t vb : blocks) {
        THINFS_ASSIGN_OR_RETURN(int n, CollectBlock(*vol, vb));
        (void)n;
      }
      b = blocks.back() + 1;
      // Let I/O and commits through between chunks.
      std::this_thread::yield();
    }
    bool remove_record = false;
    {
      MutexLock d(&devices_mu);
      if (vol->rec.flags & DeviceRecord::kDeleting) {
        remove_record = true;
      } else if (vol->rec.flags & DeviceRecord::kGcPending) {
        vol->rec.flags &= ~DeviceRecord::kGcPending;
        vol->dirty.store(true);
      }
    }
    if (remove_record) {
      THINFS_RETURN_IF_ERROR(Commit());
      // Every version is gone from the store now; drop the record.
      auto it = store->NewMapIterator();
      it->Seek(vol->id, VolumeBlock(0));
      if (it->Valid() && it->entry().device == vol->id) {
        ScheduleGc(id);  // something appeared meanwhile: another pass
        return Status::Ok();
      }
      MutexLock d(&devices_mu);
      devices.erase(id);
      deleted_records.push_back(vol->id);
    }
    return Commit();
  }

  // Runs everything queued. Returns when the queues were empty.
  Status GcOnce() {
    MutexLock run(&gc_run_mu);
    std::set<uint64_t> devs;
    std::set<BlockKey> cands;
    {
      MutexLock l(&gc_mu);
      devs.swap(gc_devices);
      cands.swap(gc_candidates);
    }
    for (uint64_t id : devs) {
      Status s = CollectDevice(id);
      if (!s.ok()) {
        MutexLock l(&gc_mu);
        gc_devices.insert(id);
        return s;
      }
    }
    for (const BlockKey& k : cands) {
      std::shared_ptr<VolumeState> vol = FindById(k.dev);
      if (!vol) continue;
      THINFS_ASSIGN_OR_RETURN(int n, CollectBlock(*vol, k.vblock));
      (void)n;
    }
    return Status::Ok();
  }

  void GcLoop() {
    while (true) {
      {
        MutexLock l(&gc_mu);
        while (!gc_stop && gc_devices.empty() && gc_candidates.size() < 1024) {
          if (!gc_cv.WaitFor(std::chrono::seconds(5)) && !gc_candidates.empty()) break;
        }
        if (gc_stop) return;
      }
      Status s = GcOnce();
      if (!s.ok()) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }

  // ---- Device table helpers ----

  // Queues `st` and every ancestor for a full collector pass: a device
  // that stops reading (deleted or hidden) may leave garbage anywhere up
  // its chain.
  // REQUIRES: devices_mu held.
  void ScheduleChainGc(VolumeState* st) REQUIRES(devices_mu) {
    for (VolumeState* a = st; a != nullptr; a = a->parent.get()) {
      if (!(a->rec.flags & DeviceRecord::kDeleting)) {
        a->rec.flags |= DeviceRecord::kGcPending;
        a->dirty.store(true);
      }
      MutexLock l(&gc_mu);
      gc_devices.insert(a->id.value);
    }
  }

  // REQUIRES: devices_mu held.
  void MarkDeleting(VolumeState* st) REQUIRES(devices_mu) {
    st->rec.flags |= DeviceRecord::kDeleting;
    st->rec.flags &= ~DeviceRecord::kGcPending;
    st->dirty.store(true);
    {
      MutexLock l(&gc_mu);
      gc_devices.insert(st->id.value);
    }
    VolumeState* parent = st->parent.get();
    if (parent == nullptr) return;
    auto& ch = parent->children;
    ch.erase(std::remove(ch.begin(), ch.end(), st), ch.end());
    if (!parent->live() && !(parent->rec.flags & DeviceRecord::kDeleting) && ch.empty()) {
      MarkDeleting(parent);
    } else {
      ScheduleChainGc(parent);
    }
  }

  // Removes a device the user asked to delete.
  // REQUIRES: devices_mu held; st->io_mu held exclusively.
  void DeleteLocked(VolumeState* st) REQUIRES(devices_mu) {
    if (!st->rec.name.empty()) names.erase(st->rec.name);
    st->rec.name.clear();
    st->gone.store(true);
    st->rec.flags &= ~DeviceRecord::kDetached;
    if (!st->children.empty()) {
      st->rec.flags |= DeviceRecord::kHidden;
      ScheduleChainGc(st);
    } else {
      MarkDeleting(st);
    }
    gc_cv.Signal();
  }

  DeviceInfo InfoLocked(const VolumeState& st) const REQUIRES(devices_mu) {
    DeviceInfo i;
    i.id = st.id;
    i.name = st.rec.name;
    i.size = st.size.load();
    i.epoch = st.epoch.load();
    i.has_parent = st.parent != nullptr;
    if (st.parent) {
      i.parent = st.parent->id;
      i.parent_name = st.parent->rec.name;
      i.parent_epoch = st.parent_epoch;
    }
    i.mapped_blocks = static_cast<uint64_t>(std::max<int64_t>(0, st.mapped.load()));
    i.mode = st.rec.mode;
    i.uid = st.rec.uid;
    i.gid = st.rec.gid;
    i.created_ns = st.rec.created_ns;
    i.mtime_ns = st.mtime_ns.load();
    i.ctime_ns = st.ctime_ns.load();
    i.atime_ns = st.atime_ns.load();
    return i;
  }

  Result<std::shared_ptr<VolumeState>> Named(const std::string& name) {
    MutexLock d(&devices_mu);
    auto it = names.find(name);
    if (it == names.end()) return Status::NotFound("no device named '" + name + "'");
    return devices.at(it->second);
  }

  // Stops the periodic commit and the collector and waits for them.
  void StopBackground() {
    {
      MutexLock l(&timer_mu);
      timer_stop = true;
      timer_cv.SignalAll();
    }
    {
      MutexLock l(&gc_mu);
      gc_stop = true;
      gc_cv.SignalAll();
    }
    {
      MutexLock l(&copier_mu);
      copier_stop = true;
      copier_cv.SignalAll();
    }
    if (commit_thread.joinable()) commit_thread.join();
    if (gc_thread.joinable()) gc_thread.join();
    if (copier_thread.joinable()) copier_thread.join();
  }

  Status ResizeLocked(VolumeState& st, uint64_t new_size);
  Status DiscardRange(VolumeState& st, uint64_t offset, uint64_t length);
  Status RebuildSpaceMap();
  // Commits the superblock with data_blocks = n and publishes n.
  Status CommitDataBlocks(uint64_t n) REQUIRES(commit_mu);
};

// ---------------------------------------------------------------------------

Status Pool::Impl::DiscardRange(VolumeState& st, uint64_t offset, uint64_t length) {
  const uint64_t bs = geometry.block_size();
  uint64_t end = offset + length;
  uint64_t first_whole = geometry.BlocksFor(offset);
  uint64_t end_whole = geometry.BlockOf(end);
  auto zero_part = [&](uint64_t from, uint64_t to) -> Status {
    // Partial block: write zeros only if the block reads data.
    uint64_t b = geometry.BlockOf(from);
    {
      ReaderLock stripe(&Stripe(st.id, b));
      THINFS_ASSIGN_OR_RETURN(Resolved r, Resolve(st, b));
      if (!r.mapped()) return Status::Ok();
    }
    std::vector<std::byte> zeros(to - from);
    return WriteBlock(st, b, geometry.OffsetInBlock(from), zeros);
  };
  if (first_whole > end_whole) {
    // Inside one block.
    return zero_part(offset, end);
  }
  if (geometry.OffsetInBlock(offset) != 0) {
    THINFS_RETURN_IF_ERROR(zero_part(offset, geometry.BytesOf(first_whole)));
  }
  THINFS_RETURN_IF_ERROR(ForEachCandidate(st, first_whole, end_whole, [&](uint64_t b) {
    WriterLock stripe(&Stripe(st.id, b));
    return DiscardBlockLocked(st, b);
  }));
  if (geometry.OffsetInBlock(end) != 0 && end_whole >= first_whole) {
    THINFS_RETURN_IF_ERROR(zero_part(geometry.BytesOf(end_whole), end));
  }
  (void)bs;
  return Status::Ok();
}

Status Pool::Impl::ResizeLocked(VolumeState& st, uint64_t new_size) {
  uint64_t old = st.size.load();
  if (new_size < old) {
    // Zero the tail of the new last block (a later grow must read zeros
    // there), then unmap every block wholly beyond the new end, including
    // a partial old last block.
    uint64_t keep = geometry.BlocksFor(new_size);
    uint64_t tail_end = std::min(old, geometry.BytesOf(keep));
    if (tail_end > new_size) THINFS_RETURN_IF_ERROR(DiscardRange(st, new_size, tail_end - new_size));
    bool has_children;
    {
      MutexLock d(&devices_mu);
      has_children = !st.children.empty();
    }
    // The limit is not versioned by epoch, so it may change only while no
    // child reads through this device; with children, the parent's tail is
    // hidden by tombstones instead (ForEachCandidate below).
    if (st.parent && keep < st.parent_limit.load() && !has_children) {
      // Hide the parent beyond the new end with the limit; only our own
      // versions need unmapping below. Count what disappears from view.
      int64_t hidden = 0;
      THINFS_RETURN_IF_ERROR(
          ForEachCandidate(st, keep, geometry.BlocksFor(old), [&](uint64_t b) -> Status {
            THINFS_ASSIGN_OR_RETURN(std::optional<Version> own, FindOwn(st.id, b, st.epoch.load()));
            if (own) return Status::Ok();
            THINFS_ASSIGN_OR_RETURN(Resolved r, ResolveParent(st, b));
            if (r.mapped()) ++hidden;
            return Status::Ok();
          }));
      ReaderLock swap(&swap_mu);
      st.mapped.fetch_sub(hidden);
      MutexLock d(&devices_mu);
      st.parent_limit.store(keep);
      st.map_gen.fetch_add(1, std::memory_order_release);
      ScheduleChainGc(st.parent.get());
    }
    THINFS_RETURN_IF_ERROR(
        ForEachCandidate(st, keep, geometry.BlocksFor(old), [&](uint64_t b) {
          WriterLock stripe(&Stripe(st.id, b));
          return DiscardBlockLocked(st, b);
        }));
  }
  // Growing adds blocks that read zeros and changes nothing readable: a
  // clone being extended piece by piece (copy_file_range after the grow)
  // stays extendable. Shrinking changes content.
  if (new_size < old) st.write_gen.fetch_add(1);
  st.size.store(new_size);
  int64_t now = NowNs();
  st.mtime_ns.store(now);
  st.ctime_ns.store(now);
  st.dirty.store(true);
  return Status::Ok();
}

Status Pool::Impl::RebuildSpaceMap() {
  space->ClearAllForRebuild();
  auto it = store->NewMapIterator();
  it->Seek(VolumeId(0), VolumeBlock(0));
  uint64_t n = 0;
  for (; it->Valid(); it->Next()) {
    const MapEntry& e = it->entry();
    if (e.value.tombstone()) continue;
    if (e.value.block.value >= data_blocks.load()) {
      return Status::Corruption("mapping of device " + std::to_string(e.device.value) +
                                " block " + std::to_string(e.vblock.value) +
                                " points outside the data area (block " +
                                std::to_string(e.value.block.value) + ")");
    }
    space->MarkUsed(e.value.block);
    ++n;
  }
  THINFS_RETURN_IF_ERROR(it->status());
  (void)n;
  return space->Sync(superblock.transaction_id);
}

// ---------------------------------------------------------------------------
// Volume

Volume::Volume(Pool* pool, std::shared_ptr<VolumeState> state)
    : pool_(pool), state_(std::move(state)) {}
Volume::~Volume() = default;

VolumeId Volume::id() const { return state_->id; }
uint64_t Volume::size() const { return state_->size.load(); }

Result<size_t> Volume::Read(uint64_t offset, std::span<std::byte> buf, ReadCache cache) {
  Pool::Impl& p = *pool_->impl_;
  VolumeState& st = *state_;
  ReaderLock io(&st.io_mu);
  if (st.gone.load()) {
    return Status::NotFound("device was deleted");
  }
  uint64_t size = st.size.load();
  if (offset >= size || buf.empty()) return size_t{0};
  size_t len = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - offset));
  p.n_reads.fetch_add(1, std::memory_order_relaxed);
  const uint64_t first = p.geometry.BlockOf(offset);
  const uint64_t end = p.geometry.BlocksFor(offset + len);
  const std::span<std::byte> out = buf.first(len);
  if (end - first == 1) {
    // Not read around when it goes on where the last one-block read ended.
    const bool around = st.single_next.exchange(offset + len, std::memory_order_relaxed) != offset;
    THINFS_RETURN_IF_ERROR(p.ReadBlock(st, first, p.geometry.OffsetInBlock(offset), out, around));
    return len;
  }
  using Cache = BlockDevice::Cache;
  if (cache == ReadCache::kReader && p.data->CanReadPastCache()) {
    // Several blocks for a reader with its own cache: past the host's
    // unless the host's holds them already (ReadBlocks probes it). No
    // hint: the disk reads straight into `out`, and the reader's own
    // readahead keeps several such reads in flight (lever 46).
    THINFS_RETURN_IF_ERROR(p.ReadBlocks(st, offset, out, Cache::kBypass));
    return len;
  }
  // Several blocks: let their cold reads overlap (docs/design.md, "Locking"),
  // then read them a run at a time.
  const bool cached = p.PrefetchBlocks(st, first, end, p.geometry.OffsetInBlock(offset), out);
  THINFS_RETURN_IF_ERROR(p.ReadBlocks(st, offset, out, cached ? Cache::kHeld : Cache::kUnknown));
  return len;
}

Status Volume::Write(uint64_t offset, std::span<const std::byte> buf, WriteCache cache) {
  Pool::Impl& p = *pool_->impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  VolumeState& st = *state_;
  // For a stream of WriteCache::kWriter writes: the pool blocks written, as
  // runs, for StartWriteback once io_mu is released (the hint may wait for
  // the disk's queue).
  std::vector<BlockDevice::Run> written;
  Status status = [&]() -> Status {
    ReaderLock io(&st.io_mu);
    if (st.gone.load()) {
      return Status::NotFound("device was deleted");
    }
    uint64_t size = st.size.load();
    if (offset > size || buf.size() > size - offset) {
      return Status::InvalidArgument("write past the end of the device");
    }
    p.n_writes.fetch_add(1, std::memory_order_relaxed);
    st.write_gen.fetch_add(1, std::memory_order_relaxed);
    if (cache == WriteCache::kWriter && st.ContinuesWrite(offset, offset + buf.size())) {
      THINFS_RETURN_IF_ERROR(p.WriteStream(st, offset, buf, &written));
      st.TouchForWrite();
      return Status::Ok();
    }
    const uint64_t end = p.geometry.BlocksFor(offset + buf.size());
    Pool::Impl::BlockRun run(&p);
    size_t done = 0;
    while (done < buf.size()) {
      uint64_t pos = offset + done;
      uint64_t b = p.geometry.BlockOf(pos);
      uint64_t off = p.geometry.OffsetInBlock(pos);
      size_t n = static_cast<size_t>(
          std::min<uint64_t>(p.geometry.block_size() - off, buf.size() - done));
      THINFS_RETURN_IF_ERROR(p.WriteBlock(st, b, off, buf.subspan(done, n), &run, end - b));
      done += n;
    }
    st.TouchForWrite();
    return Status::Ok();
  }();
  // Also after a failure: what was written before it heads for the disk.
  if (!written.empty()) p.data->StartWriteback(written);
  return status;
}

Status Volume::Discard(uint64_t offset, uint64_t length) {
  Pool::Impl& p = *pool_->impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  VolumeState& st = *state_;
  ReaderLock io(&st.io_mu);
  uint64_t size = st.size.load();
  if (offset >= size || length == 0) return Status::Ok();
  length = std::min(length, size - offset);
  st.write_gen.fetch_add(1, std::memory_order_relaxed);
  return p.DiscardRange(st, offset, length);
}

Status Volume::Provision(uint64_t offset, uint64_t length) {
  Pool::Impl& p = *pool_->impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  VolumeState& st = *state_;
  ReaderLock io(&st.io_mu);
  uint64_t size = st.size.load();
  if (offset >= size || length == 0) return Status::Ok();
  length = std::min(length, size - offset);
  uint64_t first = p.geometry.BlockOf(offset);
  uint64_t last = p.geometry.BlocksFor(offset + length);
  st.write_gen.fetch_add(1, std::memory_order_relaxed);
  Pool::Impl::BlockRun run(&p);
  for (uint64_t b = first; b < last; ++b) {
    WriterLock stripe(&p.Stripe(st.id, b));
    Epoch e = st.epoch.load();
    THINFS_ASSIGN_OR_RETURN(std::optional<Version> own, p.FindOwn(st.id, b, e));
    Resolved before;
    if (own) {
      before = Resolved{true, st.id, own->epoch, own->value};
    } else {
      THINFS_ASSIGN_OR_RETURN(before, p.ResolveParent(st, b));
    }
    if (before.mapped()) continue;
    THINFS_ASSIGN_OR_RETURN(PoolBlock pb, run.Take(last - b));
    p.n_provisions.fetch_add(1, std::memory_order_relaxed);
    // No stale data: the block reads zeros (a punched hole where the data
    // area can, so preallocating a large range is cheap).
    Status s = p.data->WriteZeroes(pb, 1);
    if (!s.ok()) {
      ReaderLock swap(&p.swap_mu);
      p.space->Free(pb);
      return s;
    }
    p.NoteDataWritten(/*new_block=*/true);
    THINFS_RETURN_IF_ERROR(p.InstallVersion(st, b, e, own, before, MapValue{pb, 0}));
  }
  return Status::Ok();
}

Status Volume::Flush(bool data_only) {
  return pool_->impl_->Commit(data_only ? Pool::Impl::CommitKind::kDataSync
                                        : Pool::Impl::CommitKind::kExplicit);
}

Result<uint64_t> Volume::SeekData(uint64_t offset) {
  Pool::Impl& p = *pool_->impl_;
  VolumeState& st = *state_;
  ReaderLock io(&st.io_mu);
  uint64_t size = st.size.load();
  if (offset >= size) return Status::NotFound("offset at or past the end");
  uint64_t b = p.geometry.BlockOf(offset);
  uint64_t last = p.geometry.BlocksFor(size);
  while (b < last) {
    THINFS_ASSIGN_OR_RETURN(std::optional<uint64_t> next, p.NextCandidate(st, b));
    if (!next || *next >= last) break;
    ReaderLock stripe(&p.Stripe(st.id, *next));
    THINFS_ASSIGN_OR_RETURN(Resolved r, p.Resolve(st, *next));
    if (r.mapped()) return std::max(offset, p.geometry.BytesOf(*next));
    b = *next + 1;
  }
  return Status::NotFound("no data after offset");
}

Result<uint64_t> Volume::SeekHole(uint64_t offset) {
  Pool::Impl& p = *pool_->impl_;
  VolumeState& st = *state_;
  ReaderLock io(&st.io_mu);
  uint64_t size = st.size.load();
  if (offset >= size) return Status::NotFound("offset at or past the end");
  uint64_t b = p.geometry.BlockOf(offset);
  uint64_t last = p.geometry.BlocksFor(size);
  for (; b < last; ++b) {
    ReaderLock stripe(&p.Stripe(st.id, b));
    THINFS_ASSIGN_OR_RETURN(Resolved r, p.Resolve(st, b));
    if (!r.mapped()) return std::max(offset, p.geometry.BytesOf(b));
  }
  return size;
}

// ---------------------------------------------------------------------------
// Pool

Pool::Pool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Pool::~Pool() {
  if (impl_ && !impl_->closed) {
    Status s = Close();
    (void)s;
  }
}

Result<std::unique_ptr<Pool>> Pool::Open(std::unique_ptr<BlockDevice> data,
                                         std::unique_ptr<SpaceMap> space,
                                         std::unique_ptr<MetadataStore> store,
                                         const PoolOptions& options) {
  auto impl = std::make_unique<Impl>(std::move(data), std::move(space), std::move(store), options);
  Impl& p = *impl;
  THINFS_ASSIGN_OR_RETURN(Superblock sb, p.store->ReadSuperblock());
  if (sb.block_size != p.geometry.block_size() || sb.data_blocks < p.geometry.data_blocks()) {
    return Status::Corruption("superblock geometry does not match the data area");
  }
  // A device opened at an older size (kept across a grow) must reach the
  // superblock's blocks.
  if (sb.data_blocks > p.geometry.data_blocks()) {
    Status s = p.data->Grow(sb.data_blocks);
    if (!s.ok()) {
      return Status::Corruption("the data area cannot hold the superblock's " +
                                std::to_string(sb.data_blocks) + " blocks: " + s.message());
    }
  }
  // A larger space map is a grow interrupted before its superblock commit
  // (Grow orders them so); it is completed below.
  if (sb.data_blocks > p.space->total_blocks()) {
    return Status::Corruption("superblock says " + std::to_string(sb.data_blocks) +
                              " data blocks, bitmap covers only " +
                              std::to_string(p.space->total_blocks()));
  }
  {
    MutexLock c(&p.commit_mu);
    p.superblock = sb;
  }
  p.data_blocks.store(sb.data_blocks);
  p.transaction_id.store(sb.transaction_id);
  THINFS_ASSIGN_OR_RETURN(std::vector<DeviceRecord> recs, p.store->LoadDevices());
  std::vector<VolumeId> orphans;
  {
    MutexLock d(&p.devices_mu);
    p.next_device_id = std::max<uint64_t>(sb.next_device_id, 1);
    for (const DeviceRecord& r : recs) {
      auto st = std::make_shared<VolumeState>(r);
      p.devices[r.id.value] = st;
      if (r.id.value >= p.next_device_id) p.next_device_id = r.id.value + 1;
    }
    for (const DeviceRecord& r : recs) {
      auto& st = p.devices[r.id.value];
      if (r.has_parent) {
        auto it = p.devices.find(r.parent.value);
        if (it == p.devices.end()) {
          return Status::Corruption("device " + std::to_string(r.id.value) +
                                    " has missing parent " + std::to_string(r.parent.value));
        }
        st->parent = it->second;
        st->parent_epoch = r.parent_epoch;
        st->parent_limit.store(r.parent_limit);
        if (r.parent_epoch >= it->second->epoch.load()) {
          return Status::Corruption("device " + std::to_string(r.id.value) +
                                    " reads its parent at a future epoch");
        }
        // A device being collected reads nothing: it is no one's child.
        if (!(r.flags & DeviceRecord::kDeleting)) it->second->children.push_back(st.get());
      }
      if (!r.name.empty() && st->live() && !(r.flags & DeviceRecord::kDetached)) {
        if (!p.names.emplace(r.name, r.id.value).second) {
          return Status::Corruption("two devices are named '" + r.name + "'");
        }
      }
    }
    // The ancestry must be acyclic.
    for (auto& [id, st] : p.devices) {
      size_t steps = 0;
      for (VolumeState* a = st->parent.get(); a != nullptr; a = a->parent.get()) {
        if (++steps > p.devices.size()) {
          return Status::Corruption("device ancestry has a cycle through device " +
                                    std::to_string(id));
        }
      }
    }
    for (auto& [id, st] : p.devices) {
      if (st->rec.flags & DeviceRecord::kDetached) orphans.push_back(st->id);
      if (st->rec.flags & (DeviceRecord::kDeleting | DeviceRecord::kGcPending)) {
        MutexLock l(&p.gc_mu);
        p.gc_devices.insert(id);
      }
    }
  }
  if (!options.read_only) {
    if (!p.space->was_clean()) {
      // Recovery: the bitmap may have lost frees or kept leaks; rebuild it
      // from the committed block map and re-check every device for garbage
      // whose collection was pending in memory only.
      THINFS_RETURN_IF_ERROR(p.RebuildSpaceMap());
      MutexLock d(&p.devices_mu);
      MutexLock l(&p.gc_mu);
      for (auto& [id, st] : p.devices) p.gc_devices.insert(id);
      p.Log(2, "recovery: the pool was not closed cleanly; rebuilt the allocation bitmap "
               "from the block map of transaction " + std::to_string(sb.transaction_id) + " (" +
               std::to_string(p.space->total_blocks() - p.space->free_blocks()) +
               " blocks in use) and queued " + std::to_string(p.devices.size()) +
               " devices for garbage collection");
    }
    THINFS_RETURN_IF_ERROR(p.space->MarkDirty());
    if (p.space->total_blocks() > sb.data_blocks) {
      const uint64_t n = p.space->total_blocks();
      THINFS_RETURN_IF_ERROR(p.data->Grow(n).WithContext(
          "completing an interrupted grow to " + std::to_string(n) + " blocks"));
      {
        MutexLock c(&p.commit_mu);
        THINFS_RETURN_IF_ERROR(p.CommitDataBlocks(n));
      }
      p.Log(2, "recovery: completed an interrupted grow from " + std::to_string(sb.data_blocks) +
                   " to " + std::to_string(n) + " data blocks");
    }
    p.CheckLowWater();
  }
  std::unique_ptr<Pool> pool(new Pool(std::move(impl)));
  for (VolumeId id : orphans) {
    Status s = pool->DeleteDetached(id);
    if (!s.ok()) return s;
  }
  if (!options.read_only) {
    // Named, so that `top -H`, perf and /proc/PID/task/*/comm tell them
    // apart from the FUSE workers; named here, so that a thread has its
    // name by the time Open returns.
    Impl& p = *pool->impl_;
    auto start = [&p](std::thread& thread, const char* name, void (Impl::*loop)()) {
      thread = std::thread([&p, loop] { (p.*loop)(); });
      pthread_setname_np(thread.native_handle(), name);
    };
    if (options.commit_interval.count() > 0) start(p.commit_thread, "thinfs-commit", &Impl::CommitLoop);
    if (options.background_gc) start(p.gc_thread, "thinfs-gc", &Impl::GcLoop);
    if (options.background_copies && p.copies.capacity() > 0) {
      start(p.copier_thread, "thinfs-copier", &Impl::CopierLoop);
    }
  }
  return pool;
}

Status Pool::Close() {
  Impl& p = *impl_;
  if (p.closed) return Status::Ok();
  p.closed = true;
  p.StopBackground();
  if (p.options.read_only) return Status::Ok();
  {
    // The collector's queues live in memory: persist them as whole-device
    // scans for the next open.
    std::set<uint64_t> devs;
    {
      MutexLock l(&p.gc_mu);
      for (const BlockKey& k : p.gc_candidates) devs.insert(k.dev);
      devs.insert(p.gc_devices.begin(), p.gc_devices.end());
      p.gc_candidates.clear();
    }
    ReaderLock swap(&p.swap_mu);
    MutexLock d(&p.devices_mu);
    for (uint64_t id : devs) {
      auto it = p.devices.find(id);
      if (it == p.devices.end()) continue;
      if (it->second->rec.flags & DeviceRecord::kDeleting) continue;
      it->second->rec.flags |= DeviceRecord::kGcPending;
      it->second->dirty.store(true);
    }
  }
  THINFS_RETURN_IF_ERROR(p.Commit());
  if (p.failed.load()) return Status::IOError("pool failed earlier: " + p.failure);
  // Frees released by the last commit must reach the disk before the bitmap
  // is declared clean; MarkClean writes the whole state.
  return p.space->MarkClean(p.transaction_id.load());
}

void Pool::AbandonForTesting() {
  Impl& p = *impl_;
  p.closed = true;
  p.StopBackground();
}

Result<VolumeId> Pool::CreateDevice(const std::string& name, uint64_t size,
                                    const DeviceAttrs& attrs) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  THINFS_RETURN_IF_ERROR(ValidateName(name));
  VolumeId id;
  {
    ReaderLock swap(&p.swap_mu);
    MutexLock d(&p.devices_mu);
    if (p.names.count(name)) return Status::Exists("device '" + name + "' already exists");
    DeviceRecord r;
    r.id = VolumeId(p.next_device_id++);
    r.name = name;
    r.size = size;
    r.mode = attrs.mode;
    r.uid = attrs.uid;
    r.gid = attrs.gid;
    r.created_ns = r.mtime_ns = r.ctime_ns = r.atime_ns = NowNs();
    auto st = std::make_shared<VolumeState>(r);
    st->dirty.store(true);
    p.devices[r.id.value] = st;
    p.names[name] = r.id.value;
    id = r.id;
  }
  THINFS_RETURN_IF_ERROR(p.Commit());
  return id;
}

Result<VolumeId> Pool::CreateSnapshot(const std::string& origin, const std::string& name) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  THINFS_RETURN_IF_ERROR(ValidateName(name));
  THINFS_ASSIGN_OR_RETURN(std::shared_ptr<VolumeState> o, p.Named(origin));
  VolumeId id;
  {
    // Drain in-flight I/O on the origin: the snapshot holds every write
    // completed before this point and none after.
    WriterLock io(&o->io_mu);
    ReaderLock swap(&p.swap_mu);
    MutexLock d(&p.devices_mu);
    if (o->gone.load()) return Status::NotFound("no device named '" + origin + "'");
    if (p.names.count(name)) return Status::Exists("device '" + name + "' already exists");
    Epoch e = o->epoch.load();
    if (e == std::numeric_limits<Epoch>::max()) {
      return Status::NoSpace("device '" + origin + "' has used up its snapshot epochs");
    }
    DeviceRecord r;
    r.id = VolumeId(p.next_device_id++);
    r.name = name;
    r.size = o->size.load();
    r.mode = o->rec.mode;
    r.uid = o->rec.uid;
    r.gid = o->rec.gid;
    r.created_ns = r.ctime_ns = r.atime_ns = NowNs();
    r.mtime_ns = o->mtime_ns.load();
    r.mapped_blocks = static_cast<uint64_t>(std::max<int64_t>(0, o->mapped.load()));
    auto st = std::make_shared<VolumeState>(r);
    st->parent = o;
    st->parent_epoch = e;
    st->dirty.store(true);
    o->epoch.store(e + 1);
    o->dirty.store(true);
    o->children.push_back(st.get());
    p.devices[r.id.value] = st;
    p.names[name] = r.id.value;
    id = r.id;
  }
  THINFS_RETURN_IF_ERROR(p.Commit());
  return id;
}

Status Pool::DeleteDevice(const std::string& name) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  THINFS_ASSIGN_OR_RETURN(std::shared_ptr<VolumeState> st, p.Named(name));
  {
    WriterLock io(&st->io_mu);
    ReaderLock swap(&p.swap_mu);
    MutexLock d(&p.devices_mu);
    if (st->gone.load()) return Status::NotFound("no device named '" + name + "'");
    p.DeleteLocked(st.get());
  }
  return p.Commit();
}

Status Pool::DetachName(const std::string& name) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  THINFS_ASSIGN_OR_RETURN(std::shared_ptr<VolumeState> st, p.Named(name));
  {
    ReaderLock swap(&p.swap_mu);
    MutexLock d(&p.devices_mu);
    p.names.erase(name);
    st->rec.name.clear();
    st->rec.flags |= DeviceRecord::kDetached;
    st->dirty.store(true);
  }
  return p.Commit();
}

Status Pool::DeleteDetached(VolumeId id) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  std::shared_ptr<VolumeState> st = p.FindById(id.value);
  if (!st) return Status::NotFound("no device " + std::to_string(id.value));
  {
    WriterLock io(&st->io_mu);
    ReaderLock swap(&p.swap_mu);
    MutexLock d(&p.devices_mu);
    if (!(st->rec.flags & DeviceRecord::kDetached)) {
      return Status::InvalidArgument("device " + std::to_string(id.value) + " is not detached");
    }
    p.DeleteLocked(st.get());
  }
  return p.Commit();
}

Status Pool::ResizeDevice(const std::string& name, uint64_t new_size) {
  THINFS_ASSIGN_OR_RETURN(std::shared_ptr<VolumeState> st, impl_->Named(name));
  return ResizeDevice(st->id, new_size);
}

Status Pool::ResizeDevice(VolumeId id, uint64_t new_size, bool commit) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  std::shared_ptr<VolumeState> st = p.FindById(id.value);
  if (!st || (st->gone.load())) {
    return Status::NotFound("no device " + std::to_string(id.value));
  }
  {
    WriterLock io(&st->io_mu);
    THINFS_RETURN_IF_ERROR(p.ResizeLocked(*st, new_size));
  }
  return commit ? p.Commit() : Status::Ok();
}

Status Pool::RenameDevice(const std::string& from, const std::string& to, bool replace) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  THINFS_RETURN_IF_ERROR(ValidateName(to));
  THINFS_ASSIGN_OR_RETURN(std::shared_ptr<VolumeState> st, p.Named(from));
  if (from == to) return Status::Ok();
  std::shared_ptr<VolumeState> victim;
  {
    MutexLock d(&p.devices_mu);
    auto it = p.names.find(to);
    if (it != p.names.end()) {
      if (!replace) return Status::Exists("device '" + to + "' already exists");
      victim = p.devices.at(it->second);
    }
  }
  if (victim) {
    WriterLock io(&victim->io_mu);
    ReaderLock swap(&p.swap_mu);
    MutexLock d(&p.devices_mu);
    if (!victim->gone.load()) p.DeleteLocked(victim.get());
  }
  {
    ReaderLock swap(&p.swap_mu);
    MutexLock d(&p.devices_mu);
    if (st->gone.load()) return Status::NotFound("no device named '" + from + "'");
    if (p.names.count(to)) return Status::Exists("device '" + to + "' already exists");
    p.names.erase(from);
    p.names[to] = st->id.value;
    st->rec.name = to;
    st->ctime_ns.store(NowNs());
    st->dirty.store(true);
  }
  return p.Commit();
}

Status Pool::SetAttrs(VolumeId id, std::optional<uint32_t> mode, std::optional<uint32_t> uid,
                      std::optional<uint32_t> gid, std::optional<int64_t> atime_ns,
                      std::optional<int64_t> mtime_ns) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  std::shared_ptr<VolumeState> st = p.FindById(id.value);
  if (!st || (st->gone.load())) {
    return Status::NotFound("no device " + std::to_string(id.value));
  }
  ReaderLock swap(&p.swap_mu);
  MutexLock d(&p.devices_mu);
  if (mode) st->rec.mode = (st->rec.mode & ~07777u) | (*mode & 07777u);
  if (uid) st->rec.uid = *uid;
  if (gid) st->rec.gid = *gid;
  if (atime_ns) st->atime_ns.store(*atime_ns);
  if (mtime_ns) st->mtime_ns.store(*mtime_ns);
  st->ctime_ns.store(NowNs());
  st->dirty.store(true);
  return Status::Ok();
}

Result<DeviceInfo> Pool::GetDevice(const std::string& name) const {
  MutexLock d(&impl_->devices_mu);
  auto it = impl_->names.find(name);
  if (it == impl_->names.end()) return Status::NotFound("no device named '" + name + "'");
  return impl_->InfoLocked(*impl_->devices.at(it->second));
}

Result<DeviceInfo> Pool::GetDevice(VolumeId id) const {
  MutexLock d(&impl_->devices_mu);
  auto it = impl_->devices.find(id.value);
  if (it == impl_->devices.end() ||
      (it->second->gone.load())) {
    return Status::NotFound("no device " + std::to_string(id.value));
  }
  return impl_->InfoLocked(*it->second);
}

std::vector<DeviceInfo> Pool::ListDevices() const {
  MutexLock d(&impl_->devices_mu);
  std::vector<DeviceInfo> out;
  for (const auto& [name, id] : impl_->names) out.push_back(impl_->InfoLocked(*impl_->devices.at(id)));
  return out;
}

Result<DeviceUsage> Pool::ComputeUsage(VolumeId id) {
  Impl& p = *impl_;
  std::shared_ptr<VolumeState> st = p.FindById(id.value);
  if (!st) return Status::NotFound("no device " + std::to_string(id.value));
  ReaderLock io(&st->io_mu);
  DeviceUsage u;
  uint64_t last = p.geometry.BlocksFor(st->size.load());
  THINFS_RETURN_IF_ERROR(p.ForEachCandidate(*st, 0, last, [&](uint64_t b) -> Status {
    ReaderLock stripe(&p.Stripe(st->id, b));
    THINFS_ASSIGN_OR_RETURN(Resolved r, p.Resolve(*st, b));
    if (!r.mapped()) return Status::Ok();
    u.mapped_blocks++;
    bool shared = false;
    if (r.value.flags & MapValue::kMaybeShared) {
      THINFS_ASSIGN_OR_RETURN(uint32_t rc, p.Refcount(r.value.block));
      shared = rc >= 2;
    }
    if (!shared) {
      // Count the live devices that read this version: its owner (when it
      // is the owner's newest) and everything reaching through its children.
      std::shared_ptr<VolumeState> owner = r.owner == st->id ? st : p.FindById(r.owner.value);
      if (!owner) return Status::Corruption("mapping owned by a missing device");
      THINFS_ASSIGN_OR_RETURN(std::vector<Version> own, p.ListOwn(owner->id, b));
      Epoch next = std::numeric_limits<Epoch>::max();
      for (size_t i = 0; i < own.size(); ++i) {
        if (own[i].epoch == r.epoch) {
          next = i == 0 ? std::numeric_limits<Epoch>::max() : own[i - 1].epoch;
          break;
        }
      }
      MutexLock d(&p.devices_mu);
      int readers = next == std::numeric_limits<Epoch>::max() && owner->live() &&
                            !owner->gone.load()
                        ? 1
                        : 0;
      for (const VolumeState* c : owner->children) {
        if (readers >= 2) break;
        if (c->parent_epoch < r.epoch || c->parent_epoch >= next) continue;
        THINFS_ASSIGN_OR_RETURN(int m, p.ReadersThrough(*c, b));
        readers += m;
      }
      shared = readers >= 2;
    }
    if (shared) {
      u.shared_blocks++;
    } else {
      u.exclusive_blocks++;
    }
    return Status::Ok();
  }));
  return u;
}

Result<std::shared_ptr<Volume>> Pool::OpenVolume(VolumeId id) {
  std::shared_ptr<VolumeState> st = impl_->FindById(id.value);
  if (!st || (st->gone.load())) {
    return Status::NotFound("no device " + std::to_string(id.value));
  }
  return std::shared_ptr<Volume>(new Volume(this, st));
}

Result<std::shared_ptr<Volume>> Pool::OpenVolume(const std::string& name) {
  THINFS_ASSIGN_OR_RETURN(std::shared_ptr<VolumeState> st, impl_->Named(name));
  return std::shared_ptr<Volume>(new Volume(this, st));
}

Status Pool::ShareRange(VolumeId src_id, uint64_t src_offset, VolumeId dst_id,
                        uint64_t dst_offset, uint64_t length) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  std::shared_ptr<VolumeState> src = p.FindById(src_id.value);
  std::shared_ptr<VolumeState> dst = p.FindById(dst_id.value);
  if (!src || src->gone.load()) return Status::NotFound("no source device");
  if (!dst || dst->gone.load()) return Status::NotFound("no destination device");
  if (length == 0) return Status::Ok();
  const Geometry& g = p.geometry;

  // A copy from offset 0 onto an empty device, and each call continuing
  // it, is O(1) in the data: dst becomes a snapshot of src whose
  // parent_limit covers the whole blocks copied so far, and only partial
  // edge blocks are copied. (The kernel splits one copy_file_range into
  // calls of 4 GiB less a page, so `cp` of a large volume arrives in
  // pieces.)
  if (src != dst && src_offset == dst_offset) {
    WriterLock io1(src->id < dst->id ? &src->io_mu : &dst->io_mu);
    WriterLock io2(src->id < dst->id ? &dst->io_mu : &src->io_mu);
    const uint64_t ssize = src->size.load();
    const uint64_t dsize = dst->size.load();
    uint64_t len = src_offset < ssize ? std::min(length, ssize - src_offset) : 0;
    bool usable = len > 0 && dst_offset + len <= dsize;
    bool dst_has_children;
    {
      MutexLock d(&p.devices_mu);
      dst_has_children = !dst->children.empty();
    }
    // The limit may change only while no child reads through dst.
    usable = usable && !dst_has_children;
    bool extend = usable && dst->clone_src == src.get() && dst->parent == src &&
                  src->write_gen.load() == dst->clone_src_gen &&
                  dst->write_gen.load() == dst->clone_dst_gen &&
                  src_offset == dst->clone_dst_end;
    bool fresh = false;
    if (usable && !extend && src_offset == 0 && len >= g.block_size()) {
      {
        MutexLock d(&p.devices_mu);
        fresh = dst->parent == nullptr && dst->mapped.load() == 0;
      }
      if (fresh) {
        THINFS_ASSIGN_OR_RETURN(std::optional<uint64_t> next, p.NextCandidate(*dst, 0));
        fresh = !next.has_value();
      }
    }
    if (fresh || extend) {
      if (fresh) {
        ReaderLock swap(&p.swap_mu);
        MutexLock d(&p.devices_mu);
        Epoch e = src->epoch.load();
        if (e == std::numeric_limits<Epoch>::max()) return Status::NoSpace("snapshot epochs used up");
        dst->parent = src;
        dst->parent_epoch = e;
        dst->parent_limit.store(0);
        dst->map_gen.fetch_add(1, std::memory_order_release);
        src->epoch.store(e + 1);
        src->dirty.store(true);
        src->children.push_back(dst.get());
        dst->clone_src = src.get();
        dst->clone_dst_end = 0;
      }
      const uint64_t bs = g.block_size();
      std::vector<std::byte> buf;
      auto copy_bytes = [&](uint64_t off, uint64_t n) -> Status {
        while (n > 0) {
          uint64_t b = g.BlockOf(off), o = g.OffsetInBlock(off);
          uint64_t chunk = std::min(n, bs - o);
          buf.resize(chunk);
          THINFS_RETURN_IF_ERROR(p.ReadBlock(*src, b, o, buf));
          THINFS_RETURN_IF_ERROR(p.WriteBlock(*dst, b, o, buf));
          off += chunk;
          n -= chunk;
        }
        return Status::Ok();
      };
      uint64_t off = src_offset, end = src_offset + len;
      uint64_t head_end = std::min(end, g.BytesOf(g.BlocksFor(off)));
      THINFS_RETURN_IF_ERROR(copy_bytes(off, head_end - off));
      uint64_t whole_end = std::max(head_end, g.BytesOf(g.BlockOf(end)));
      const uint64_t limit = g.BlockOf(whole_end);
      // Changed only here and by resize, both with dst's io_mu exclusive.
      const uint64_t old_limit = dst->parent_limit.load();
      // mapped_blocks gains the blocks dst comes to read from src in
      // [old_limit, limit), exactly (thinfs check verifies it), counted
      // first and applied with the limit, so that no commit records one
      // without the other. A fresh copy of all of src's whole blocks reads
      // what src reads but a partial last block: O(1) from src's count. A
      // piece of a larger copy commits, then counts in one ordered pass over
      // the committed map what src maps in the range, less the blocks dst
      // has its own version of (edge blocks of earlier pieces); point
      // lookups per block would cost seconds for a piece of 4 GiB.
      int64_t shown = 0;
      if (limit > old_limit) {
        const uint64_t src_blocks = g.BlocksFor(ssize);
        if (fresh && limit + 1 >= src_blocks) {
          shown = src->mapped.load();
          for (uint64_t b = limit; b < src_blocks; ++b) {
            THINFS_ASSIGN_OR_RETURN(Resolved r, p.Resolve(*src, b));
            if (r.mapped()) --shown;
          }
        } else {
          // src reads at its committed epoch what dst reads at
          // parent_epoch: nothing was written to it since (write_gen).
          THINFS_RETURN_IF_ERROR(p.Commit());
          std::set<uint64_t> own;
          std::unique_ptr<MapIterator> it = p.store->NewMapIterator();
          for (it->Seek(dst->id, VolumeBlock(old_limit));
               it->Valid() && it->entry().device == dst->id && it->entry().vblock.value < limit;
               it->Next()) {
            own.insert(it->entry().vblock.value);
          }
          THINFS_RETURN_IF_ERROR(it->status());
          THINFS_ASSIGN_OR_RETURN(MappingWalk walk, MappingWalk::Open(p.store.get()));
          THINFS_RETURN_IF_ERROR(
              walk.ForEach(src->id, old_limit, limit, [&](const ResolvedMapping& m) {
                if (!own.count(m.vblock.value)) ++shown;
                return Status::Ok();
              }));
        }
      }
      {
        ReaderLock swap(&p.swap_mu);
        MutexLock d(&p.devices_mu);
        if (limit > old_limit) {
          dst->parent_limit.store(limit);
          dst->map_gen.fetch_add(1, std::memory_order_release);
          dst->mapped.fetch_add(shown);
        }
        dst->dirty.store(true);
      }
      THINFS_RETURN_IF_ERROR(copy_bytes(whole_end, end - whole_end));
      dst->write_gen.fetch_add(1);
      dst->clone_dst_end = end;
      dst->clone_src_gen = src->write_gen.load();
      dst->clone_dst_gen = dst->write_gen.load();
      int64_t now = NowNs();
      dst->mtime_ns.store(now);
      dst->ctime_ns.store(now);
      return fresh ? p.Commit() : Status::Ok();
    }
  }

  // Both device locks in id order, as the clone path above takes them: a
  // copy a->b and a copy b->a on the other path must not each hold the
  // lock the other waits for (tests/regress/issue_6_share_range_lock_order).
  ReaderLock io_first(src->id <= dst->id ? &src->io_mu : &dst->io_mu);
  std::optional<ReaderLock> io_second;
  if (dst != src) io_second.emplace(src->id <= dst->id ? &dst->io_mu : &src->io_mu);
  uint64_t ssize = src->size.load();
  uint64_t dsize = dst->size.load();
  if (src_offset >= ssize) return Status::Ok();
  length = std::min(length, ssize - src_offset);
  if (dst_offset > dsize || length > dsize - dst_offset) {
    return Status::InvalidArgument("copy past the end of the destination");
  }
  if (src == dst && src_offset < dst_offset + length && dst_offset < src_offset + length) {
    return Status::InvalidArgument("overlapping copy within one device");
  }
  const uint64_t bs = g.block_size();
  std::vector<std::byte> buf;
  auto copy_bytes = [&](uint64_t s, uint64_t d, uint64_t n) -> Status {
    while (n > 0) {
      uint64_t sb = g.BlockOf(s), so = g.OffsetInBlock(s);
      uint64_t db = g.BlockOf(d), doff = g.OffsetInBlock(d);
      uint64_t chunk = std::min({n, bs - so, bs - doff});
      buf.resize(chunk);
      THINFS_RETURN_IF_ERROR(p.ReadBlock(*src, sb, so, buf));
      THINFS_RETURN_IF_ERROR(p.WriteBlock(*dst, db, doff, buf));
      s += chunk;
      d += chunk;
      n -= chunk;
    }
    return Status::Ok();
  };
  if (g.OffsetInBlock(src_offset) != g.OffsetInBlock(dst_offset)) {
    return copy_bytes(src_offset, dst_offset, length);
  }
  uint64_t head = std::min(length, (bs - g.OffsetInBlock(src_offset)) % bs);
  THINFS_RETURN_IF_ERROR(copy_bytes(src_offset, dst_offset, head));
  uint64_t s = src_offset + head, d = dst_offset + head, n = length - head;
  while (n >= bs) {
    uint64_t sb = g.BlockOf(s), db = g.BlockOf(d);
    SharedMutex* m1 = &p.Stripe(src->id, sb);
    SharedMutex* m2 = &p.Stripe(dst->id, db);
    if (m1 > m2) std::swap(m1, m2);
    WriterLock l1(m1);
    std::optional<WriterLock> l2;
    if (m2 != m1) l2.emplace(m2);
    THINFS_ASSIGN_OR_RETURN(Resolved r, p.Resolve(*src, sb));
    if (!r.mapped()) {
      THINFS_RETURN_IF_ERROR(p.DiscardBlockLocked(*dst, db));
    } else {
      Epoch de = dst->epoch.load();
      THINFS_ASSIGN_OR_RETURN(std::optional<Version> own, p.FindOwn(dst->id, db, de));
      bool same = own && !own->value.tombstone() && own->value.block == r.value.block;
      if (!same) {
        Resolved before;
        if (own) {
          before = Resolved{true, dst->id, own->epoch, own->value};
        } else {
          THINFS_ASSIGN_OR_RETURN(before, p.ResolveParent(*dst, db));
        }
        {
          ReaderLock swap(&p.swap_mu);
          THINFS_RETURN_IF_ERROR(p.AddReference(r.value.block));
          if (r.owner == src->id && r.epoch == src->epoch.load() &&
              !(r.value.flags & MapValue::kMaybeShared)) {
            // The source could overwrite it in place: flag it.
            MapValue v = r.value;
            v.flags |= MapValue::kMaybeShared;
            p.SetEdit(src->id, sb, r.epoch, v);
          }
        }
        MapValue v{r.value.block, MapValue::kMaybeShared};
        THINFS_RETURN_IF_ERROR(p.InstallVersion(*dst, db, de, own, before, v));
      }
    }
    s += bs;
    d += bs;
    n -= bs;
  }
  THINFS_RETURN_IF_ERROR(copy_bytes(s, d, n));
  dst->write_gen.fetch_add(1);
  int64_t now = NowNs();
  dst->mtime_ns.store(now);
  dst->ctime_ns.store(now);
  dst->dirty.store(true);
  return Status::Ok();
}

Status Pool::Commit() { return impl_->Commit(); }
Status Pool::PeriodicCommitForTesting() { return impl_->Commit(Impl::CommitKind::kPeriodic); }

Status Pool::Impl::CommitDataBlocks(uint64_t n) {
  MetaBatch batch;
  Superblock sb = superblock;
  sb.data_blocks = n;
  batch.superblock = sb;
  Status s = store->Commit(batch, /*sync=*/true);
  if (!s.ok()) {
    // The space map already hands out the new blocks: no mapping of them
    // may commit under a superblock that does not cover them.
    failure = s.ToString();
    failed.store(true);
    Log(0, "grow failed to commit, the pool stops writing until 'thinfs check': " + failure);
    return s;
  }
  superblock = sb;
  data_blocks.store(n);
  return Status::Ok();
}

Status Pool::Grow(uint64_t new_data_blocks) {
  Impl& p = *impl_;
  THINFS_RETURN_IF_ERROR(p.CheckWritable());
  uint64_t old_blocks;
  {
    // commit_mu keeps every commit out until the superblock covers the
    // new blocks (they are allocatable as soon as the space map grows).
    MutexLock c(&p.commit_mu);
    old_blocks = p.data_blocks.load();
    if (new_data_blocks < old_blocks) {
      return Status::InvalidArgument("shrinking the pool is not supported (" +
                                     std::to_string(old_blocks) + " blocks, asked for " +
                                     std::to_string(new_data_blocks) + ")");
    }
    if (new_data_blocks == old_blocks) return Status::Ok();
    // Order for crashes: device, then space map, then superblock. Open()
    // accepts a space map larger than the superblock and finishes the grow.
    THINFS_RETURN_IF_ERROR(p.data->Grow(new_data_blocks));
    THINFS_RETURN_IF_ERROR(p.space->Grow(new_data_blocks));
    THINFS_RETURN_IF_ERROR(p.CommitDataBlocks(new_data_blocks));
  }
  p.Log(2, "pool grown from " + std::to_string(old_blocks) + " to " +
               std::to_string(new_data_blocks) + " data blocks");
  p.space_cv.SignalAll();
  p.CheckLowWater();
  return Status::Ok();
}

PoolStats Pool::Stats() const {
  Impl& p = *impl_;
  PoolStats s;
  s = p.SpaceStats();
  {
    MutexLock d(&p.devices_mu);
    s.devices = p.names.size();
  }
  s.transaction_id = p.transaction_id.load();
  s.reads = p.n_reads.load();
  s.writes = p.n_writes.load();
  s.provisions = p.n_provisions.load();
  s.cow_copies = p.n_cow.load();
  s.deferred_copies = p.copies.completed();
  s.discards = p.n_discards.load();
  s.commits = p.n_commits.load();
  s.data_syncs = p.n_data_syncs.load();
  {
    MutexLock l(&p.gc_mu);
    s.gc_backlog = p.gc_devices.size() + p.gc_candidates.size();
  }
  {
    MutexLock l(&p.latency_mu);
    std::vector<uint64_t> v = p.latency_us;
    if (!v.empty()) {
      std::sort(v.begin(), v.end());
      auto pct = [&](size_t q) { return v[std::min(v.size() - 1, v.size() * q / 100)]; };
      s.commit_p50_us = pct(50);
      s.commit_p90_us = pct(90);
      s.commit_p99_us = pct(99);
      s.commit_max_us = v.back();
    }
  }
  s.read_only = p.options.read_only || p.failed.load();
  return s;
}

const Geometry& Pool::geometry() const { return impl_->geometry; }
MetadataStore* Pool::store() { return impl_->store.get(); }
SpaceMap* Pool::space_map() { return impl_->space.get(); }

Result<std::optional<PoolBlock>> Pool::MappedBlockForTesting(VolumeId id, uint64_t vblock) {
  Impl& p = *impl_;
  std::shared_ptr<VolumeState> st = p.FindById(id.value);
  if (!st) return Status::NotFound("no device " + std::to_string(id.value));
  ReaderLock io(&st->io_mu);
  ReaderLock stripe(&p.Stripe(st->id, vblock));
  THINFS_ASSIGN_OR_RETURN(Resolved r, p.Resolve(*st, vblock));
  if (!r.mapped()) return std::optional<PoolBlock>();
  return std::optional<PoolBlock>(r.value.block);
}

Status Pool::RunGcForTesting() {
  Impl& p = *impl_;
  for (int round = 0; round < 100; ++round) {
    THINFS_RETURN_IF_ERROR(p.GcOnce());
    MutexLock l(&p.gc_mu);
    if (p.gc_devices.empty() && p.gc_candidates.empty()) break;
  }
  return p.Commit();
}

}  // namespace thinfs
