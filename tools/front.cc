// thinfs, the command users run: the CLI's front binary.
//
// It serves the device commands (create, snapshot, delete, resize, rename,
// list, grow) of a mounted pool itself, through the daemon's control socket
// (tools/cmd_dev.cc, the same code as the engine binary's), and runs the
// engine binary, thinfs-engine, with its command line for everything else:
// the other commands, --help, and device commands of a pool no daemon
// serves.
//
// Why two binaries: thinfs-engine links RocksDB statically, whose static
// initialisers (option tables, statistics names, registries) run before
// main() in every process: 2.8 ms of the 5.3 ms a `thinfs --version` took,
// most of a `thinfs snapshot` of a mounted pool, whose own work is one
// control request. This binary links neither RocksDB nor libfuse (its
// sources are listed in CMakeLists.txt; an engine symbol would fail the
// link) and, built with THINFS_STATIC_DEPS, is a static PIE: no dynamic
// loader either (docs/benchmarks.md, "32. A front binary without the
// engine").
//
// Where thinfs-engine is: next to this executable (a build tree, or both
// installed in one directory), else THINFS_ENGINE_FROM_BIN from this
// executable's directory (an install: ../libexec/thinfs/thinfs-engine).

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "tools/cli.h"
#include "tools/device_here.h"

namespace thinfs::tools {

namespace {

constexpr const char* kEngineName = "thinfs-engine";

// argv[0] as this process was started (passed on to the engine).
std::string g_argv0 = "thinfs";

// The directory of this executable, "" when /proc/self/exe cannot be read.
std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string self(buf, static_cast<size_t>(n));
  size_t slash = self.rfind('/');
  return slash == std::string::npos ? "" : self.substr(0, slash == 0 ? 1 : slash);
}

std::vector<std::string> EngineCandidates() {
  const std::string dir = SelfDir();
  if (dir.empty()) return {};
  const std::string prefix = dir == "/" ? dir : dir + "/";
  std::vector<std::string> c = {prefix + kEngineName};
  const std::string installed = prefix + THINFS_ENGINE_FROM_BIN;
  if (installed != c[0]) c.push_back(installed);
  return c;
}

// Runs thinfs-engine with `args` (what follows the program name). Returns
// only when it cannot, saying why.
std::string ExecEngine(const std::vector<std::string>& args) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  argv.push_back(g_argv0.data());
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  const std::vector<std::string> tried = EngineCandidates();
  if (tried.empty()) return "cannot find " + std::string(kEngineName) + ": /proc/self/exe unreadable";
  for (const std::string& path : tried) {
    ::execv(path.c_str(), argv.data());
    if (errno != ENOENT) return "cannot run " + path + ": " + std::strerror(errno);
  }
  std::string why = "cannot find " + std::string(kEngineName) + " (looked for";
  for (const std::string& path : tried) why += " " + path;
  return why + ")";
}

}  // namespace

AdminReply RunWithoutDaemon(const CommandLine& cl, const std::string&, const AdminRequest&,
                            bool) {
  std::vector<std::string> args = {cl.name()};
  args.insert(args.end(), cl.args().begin(), cl.args().end());
  return AdminReply::Error(kAdminFailure, ExecEngine(args));
}

namespace {

struct Served {
  const char* name;
  int (*run)(const std::vector<std::string>& args);
};

// The commands served here; the names as in tools/main.cc's table.
constexpr Served kServed[] = {
    {"create", RunCreate}, {"snapshot", RunSnapshot}, {"delete", RunDelete},
    {"resize", RunResize}, {"rename", RunRename},     {"list", RunList},
    {"grow", RunGrow},
};

int Main(const std::vector<std::string>& args) {
  if (!args.empty()) {
    if (args[0] == "--version" || args[0] == "-V") {
      std::cout << "thinfs " << THINFS_VERSION << std::endl;
      return kExitOk;
    }
    for (const Served& s : kServed) {
      if (args[0] == s.name) return s.run(std::vector<std::string>(args.begin() + 1, args.end()));
    }
  }
  const std::string why = ExecEngine(args);  // returns only when it failed
  std::cerr << "thinfs: " << why << std::endl;
  return kExitFailure;
}

}  // namespace
}  // namespace thinfs::tools

int main(int argc, char** argv) {
  if (argc > 0 && argv[0] != nullptr) thinfs::tools::g_argv0 = argv[0];
  return thinfs::tools::CatchToExitCode(
      [&] { return thinfs::tools::Main(std::vector<std::string>(argv + 1, argv + argc)); });
}
