// Pool commands: format, status.
//
// status of a mounted pool asks the daemon (tools/control_client.h); both
// paths print the report of core/admin.h.

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "core/admin.h"
#include "core/size.h"
#include "meta/pool_dir.h"
#include "tools/cli.h"
#include "tools/control_client.h"
#include "tools/json.h"
#include "tools/pool_here.h"

namespace thinfs::tools {

namespace {


}  // namespace

int RunFormat(const std::vector<std::string>& args) {
  CommandLine cl("format", "POOL --size SIZE [--block-size SIZE] [--data PATH] [--force] [--json]",
                 "Creates a pool in the directory POOL (created if missing): a data area,\n"
                 "the metadata store POOL/meta/ and the allocation bitmap POOL/bitmap.\n"
                 "Without --data the data area is the sparse file POOL/data, which takes\n"
                 "no space until blocks are written.");
  cl.Positional("POOL", "pool directory");
  cl.AddOptions()
      ("size", po::value<std::string>()->value_name("SIZE"),
       "data area size (required), rounded down to whole blocks; binary suffixes "
       "K M G T P (or KiB...), e.g. 10G")
      ("block-size", po::value<std::string>()->value_name("SIZE")->default_value("64K"),
       "block size: a multiple of 4K from 4K to 1G (powers of two are fastest)")
      ("data", po::value<std::string>()->value_name("PATH"),
       "use this existing block device or regular file as the data area "
       "(POOL/data becomes a symlink to it); it must hold SIZE bytes")
      ("force", po::bool_switch(),
       "reformat an existing pool (its data is lost), or format into a non-empty "
       "directory; a pool in use is never reformatted")
      ("json", po::bool_switch(), "print the summary as JSON");
  cl.SetEpilog(
      "Example:\n"
      "  thinfs format /srv/pool --size 1T --block-size 64K\n"
      "  thinfs format /srv/pool --size 100G --data /dev/vg0/thindata\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  if (!cl.Has("size")) {
    return cl.Fail(kExitUsage, "--size is required (see 'thinfs format --help')");
  }

  meta::FormatOptions options;
  std::optional<uint64_t> size = cl.SizeOption("size");
  if (!size) return kExitUsage;
  std::optional<uint64_t> block_size = cl.SizeOption("block-size");
  if (!block_size) return kExitUsage;
  options.size = *size;
  options.block_size = *block_size;
  if (cl.Has("data")) options.data_path = cl.Get<std::string>("data");
  options.force = cl.Get<bool>("force");

  const std::string& pool = cl.Arg(0);
  Status s = meta::FormatPool(pool, options);
  if (!s.ok()) return cl.Fail(s);

  // Reopening shows what was really written, and proves it opens.
  Result<meta::PoolFiles> files = OpenPoolFilesHere(pool, /*read_only=*/true);
  if (!files.ok()) return cl.Fail(kExitFailure, "formatted, but reopening failed: " +
                                                    files.status().message());
  const Superblock& sb = files->superblock;
  const uint64_t data_bytes = sb.data_blocks * sb.block_size;
  const std::string data_path = meta::DataPathOf(files->paths);
  const std::string uuid = meta::FormatUuid(sb.uuid);
  if (cl.Get<bool>("json")) {
    JsonWriter j;
    j.BeginObject()
        .Key("pool").String(files->paths.root)
        .Key("data_path").String(data_path)
        .Key("data_bytes").Uint(data_bytes)
        .Key("block_size").Uint(sb.block_size)
        .Key("data_blocks").Uint(sb.data_blocks)
        .Key("uuid").String(uuid)
        .EndObject();
    std::cout << j.str() << std::endl;
  } else {
    std::cout << "formatted pool " << files->paths.root << "\n"
              << "  data:        " << data_path << "\n"
              << "  data size:   " << FormatSize(data_bytes) << " (" << data_bytes
              << " bytes)\n"
              << "  block size:  " << FormatSize(sb.block_size) << "\n"
              << "  blocks:      " << sb.data_blocks << "\n"
              << "  uuid:        " << uuid << std::endl;
  }
  return kExitOk;
}

int RunStatus(const std::vector<std::string>& args) {
  CommandLine cl("status", "POOL [--json]",
                 "Shows a pool's geometry, space usage, device count and transaction id.\n"
                 "When the pool is mounted the daemon answers through its control socket\n"
                 "and adds its engine counters; otherwise the pool is opened read-only.");
  cl.Positional("POOL", "pool directory");
  cl.AddOptions()("json", po::bool_switch(), "print one JSON object");
  cl.SetEpilog(
      "JSON keys: pool, uuid, created, created_ns, data_path, data_bytes, block_size,\n"
      "data_blocks, used_blocks, free_blocks, devices, transaction_id, bitmap_clean,\n"
      "mounted, mountpoint (null when not mounted), fuse_transport (null when not\n"
      "mounted, else {kind: io_uring or dev_fuse, queues, ring_threads_per_queue,\n"
      "ring_requests, ring_entries, ring_entries_registered, cpu_latency: null\n"
      "when the mount option cpu_latency is off, else {usec, held, times_set,\n"
      "ms_held}}: how the kernel's requests reach the daemon) and, when\n"
      "mounted, counters:\n"
      "{reads, writes, provisions, cow_copies, deferred_copies, discards, commits,\n"
      "data_syncs, gc_backlog, commit_p50_us, commit_p90_us, commit_p99_us,\n"
      "commit_max_us}: the commit_* keys are the latency of the last 1024 commits\n"
      "that wrote something, owed copy-on-write copies included.\n\n"
      "Example:\n"
      "  thinfs status /srv/pool --json\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  const bool json = cl.Get<bool>("json");

  std::optional<Result<AdminReply>> remote =
      CallDaemon(cl.Arg(0), AdminRequest{"status", {{"json", json ? "1" : "0"}}});
  if (remote) {
    if (!remote->ok()) return cl.Fail(kExitFailure, remote->status().message());
    const AdminReply& r = **remote;
    if (r.exit_code != kAdminOk) return cl.Fail(kExitFailure, r.error);
    if (json) {
      std::cout << r.json << std::endl;
    } else {
      std::cout << r.text << std::flush;
    }
    return kExitOk;
  }

  Result<meta::PoolFiles> files = OpenPoolFilesHere(cl.Arg(0), /*read_only=*/true);
  if (!files.ok()) return cl.Fail(kExitFailure, files.status().message());
  Result<std::vector<DeviceRecord>> devices = files->store->LoadDevices();
  if (!devices.ok()) return cl.Fail(kExitFailure, "device table: " + devices.status().message());
  // Hidden, deleting and detached devices have no name in the mount.
  constexpr uint32_t kInvisible =
      DeviceRecord::kHidden | DeviceRecord::kDeleting | DeviceRecord::kDetached;
  uint64_t visible = 0;
  for (const DeviceRecord& d : *devices) {
    if ((d.flags & kInvisible) == 0) ++visible;
  }

  const Superblock& sb = files->superblock;
  PoolStatusReport report;
  report.pool = files->paths.root;
  report.uuid = meta::FormatUuid(sb.uuid);
  report.created_ns = sb.created_ns;
  report.data_path = meta::DataPathOf(files->paths);
  report.block_size = sb.block_size;
  report.data_blocks = sb.data_blocks;
  // A bitmap larger than the superblock (an interrupted grow, completed by
  // the next writable open) counts its extra blocks as free.
  report.used_blocks = std::min(files->bitmap->total_blocks() - files->bitmap->free_blocks(),
                                sb.data_blocks);
  report.free_blocks = sb.data_blocks - report.used_blocks;
  report.devices = visible;
  report.transaction_id = sb.transaction_id;
  report.bitmap_clean = files->bitmap->was_clean();
  if (json) {
    std::cout << FormatStatusJson(report) << std::endl;
  } else {
    std::cout << FormatStatusText(report) << std::flush;
  }
  return kExitOk;
}

}  // namespace thinfs::tools
