// Shared plumbing of the thinfs CLI: the subcommand table, option parsing
// with uniform --help and error reporting, exit codes.
//
// Adding a subcommand: write `int RunFoo(const std::vector<std::string>&)`
// in the tools/cmd_<group>.cc file of its group, declare it below and add a
// row to the table in tools/main.cc. Inside, build a CommandLine, call
// Parse() and return its code when it has one.
//
// Only tools/ uses Boost.Program_options; its exceptions never leave main().
//
// Thread safety: single-threaded.

#ifndef THINFS_TOOLS_CLI_H_
#define THINFS_TOOLS_CLI_H_

#include <boost/program_options.hpp>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"

namespace thinfs::tools {

namespace po = boost::program_options;

// Exit codes of every subcommand but check (which uses fsck's, below).
inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 1;    // bad option, missing or invalid argument
inline constexpr int kExitFailure = 2;  // the operation failed

// thinfs check, like fsck(8).
inline constexpr int kCheckClean = 0;
inline constexpr int kCheckErrorsCorrected = 1;  // check --repair
inline constexpr int kCheckErrorsLeft = 4;
inline constexpr int kCheckOperational = 8;

inline constexpr const char* kExitCodesHelp =
    "Exit status: 0 success; 1 usage error (bad option, missing or invalid\n"
    "argument); 2 the operation failed. 'check' exits like fsck: 0 clean,\n"
    "1 errors corrected (--repair), 4 errors left uncorrected, 8 operational\n"
    "error (pool missing, locked or unreadable), 1 usage error.\n";

struct Command {
  const char* name;
  const char* summary;
  // `args` are the arguments after the subcommand's name.
  int (*run)(const std::vector<std::string>& args);
};

// The table in tools/main.cc.
const std::vector<Command>& Commands();

// tools/cmd_pool.cc
int RunFormat(const std::vector<std::string>& args);
int RunStatus(const std::vector<std::string>& args);
// tools/cmd_check.cc
int RunCheck(const std::vector<std::string>& args);
// tools/cmd_mount.cc
int RunMount(const std::vector<std::string>& args);
int RunUmount(const std::vector<std::string>& args);
// tools/cmd_dev.cc
int RunCreate(const std::vector<std::string>& args);
int RunSnapshot(const std::vector<std::string>& args);
int RunDelete(const std::vector<std::string>& args);
int RunResize(const std::vector<std::string>& args);
int RunRename(const std::vector<std::string>& args);
int RunList(const std::vector<std::string>& args);
int RunGrow(const std::vector<std::string>& args);
// tools/cmd_dump.cc
int RunDump(const std::vector<std::string>& args);
int RunRestore(const std::vector<std::string>& args);
int RunMetadataSize(const std::vector<std::string>& args);
// tools/cmd_send.cc
int RunDiff(const std::vector<std::string>& args);
int RunSend(const std::vector<std::string>& args);
int RunReceive(const std::vector<std::string>& args);

// The options and positional arguments of one subcommand.
class CommandLine {
 public:
  // `synopsis` follows "thinfs NAME " in the usage line; `description` is
  // the paragraph under it.
  CommandLine(std::string name, std::string synopsis, std::string description);

  // Adds a required positional argument (in order).
  CommandLine& Positional(const char* name, const char* help);
  // Adds options, as with options_description::add_options().
  po::options_description_easy_init AddOptions() { return options_.add_options(); }
  // Text printed after the options in --help (examples, notes).
  void SetEpilog(std::string epilog) { epilog_ = std::move(epilog); }

  // Parses `args`. Returns nullopt when the command should go on; otherwise
  // the exit code to return at once: kExitOk after printing the usage for
  // --help, kExitUsage after printing a one-line error.
  std::optional<int> Parse(const std::vector<std::string>& args);

  bool Has(const char* option) const { return vm_.count(option) != 0; }
  template <typename T>
  const T& Get(const char* option) const {
    return vm_[option].as<T>();
  }
  const std::string& Arg(size_t i) const { return positional_values_.at(i); }

  void PrintUsage(std::ostream& out) const;

  // Prints "thinfs NAME: message" on stderr and returns `code`.
  int Fail(int code, const std::string& message) const;
  // Same with status.message(), and kExitUsage for kInvalidArgument,
  // kExitFailure otherwise.
  int Fail(const Status& status) const;

  // Parses a size option's value; on error reports it (exit kExitUsage).
  std::optional<uint64_t> SizeOption(const char* option) const;

  const std::string& name() const { return name_; }
  // The arguments Parse() was given (after the subcommand's name).
  const std::vector<std::string>& args() const { return args_; }

 private:
  std::string name_;
  std::string synopsis_;
  std::string description_;
  std::string epilog_;
  po::options_description options_;
  std::vector<std::pair<std::string, std::string>> positionals_;  // name, help
  std::vector<std::string> positional_values_;
  std::vector<std::string> args_;
  po::variables_map vm_;
};

// "2024-05-01T12:00:00Z" for a CLOCK_REALTIME time in nanoseconds.
std::string FormatTime(int64_t ns);

// Runs a binary's main body: Boost.Program_options reports through
// exceptions, and none may leave main(). An option error is reported as
// "thinfs: ..." with kExitUsage, any other exception with kExitFailure.
int CatchToExitCode(const std::function<int()>& body);

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_CLI_H_
