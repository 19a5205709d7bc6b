#include "meta/pool_dump.h"

#include <cerrno>
#include <cinttypes>
#include <vector>

#include "core/json.h"
#include "core/mapping_walk.h"
#include "meta/pool_dir.h"
#include "meta/thin_xml.h"

namespace thinfs::meta {

namespace {

constexpr uint64_t kSectorSize = 512;

// Which data blocks two or more dumped devices map: two bits per block,
// "seen" and "seen again".
class ShareMap {
 public:
  explicit ShareMap(uint64_t blocks) : once_((blocks + 63) / 64), twice_((blocks + 63) / 64) {}
  // Returns true when the block was seen before.
  bool Add(uint64_t b) {
    uint64_t& w = once_[b / 64];
    const uint64_t bit = uint64_t{1} << (b % 64);
    if ((w & bit) == 0) {
      w |= bit;
      return false;
    }
    twice_[b / 64] |= bit;
    return true;
  }
  bool Shared(uint64_t b) const { return (twice_[b / 64] >> (b % 64)) & 1; }

 private:
  std::vector<uint64_t> once_;
  std::vector<uint64_t> twice_;
};

}  // namespace

Result<DumpStats> DumpPool(MetadataStore* store, std::FILE* out, const std::string& what,
                           const DumpOptions& options) {
  THINFS_ASSIGN_OR_RETURN(MappingWalk walk, MappingWalk::Open(store));
  const Superblock& sb = walk.superblock();
  const std::vector<const DeviceRecord*> devices = walk.VisibleDevices();
  // Progress in mapped blocks: counted in pass 1 (total unknown), then
  // written out of the known total.
  constexpr uint64_t kProgressEvery = 4096;
  uint64_t walked = 0;
  auto tick = [&](const char* phase, uint64_t total) {
    if (options.progress && ++walked % kProgressEvery == 0) options.progress(phase, walked, total);
  };

  // Pass 1: count each device's blocks and find the shared data blocks.
  DumpStats stats;
  stats.devices = devices.size();
  ShareMap shares(sb.data_blocks);
  std::vector<uint64_t> mapped(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    THINFS_RETURN_IF_ERROR(walk.ForEach(devices[i]->id, [&](const ResolvedMapping& m) {
      if (m.block.value >= sb.data_blocks) {
        return Status::Corruption("device " + std::to_string(devices[i]->id.value) +
                                  " block " + std::to_string(m.vblock.value) +
                                  " maps data block " + std::to_string(m.block.value) +
                                  ", outside the data area of " +
                                  std::to_string(sb.data_blocks) + " blocks (run thinfs check)");
      }
      if (shares.Add(m.block.value)) ++stats.shared_blocks;
      ++mapped[i];
      tick("scanning mappings", 0);
      return Status::Ok();
    }));
    stats.mapped_blocks += mapped[i];
  }
  auto time_of = [&](const ResolvedMapping& m) -> uint64_t {
    return shares.Shared(m.block.value) ? 0 : 1;
  };

  // Pass 2: write.
  walked = 0;
  if (options.format == DumpFormat::kXml) {
    ThinXmlWriter w(out);
    ThinSuperblock tsb;
    tsb.uuid = FormatUuid(sb.uuid);
    tsb.time = 1;
    tsb.transaction = sb.transaction_id;
    tsb.data_block_size = sb.block_size / kSectorSize;
    tsb.nr_data_blocks = sb.data_blocks;
    w.BeginSuperblock(tsb);
    for (size_t i = 0; i < devices.size(); ++i) {
      ThinDevice td;
      td.dev_id = devices[i]->id.value;
      td.mapped_blocks = mapped[i];
      td.snap_time = 1;
      w.BeginDevice(td);
      THINFS_RETURN_IF_ERROR(walk.ForEach(devices[i]->id, [&](const ResolvedMapping& m) {
        w.Map(m.vblock.value, m.block.value, time_of(m));
        tick("writing mappings", stats.mapped_blocks);
        return Status::Ok();
      }));
      w.EndDevice();
    }
    w.EndSuperblock();
    THINFS_RETURN_IF_ERROR(w.Finish(what));
  } else {
    JsonWriter j;
    j.BeginObject()
        .Key("format").String("thinfs-dump")
        .Key("version").Uint(1)
        .Key("uuid").String(FormatUuid(sb.uuid))
        .Key("transaction").Uint(sb.transaction_id)
        .Key("block_size").Uint(sb.block_size)
        .Key("data_block_size").Uint(sb.block_size / kSectorSize)
        .Key("nr_data_blocks").Uint(sb.data_blocks)
        .Key("shared_blocks").Uint(stats.shared_blocks)
        .Key("devices").BeginArray();
    for (size_t i = 0; i < devices.size(); ++i) {
      const DeviceRecord& d = *devices[i];
      j.BeginObject()
          .Key("dev_id").Uint(d.id.value)
          .Key("name").String(d.name)
          .Key("size").Uint(d.size)
          .Key("mapped_blocks").Uint(mapped[i])
          .Key("epoch").Uint(d.epoch)
          .Key("parent");
      if (d.has_parent) {
        j.Uint(d.parent.value);
      } else {
        j.Null();
      }
      j.Key("mode").Uint(d.mode).Key("uid").Uint(d.uid).Key("gid").Uint(d.gid);
      j.Key("mappings").BeginArray();
      // Runs as in the XML: origin_begin, data_begin, length, time.
      bool open = false;
      ThinRange r;
      auto flush = [&] {
        if (!open) return;
        j.BeginObject()
            .Key("origin_begin").Uint(r.origin_begin)
            .Key("data_begin").Uint(r.data_begin)
            .Key("length").Uint(r.length)
            .Key("time").Uint(r.time)
            .EndObject();
      };
      THINFS_RETURN_IF_ERROR(walk.ForEach(d.id, [&](const ResolvedMapping& m) {
        const uint64_t t = time_of(m);
        tick("writing mappings", stats.mapped_blocks);
        if (open && m.vblock.value == r.origin_begin + r.length &&
            m.block.value == r.data_begin + r.length && t == r.time) {
          r.length++;
        } else {
          flush();
          r = ThinRange{m.vblock.value, m.block.value, 1, t};
          open = true;
        }
        return Status::Ok();
      }));
      flush();
      j.EndArray().EndObject();
    }
    j.EndArray().EndObject();
    const std::string& s = j.str();
    if (std::fwrite(s.data(), 1, s.size(), out) != s.size() || std::fputc('\n', out) == EOF ||
        std::fflush(out) != 0) {
      return Status::FromErrno(errno != 0 ? errno : EIO, "write " + what);
    }
  }

  if (options.table != nullptr) {
    std::fputs(kDeviceTableHeader, options.table);
    for (const DeviceRecord* d : devices) {
      std::fprintf(options.table, "%" PRIu64 "\t%" PRIu64 "\t%s\n", d->id.value, d->size,
                   d->name.c_str());
    }
    if (std::fflush(options.table) != 0 || std::ferror(options.table)) {
      return Status::FromErrno(errno != 0 ? errno : EIO, "write the device table");
    }
  }
  return stats;
}

}  // namespace thinfs::meta
