#include "meta/rocksdb_store.h"

#include <pthread.h>
#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <rocksdb/table_properties.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <sched.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "meta/format.h"
#include "meta/record_codec.h"

namespace thinfs::meta {

namespace {

// The one place where rocksdb::Status becomes ours.
Status FromRocks(const rocksdb::Status& s, const std::string& context) {
  if (s.ok()) return Status::Ok();
  std::string msg = context + ": " + s.ToString();
  switch (s.code()) {
    case rocksdb::Status::kNotFound:
      return Status::NotFound(std::move(msg));
    case rocksdb::Status::kCorruption:
      return Status::Corruption(std::move(msg));
    case rocksdb::Status::kNotSupported:
      return Status::NotSupported(std::move(msg));
    case rocksdb::Status::kInvalidArgument:
      return Status::InvalidArgument(std::move(msg));
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kTryAgain:
      return Status::Busy(std::move(msg));
    case rocksdb::Status::kIOError:
      if (s.IsNoSpace()) return Status::NoSpace(std::move(msg));
      // RocksDB reports a held LOCK file as a plain IOError ("While lock
      // file: .../LOCK: Resource temporarily unavailable", or "lock hold by
      // current process" within one process); the path is the only marker.
      if (msg.find("/LOCK") != std::string::npos) return Status::Busy(std::move(msg));
      return Status::IOError(std::move(msg));
    default:
      return Status::IOError(std::move(msg));
  }
}

const char* CompressionName(rocksdb::CompressionType t) {
  switch (t) {
    case rocksdb::kZSTD:
      return "ZSTD";
    case rocksdb::kLZ4Compression:
      return "LZ4";
    case rocksdb::kSnappyCompression:
      return "Snappy";
    default:
      return "NoCompression";
  }
}

// Iterates the "map" column family across devices: total_order_seek, since
// the prefix extractor would otherwise let Seek/Next stop at a prefix
// boundary. With `on_damaged` (check only), an undecodable record is
// reported and stepped over instead of ending the iteration.
class RocksMapIterator final : public MapIterator {
 public:
  using DamageFn = std::function<void(const DamagedMapRecord&)>;
  RocksMapIterator(std::unique_ptr<rocksdb::Iterator> it, DamageFn on_damaged)
      : it_(std::move(it)), on_damaged_(std::move(on_damaged)) {}

  bool Valid() const override { return valid_; }
  const MapEntry& entry() const override { return entry_; }
  void Next() override {
    if (!valid_) return;
    it_->Next();
    Load();
  }
  void Seek(VolumeId device, VolumeBlock vblock) override {
    status_ = Status::Ok();
    if (on_damaged_ && device.value == 0 && vblock.value == 0) {
      // A malformed key shorter than 20 bytes may sort before MapKey(0, 0, ...).
      it_->SeekToFirst();
    } else {
      it_->Seek(MapKey(device, vblock, UINT32_MAX));
    }
    Load();
  }
  Status status() const override { return status_; }

 private:
  void Load() {
    valid_ = false;
    for (; it_->Valid(); it_->Next()) {
      const rocksdb::Slice key = it_->key();
      Result<MapValue> v = DecodeMapValue(key.ToStringView(), it_->value().ToStringView());
      if (!v.ok()) {
        if (!on_damaged_) {
          status_ = v.status();
          return;
        }
        DamagedMapRecord d;
        d.raw_key = key.ToString();
        d.key_decoded = key.size() == dbformat::kMapKeySize;
        if (d.key_decoded) DecodeKey(key, &d.device, &d.vblock, &d.epoch);
        d.why = v.status();
        on_damaged_(d);
        continue;
      }
      DecodeKey(key, &entry_.device, &entry_.vblock, &entry_.epoch);
      entry_.value = *v;
      valid_ = true;
      return;
    }
    status_ = FromRocks(it_->status(), "iterate block map");
  }

  // REQUIRES: key.size() == dbformat::kMapKeySize.
  static void DecodeKey(const rocksdb::Slice& key, VolumeId* device, VolumeBlock* vblock,
                        Epoch* epoch) {
    *device = VolumeId(GetBe64(key.data()));
    *vblock = VolumeBlock(GetBe64(key.data() + 8));
    *epoch = ~GetBe32(key.data() + 16);
  }

  const std::unique_ptr<rocksdb::Iterator> it_;
  const DamageFn on_damaged_;
  MapEntry entry_;
  bool valid_ = false;
  Status status_;
};

}  // namespace

namespace {

// One thread's cached map iterator for FindVersion (see there). Its mutex is
// only ever contended by ~Rep / DropCachedIterators, never by another reader.
struct CachedIterator {
  std::mutex mu;
  std::unique_ptr<rocksdb::Iterator> it;  // null: build one at next use
  rocksdb::SequenceNumber seq = 0;        // the DB's sequence when `it` was built
  std::atomic<bool> thread_gone{false};   // its thread exited: prune the slot
};

// A thread's slots, one per store it looked up in. At thread exit (FUSE
// workers come and go) it releases their iterators, which would otherwise
// pin memtables and SST files until the store closes.
struct ThreadSlots {
  std::unordered_map<uint64_t, std::weak_ptr<CachedIterator>> by_store;
  ~ThreadSlots() {
    for (auto& [uid, weak] : by_store) {
      if (std::shared_ptr<CachedIterator> c = weak.lock()) {
        std::lock_guard<std::mutex> l(c->mu);
        c->it.reset();
        c->thread_gone.store(true);
      }
    }
  }
};

std::atomic<uint64_t> next_store_uid{1};

}  // namespace

struct RocksDbStore::Rep {
  ~Rep() {
    // Iterators must go before the column families and the DB.
    DropCachedIterators();
    for (rocksdb::ColumnFamilyHandle* h : handles) {
      if (db != nullptr) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
    if (db != nullptr) db->Close().PermitUncheckedError();
    delete db;
  }

  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // owned, in Open order
  std::map<std::string, rocksdb::ColumnFamilyHandle*> by_name;
  rocksdb::ColumnFamilyHandle* sb_cf = nullptr;
  rocksdb::ColumnFamilyHandle* dev_cf = nullptr;
  rocksdb::ColumnFamilyHandle* map_cf = nullptr;
  rocksdb::ColumnFamilyHandle* ref_cf = nullptr;
  bool read_only = false;
  std::string dir;
  std::string bottommost_compression;
  // Set by a failed commit; later commits refuse to write. Atomic because
  // Commit() and readers of the flag may run on different threads.
  std::atomic<bool> failed{false};

  // FindVersion's per-thread iterators, owned here so that they die before
  // the DB whatever threads still exist; threads find theirs by `uid`
  // (unique per store, never reused, unlike the address).
  const uint64_t uid = next_store_uid.fetch_add(1);
  std::mutex cache_mu;
  std::vector<std::shared_ptr<CachedIterator>> cached;

  std::shared_ptr<CachedIterator> ThreadIterator() {
    thread_local ThreadSlots slots;
    auto& mine = slots.by_store;
    auto i = mine.find(uid);
    if (i != mine.end()) {
      if (std::shared_ptr<CachedIterator> c = i->second.lock()) return c;
    }
    // First use on this thread (or after DropCachedIterators): forget slots
    // of stores that are gone, register a new one.
    std::erase_if(mine, [](const auto& kv) { return kv.second.expired(); });
    auto c = std::make_shared<CachedIterator>();
    {
      std::lock_guard<std::mutex> l(cache_mu);
      std::erase_if(cached, [](const auto& x) { return x->thread_gone.load(); });
      cached.push_back(c);
    }
    mine[uid] = c;
    return c;
  }

  // Releases every cached iterator (they pin memtables and SST files).
  void DropCachedIterators() {
    std::vector<std::shared_ptr<CachedIterator>> all;
    {
      std::lock_guard<std::mutex> l(cache_mu);
      all.swap(cached);
    }
    for (const auto& c : all) {
      std::lock_guard<std::mutex> l(c->mu);
      c->it.reset();
    }
  }
};

namespace {

struct TunedOptions {
  rocksdb::DBOptions db;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;  // default first
  std::string bottommost_compression;
};

int TableOpeningThreads() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (::sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
  return std::clamp(CPU_COUNT(&cpus), 1, RocksDbStore::kMaxTableOpeningThreads);
}

TunedOptions MakeOptions(const RocksDbOptions& o) {
  TunedOptions t;
  t.db.env = o.env_for_testing != nullptr ? static_cast<rocksdb::Env*>(o.env_for_testing)
                                          : rocksdb::Env::Default();
  t.db.max_background_jobs = 2;
  t.db.keep_log_file_num = 4;
  t.db.max_log_file_size = 4 << 20;
  // RocksDB opens each column family's table files from
  // max_file_opening_threads threads, started and joined whether there
  // are files or not. Its default, 16, made 75 thread starts for our five
  // column families: about 40% of a CLI command's CPU on a VM where a
  // clone costs 150 us, so a one-shot open uses one (docs/benchmarks.md,
  // lever 59). The daemon opens once per mount and gets one per CPU: on
  // 2 CPUs, 2 threads opened 32 table files in 52-73% of the time of 1,
  // 4 files as fast as 1, and both faster than 16 (lever 60).
  t.db.max_file_opening_threads = o.one_shot ? 1 : TableOpeningThreads();

  const std::vector<rocksdb::CompressionType> supported = rocksdb::GetSupportedCompressions();
  auto has = [&](rocksdb::CompressionType c) {
    return std::find(supported.begin(), supported.end(), c) != supported.end();
  };
  // One compression at every level, LZ4 where the library has it. Every
  // lookup that misses the block cache decompresses a whole 16 KiB block:
  // with ZSTD at the bottom level, where a long-lived pool's map lies, that
  // took 21-28 us a lookup against 10-12 with LZ4, and 4 KiB random reads
  // through FUSE of a map 12x the block cache ran 22-27% faster with LZ4, for
  // 13.6 B per mapping on disk instead of 9.3 (docs/benchmarks.md, lever
  // 63).
  rocksdb::CompressionType compression = rocksdb::kNoCompression;
  if (has(rocksdb::kLZ4Compression)) {
    compression = rocksdb::kLZ4Compression;
  } else if (has(rocksdb::kSnappyCompression)) {
    compression = rocksdb::kSnappyCompression;
  }
  // RocksDB compresses the bottom level like the others unless told.
  t.bottommost_compression = CompressionName(compression);

  std::shared_ptr<rocksdb::Cache> cache = rocksdb::NewLRUCache(o.block_cache_bytes);
  auto base_cf = [&](size_t block_size, const rocksdb::FilterPolicy* filter,
                     bool whole_key) {
    rocksdb::BlockBasedTableOptions table;
    table.block_cache = cache;
    table.block_size = block_size;
    table.checksum = rocksdb::kXXH3;
    table.whole_key_filtering = whole_key;
    if (filter != nullptr) table.filter_policy.reset(filter);
    rocksdb::ColumnFamilyOptions cf;
    cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    cf.compression = compression;
    return cf;
  };

  t.cfs.emplace_back(rocksdb::kDefaultColumnFamilyName, base_cf(4096, nullptr, true));
  t.cfs.emplace_back(dbformat::kSuperblockCf, base_cf(4096, nullptr, true));
  t.cfs.emplace_back(dbformat::kDevicesCf, base_cf(4096, nullptr, true));
  // Every map lookup is a Seek on (device, vblock): a prefix Bloom filter
  // serves it, a whole-key filter never would and would double the filter
  // size. 16 KiB blocks keep the index small; keys delta-encode well.
  rocksdb::ColumnFamilyOptions map_cf =
      base_cf(o.map_block_size_for_testing != 0 ? o.map_block_size_for_testing : 16 * 1024,
              o.no_map_filter_for_testing ? nullptr : rocksdb::NewBloomFilterPolicy(10),
              /*whole_key=*/false);
  map_cf.prefix_extractor.reset(rocksdb::NewFixedPrefixTransform(dbformat::kMapPrefixSize));
  // The memtable's prefix Bloom filter: 5% of the 64 MiB write buffer,
  // 3.2 MiB that RocksDB zeroes for every memtable it creates, the first
  // one at open. Only a writer that keeps the store open fills memtables
  // that lookups then seek in; a read-only or one-shot open goes without.
  for (rocksdb::CompressionType c : {rocksdb::kNoCompression, rocksdb::kSnappyCompression,
                                     rocksdb::kLZ4Compression, rocksdb::kZSTD}) {
    if (o.map_bottom_compression_for_testing == CompressionName(c)) {
      map_cf.bottommost_compression = c;
    }
  }
  if (!o.one_shot && !o.read_only && !o.no_map_memtable_filter_for_testing) {
    map_cf.memtable_prefix_bloom_size_ratio = 0.05;
  }
  t.cfs.emplace_back(dbformat::kMapCf, map_cf);
  // GetRefcount mostly asks about unshared blocks, which have no entry: a
  // whole-key filter answers those without reading a data block.
  t.cfs.emplace_back(dbformat::kRefcountsCf,
                     base_cf(4096, rocksdb::NewBloomFilterPolicy(10), /*whole_key=*/true));
  return t;
}

// RocksDB starts a process-wide timer thread for its periodic tasks
// (flushing its log, dumping statistics) in the first DB::Open and does not
// name it, so it would carry the name of the thread that opens: in the
// daemon the main thread's, `thinfs-engine`, which is also the process's
// (README "mount"). The opening thread wears "rocksdb:timer" while it
// opens, and gets its own name back after.
template <typename OpenFn>
rocksdb::Status OpenNamingTheTimer(OpenFn open) {
  char own[16] = {};
  const bool saved = pthread_getname_np(pthread_self(), own, sizeof own) == 0;
  if (saved) pthread_setname_np(pthread_self(), "rocksdb:timer");
  rocksdb::Status s = open();
  if (saved) pthread_setname_np(pthread_self(), own);
  return s;
}

}  // namespace

RocksDbStore::RocksDbStore(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
RocksDbStore::~RocksDbStore() = default;

Result<std::unique_ptr<RocksDbStore>> RocksDbStore::Create(const std::string& dir,
                                                           const Superblock& sb,
                                                           const RocksDbOptions& options) {
  if (options.read_only) return Status::InvalidArgument("create " + dir + ": read_only set");
  if (sb.magic != kSuperblockMagic) {
    return Status::InvalidArgument("create " + dir + ": superblock has a bad magic");
  }
  TunedOptions t = MakeOptions(options);
  rocksdb::Status exists = t.db.env->FileExists(dir + "/CURRENT");
  if (exists.ok()) return Status::Exists("create " + dir + ": a database exists");
  if (!exists.IsNotFound()) return FromRocks(exists, "create " + dir);

  t.db.create_if_missing = true;
  t.db.error_if_exists = true;
  t.db.create_missing_column_families = true;
  auto rep = std::make_unique<Rep>();
  rep->dir = dir;
  rep->bottommost_compression = t.bottommost_compression;
  rocksdb::Status opened = OpenNamingTheTimer(
      [&] { return rocksdb::DB::Open(t.db, dir, t.cfs, &rep->handles, &rep->db); });
  THINFS_RETURN_IF_ERROR(FromRocks(opened, "create " + dir));
  for (size_t i = 0; i < t.cfs.size(); ++i) rep->by_name[t.cfs[i].name] = rep->handles[i];
  rep->sb_cf = rep->by_name[dbformat::kSuperblockCf];
  rep->dev_cf = rep->by_name[dbformat::kDevicesCf];
  rep->map_cf = rep->by_name[dbformat::kMapCf];
  rep->ref_cf = rep->by_name[dbformat::kRefcountsCf];
  std::unique_ptr<RocksDbStore> store(new RocksDbStore(std::move(rep)));
  MetaBatch first;
  first.superblock = sb;
  THINFS_RETURN_IF_ERROR(store->Commit(first, /*sync=*/true).WithContext("create " + dir));
  return store;
}

Result<std::unique_ptr<RocksDbStore>> RocksDbStore::Open(const std::string& dir,
                                                         const RocksDbOptions& options) {
  TunedOptions t = MakeOptions(options);
  const std::string ctx = "open " + dir;
  rocksdb::Status exists = t.db.env->FileExists(dir + "/CURRENT");
  if (exists.IsNotFound()) return Status::NotFound(ctx + ": no database");
  THINFS_RETURN_IF_ERROR(FromRocks(exists, ctx));

  // CURRENT is there: a file it leads to that is missing (the MANIFEST,
  // an SST) is a damaged database, not an I/O problem.
  auto opened = [&ctx](const rocksdb::Status& s) {
    if (s.IsPathNotFound()) {
      return Status::Corruption(ctx + ": a database file is missing: " + s.ToString());
    }
    return FromRocks(s, ctx);
  };
  std::vector<std::string> names;
  THINFS_RETURN_IF_ERROR(opened(rocksdb::DB::ListColumnFamilies(t.db, dir, &names)));
  for (const rocksdb::ColumnFamilyDescriptor& d : t.cfs) {
    if (std::find(names.begin(), names.end(), d.name) == names.end()) {
      return Status::Corruption(ctx + ": column family \"" + d.name + "\" is missing");
    }
  }
  for (const std::string& n : names) {
    bool known = std::any_of(t.cfs.begin(), t.cfs.end(),
                             [&](const rocksdb::ColumnFamilyDescriptor& d) { return d.name == n; });
    if (!known) {
      return Status::NotSupported(ctx + ": unknown column family \"" + n +
                                  "\" (written by a newer thinfs?)");
    }
  }

  auto rep = std::make_unique<Rep>();
  rep->dir = dir;
  rep->read_only = options.read_only;
  rep->bottommost_compression = t.bottommost_compression;
  rocksdb::Status s = OpenNamingTheTimer([&] {
    return options.read_only
               ? rocksdb::DB::OpenForReadOnly(t.db, dir, t.cfs, &rep->handles, &rep->db)
               : rocksdb::DB::Open(t.db, dir, t.cfs, &rep->handles, &rep->db);
  });
  THINFS_RETURN_IF_ERROR(opened(s));
  for (size_t i = 0; i < t.cfs.size(); ++i) rep->by_name[t.cfs[i].name] = rep->handles[i];
  rep->sb_cf = rep->by_name[dbformat::kSuperblockCf];
  rep->dev_cf = rep->by_name[dbformat::kDevicesCf];
  rep->map_cf = rep->by_name[dbformat::kMapCf];
  rep->ref_cf = rep->by_name[dbformat::kRefcountsCf];
  std::unique_ptr<RocksDbStore> store(new RocksDbStore(std::move(rep)));
  Result<Superblock> sb = store->ReadSuperblock();
  if (!sb.ok()) {
    Status st = sb.status();
    if (st.IsNotFound()) return Status::Corruption(ctx + ": superblock record is missing");
    return st.WithContext(ctx);
  }
  return store;
}

Result<Superblock> RocksDbStore::ReadSuperblock() {
  std::string value;
  THINFS_RETURN_IF_ERROR(FromRocks(
      rep_->db->Get(rocksdb::ReadOptions(), rep_->sb_cf, dbformat::kSuperblockKey, &value),
      "read superblock"));
  return DecodeSuperblockValue(value);
}

Result<std::vector<DeviceRecord>> RocksDbStore::LoadDevices() {
  std::vector<DeviceRecord> out;
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(rocksdb::ReadOptions(),
                                                              rep_->dev_cf));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    THINFS_ASSIGN_OR_RETURN(DeviceRecord d, DecodeDeviceValue(it->key().ToStringView(), it->value().ToStringView()));
    out.push_back(std::move(d));
  }
  THINFS_RETURN_IF_ERROR(FromRocks(it->status(), "load devices"));
  return out;
}

Result<std::optional<Version>> RocksDbStore::FindVersion(VolumeId device, VolumeBlock vblock,
                                                         Epoch max_epoch) {
  // Building an iterator costs more than the Seek itself (it references the
  // current memtables and SST files and builds a merging iterator over them),
  // so each thread keeps one and rebuilds it only when the DB's sequence
  // number has moved, i.e. after a commit wrote something. That is as fresh
  // as a new iterator: the engine reads its overlay before calling here and
  // drops overlay edits only after the commit that stored them returned, so
  // a lookup that no longer sees an edit in the overlay sees the new
  // sequence number here. Compactions do not move the sequence number and
  // do not change what an iterator reads.
  std::shared_ptr<CachedIterator> c = rep_->ThreadIterator();
  std::lock_guard<std::mutex> l(c->mu);
  const rocksdb::SequenceNumber seq = rep_->db->GetLatestSequenceNumber();
  if (c->it == nullptr || c->seq != seq || !c->it->status().ok()) {
    rocksdb::ReadOptions ro;
    // The seek key's 16-byte prefix is (device, vblock): the prefix Bloom
    // filter can skip files, and the iterator stops at the next block.
    ro.prefix_same_as_start = true;
    c->it.reset();
    c->it.reset(rep_->db->NewIterator(ro, rep_->map_cf));
    c->seq = seq;
  }
  rocksdb::Iterator* it = c->it.get();
  const std::string key = MapKey(device, vblock, max_epoch);
  it->Seek(key);
  if (!it->Valid()) {
    THINFS_RETURN_IF_ERROR(FromRocks(it->status(), "find version"));
    return std::optional<Version>();
  }
  const rocksdb::Slice found = it->key();
  if (found.size() < dbformat::kMapPrefixSize ||
      std::memcmp(found.data(), key.data(), dbformat::kMapPrefixSize) != 0) {
    return std::optional<Version>();
  }
  THINFS_ASSIGN_OR_RETURN(MapValue v, DecodeMapValue(found.ToStringView(), it->value().ToStringView()));
  return std::optional<Version>(Version{~GetBe32(found.data() + 16), v});
}

Result<std::vector<Version>> RocksDbStore::ListVersions(VolumeId device, VolumeBlock vblock) {
  rocksdb::ReadOptions ro;
  ro.prefix_same_as_start = true;
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(ro, rep_->map_cf));
  const std::string start = MapKey(device, vblock, UINT32_MAX);
  std::vector<Version> out;
  for (it->Seek(start); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (k.size() < dbformat::kMapPrefixSize ||
        std::memcmp(k.data(), start.data(), dbformat::kMapPrefixSize) != 0) {
      break;
    }
    THINFS_ASSIGN_OR_RETURN(MapValue v, DecodeMapValue(k.ToStringView(), it->value().ToStringView()));
    out.push_back(Version{~GetBe32(k.data() + 16), v});
  }
  THINFS_RETURN_IF_ERROR(FromRocks(it->status(), "list versions"));
  return out;
}

Result<uint32_t> RocksDbStore::GetRefcount(PoolBlock block) {
  std::string value;
  const std::string key = Id64Key(block.value);
  rocksdb::Status s = rep_->db->Get(rocksdb::ReadOptions(), rep_->ref_cf, key, &value);
  if (s.IsNotFound()) return uint32_t{0};
  THINFS_RETURN_IF_ERROR(FromRocks(s, "get refcount"));
  THINFS_ASSIGN_OR_RETURN(auto entry, DecodeRefcountValue(key, value));
  return entry.second;
}

Result<std::vector<std::pair<PoolBlock, uint32_t>>> RocksDbStore::ListRefcounts() {
  std::vector<std::pair<PoolBlock, uint32_t>> out;
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(rocksdb::ReadOptions(),
                                                              rep_->ref_cf));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    THINFS_ASSIGN_OR_RETURN(
        auto entry, DecodeRefcountValue(it->key().ToStringView(), it->value().ToStringView()));
    out.push_back(entry);
  }
  THINFS_RETURN_IF_ERROR(FromRocks(it->status(), "list refcounts"));
  return out;
}

std::unique_ptr<MapIterator> RocksDbStore::NewMapIterator() {
  return NewMapIteratorSkippingDamaged(nullptr);
}

std::unique_ptr<MapIterator> RocksDbStore::NewMapIteratorSkippingDamaged(
    std::function<void(const DamagedMapRecord&)> on_damaged) {
  rocksdb::ReadOptions ro;
  ro.total_order_seek = true;
  return std::make_unique<RocksMapIterator>(
      std::unique_ptr<rocksdb::Iterator>(rep_->db->NewIterator(ro, rep_->map_cf)),
      std::move(on_damaged));
}

Status RocksDbStore::Commit(const MetaBatch& batch, bool sync) {
  if (rep_->read_only) return Status::ReadOnly("commit: metadata opened read-only");
  if (rep_->failed.load()) return Status::IOError("commit: an earlier commit failed");
  rocksdb::WriteBatch wb;
  auto put = [&](rocksdb::ColumnFamilyHandle* cf, const std::string& k, const std::string& v) {
    return FromRocks(wb.Put(cf, k, v), "commit: batch put");
  };
  if (batch.superblock) {
    THINFS_RETURN_IF_ERROR(
        put(rep_->sb_cf, dbformat::kSuperblockKey, EncodeSuperblock(*batch.superblock)));
  }
  for (const DeviceRecord& d : batch.put_devices) {
    THINFS_ASSIGN_OR_RETURN(std::string v, EncodeDevice(d));
    THINFS_RETURN_IF_ERROR(put(rep_->dev_cf, Id64Key(d.id.value), v));
  }
  for (VolumeId id : batch.delete_devices) {
    THINFS_RETURN_IF_ERROR(FromRocks(wb.Delete(rep_->dev_cf, Id64Key(id.value)), "commit"));
  }
  for (const MapEntry& e : batch.put_mappings) {
    const std::string k = MapKey(e.device, e.vblock, e.epoch);
    THINFS_RETURN_IF_ERROR(put(rep_->map_cf, k, EncodeMapValue(k, e.value)));
  }
  for (const MetaBatch::MappingKey& m : batch.delete_mappings) {
    THINFS_RETURN_IF_ERROR(
        FromRocks(wb.Delete(rep_->map_cf, MapKey(m.device, m.vblock, m.epoch)), "commit"));
  }
  for (const std::string& k : batch.delete_raw_map_keys) {
    THINFS_RETURN_IF_ERROR(FromRocks(wb.Delete(rep_->map_cf, k), "commit"));
  }
  for (const auto& [block, count] : batch.refcounts) {
    const std::string k = Id64Key(block.value);
    if (count >= 2) {
      THINFS_RETURN_IF_ERROR(put(rep_->ref_cf, k, EncodeRefcount(k, count)));
    } else {
      THINFS_RETURN_IF_ERROR(FromRocks(wb.Delete(rep_->ref_cf, k), "commit"));
    }
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  Status s = FromRocks(rep_->db->Write(wo, &wb), "commit");
  if (!s.ok()) {
    rep_->failed.store(true);
    if (s.code() != Status::Code::kNoSpace) s = Status::IOError(s.message());
  }
  return s;
}

Result<uint64_t> RocksDbStore::MapBytesOnDisk(bool compact) {
  // Cached lookup iterators pin the files a compaction replaces.
  rep_->DropCachedIterators();
  if (compact) {
    rocksdb::CompactRangeOptions cro;
    cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    THINFS_RETURN_IF_ERROR(
        FromRocks(rep_->db->CompactRange(cro, rep_->map_cf, nullptr, nullptr), "compact map"));
  }
  uint64_t bytes = 0;
  if (!rep_->db->GetIntProperty(rep_->map_cf, rocksdb::DB::Properties::kTotalSstFilesSize,
                                &bytes)) {
    return Status::IOError("map bytes on disk: property unavailable");
  }
  return bytes;
}

Status RocksDbStore::CompactForTesting() {
  rocksdb::CompactRangeOptions cro;
  cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  for (rocksdb::ColumnFamilyHandle* h : rep_->handles) {
    THINFS_RETURN_IF_ERROR(
        FromRocks(rep_->db->CompactRange(cro, h, nullptr, nullptr), "compact " + h->GetName()));
  }
  return Status::Ok();
}

Status RocksDbStore::FlushMapForTesting() {
  rocksdb::FlushOptions fo;
  fo.wait = true;
  return FromRocks(rep_->db->Flush(fo, rep_->map_cf), "flush map");
}

std::vector<int> RocksDbStore::MapFilesPerLevelForTesting() const {
  rocksdb::ColumnFamilyMetaData meta;
  rep_->db->GetColumnFamilyMetaData(rep_->map_cf, &meta);
  std::vector<int> files;
  for (const rocksdb::LevelMetaData& level : meta.levels) {
    files.push_back(static_cast<int>(level.files.size()));
  }
  while (!files.empty() && files.back() == 0) files.pop_back();
  return files;
}

Result<std::vector<std::string>> RocksDbStore::MapTableCompressionsForTesting() const {
  rocksdb::TablePropertiesCollection props;
  THINFS_RETURN_IF_ERROR(
      FromRocks(rep_->db->GetPropertiesOfAllTables(rep_->map_cf, &props), "table properties"));
  std::vector<std::string> out;
  for (const auto& [file, p] : props) out.push_back(p->compression_name);
  return out;
}

double RocksDbStore::MapMemtableBloomRatioForTesting() const {
  return rep_->db->GetOptions(rep_->map_cf).memtable_prefix_bloom_size_ratio;
}

int RocksDbStore::FileOpeningThreadsForTesting() const {
  return rep_->db->GetDBOptions().max_file_opening_threads;
}

Result<std::string> RocksDbStore::CheckpointTo(const std::string& dir) {
  const std::string ctx = "checkpoint to " + dir;
  rocksdb::Status exists = rep_->db->GetEnv()->FileExists(dir);
  if (exists.ok()) return Status::Exists(ctx + ": exists");
  if (!exists.IsNotFound()) return FromRocks(exists, ctx);
  rocksdb::Checkpoint* raw = nullptr;
  THINFS_RETURN_IF_ERROR(FromRocks(rocksdb::Checkpoint::Create(rep_->db, &raw), ctx));
  std::unique_ptr<rocksdb::Checkpoint> cp(raw);
  THINFS_RETURN_IF_ERROR(FromRocks(cp->CreateCheckpoint(dir), ctx));
  return dir;
}

const std::string& RocksDbStore::bottommost_compression() const {
  return rep_->bottommost_compression;
}

Status RocksDbStore::PutRawForTesting(const std::string& cf, std::string key,
                                      std::string value) {
  auto it = rep_->by_name.find(cf);
  if (it == rep_->by_name.end()) return Status::InvalidArgument("no column family " + cf);
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(rep_->db->Put(wo, it->second, key, value), "put raw");
}

Result<std::string> RocksDbStore::GetRawForTesting(const std::string& cf,
                                                   const std::string& key) {
  auto it = rep_->by_name.find(cf);
  if (it == rep_->by_name.end()) return Status::InvalidArgument("no column family " + cf);
  std::string value;
  THINFS_RETURN_IF_ERROR(
      FromRocks(rep_->db->Get(rocksdb::ReadOptions(), it->second, key, &value), "get raw"));
  return value;
}

}  // namespace thinfs::meta
