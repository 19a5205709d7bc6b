#include "core/admin.h"

#include <time.h>

#include <cstdio>
#include <limits>
#include <unordered_map>

#include "core/json.h"
#include "core/size.h"
#include "core/usage_scan.h"

namespace thinfs {

namespace {

// The largest device: file offsets are off_t.
constexpr uint64_t kMaxDeviceSize = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

int ExitCodeOf(const Status& s) {
  return (s.IsInvalidArgument() || s.code() == Status::Code::kNameTooLong) ? kAdminUsage
                                                                           : kAdminFailure;
}

AdminReply FromStatus(const Status& s) { return AdminReply::Error(ExitCodeOf(s), s.message()); }

// The arguments each command takes; anything else is a usage error, so a
// typo in a hand-written request never passes silently.
struct CommandSpec {
  const char* name;
  std::vector<const char*> required;
};
const std::vector<CommandSpec>& Specs() {
  static const std::vector<CommandSpec> kSpecs = {
      {"create", {"name", "size"}}, {"snapshot", {"source", "name"}},
      {"delete", {"name"}},         {"resize", {"name", "size"}},
      {"rename", {"from", "to"}},   {"list", {}},
      {"status", {}},               {"mountpoint", {}},
      {"checkpoint", {"dir"}},      {"grow", {"size"}},
  };
  return kSpecs;
}

// Whether the request asks for a JSON reply (CheckArgs allows "0" or "1").
bool JsonAsked(const AdminRequest& req) {
  const std::string* json = req.Find("json");
  return json != nullptr && *json == "1";
}

// Checks the request against its spec; the error reply, or nullopt.
std::optional<AdminReply> CheckArgs(const AdminRequest& req, const CommandSpec& spec) {
  for (const auto& [key, value] : req.args) {
    bool known = key == "json";
    for (const char* r : spec.required) known = known || key == r;
    if (!known) {
      return AdminReply::Error(kAdminUsage,
                               "command '" + req.command + "' takes no argument '" + key + "'");
    }
    size_t n = 0;
    for (const auto& other : req.args) n += other.first == key;
    if (n != 1) return AdminReply::Error(kAdminUsage, "argument '" + key + "' given twice");
  }
  for (const char* r : spec.required) {
    if (req.Find(r) == nullptr) {
      return AdminReply::Error(kAdminUsage,
                               "command '" + req.command + "' needs argument '" + r + "'");
    }
  }
  const std::string* json = req.Find("json");
  if (json != nullptr && *json != "0" && *json != "1") {
    return AdminReply::Error(kAdminUsage, "json must be 0 or 1, not '" + *json + "'");
  }
  return std::nullopt;
}

Result<uint64_t> ParseDeviceSize(const std::string& text) {
  Result<uint64_t> size = ParseSize(text);
  if (!size.ok()) return size.status();
  if (*size > kMaxDeviceSize) {
    return Status::InvalidArgument("size " + text + " is larger than the largest device (" +
                                   FormatSize(kMaxDeviceSize) + ")");
  }
  return *size;
}

void DeviceJson(const DeviceInfo& d, const DeviceUsage& u, JsonWriter* j) {
  j->BeginObject()
      .Key("name").String(d.name)
      .Key("id").Uint(d.id.value)
      .Key("size").Uint(d.size)
      .Key("mapped_blocks").Uint(u.mapped_blocks)
      .Key("exclusive_blocks").Uint(u.exclusive_blocks)
      .Key("shared_blocks").Uint(u.shared_blocks)
      .Key("parent");
  if (d.parent_name.empty()) {
    j->Null();
  } else {
    j->String(d.parent_name);
  }
  j->Key("created").String(FormatUtcTime(d.created_ns));
  j->EndObject();
}

// How a device's usage is found for a reply.
enum class UsageOf {
  kScan,      // ComputeUsage: reads the device's block map
  kNew,       // a new empty device: nothing mapped
  kSnapshot,  // a new snapshot: everything it maps, its origin maps too
  kNotShown,  // a text reply, which shows no usage: no JSON, nothing read
};

// The device `name` with its usage, as the reply to a change. Creating a
// device or a snapshot stays O(1): their usage is known without a scan.
// Resizing or renaming one scans its block map (O(mapped blocks)) only when
// the reply is JSON: the text reply names the change, not the usage.
AdminReply DeviceReply(Pool& pool, const std::string& name, const std::string& text,
                       UsageOf how) {
  Result<DeviceInfo> info = pool.GetDevice(name);
  if (!info.ok()) return FromStatus(info.status());
  if (how == UsageOf::kNotShown) {
    AdminReply reply;
    reply.text = text;
    return reply;
  }
  DeviceUsage usage;
  if (how == UsageOf::kSnapshot) {
    usage.mapped_blocks = info->mapped_blocks;
    usage.shared_blocks = info->mapped_blocks;
  } else if (how == UsageOf::kScan) {
    Result<DeviceUsage> scanned = pool.ComputeUsage(info->id);
    if (!scanned.ok()) return FromStatus(scanned.status());
    usage = *scanned;
  }
  JsonWriter j;
  DeviceJson(*info, usage, &j);
  AdminReply reply;
  reply.text = text;
  reply.json = j.str();
  return reply;
}

AdminReply ListDevices(Pool& pool) {
  std::vector<DeviceInfo> devices = pool.ListDevices();
  JsonWriter j;
  j.BeginArray();
  std::string text;
  char line[512];
  std::snprintf(line, sizeof line, "%-24s %12s %10s %10s %10s %-24s %s\n", "NAME", "SIZE",
                "MAPPED", "EXCLUSIVE", "SHARED", "PARENT", "CREATED");
  text += line;
  // One scan of the committed map for every device (core/usage_scan.h);
  // a device the scan missed (created meanwhile) is computed alone.
  std::unordered_map<uint64_t, DeviceUsage> scanned;
  Status committed = pool.Commit();
  if (committed.ok() || committed.code() == Status::Code::kReadOnly) {
    Status scan = ScanUsage(pool.store(), pool.geometry().block_size(), &scanned);
    if (!scan.ok()) return FromStatus(scan);
  }
  for (const DeviceInfo& d : devices) {
    auto hit = scanned.find(d.id.value);
    Result<DeviceUsage> u =
        hit != scanned.end() ? Result<DeviceUsage>(hit->second) : pool.ComputeUsage(d.id);
    // A device deleted while listing is simply not listed.
    if (u.status().IsNotFound()) continue;
    if (!u.ok()) return FromStatus(u.status());
    DeviceJson(d, *u, &j);
    std::snprintf(line, sizeof line, "%-24s %12s %10llu %10llu %10llu %-24s %s\n",
                  d.name.c_str(), FormatSize(d.size).c_str(),
                  static_cast<unsigned long long>(u->mapped_blocks),
                  static_cast<unsigned long long>(u->exclusive_blocks),
                  static_cast<unsigned long long>(u->shared_blocks),
                  d.parent_name.empty() ? "-" : d.parent_name.c_str(),
                  FormatUtcTime(d.created_ns).c_str());
    text += line;
  }
  j.EndArray();
  AdminReply reply;
  reply.text = text;
  reply.json = j.str();
  return reply;
}

AdminReply PoolStatus(Pool& pool, const AdminContext& ctx) {
  PoolStats st = pool.Stats();
  Result<Superblock> sb = pool.store()->ReadSuperblock();
  if (!sb.ok()) return FromStatus(sb.status());
  PoolStatusReport r;
  r.pool = ctx.pool_root;
  r.uuid = FormatUuidBytes(sb->uuid);
  r.created_ns = sb->created_ns;
  r.data_path = ctx.data_path;
  r.block_size = st.block_size;
  r.data_blocks = st.data_blocks;
  r.used_blocks = st.used_blocks;
  r.free_blocks = st.free_blocks;
  r.devices = pool.ListDevices().size();
  r.transaction_id = st.transaction_id;
  // The engine holds the bitmap open (marked in use) while it runs.
  r.bitmap_clean = false;
  r.mountpoint = ctx.mountpoint;
  r.low_water_blocks = st.low_water_blocks;
  r.below_low_water = st.below_low_water;
  r.counters = st;
  if (ctx.fuse_transport) r.fuse = ctx.fuse_transport();
  AdminReply reply;
  reply.text = FormatStatusText(r);
  reply.json = FormatStatusJson(r);
  return reply;
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "0%";
  auto hundredths =
      static_cast<uint64_t>(static_cast<unsigned __int128>(part) * 10000 / whole);
  std::string frac = std::to_string(hundredths % 100);
  if (frac.size() < 2) frac = "0" + frac;
  return std::to_string(hundredths / 100) + "." + frac + "%";
}

AdminReply Dispatch(Pool& pool, const AdminRequest& req, const AdminContext& ctx) {
  const std::string& cmd = req.command;
  auto arg = [&](const char* key) -> const std::string& { return *req.Find(key); };
  const UsageOf changed_usage = JsonAsked(req) ? UsageOf::kScan : UsageOf::kNotShown;

  if (cmd == "list") return ListDevices(pool);
  if (cmd == "status") return PoolStatus(pool, ctx);
  if (cmd == "mountpoint") {
    if (ctx.mountpoint.empty()) return AdminReply::Error(kAdminFailure, "the pool is not mounted");
    AdminReply reply;
    reply.text = ctx.mountpoint + "\n";
    JsonWriter j;
    j.BeginObject().Key("mountpoint").String(ctx.mountpoint).EndObject();
    reply.json = j.str();
    return reply;
  }
  if (cmd == "checkpoint") {
    if (!ctx.checkpoint) return AdminReply::Error(kAdminFailure, "the pool is not mounted");
    const std::string& dir = arg("dir");
    if (dir.empty() || dir[0] != '/') {
      return AdminReply::Error(kAdminUsage, "checkpoint needs an absolute directory");
    }
    Status s = pool.Commit();
    if (s.ok()) s = ctx.checkpoint(dir);
    if (!s.ok()) return AdminReply::Error(kAdminFailure, "checkpoint: " + s.message());
    AdminReply reply;
    reply.text = dir + "\n";
    return reply;
  }
  if (cmd == "create") {
    const std::string& name = arg("name");
    Result<uint64_t> size = ParseDeviceSize(arg("size"));
    if (!size.ok()) return AdminReply::Error(kAdminUsage, "size: " + size.status().message());
    Result<VolumeId> id = pool.CreateDevice(name, *size, ctx.create_attrs);
    if (!id.ok()) return FromStatus(id.status());
    if (ctx.entry_changed) ctx.entry_changed(name);
    return DeviceReply(pool, name, "created device " + name + " (" + FormatSize(*size) + ")\n",
                       UsageOf::kNew);
  }
  if (cmd == "snapshot") {
    const std::string& source = arg("source");
    const std::string& name = arg("name");
    // The engine checks the name only after finding the source; a bad name
    // is a usage error whatever the source.
    Status valid = Pool::ValidateName(name);
    if (!valid.ok()) return FromStatus(valid);
    Result<VolumeId> id = pool.CreateSnapshot(source, name);
    if (!id.ok()) return FromStatus(id.status());
    if (ctx.entry_changed) ctx.entry_changed(name);
    return DeviceReply(pool, name, "created snapshot " + name + " of " + source + "\n",
                       UsageOf::kSnapshot);
  }
  if (cmd == "delete") {
    const std::string& name = arg("name");
    Result<DeviceInfo> info = pool.GetDevice(name);
    if (!info.ok()) return FromStatus(info.status());
    Status s = ctx.delete_device ? ctx.delete_device(name) : pool.DeleteDevice(name);
    if (!s.ok()) return FromStatus(s);
    if (ctx.entry_changed) ctx.entry_changed(name);
    AdminReply reply;
    reply.text = "deleted device " + name + "\n";
    JsonWriter j;
    j.BeginObject().Key("name").String(name).Key("deleted").Bool(true).EndObject();
    reply.json = j.str();
    return reply;
  }
  if (cmd == "grow") {
    Result<uint64_t> size = ParseSize(arg("size"));
    if (!size.ok()) return AdminReply::Error(kAdminUsage, "size: " + size.status().message());
    const PoolStats before = pool.Stats();
    const uint64_t blocks = *size / before.block_size;
    if (blocks < before.data_blocks) {
      return AdminReply::Error(kAdminUsage,
                               "shrinking a pool is not supported: it holds " +
                                   FormatSize(before.data_blocks * before.block_size) +
                                   ", asked for " + FormatSize(blocks * before.block_size));
    }
    Status s = pool.Grow(blocks);
    if (!s.ok()) return FromStatus(s);
    const PoolStats after = pool.Stats();
    AdminReply reply;
    reply.text = "grew pool from " + FormatSize(before.data_blocks * before.block_size) + " to " +
                 FormatSize(after.data_blocks * after.block_size) + " (" +
                 std::to_string(after.data_blocks) + " blocks, " +
                 std::to_string(after.free_blocks) + " free)\n";
    JsonWriter j;
    j.BeginObject()
        .Key("old_data_blocks").Uint(before.data_blocks)
        .Key("data_blocks").Uint(after.data_blocks)
        .Key("data_bytes").Uint(after.data_blocks * after.block_size)
        .Key("free_blocks").Uint(after.free_blocks)
        .EndObject();
    reply.json = j.str();
    return reply;
  }
  if (cmd == "resize") {
    const std::string& name = arg("name");
    Result<uint64_t> size = ParseDeviceSize(arg("size"));
    if (!size.ok()) return AdminReply::Error(kAdminUsage, "size: " + size.status().message());
    Result<DeviceInfo> info = pool.GetDevice(name);
    if (!info.ok()) return FromStatus(info.status());
    Status s = ctx.resize_device ? ctx.resize_device(info->id, *size)
                                 : pool.ResizeDevice(info->id, *size);
    if (!s.ok()) return FromStatus(s);
    if (ctx.inode_changed) ctx.inode_changed(info->id);
    return DeviceReply(pool, name, "resized device " + name + " to " + FormatSize(*size) + "\n",
                       changed_usage);
  }
  if (cmd == "rename") {
    const std::string& from = arg("from");
    const std::string& to = arg("to");
    Status valid = Pool::ValidateName(to);
    if (!valid.ok()) return FromStatus(valid);
    Status s = pool.RenameDevice(from, to, /*replace=*/false);
    if (!s.ok()) return FromStatus(s);
    if (ctx.entry_changed) {
      ctx.entry_changed(from);
      ctx.entry_changed(to);
    }
    return DeviceReply(pool, to, "renamed device " + from + " to " + to + "\n", changed_usage);
  }
  return AdminReply::Error(kAdminUsage, "unknown command '" + cmd + "'");
}

}  // namespace

AdminReply RunAdmin(Pool& pool, const AdminRequest& request, const AdminContext& context) {
  const CommandSpec* spec = nullptr;
  for (const CommandSpec& s : Specs()) {
    if (request.command == s.name) spec = &s;
  }
  if (spec == nullptr) {
    return AdminReply::Error(kAdminUsage, "unknown command '" + request.command + "'");
  }
  if (std::optional<AdminReply> bad = CheckArgs(request, *spec)) return *bad;
  AdminReply reply;
  try {
    reply = Dispatch(pool, request, context);
  } catch (const std::bad_alloc&) {
    return AdminReply::Error(kAdminFailure, "out of memory");
  }
  if (reply.exit_code == kAdminOk && JsonAsked(request)) reply.text.clear();
  return reply;
}

// --- Status report ---------------------------------------------------------

std::string FormatUtcTime(int64_t ns) {
  time_t secs = static_cast<time_t>(ns / 1000000000);
  struct tm tm {};
  if (::gmtime_r(&secs, &tm) == nullptr) return std::to_string(ns) + " ns";
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string FormatUuidBytes(const uint8_t (&uuid)[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[uuid[i] >> 4]);
    out.push_back(kHex[uuid[i] & 0xf]);
  }
  return out;
}

std::string FormatStatusText(const PoolStatusReport& r) {
  const uint64_t data_bytes = r.data_blocks * r.block_size;
  std::string bitmap;
  if (!r.mountpoint.empty()) {
    bitmap = "in use by the mount daemon";
  } else {
    bitmap = r.bitmap_clean ? "clean" : "not closed cleanly (may over-report used blocks)";
  }
  std::string out;
  auto line = [&out](const char* label, const std::string& value) {
    std::string l = label;
    l.resize(17, ' ');
    out += l + value + "\n";
  };
  line("pool:", r.pool);
  line("uuid:", r.uuid);
  line("created:", FormatUtcTime(r.created_ns));
  line("data:", r.data_path);
  line("block size:", FormatSize(r.block_size));
  line("data size:", FormatSize(data_bytes) + " (" + std::to_string(r.data_blocks) + " blocks)");
  line("used:", std::to_string(r.used_blocks) + " blocks (" +
                    FormatSize(r.used_blocks * r.block_size) + ", " +
                    Percent(r.used_blocks, r.data_blocks) + ")");
  line("free:", std::to_string(r.free_blocks) + " blocks (" +
                    FormatSize(r.free_blocks * r.block_size) + ")");
  line("devices:", std::to_string(r.devices));
  line("transaction id:", std::to_string(r.transaction_id));
  line("bitmap:", bitmap);
  if (r.low_water_blocks == 0) {
    line("low water:", "off");
  } else {
    line("low water:", std::to_string(r.low_water_blocks) + " blocks (" +
                           FormatSize(r.low_water_blocks * r.block_size) + "), free space " +
                           (r.below_low_water ? "BELOW the mark" : "above the mark"));
  }
  if (!r.mountpoint.empty()) line("mounted on:", r.mountpoint);
  if (r.fuse) {
    const FuseTransportInfo& f = *r.fuse;
    line("fuse requests:",
         f.io_uring ? "io_uring, " + std::to_string(f.queues) + " CPU queues x " +
                          std::to_string(f.threads_per_queue) + " ring threads (" +
                          std::to_string(f.ring_requests) + " requests through the rings)" +
                          (f.ring_entries_registered < f.ring_entries
                               ? "; only " + std::to_string(f.ring_entries_registered) + " of " +
                                     std::to_string(f.ring_entries) + " ring entries registered"
                               : "")
                    : "/dev/fuse");
    if (f.cpu_latency) {
      char held[64];
      std::snprintf(held, sizeof held, "set %llu times, %.1f s in all",
                    static_cast<unsigned long long>(f.cpu_latency->times_set),
                    static_cast<double>(f.cpu_latency->ms_held) / 1000);
      line("cpu latency:", std::to_string(f.cpu_latency->usec) +
                               " µs while requests arrive, " +
                               (f.cpu_latency->held ? "held now (" : "not held now (") + held + ")");
    } else {
      line("cpu latency:", "not held (mount option cpu_latency=off)");
    }
  }
  if (r.counters) {
    const PoolStats& c = *r.counters;
    line("since mount:", "reads " + std::to_string(c.reads) + ", writes " +
                             std::to_string(c.writes) + ", provisions " +
                             std::to_string(c.provisions) + ", cow copies " +
                             std::to_string(c.cow_copies) + " (" +
                             std::to_string(c.deferred_copies) + " deferred to a commit), discards " +
                             std::to_string(c.discards) + ", commits " +
                             std::to_string(c.commits) + " (" + std::to_string(c.data_syncs) +
                             " with a data sync)");
    line("commit latency:", "p50 " + std::to_string(c.commit_p50_us) + " us, p90 " +
                                std::to_string(c.commit_p90_us) + " us, p99 " +
                                std::to_string(c.commit_p99_us) + " us, max " +
                                std::to_string(c.commit_max_us) + " us");
    line("gc backlog:", std::to_string(c.gc_backlog));
  }
  return out;
}

std::string FormatStatusJson(const PoolStatusReport& r) {
  JsonWriter j;
  j.BeginObject()
      .Key("pool").String(r.pool)
      .Key("uuid").String(r.uuid)
      .Key("created").String(FormatUtcTime(r.created_ns))
      .Key("created_ns").Int(r.created_ns)
      .Key("data_path").String(r.data_path)
      .Key("data_bytes").Uint(r.data_blocks * r.block_size)
      .Key("block_size").Uint(r.block_size)
      .Key("data_blocks").Uint(r.data_blocks)
      .Key("used_blocks").Uint(r.used_blocks)
      .Key("free_blocks").Uint(r.free_blocks)
      .Key("devices").Uint(r.devices)
      .Key("transaction_id").Uint(r.transaction_id)
      .Key("bitmap_clean").Bool(r.bitmap_clean)
      .Key("low_water_blocks").Uint(r.low_water_blocks)
      .Key("below_low_water").Bool(r.below_low_water)
      .Key("mounted").Bool(!r.mountpoint.empty())
      .Key("mountpoint");
  if (r.mountpoint.empty()) {
    j.Null();
  } else {
    j.String(r.mountpoint);
  }
  j.Key("fuse_transport");
  if (!r.fuse) {
    j.Null();
  } else {
    j.BeginObject()
        .Key("kind").String(r.fuse->io_uring ? "io_uring" : "dev_fuse")
        .Key("queues").Uint(r.fuse->queues)
        .Key("ring_threads_per_queue").Uint(r.fuse->threads_per_queue)
        .Key("ring_requests").Uint(r.fuse->ring_requests)
        .Key("ring_entries").Uint(r.fuse->ring_entries)
        .Key("ring_entries_registered").Uint(r.fuse->ring_entries_registered)
        .Key("cpu_latency");
    if (!r.fuse->cpu_latency) {
      j.Null();
    } else {
      const CpuLatencyInfo& c = *r.fuse->cpu_latency;
      j.BeginObject()
          .Key("usec").Uint(c.usec)
          .Key("held").Bool(c.held)
          .Key("times_set").Uint(c.times_set)
          .Key("ms_held").Uint(c.ms_held)
          .EndObject();
    }
    j.EndObject();
  }
  if (r.counters) {
    const PoolStats& c = *r.counters;
    j.Key("counters")
        .BeginObject()
        .Key("reads").Uint(c.reads)
        .Key("writes").Uint(c.writes)
        .Key("provisions").Uint(c.provisions)
        .Key("cow_copies").Uint(c.cow_copies)
        .Key("deferred_copies").Uint(c.deferred_copies)
        .Key("discards").Uint(c.discards)
        .Key("commits").Uint(c.commits)
        .Key("data_syncs").Uint(c.data_syncs)
        .Key("gc_backlog").Uint(c.gc_backlog)
        .Key("commit_p50_us").Uint(c.commit_p50_us)
        .Key("commit_p90_us").Uint(c.commit_p90_us)
        .Key("commit_p99_us").Uint(c.commit_p99_us)
        .Key("commit_max_us").Uint(c.commit_max_us)
        .EndObject();
  }
  j.EndObject();
  return j.str();
}

}  // namespace thinfs
