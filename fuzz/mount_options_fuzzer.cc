// libFuzzer target for the mount-option parser (fs/mount_options.cc): any
// -o string is parsed or rejected with kInvalidArgument; an accepted one
// gives options within their documented ranges (fs/mount.h).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fs/mount.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dash_o(reinterpret_cast<const char*>(data), size);
  thinfs::Result<thinfs::fs::MountOptions> o =
      thinfs::fs::ParseMountOptions("/var/tmp/pool", "/var/tmp/mnt", dash_o, false);
  if (!o.ok()) {
    if (!o.status().IsInvalidArgument()) std::abort();
    return 0;
  }
  if (o->pool != "/var/tmp/pool" || o->mountpoint != "/var/tmp/mnt") std::abort();
  if (o->low_water_bytes != 0 && o->low_water_percent != 0) std::abort();
  if (o->low_water_percent > 99) std::abort();
  if (!o->low_water_cmd.empty() && o->low_water_cmd[0] != '/') std::abort();
  constexpr int64_t kDayMs = int64_t{24} * 3600 * 1000;
  if (o->commit_interval.count() < 0 || o->commit_interval.count() > kDayMs) std::abort();
  if (o->no_space_timeout.count() < 0 || o->no_space_timeout.count() > kDayMs) std::abort();
  if (o->log_level != "error" && o->log_level != "warning" && o->log_level != "info" &&
      o->log_level != "debug") {
    std::abort();
  }
  return 0;
}
