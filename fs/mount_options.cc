// ParseMountOptions: the -o string of `thinfs mount`.

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fs/log.h"
#include "fs/mount.h"

namespace thinfs::fs {
namespace {

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// Parses the leading unsigned integer of `s`; `rest` gets the suffix.
bool ParseLeadingNumber(const std::string& s, uint64_t* value, std::string* rest) {
  if (s.empty() || s[0] < '0' || s[0] > '9') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(s.c_str(), &end, 10);
  if (errno != 0) return false;
  *value = v;
  *rest = end;
  return true;
}

// A thread count, 1-1024 (threads=, uring_threads=).
Result<unsigned> ParseThreadCount(const std::string& key, const std::string& value) {
  uint64_t n = 0;
  std::string rest;
  if (!ParseLeadingNumber(value, &n, &rest) || !rest.empty() || n < 1 || n > 1024) {
    return Status::InvalidArgument("option " + key + ": expected 1-1024, got '" + value + "'");
  }
  return static_cast<unsigned>(n);
}

Result<bool> ParseBool(const std::string& key, const std::string& value) {
  if (value == "on" || value == "yes" || value == "true" || value == "1") return true;
  if (value == "off" || value == "no" || value == "false" || value == "0") return false;
  return Status::InvalidArgument("option " + key + ": expected on or off, got '" + value + "'");
}

Result<std::chrono::milliseconds> ParseDuration(const std::string& key, const std::string& value) {
  uint64_t n = 0;
  std::string unit;
  if (!ParseLeadingNumber(value, &n, &unit)) {
    return Status::InvalidArgument("option " + key + ": expected a duration, got '" + value + "'");
  }
  uint64_t ms_per_unit = 0;
  if (unit.empty() || unit == "ms") {
    ms_per_unit = 1;
  } else if (unit == "s") {
    ms_per_unit = 1000;
  } else if (unit == "m" || unit == "min") {
    ms_per_unit = 60 * 1000;
  } else {
    return Status::InvalidArgument("option " + key + ": unknown unit '" + unit +
                                   "' (use ms, s or m)");
  }
  constexpr uint64_t kMaxMs = uint64_t{24} * 3600 * 1000;
  if (n > kMaxMs / ms_per_unit) {
    return Status::InvalidArgument("option " + key + ": " + value + " is longer than a day");
  }
  return std::chrono::milliseconds(n * ms_per_unit);
}

Result<size_t> ParseSize(const std::string& key, const std::string& value) {
  uint64_t n = 0;
  std::string unit;
  if (!ParseLeadingNumber(value, &n, &unit)) {
    return Status::InvalidArgument("option " + key + ": expected a size, got '" + value + "'");
  }
  int shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "K" || unit == "k" || unit == "KiB") {
    shift = 10;
  } else if (unit == "M" || unit == "MiB") {
    shift = 20;
  } else if (unit == "G" || unit == "GiB") {
    shift = 30;
  } else {
    return Status::InvalidArgument("option " + key + ": unknown unit '" + unit +
                                   "' (use K, M or G)");
  }
  if (shift > 0 && n > (SIZE_MAX >> shift)) {
    return Status::InvalidArgument("option " + key + ": " + value + " is too large");
  }
  return static_cast<size_t>(n << shift);
}

// A window in bytes (readahead=, read_around=): 0 or a multiple of 4K up
// to 64M.
Result<size_t> ParseWindow(const std::string& key, const std::string& value) {
  THINFS_ASSIGN_OR_RETURN(const size_t bytes, ParseSize(key, value));
  if (bytes % 4096 != 0 || bytes > (size_t{64} << 20)) {
    return Status::InvalidArgument("option " + key +
                                   ": expected 0 or a multiple of 4K up to 64M, got '" + value +
                                   "'");
  }
  return bytes;
}

}  // namespace

Result<MountOptions> ParseMountOptions(const std::string& pool, const std::string& mountpoint,
                                       const std::string& dash_o, bool foreground) {
  if (pool.empty()) return Status::InvalidArgument("no pool directory given");
  if (mountpoint.empty()) return Status::InvalidArgument("no mountpoint given");
  MountOptions opts;
  opts.pool = pool;
  opts.mountpoint = mountpoint;
  opts.foreground = foreground;
  for (const std::string& item : SplitCommas(dash_o)) {
    size_t eq = item.find('=');
    std::string key = item.substr(0, eq);
    bool has_value = eq != std::string::npos;
    std::string value = has_value ? item.substr(eq + 1) : "";
    auto require_value = [&]() -> Status {
      if (!has_value || value.empty()) {
        return Status::InvalidArgument("option " + key + " needs a value (" + key + "=...)");
      }
      return Status::Ok();
    };
    auto require_no_value = [&]() -> Status {
      if (has_value) return Status::InvalidArgument("option " + key + " takes no value");
      return Status::Ok();
    };
    if (key == "ro" || key == "rw") {
      THINFS_RETURN_IF_ERROR(require_no_value());
      opts.read_only = key == "ro";
    } else if (key == "allow_other") {
      THINFS_RETURN_IF_ERROR(require_no_value());
      opts.allow_other = true;
    } else if (key == "commit_interval") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.commit_interval, ParseDuration(key, value));
    } else if (key == "sync_overwrites") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.sync_overwrites, ParseBool(key, value));
    } else if (key == "cache_size") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.block_cache_bytes, ParseSize(key, value));
    } else if (key == "map_cache") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.map_cache_bytes, ParseSize(key, value));
    } else if (key == "deferred_copy") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.deferred_copy_bytes, ParseSize(key, value));
    } else if (key == "background_copies") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.background_copies, ParseBool(key, value));
    } else if (key == "zero_detect") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.zero_detection, ParseBool(key, value));
    } else if (key == "direct_io") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.direct_io, ParseBool(key, value));
    } else if (key == "direct_reads") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.direct_reads, ParseBool(key, value));
    } else if (key == "direct_writes") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.direct_writes, ParseBool(key, value));
    } else if (key == "mapped_reads") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.mapped_reads, ParseBool(key, value));
    } else if (key == "read_around") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.read_around_bytes, ParseWindow(key, value));
    } else if (key == "reflink") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.reflink, ParseBool(key, value));
    } else if (key == "writeback_cache") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.writeback_cache, ParseBool(key, value));
    } else if (key == "page_cache") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.page_cache, ParseBool(key, value));
    } else if (key == "io_uring") {
      THINFS_RETURN_IF_ERROR(require_value());
      if (value == "auto") {
        opts.io_uring = UringMode::kAuto;
      } else if (value == "on") {
        opts.io_uring = UringMode::kOn;
      } else if (value == "off") {
        opts.io_uring = UringMode::kOff;
      } else {
        return Status::InvalidArgument("option io_uring: expected auto, on or off, got '" +
                                       value + "'");
      }
    } else if (key == "readahead") {
      THINFS_RETURN_IF_ERROR(require_value());
      size_t bytes = 0;
      THINFS_ASSIGN_OR_RETURN(bytes, ParseWindow(key, value));
      opts.readahead_bytes = static_cast<uint32_t>(bytes);
    } else if (key == "threads") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.threads, ParseThreadCount(key, value));
    } else if (key == "uring_threads") {
      THINFS_RETURN_IF_ERROR(require_value());
      THINFS_ASSIGN_OR_RETURN(opts.uring_threads, ParseThreadCount(key, value));
    } else if (key == "cpu_latency") {
      THINFS_RETURN_IF_ERROR(require_value());
      uint64_t usec = 0;
      std::string rest;
      if (value == "off") {
        opts.cpu_latency_us.reset();
      } else if (ParseLeadingNumber(value, &usec, &rest) && rest.empty() && usec <= 1'000'000) {
        opts.cpu_latency_us = static_cast<uint32_t>(usec);
      } else {
        return Status::InvalidArgument("option cpu_latency: expected off or 0-1000000 (µs), got '" +
                                       value + "'");
      }
    } else if (key == "low_water") {
      THINFS_RETURN_IF_ERROR(require_value());
      opts.low_water_bytes = 0;
      opts.low_water_percent = 0;
      if (value.back() == '%') {
        uint64_t pct = 0;
        std::string rest;
        if (!ParseLeadingNumber(value, &pct, &rest) || rest != "%" || pct < 1 || pct > 99) {
          return Status::InvalidArgument("option low_water: expected SIZE or 1%-99%, got '" +
                                         value + "'");
        }
        opts.low_water_percent = static_cast<uint32_t>(pct);
      } else {
        THINFS_ASSIGN_OR_RETURN(opts.low_water_bytes, ParseSize(key, value));
        if (opts.low_water_bytes == 0) {
          return Status::InvalidArgument("option low_water: the mark must be above zero");
        }
      }
    } else if (key == "low_water_cmd") {
      THINFS_RETURN_IF_ERROR(require_value());
      // The daemon runs from "/": a relative path would name another file.
      if (value[0] != '/') {
        return Status::InvalidArgument("option low_water_cmd: '" + value +
                                       "' is not an absolute path");
      }
      opts.low_water_cmd = value;
    } else if (key == "no_space") {
      THINFS_RETURN_IF_ERROR(require_value());
      if (value == "error") {
        opts.no_space_timeout = std::chrono::milliseconds(0);
      } else if (value.rfind("wait:", 0) == 0) {
        THINFS_ASSIGN_OR_RETURN(opts.no_space_timeout, ParseDuration(key, value.substr(5)));
        if (opts.no_space_timeout.count() == 0) {
          return Status::InvalidArgument("option no_space: wait:0 waits for nothing; use error");
        }
      } else {
        return Status::InvalidArgument("option no_space: expected error or wait:DUR, got '" +
                                       value + "'");
      }
    } else if (key == "log_level") {
      THINFS_RETURN_IF_ERROR(require_value());
      Result<LogLevel> level = ParseLogLevel(value);
      if (!level.ok()) return level.status().WithContext("option log_level");
      opts.log_level = value;
    } else {
      return Status::InvalidArgument("unknown mount option '" + key + "'");
    }
  }
  if (opts.writeback_cache && !opts.page_cache) {
    // The writeback cache is the page cache holding writes back: with no
    // page cache there is nothing for it to do.
    return Status::InvalidArgument(
        "options writeback_cache=on and page_cache=off exclude each other");
  }
  return opts;
}

}  // namespace thinfs::fs
