// The mountpoint of a pool, from the kernel's mount table instead of a
// control-socket round trip to its daemon: `thinfs snapshot` needs it to
// flush the origin through the mount, and asking costs a connection and a
// daemon thread (docs/benchmarks.md, lever 7). A daemon names its mount
// "thinfs:" + realpath(POOL) (fs/main.cc), type fuse.thinfs.
//
// Header-only so that tests/tools can test the parser. Thread-safe.

#ifndef THINFS_TOOLS_MOUNT_LOOKUP_H_
#define THINFS_TOOLS_MOUNT_LOOKUP_H_

#include <climits>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace thinfs::tools {

// Decodes mountinfo's octal escapes (\040 space, \011 tab, \012 newline,
// \134 backslash).
inline std::string UnescapeMountField(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' &&
        s[i + 2] >= '0' && s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
      out.push_back(
          static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The mountpoint of the one fuse.thinfs mount whose source is
// "thinfs:" + pool_root in `mountinfo` (the text of /proc/PID/mountinfo),
// or nullopt when none or several match (a stale mount of a killed daemon
// next to a live one: only the daemon knows which is its own).
inline std::optional<std::string> FindThinfsMount(std::string_view mountinfo,
                                                  const std::string& pool_root) {
  const std::string source = "thinfs:" + pool_root;
  std::optional<std::string> found;
  std::istringstream lines{std::string(mountinfo)};
  std::string line;
  while (std::getline(lines, line)) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
    std::vector<std::string> f;
    std::istringstream words(line);
    for (std::string w; words >> w;) f.push_back(w);
    size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 5 || dash + 2 >= f.size()) continue;
    if (f[dash + 1] != "fuse.thinfs" || UnescapeMountField(f[dash + 2]) != source) continue;
    if (found) return std::nullopt;
    found = UnescapeMountField(f[4]);
  }
  return found;
}

// FindThinfsMount for `pool` as the daemon names it (realpath), in this
// process's mount namespace. nullopt on any error.
inline std::optional<std::string> ThinfsMountOf(const std::string& pool) {
  char resolved[PATH_MAX];
  if (::realpath(pool.c_str(), resolved) == nullptr) return std::nullopt;
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return FindThinfsMount(text.str(), resolved);
}

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_MOUNT_LOOKUP_H_
