#include "meta/pool_restore.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "core/pool.h"
#include "core/size.h"
#include "meta/bitmap_space_map.h"
#include "meta/pool_dir.h"
#include "meta/rocksdb_store.h"
#include "meta/thin_xml.h"

namespace thinfs::meta {

namespace {

namespace stdfs = std::filesystem;

constexpr uint64_t kSectorSize = 512;

struct TableEntry {
  uint64_t size = 0;
  std::string name;
};

// Reads the side table: '#' comments and blank lines, else
// "DEV_ID<TAB>SIZE<TAB>NAME".
Result<std::map<uint64_t, TableEntry>> ReadTable(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::FromErrno(errno, "open table " + path);
  std::map<uint64_t, TableEntry> out;
  std::set<std::string> names;
  std::string line;
  for (uint64_t n = 1; std::getline(in, line); ++n) {
    const std::string at = path + ":" + std::to_string(n) + ": ";
    if (line.empty() || line[0] == '#') continue;
    const size_t t1 = line.find('\t');
    const size_t t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    if (t2 == std::string::npos) {
      return Status::InvalidArgument(at + "expected DEV_ID<TAB>SIZE<TAB>NAME");
    }
    auto number = [&](const std::string& s, const char* what) -> Result<uint64_t> {
      if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string::npos) {
        return Status::InvalidArgument(at + what + " '" + s + "' is not a decimal number");
      }
      errno = 0;
      const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
      if (errno == ERANGE) return Status::InvalidArgument(at + what + " '" + s + "' overflows");
      return uint64_t{v};
    };
    THINFS_ASSIGN_OR_RETURN(uint64_t id, number(line.substr(0, t1), "dev_id"));
    THINFS_ASSIGN_OR_RETURN(uint64_t size, number(line.substr(t1 + 1, t2 - t1 - 1), "size"));
    std::string name = line.substr(t2 + 1);
    if (Status s = Pool::ValidateName(name); !s.ok()) {
      return Status::InvalidArgument(at + "name '" + name + "': " + s.message());
    }
    if (!names.insert(name).second) {
      return Status::InvalidArgument(at + "name '" + name + "' appears twice");
    }
    if (!out.emplace(id, TableEntry{size, name}).second) {
      return Status::InvalidArgument(at + "dev_id " + std::to_string(id) + " appears twice");
    }
  }
  if (in.bad()) return Status::FromErrno(errno, "read table " + path);
  return out;
}

struct RestoredDevice {
  uint64_t dev_id = 0;
  std::vector<ThinRange> ranges;
  uint64_t end = 0;  // highest mapped origin block + 1
  uint64_t blocks = 0;
};

// Collects and validates the parse.
class Collector final : public ThinXmlHandler {
 public:
  Collector(uint64_t data_bytes, std::string data_path)
      : data_bytes_(data_bytes), data_path_(std::move(data_path)) {}

  Status OnSuperblock(const ThinSuperblock& sb) override {
    sb_ = sb;
    if (sb.data_block_size > kMaxBlockSize / kSectorSize) {
      return Status::InvalidArgument("data_block_size " + std::to_string(sb.data_block_size) +
                                     " sectors is above thinfs's maximum block size of " +
                                     FormatSize(kMaxBlockSize));
    }
    block_size_ = sb.data_block_size * kSectorSize;
    if (const char* why = Geometry::Validate(block_size_); why[0] != '\0') {
      return Status::InvalidArgument("data_block_size " + std::to_string(sb.data_block_size) +
                                     " sectors (" + std::to_string(block_size_) +
                                     " bytes): " + why);
    }
    if (sb.nr_data_blocks == 0) return Status::InvalidArgument("nr_data_blocks is zero");
    if (sb.nr_data_blocks > data_bytes_ / block_size_) {
      return Status::InvalidArgument(
          "nr_data_blocks=" + std::to_string(sb.nr_data_blocks) + " blocks of " +
          FormatSize(block_size_) + " do not fit in the " + std::to_string(data_bytes_) +
          " bytes of " + data_path_ + " (room for " + std::to_string(data_bytes_ / block_size_) +
          " blocks)");
    }
    refs_.assign(sb.nr_data_blocks, 0);
    return Status::Ok();
  }

  Status OnDevice(const ThinDevice& d) override {
    if (!ids_.insert(d.dev_id).second) {
      return Status::InvalidArgument("dev_id " + std::to_string(d.dev_id) + " appears twice");
    }
    devices_.push_back(RestoredDevice{d.dev_id, {}, 0, 0});
    origins_.clear();
    datas_.clear();
    return Status::Ok();
  }

  Status OnMapping(const ThinRange& r) override {
    RestoredDevice& d = devices_.back();
    const std::string dev = "device " + std::to_string(d.dev_id);
    if (Status s = Overlap(&origins_, r.origin_begin, r.length); !s.ok()) {
      return Status::InvalidArgument(dev + " maps origin " + s.message() + " twice");
    }
    if (Status s = Overlap(&datas_, r.data_begin, r.length); !s.ok()) {
      return Status::InvalidArgument(dev + " maps data " + s.message() +
                                     " at two origin blocks (a data block mapped twice without "
                                     "sharing)");
    }
    for (uint64_t i = 0; i < r.length; ++i) {
      uint32_t& c = refs_[r.data_begin + i];
      if (c == UINT32_MAX) return Status::InvalidArgument("a data block is mapped 2^32 times");
      ++c;
    }
    d.ranges.push_back(r);
    d.end = std::max(d.end, r.origin_begin + r.length);
    d.blocks += r.length;
    return Status::Ok();
  }

  Status OnDeviceEnd() override { return Status::Ok(); }

  const ThinSuperblock& superblock() const { return sb_; }
  uint64_t block_size() const { return block_size_; }
  std::vector<RestoredDevice>& devices() { return devices_; }
  const std::vector<uint32_t>& refs() const { return refs_; }

 private:
  // Records [begin, begin + len) in `ranges` (begin -> end); names the
  // first block already there, if any.
  static Status Overlap(std::map<uint64_t, uint64_t>* ranges, uint64_t begin, uint64_t len) {
    const uint64_t end = begin + len;
    auto next = ranges->lower_bound(begin);
    if (next != ranges->end() && next->first < end) {
      return Status::InvalidArgument("block " + std::to_string(next->first));
    }
    if (next != ranges->begin()) {
      auto prev = std::prev(next);
      if (prev->second > begin) return Status::InvalidArgument("block " + std::to_string(begin));
    }
    ranges->emplace_hint(next, begin, end);
    return Status::Ok();
  }

  const uint64_t data_bytes_;
  const std::string data_path_;
  ThinSuperblock sb_;
  uint64_t block_size_ = 0;
  std::vector<RestoredDevice> devices_;
  std::set<uint64_t> ids_;
  std::vector<uint32_t> refs_;  // data block -> mappings naming it
  std::map<uint64_t, uint64_t> origins_;  // of the open device
  std::map<uint64_t, uint64_t> datas_;    // of the open device
};

int64_t NowNs() {
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// Removes the temporary pool unless dismissed.
struct TempDir {
  std::string path;
  ~TempDir() {
    if (path.empty()) return;
    std::error_code ec;
    stdfs::remove_all(path, ec);  // does not follow the data symlink
  }
};

// The metadata batch for the parsed devices (everything but the
// superblock), with the last checks that need the table and the XML
// together. Writes nothing.
Result<MetaBatch> Plan(Collector& c, const std::map<uint64_t, TableEntry>& table,
                       const RestoreOptions& options, RestoreStats* stats) {
  const std::vector<uint32_t>& refs = c.refs();
  uint64_t max_id = 0;
  for (const RestoredDevice& d : c.devices()) max_id = std::max(max_id, d.dev_id);
  if (max_id == UINT64_MAX) return Status::InvalidArgument("dev_id 2^64-1 is not supported");

  MetaBatch batch;
  const int64_t now = NowNs();
  uint64_t next_id = max_id + 1;
  uint64_t done = 0, total = 0;
  for (const RestoredDevice& d : c.devices()) total += d.blocks;
  for (RestoredDevice& d : c.devices()) {
    DeviceRecord r;
    r.id = VolumeId(d.dev_id != 0 ? d.dev_id : next_id++);
    auto t = table.find(d.dev_id);
    r.name = t != table.end() ? t->second.name : "thin" + std::to_string(d.dev_id);
    r.size = t != table.end() ? t->second.size : d.end * c.block_size();
    if (r.size / c.block_size() < d.end) {
      return Status::InvalidArgument(options.table_path + ": device " + std::to_string(d.dev_id) +
                                     " has size " + std::to_string(r.size) +
                                     " but maps block " + std::to_string(d.end - 1) + " (needs " +
                                     std::to_string(d.end * c.block_size()) + " bytes)");
    }
    r.created_ns = r.mtime_ns = r.ctime_ns = r.atime_ns = now;
    r.mapped_blocks = d.blocks;
    batch.put_devices.push_back(r);
    for (const ThinRange& m : d.ranges) {
      for (uint64_t i = 0; i < m.length; ++i) {
        const uint64_t b = m.data_begin + i;
        MapValue v{PoolBlock(b), refs[b] >= 2 ? uint8_t{MapValue::kMaybeShared} : uint8_t{0}};
        batch.put_mappings.push_back(MapEntry{r.id, VolumeBlock(m.origin_begin + i), 0, v});
      }
      done += m.length;
      if (options.progress) options.progress("building the block map", done, total);
    }
    stats->mapped_blocks += d.blocks;
  }
  std::set<uint64_t> ids;
  for (const RestoredDevice& d : c.devices()) ids.insert(d.dev_id);
  for (const auto& [id, entry] : table) {
    if (ids.count(id) == 0) {
      return Status::InvalidArgument(options.table_path + ": dev_id " + std::to_string(id) +
                                     " (" + entry.name + ") is not in the XML");
    }
  }
  {
    std::set<std::string> names;
    for (const DeviceRecord& r : batch.put_devices) {
      if (!names.insert(r.name).second) {
        return Status::InvalidArgument("two devices would be named '" + r.name +
                                       "' (give names in a --table)");
      }
    }
  }
  for (uint64_t b = 0; b < refs.size(); ++b) {
    if (refs[b] >= 2) {
      batch.refcounts.emplace_back(PoolBlock(b), refs[b]);
      stats->shared_blocks++;
    }
    if (refs[b] >= 1) stats->used_blocks++;
  }
  stats->devices = batch.put_devices.size();
  batch.superblock = Superblock();
  batch.superblock->next_device_id = next_id;
  return batch;
}

// Writes `batch` into the freshly formatted pool at `dir` and marks the
// mapped blocks in its bitmap.
Status Build(const std::string& dir, MetaBatch batch, const std::vector<uint32_t>& refs,
             uint64_t xml_transaction, const RestoreOptions& options) {
  const PoolPaths paths = PoolPaths::For(dir);
  const uint64_t next_id = batch.superblock->next_device_id;

  RocksDbOptions store_options;
  store_options.one_shot = true;
  THINFS_ASSIGN_OR_RETURN(std::unique_ptr<RocksDbStore> store,
                          RocksDbStore::Open(paths.meta, store_options));
  THINFS_ASSIGN_OR_RETURN(Superblock sb, store->ReadSuperblock());
  sb.next_device_id = next_id;
  sb.transaction_id = std::max<uint64_t>(sb.transaction_id + 1, xml_transaction);
  batch.superblock = sb;
  if (options.progress) options.progress("committing the metadata", 0, 0);
  THINFS_RETURN_IF_ERROR(store->Commit(batch, /*sync=*/true));
  store.reset();

  THINFS_ASSIGN_OR_RETURN(std::unique_ptr<BitmapSpaceMap> bitmap,
                          BitmapSpaceMap::Open(paths.bitmap, sb.data_blocks, sb.block_size,
                                               /*read_only=*/false));
  THINFS_RETURN_IF_ERROR(bitmap->MarkDirty());
  for (uint64_t b = 0; b < refs.size(); ++b) {
    if (refs[b] >= 1) bitmap->MarkUsed(PoolBlock(b));
  }
  THINFS_RETURN_IF_ERROR(bitmap->Sync(sb.transaction_id));
  return bitmap->MarkClean(sb.transaction_id);
}

Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + dir);
  Status s = ::fsync(fd) == 0 ? Status::Ok() : Status::FromErrno(errno, "fsync " + dir);
  ::close(fd);
  return s;
}

}  // namespace

Result<RestoreStats> RestorePool(const std::string& root, const RestoreOptions& options) {
  const PoolPaths paths = PoolPaths::For(root);
  if (paths.root.empty()) return Status::InvalidArgument("empty pool path");

  // 1. The target: absent, or an empty directory (rename(2) replaces it).
  struct stat st;
  if (::stat(paths.root.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return Status::Exists(paths.root + " exists and is not a directory");
    }
    std::error_code ec;
    if (!stdfs::is_empty(paths.root, ec) || ec) {
      return Status::Exists(paths.root + (LooksLikePool(paths.root) ? " is already a thinfs pool"
                                                                     : " is not empty") +
                            "; restore only creates new pools");
    }
  } else if (errno != ENOENT) {
    return Status::FromErrno(errno, "stat " + paths.root);
  }

  // 2. The inputs, all validated before anything is written.
  THINFS_ASSIGN_OR_RETURN(uint64_t data_bytes, DataAreaBytes(options.data_path));
  std::map<uint64_t, TableEntry> table;
  if (!options.table_path.empty()) {
    THINFS_ASSIGN_OR_RETURN(table, ReadTable(options.table_path));
  }
  Collector c(data_bytes, options.data_path);
  {
    std::FILE* in = std::fopen(options.xml_path.c_str(), "rb");
    if (in == nullptr) return Status::FromErrno(errno, "open " + options.xml_path);
    uint64_t total = 0;
    if (::fstat(::fileno(in), &st) == 0 && S_ISREG(st.st_mode)) {
      total = static_cast<uint64_t>(st.st_size);
    }
    Status s = ParseThinXml(in, &c, [&](uint64_t bytes) {
      if (options.progress) options.progress("reading the XML", bytes, total);
    });
    std::fclose(in);
    if (!s.ok()) return s.WithContext(options.xml_path);
  }

  RestoreStats stats;
  stats.block_size = c.block_size();
  stats.data_blocks = c.superblock().nr_data_blocks;
  THINFS_ASSIGN_OR_RETURN(MetaBatch batch, Plan(c, table, options, &stats));

  // 3. Build next to the target, then rename into place.
  const stdfs::path target(paths.root);
  const std::string parent =
      target.has_parent_path() ? target.parent_path().string() : std::string(".");
  std::string tmpl = parent + "/." + target.filename().string() + ".restore-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return Status::FromErrno(errno, "mkdtemp " + tmpl);
  TempDir temp{tmpl};
  FormatOptions format;
  format.block_size = c.block_size();
  format.size = c.superblock().nr_data_blocks * c.block_size();
  format.data_path = options.data_path;
  THINFS_RETURN_IF_ERROR(FormatPool(tmpl, format));
  THINFS_RETURN_IF_ERROR(
      Build(tmpl, std::move(batch), c.refs(), c.superblock().transaction, options));
  if (::rename(tmpl.c_str(), paths.root.c_str()) != 0) {
    return Status::FromErrno(errno, "rename " + tmpl + " to " + paths.root);
  }
  temp.path.clear();
  THINFS_RETURN_IF_ERROR(FsyncDir(parent));
  return stats;
}

}  // namespace thinfs::meta
