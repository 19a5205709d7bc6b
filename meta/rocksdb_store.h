// RocksDbStore: the pool's MetadataStore on RocksDB (pool/meta/).
//
// Column families "superblock", "devices", "map" and "refcounts" hold the
// records described in the RocksDB section of meta/format.h. Commit()
// writes one WriteBatch across all of them; the WAL is always on and is
// fsynced only when Commit(sync=true) asks. Reads see the committed state
// (RocksDB's latest sequence number); a MapIterator reads the implicit
// snapshot taken when it was created.
//
// This header exposes no RocksDB type: the implementation lives behind a
// pimpl so that core/ and fs/ users need no RocksDB headers.
//
// Thread safety: every method may be called concurrently, except that
// Commit() calls must be serialised by the caller (MetadataStore contract)
// and CompactForTesting/CheckpointTo may run alongside anything. Iterators
// returned by NewMapIterator() must be destroyed before the store.

#ifndef THINFS_META_ROCKSDB_STORE_H_
#define THINFS_META_ROCKSDB_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/metadata.h"
#include "core/status.h"

namespace thinfs::meta {

struct RocksDbOptions {
  // LRU block cache shared by all column families.
  size_t block_cache_bytes = size_t{64} << 20;
  // Opens with DB::OpenForReadOnly: Commit() returns kReadOnly, and no
  // background work touches the files. Create() rejects it.
  bool read_only = false;
  // The store serves one command and closes (the CLI's opens): it goes
  // without what only a long-lived opener gains from, which every open
  // would otherwise pay for: the block map's memtable prefix Bloom filter
  // (3.2 MiB zeroed at open; read-only opens never have it), and threads
  // that open the table files at once (one thread opens them all).
  bool one_shot = false;
  // Benchmarks only (bench/map_filter_probe.cc, lever 43); the daemon and
  // the CLI never set them. Without the SST filter the block map's table
  // files are read as if they had no prefix Bloom filter (and new ones are
  // written without one); without the memtable filter its memtables have
  // none (RocksDbOptions::one_shot's saving, on a long-lived open).
  bool no_map_filter_for_testing = false;
  bool no_map_memtable_filter_for_testing = false;
  // Benchmarks only (the same probe): the block map's bottommost level
  // written with this compression ("LZ4", "ZSTD", "Snappy" or
  // "NoCompression") instead of the store's choice; empty keeps it.
  std::string map_bottom_compression_for_testing;
  // Benchmarks only (the same probe): the block map's table files written
  // in blocks of this many bytes instead of 16 KiB; 0 keeps it.
  size_t map_block_size_for_testing = 0;
  // A rocksdb::Env* used for all file I/O (FaultInjectionFs::env() in
  // tests); nullptr selects the default Env. Not owned; must outlive the
  // store.
  void* env_for_testing = nullptr;
};

class RocksDbStore final : public MetadataStore {
 public:
  // Creates a new database in `dir` (created if missing; its parent must
  // exist) holding `sb` and nothing else, durably.
  // Returns kExists if `dir` already holds a database, kInvalidArgument for
  // a read-only `options` or a bad superblock magic, kIOError otherwise.
  static Result<std::unique_ptr<RocksDbStore>> Create(const std::string& dir,
                                                      const Superblock& sb,
                                                      const RocksDbOptions& options);

  // Opens an existing database and verifies its superblock.
  // Returns kNotFound if `dir` holds no database, kBusy if another
  // RocksDbStore (in this or another process) has it open for writing,
  // kCorruption if a column family is missing or the superblock is damaged,
  // kNotSupported for a newer format, kIOError otherwise.
  static Result<std::unique_ptr<RocksDbStore>> Open(const std::string& dir,
                                                    const RocksDbOptions& options);

  ~RocksDbStore() override;
  RocksDbStore(const RocksDbStore&) = delete;
  RocksDbStore& operator=(const RocksDbStore&) = delete;

  // MetadataStore. Read methods return kCorruption (naming the record)
  // for a damaged value and kIOError for a failed read.
  Result<Superblock> ReadSuperblock() override;
  Result<std::vector<DeviceRecord>> LoadDevices() override;
  Result<std::optional<Version>> FindVersion(VolumeId device, VolumeBlock vblock,
                                             Epoch max_epoch) override;
  Result<std::vector<Version>> ListVersions(VolumeId device, VolumeBlock vblock) override;
  Result<uint32_t> GetRefcount(PoolBlock block) override;
  Result<std::vector<std::pair<PoolBlock, uint32_t>>> ListRefcounts() override;
  std::unique_ptr<MapIterator> NewMapIterator() override;
  // A record whose key is not 20 bytes, or whose value fails
  // DecodeMapValue, goes to `on_damaged`. RocksDB's own errors (a failed
  // read, a block checksum mismatch in an SST file) end the iteration with
  // kIOError/kCorruption as for NewMapIterator: RocksDB cannot step past a
  // block it cannot read.
  std::unique_ptr<MapIterator> NewMapIteratorSkippingDamaged(
      std::function<void(const DamagedMapRecord&)> on_damaged) override;
  // Returns kReadOnly when opened read-only, kInvalidArgument for a record
  // that cannot be encoded (device name over 4096 bytes), kNoSpace when
  // the metadata file system is full and kIOError when the write fails. A failed write is sticky: later commits return
  // kIOError without writing (RocksDB itself stops accepting writes after
  // a WAL error).
  Status Commit(const MetaBatch& batch, bool sync) override;
  // With `compact`, compacts the "map" column family to its bottommost
  // level first. Returns the size of the map's SST files (the memtable and
  // the WAL are not counted).
  Result<uint64_t> MapBytesOnDisk(bool compact) override;

  // Compacts every column family fully. Returns kIOError on failure.
  Status CompactForTesting();
  // Writes the block map's memtable to a level-0 table file, waiting.
  Status FlushMapForTesting();
  // The block map's table files per LSM level, level 0 first (trailing
  // empty levels left out).
  std::vector<int> MapFilesPerLevelForTesting() const;
  // The compression each of the block map's table files records in its
  // properties ("LZ4", "ZSTD", "NoCompression", ...), one entry per file.
  Result<std::vector<std::string>> MapTableCompressionsForTesting() const;

  // What RocksDbOptions::one_shot changes, as the open database applies
  // it: the block map's memtable prefix Bloom filter as a share of the
  // write buffer (0 for none), and the threads that open the table files:
  // 1 for a one-shot open, else one per CPU the opening thread may run on
  // (its affinity), kMaxTableOpeningThreads at most.
  double MapMemtableBloomRatioForTesting() const;
  int FileOpeningThreadsForTesting() const;
  static constexpr int kMaxTableOpeningThreads = 4;

  // Writes a consistent point-in-time copy of the database into `dir`
  // (which must not exist; hard links where possible) with
  // rocksdb::Checkpoint. The copy opens with Open(). Returns `dir`, or
  // kExists if it exists, kIOError otherwise.
  Result<std::string> CheckpointTo(const std::string& dir);

  // Name of the compression used for the bottommost level ("LZ4",
  // "Snappy" or "NoCompression", as for the other levels), picked from
  // what the RocksDB library was built with. Table files written by an
  // older thinfs may hold ZSTD blocks; they are read as they are.
  const std::string& bottommost_compression() const;

  // Raw access for corruption tests. `cf` is a column family name from
  // meta/format.h. PutRawForTesting writes unchecked bytes (synced);
  // GetRawForTesting returns kNotFound for a missing key.
  Status PutRawForTesting(const std::string& cf, std::string key, std::string value);
  Result<std::string> GetRawForTesting(const std::string& cf, const std::string& key);

 private:
  struct Rep;
  explicit RocksDbStore(std::unique_ptr<Rep> rep);

  // Constant after construction; RocksDB synchronises itself.
  const std::unique_ptr<Rep> rep_;
};

}  // namespace thinfs::meta

#endif  // THINFS_META_ROCKSDB_STORE_H_
