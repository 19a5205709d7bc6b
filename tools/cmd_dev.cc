// Device commands: create, snapshot, delete, resize, rename, list; and grow
// (of the pool), which travels the same way.
//
// Each builds an AdminRequest (core/admin_wire.h). When a mount daemon
// answers on POOL/control.sock the request goes there (the daemon owns the
// pool while mounted and updates the mount at once); otherwise the command
// opens the pool itself, runs the same RunAdmin() and closes it
// (tools/device_here.h). This file is in both binaries of the CLI: the
// front (tools/front.cc) serves these commands of a mounted pool without
// the engine linked in.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "core/admin_wire.h"
#include "core/device_name.h"
#include "core/mountinfo.h"
#include "tools/cli.h"
#include "tools/control_client.h"
#include "tools/device_here.h"

namespace thinfs::tools {

namespace {


int PrintReply(const CommandLine& cl, const AdminReply& reply, bool json) {
  if (reply.exit_code != kAdminOk) {
    return cl.Fail(reply.exit_code == kAdminUsage ? kExitUsage : kExitFailure,
                   reply.error.empty() ? "failed" : reply.error);
  }
  if (json) {
    std::cout << reply.json << std::endl;
  } else {
    std::cout << reply.text << std::flush;
  }
  return kExitOk;
}

// Through the daemon if one serves the pool, else without one
// (tools/device_here.h: here, or in the engine binary).
int Execute(const CommandLine& cl, const std::string& pool, AdminRequest request, bool json,
            bool read_only) {
  request.args.emplace_back("json", json ? "1" : "0");
  std::optional<Result<AdminReply>> remote = CallDaemon(pool, request);
  if (remote) {
    if (!remote->ok()) return cl.Fail(kExitFailure, remote->status().message());
    return PrintReply(cl, **remote, json);
  }
  return PrintReply(cl, RunWithoutDaemon(cl, pool, request, read_only), json);
}

// open + fsync + close of SOURCE in the mount: 0, or the errno of the
// step that failed (ENOENT when there is no such file, or SOURCE is not a
// valid name: nothing to flush).
int FlushInMount(const std::string& mountpoint, const std::string& source) {
  if (!ValidateDeviceName(source).ok()) return ENOENT;
  const std::string file = mountpoint + "/" + source;
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

const char* kSizeHelp =
    "size in bytes; binary suffixes K M G T P (or KiB...), e.g. 10G";

}  // namespace

int RunCreate(const std::vector<std::string>& args) {
  CommandLine cl("create", "POOL NAME --size SIZE [--json]",
                 "Creates an empty thin device NAME of SIZE bytes. Nothing is provisioned\n"
                 "until it is written. Works on a mounted pool too (through its control\n"
                 "socket); the new file shows in the mount at once.");
  cl.Positional("POOL", "pool directory");
  cl.Positional("NAME", "1-128 characters of [A-Za-z0-9._+-], not starting with '.'");
  cl.AddOptions()
      ("size", po::value<std::string>()->value_name("SIZE"), kSizeHelp)
      ("json", po::bool_switch(), "print the new device as JSON");
  cl.SetEpilog(
      "Example:\n"
      "  thinfs create /srv/pool vm1 --size 20G\n"
      "  thinfs create /srv/pool scratch --size 512M --json\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  if (!cl.Has("size")) return cl.Fail(kExitUsage, "--size is required (see 'thinfs create --help')");
  // Parsed here too so that a bad size is reported before the pool is opened.
  if (!cl.SizeOption("size")) return kExitUsage;
  AdminRequest req{"create", {{"name", cl.Arg(1)}, {"size", cl.Get<std::string>("size")}}};
  return Execute(cl, cl.Arg(0), std::move(req), cl.Get<bool>("json"), false);
}

int RunSnapshot(const std::vector<std::string>& args) {
  CommandLine cl("snapshot", "POOL SOURCE NAME [--json]",
                 "Creates NAME, a writable snapshot of device SOURCE, in constant time. The\n"
                 "two share every block until one of them writes it. The snapshot is\n"
                 "durable when the command returns (it commits the pool's metadata).\n\n"
                 "When the pool is mounted, SOURCE is first fsync()ed through the mount,\n"
                 "so the snapshot holds every write any process completed before the\n"
                 "command started (including what the kernel still cached). For a file\n"
                 "system inside the device, freeze it around the snapshot (fsfreeze -f,\n"
                 "snapshot, fsfreeze -u) to make the snapshot consistent at its level.");
  cl.Positional("POOL", "pool directory");
  cl.Positional("SOURCE", "device to snapshot");
  cl.Positional("NAME", "name of the new snapshot");
  cl.AddOptions()("json", po::bool_switch(), "print the new snapshot as JSON");
  cl.SetEpilog(
      "Example:\n"
      "  thinfs snapshot /srv/pool vm1 vm1-before-upgrade\n"
      "  fsfreeze -f /mnt/vm1fs && thinfs snapshot /srv/pool vm1 vm1-daily && fsfreeze -u /mnt/vm1fs\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  const std::string& pool = cl.Arg(0);
  const std::string& source = cl.Arg(1);
  const bool json = cl.Get<bool>("json");
  AdminRequest req{"snapshot", {{"source", source}, {"name", cl.Arg(2)}}};

  // Mounted: flush what the kernel may still hold for SOURCE (dirty pages of
  // a writeback-cached or mmapped file) through the mount first. This runs
  // here, not in the daemon: an fsync issued by the daemon into its own
  // mount would re-enter the FUSE server from inside a request. The mount
  // is looked up in the mount table (no round trip); when that finds none,
  // or a mount the origin cannot be opened in (a killed daemon's), the
  // daemon says where it is.
  std::optional<std::string> mountpoint = ThinfsMountOf(pool);
  int flush_errno = mountpoint ? FlushInMount(*mountpoint, source) : ENOENT;
  if (!mountpoint || (flush_errno != 0 && flush_errno != ENOENT)) {
    std::optional<Result<AdminReply>> where = CallDaemon(pool, AdminRequest{"mountpoint", {}});
    if (!where) return Execute(cl, pool, std::move(req), json, false);  // not mounted
    if (!where->ok()) return cl.Fail(kExitFailure, where->status().message());
    const AdminReply& r = **where;
    if (r.exit_code != kAdminOk) return PrintReply(cl, r, false);
    std::string asked = r.text;
    while (!asked.empty() && asked.back() == '\n') asked.pop_back();
    if (asked != mountpoint) {
      mountpoint = asked;
      flush_errno = FlushInMount(asked, source);
    }
  }
  // ENOENT: no such file to flush; the daemon reports a missing source.
  if (flush_errno != 0 && flush_errno != ENOENT) {
    return cl.Fail(kExitFailure, "cannot flush " + *mountpoint + "/" + source +
                                     " before the snapshot: " + std::strerror(flush_errno));
  }
  return Execute(cl, pool, std::move(req), json, false);
}

int RunDelete(const std::vector<std::string>& args) {
  CommandLine cl("delete", "POOL NAME [--json]",
                 "Deletes device NAME. Its blocks that no other device sees return to the\n"
                 "pool in the background; snapshots of it keep their data. On a mounted\n"
                 "pool a device that is still open keeps working until its last close,\n"
                 "as with unlink(2).");
  cl.Positional("POOL", "pool directory");
  cl.Positional("NAME", "device to delete");
  cl.AddOptions()("json", po::bool_switch(), "print {\"name\": NAME, \"deleted\": true}");
  cl.SetEpilog("Example:\n  thinfs delete /srv/pool vm1-before-upgrade\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  AdminRequest req{"delete", {{"name", cl.Arg(1)}}};
  return Execute(cl, cl.Arg(0), std::move(req), cl.Get<bool>("json"), false);
}

int RunResize(const std::vector<std::string>& args) {
  CommandLine cl("resize", "POOL NAME --size SIZE [--json]",
                 "Sets the size of device NAME. Growing provisions nothing; shrinking\n"
                 "unmaps what lies beyond the new end (snapshots keep their copy).");
  cl.Positional("POOL", "pool directory");
  cl.Positional("NAME", "device to resize");
  cl.AddOptions()
      ("size", po::value<std::string>()->value_name("SIZE"), kSizeHelp)
      ("json", po::bool_switch(),
       "print the resized device as JSON, with its usage (which reads its "
       "block map: seconds for a device of millions of mapped blocks)");
  cl.SetEpilog("Example:\n  thinfs resize /srv/pool vm1 --size 40G\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  if (!cl.Has("size")) return cl.Fail(kExitUsage, "--size is required (see 'thinfs resize --help')");
  if (!cl.SizeOption("size")) return kExitUsage;
  AdminRequest req{"resize", {{"name", cl.Arg(1)}, {"size", cl.Get<std::string>("size")}}};
  return Execute(cl, cl.Arg(0), std::move(req), cl.Get<bool>("json"), false);
}

int RunGrow(const std::vector<std::string>& args) {
  CommandLine cl("grow", "POOL --size SIZE [--json]",
                 "Grows the pool's data area to SIZE bytes (rounded down to whole blocks).\n"
                 "A pool's own sparse data file is extended; a block device or file given\n"
                 "to 'format --data' must already be at least SIZE (enlarge it first, e.g.\n"
                 "with lvextend or truncate). Shrinking is refused. Works mounted (through\n"
                 "the control socket: writes waiting for space resume, df shows the new\n"
                 "size) and unmounted.");
  cl.Positional("POOL", "pool directory");
  cl.AddOptions()
      ("size", po::value<std::string>()->value_name("SIZE"), kSizeHelp)
      ("json", po::bool_switch(), "print the new geometry as JSON");
  cl.SetEpilog("Example:\n  thinfs grow /srv/pool --size 200G\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  if (!cl.Has("size")) return cl.Fail(kExitUsage, "--size is required (see 'thinfs grow --help')");
  if (!cl.SizeOption("size")) return kExitUsage;
  AdminRequest req{"grow", {{"size", cl.Get<std::string>("size")}}};
  return Execute(cl, cl.Arg(0), std::move(req), cl.Get<bool>("json"), false);
}

int RunRename(const std::vector<std::string>& args) {
  CommandLine cl("rename", "POOL OLD NEW [--json]",
                 "Renames device OLD to NEW. NEW must not exist.");
  cl.Positional("POOL", "pool directory");
  cl.Positional("OLD", "current name");
  cl.Positional("NEW", "new name");
  cl.AddOptions()("json", po::bool_switch(),
                  "print the renamed device as JSON, with its usage (which reads its "
                  "block map: seconds for a device of millions of mapped blocks)");
  cl.SetEpilog("Example:\n  thinfs rename /srv/pool vm1-daily vm1-2024-05-01\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  AdminRequest req{"rename", {{"from", cl.Arg(1)}, {"to", cl.Arg(2)}}};
  return Execute(cl, cl.Arg(0), std::move(req), cl.Get<bool>("json"), false);
}

int RunList(const std::vector<std::string>& args) {
  CommandLine cl("list", "POOL [--json]",
                 "Lists the pool's devices with their size and block usage: MAPPED blocks\n"
                 "read from the data area, of which EXCLUSIVE are seen by this device only\n"
                 "(what deleting it would free) and SHARED by another device too.");
  cl.Positional("POOL", "pool directory");
  cl.AddOptions()("json", po::bool_switch(), "print a JSON array of objects");
  cl.SetEpilog(
      "JSON keys: name, id, size, mapped_blocks, exclusive_blocks, shared_blocks,\n"
      "parent (name, or null), created (ISO-8601 UTC).\n\n"
      "Example:\n"
      "  thinfs list /srv/pool\n"
      "  thinfs list /srv/pool --json | jq '.[] | select(.parent == \"vm1\")'\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  AdminRequest req{"list", {}};
  return Execute(cl, cl.Arg(0), std::move(req), cl.Get<bool>("json"), true);
}

}  // namespace thinfs::tools
