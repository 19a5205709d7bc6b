#include "core/mountinfo.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

namespace thinfs {

namespace {

bool IsOctal(char c, char max) { return c >= '0' && c <= max; }

// The space-separated fields of `line`. Runs of spaces count as one
// separator, as they did for the istream parsers this one replaces; the
// kernel writes single spaces.
std::vector<std::string_view> SplitFields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t pos = 0;
  while (pos < line.size()) {
    if (line[pos] == ' ') {
      ++pos;
      continue;
    }
    size_t end = line.find(' ', pos);
    if (end == std::string_view::npos) end = line.size();
    fields.push_back(line.substr(pos, end - pos));
    pos = end;
  }
  return fields;
}

}  // namespace

std::string UnescapeMountField(std::string_view field) {
  std::string out;
  out.reserve(field.size());
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && IsOctal(field[i + 1], '3') &&
        IsOctal(field[i + 2], '7') && IsOctal(field[i + 3], '7')) {
      out.push_back(static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                                      (field[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

std::optional<MountInfoEntry> ParseMountInfoLine(std::string_view line) {
  // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
  constexpr size_t kFixed = 6;
  std::vector<std::string_view> f = SplitFields(line);
  // The search starts after the fixed fields: a mountpoint named "-" is one.
  size_t dash = kFixed;
  while (dash < f.size() && f[dash] != "-") ++dash;
  // The super-block options may be missing, as the parser this one replaces
  // allowed; the type and source may not.
  if (dash + 3 > f.size()) return std::nullopt;
  MountInfoEntry e;
  e.device = std::string(f[2]);
  e.root = UnescapeMountField(f[3]);
  e.mountpoint = UnescapeMountField(f[4]);
  e.options = UnescapeMountField(f[5]);
  for (size_t i = kFixed; i < dash; ++i) e.optional_fields.emplace_back(f[i]);
  e.fstype = UnescapeMountField(f[dash + 1]);
  e.source = UnescapeMountField(f[dash + 2]);
  if (dash + 3 < f.size()) e.super_options = UnescapeMountField(f[dash + 3]);
  return e;
}

std::vector<MountInfoEntry> ParseMountInfo(std::string_view text) {
  std::vector<MountInfoEntry> entries;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    if (std::optional<MountInfoEntry> e = ParseMountInfoLine(text.substr(pos, end - pos))) {
      entries.push_back(std::move(*e));
    }
    pos = end + 1;
  }
  return entries;
}

Result<std::vector<MountInfoEntry>> ReadMountInfo(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  // A proc file has no size to ask for: read until EOF.
  std::string text;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Status::FromErrno(errno, "read " + path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return ParseMountInfo(text);
}

std::string ThinfsMountSource(std::string_view pool_root) {
  std::string source = "thinfs:";
  source.append(pool_root);
  return source;
}

std::optional<std::string> FindThinfsMount(std::span<const MountInfoEntry> mounts,
                                           std::string_view pool_root) {
  const std::string source = ThinfsMountSource(pool_root);
  std::optional<std::string> found;
  for (const MountInfoEntry& m : mounts) {
    if (m.fstype != kThinfsFsType || m.source != source) continue;
    if (found) return std::nullopt;
    found = m.mountpoint;
  }
  return found;
}

const MountInfoEntry* TopMountOn(std::span<const MountInfoEntry> mounts,
                                 std::string_view mountpoint) {
  const MountInfoEntry* top = nullptr;
  for (const MountInfoEntry& m : mounts) {
    // A later mount on the same point covers the earlier ones.
    if (m.mountpoint == mountpoint) top = &m;
  }
  return top;
}

std::optional<std::string> ThinfsPoolOnMountpoint(std::span<const MountInfoEntry> mounts,
                                                  std::string_view mountpoint) {
  const std::string prefix = ThinfsMountSource("");
  const MountInfoEntry* top = TopMountOn(mounts, mountpoint);
  if (top == nullptr || top->fstype != kThinfsFsType || !top->source.starts_with(prefix)) {
    return std::nullopt;
  }
  return top->source.substr(prefix.size());
}

std::optional<std::string> ThinfsMountOf(const std::string& pool) {
  char resolved[PATH_MAX];
  if (::realpath(pool.c_str(), resolved) == nullptr) return std::nullopt;
  Result<std::vector<MountInfoEntry>> mounts = ReadMountInfo();
  if (!mounts.ok()) return std::nullopt;
  return FindThinfsMount(*mounts, resolved);
}

}  // namespace thinfs
