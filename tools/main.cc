// thinfs-engine: the command-line tool with the engine linked in, every
// command. Users run it through the front binary, thinfs (tools/front.cc),
// which serves some commands itself and runs this one for the rest.
// Dispatches to the subcommands in the table below; see tools/cli.h for how
// to add one.

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "tools/cli.h"

namespace thinfs::tools {

const std::vector<Command>& Commands() {
  static const std::vector<Command> kCommands = {
      {"format", "create a pool (data area, metadata, bitmap)", RunFormat},
      {"status", "show a pool's geometry, usage and devices", RunStatus},
      {"check", "verify a pool's metadata (fsck-like exit status)", RunCheck},
      {"grow", "grow a pool's data area", RunGrow},
      {"create", "create a thin device", RunCreate},
      {"snapshot", "snapshot a device in constant time", RunSnapshot},
      {"delete", "delete a device", RunDelete},
      {"resize", "grow or shrink a device", RunResize},
      {"rename", "rename a device", RunRename},
      {"list", "list devices with their block usage", RunList},
      {"diff", "show the ranges where two devices differ", RunDiff},
      {"send", "write a device (or its changes) as a stream", RunSend},
      {"receive", "create a device from a 'send' stream", RunReceive},
      {"mount", "serve a pool's devices as files through FUSE", RunMount},
      {"umount", "unmount a thinfs mount", RunUmount},
      {"dump", "write a pool's metadata as thin_dump XML or JSON", RunDump},
      {"restore", "create a pool from thin_dump XML over existing data", RunRestore},
      {"metadata-size", "estimate the metadata space of a pool geometry", RunMetadataSize},
  };
  return kCommands;
}

namespace {

void PrintHelp(std::ostream& out) {
  out << "usage: thinfs [--help] [--version] COMMAND [ARGS...]\n\n"
         "Thin provisioning and snapshots in user space: a pool holds one\n"
         "shared data area and the metadata that maps every thin device onto it.\n\n"
         "Commands:\n";
  for (const Command& c : Commands()) {
    out << "  " << c.name << std::string(15 - std::string(c.name).size(), ' ') << c.summary
        << "\n";
  }
  out << "  help           show the usage of a command (thinfs help COMMAND)\n\n"
         "Run 'thinfs COMMAND --help' for a command's arguments and options.\n\n"
      << kExitCodesHelp;
}

const Command* Find(const std::string& name) {
  for (const Command& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

int UnknownCommand(const std::string& name) {
  std::cerr << "thinfs: unknown command '" << name << "' (see 'thinfs --help')" << std::endl;
  return kExitUsage;
}

int Main(const std::vector<std::string>& args) {
  if (args.empty()) {
    PrintHelp(std::cerr);
    return kExitUsage;
  }
  const std::string& first = args[0];
  if (first == "--help" || first == "-h" || (first == "help" && args.size() == 1)) {
    PrintHelp(std::cout);
    return kExitOk;
  }
  if (first == "--version" || first == "-V") {
    std::cout << "thinfs " << THINFS_VERSION << std::endl;
    return kExitOk;
  }
  if (first == "help") {
    if (args.size() > 2) {
      std::cerr << "thinfs help: expected one command name" << std::endl;
      return kExitUsage;
    }
    const Command* c = Find(args[1]);
    if (c == nullptr) return UnknownCommand(args[1]);
    return c->run({"--help"});
  }
  if (!first.empty() && first[0] == '-') {
    std::cerr << "thinfs: unrecognised option '" << first << "' (see 'thinfs --help')"
              << std::endl;
    return kExitUsage;
  }
  const Command* c = Find(first);
  if (c == nullptr) return UnknownCommand(first);
  return c->run(std::vector<std::string>(args.begin() + 1, args.end()));
}

}  // namespace
}  // namespace thinfs::tools

int main(int argc, char** argv) {
  return thinfs::tools::CatchToExitCode(
      [&] { return thinfs::tools::Main(std::vector<std::string>(argv + 1, argv + argc)); });
}
