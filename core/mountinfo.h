// The kernel's mount table, /proc/PID/mountinfo (proc(5)), parsed once for
// every user: `thinfs snapshot` finds the mount of a pool in it (no
// control-socket round trip, docs/benchmarks.md lever 7), and the end-to-end
// test helpers (tests/util/e2e_util.h) find and clean up their mounts.
//
// One line per mount, fields separated by single spaces:
//
//   36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw
//   ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
//
// There are zero or more optional fields ("shared:N", "master:N",
// "propagate_from:N", "unbindable"), ended by a lone "-". The kernel writes
// a space, tab, newline or backslash inside a field as a three-digit octal
// escape (\040, \011, \012, \134), so a field never contains a separator and
// a line never contains a newline; the parser decodes the escapes.
//
// A thinfs daemon names its mount ThinfsMountSource(realpath(POOL)) with
// file system type kThinfsFsType (fs/main.cc, fs/server.cc).
//
// Thread safety: pure functions, except that ReadMountInfo and ThinfsMountOf
// read this process's mount table.

#ifndef THINFS_CORE_MOUNTINFO_H_
#define THINFS_CORE_MOUNTINFO_H_

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace thinfs {

// One line of mountinfo, every field but the mount ids decoded.
struct MountInfoEntry {
  std::string device;         // the super block's "MAJ:MIN" (st_dev; the
                              // name of its bdi in /sys/class/bdi)
  std::string root;           // the directory of the file system mounted
  std::string mountpoint;     // where, in this process's root
  std::string options;        // per-mount options: "rw,nosuid,relatime"
  std::vector<std::string> optional_fields;  // "shared:1", "master:3", ...
  std::string fstype;         // "ext4", "fuse.thinfs"
  std::string source;         // "/dev/vda", "thinfs:/srv/pool"
  std::string super_options;  // per-super-block options
};

// The file system type of a thinfs mount ("fuse." + FUSE subtype).
inline constexpr std::string_view kThinfsFsType = "fuse.thinfs";

// Decodes mountinfo's octal escapes (\040 space, \011 tab, \012 newline,
// \134 backslash, any \[0-3][0-7][0-7]). A backslash not followed by three
// such digits is kept as it is.
std::string UnescapeMountField(std::string_view field);

// Parses one line (without its newline). nullopt when it does not have the
// six leading fields, a "-" separator after them, and a type and a source
// after that (super-block options may be missing).
std::optional<MountInfoEntry> ParseMountInfoLine(std::string_view line);

// Parses the whole table, in order, skipping empty and malformed lines.
std::vector<MountInfoEntry> ParseMountInfo(std::string_view text);

// Parses `path`, by default this process's mount table. Returns the error
// of open(2) or read(2) (kNotFound for a missing file, else kIOError).
Result<std::vector<MountInfoEntry>> ReadMountInfo(
    const std::string& path = "/proc/self/mountinfo");

// "thinfs:" + pool_root: the source a daemon gives the mount of the pool
// whose real path is `pool_root`.
std::string ThinfsMountSource(std::string_view pool_root);

// The mountpoint of the one kThinfsFsType mount in `mounts` whose source is
// ThinfsMountSource(pool_root), or nullopt when none or several match (a
// stale mount of a killed daemon next to a live one: only the daemon knows
// which is its own).
std::optional<std::string> FindThinfsMount(std::span<const MountInfoEntry> mounts,
                                           std::string_view pool_root);

// The inverse: the pool root (as the daemon named its mount) of the
// kThinfsFsType mount on `mountpoint` (a real path), or nullopt when
// `mountpoint` is not the mount point of a thinfs mount. With several
// stacked there, the topmost (last) one: what the mount point shows.
std::optional<std::string> ThinfsPoolOnMountpoint(std::span<const MountInfoEntry> mounts,
                                                  std::string_view mountpoint);

// The topmost (last) mount on `mountpoint`, the one it shows, or null when
// nothing is mounted there. Points into `mounts`.
const MountInfoEntry* TopMountOn(std::span<const MountInfoEntry> mounts,
                                 std::string_view mountpoint);

// FindThinfsMount for `pool` as the daemon names it (realpath), in this
// process's mount namespace. nullopt on any error.
std::optional<std::string> ThinfsMountOf(const std::string& pool);

}  // namespace thinfs

#endif  // THINFS_CORE_MOUNTINFO_H_
