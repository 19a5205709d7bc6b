#include "tools/cli.h"

#include <time.h>

#include <cstdio>
#include <exception>
#include <iomanip>
#include <iostream>

#include "core/size.h"

namespace thinfs::tools {

namespace {
// Collects the positional arguments; never shown in --help.
constexpr const char* kPositionalKey = "positional-args";
}  // namespace

CommandLine::CommandLine(std::string name, std::string synopsis, std::string description)
    : name_(std::move(name)),
      synopsis_(std::move(synopsis)),
      description_(std::move(description)),
      options_("Options", 80, 40) {
  options_.add_options()("help,h", "print this help and exit");
}

CommandLine& CommandLine::Positional(const char* name, const char* help) {
  positionals_.emplace_back(name, help);
  return *this;
}

std::optional<int> CommandLine::Parse(const std::vector<std::string>& args) {
  args_ = args;
  po::options_description hidden;
  hidden.add_options()(kPositionalKey, po::value<std::vector<std::string>>());
  po::options_description all;
  all.add(options_).add(hidden);
  po::positional_options_description pos;
  pos.add(kPositionalKey, -1);
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm_);
    po::notify(vm_);
  } catch (const po::error& e) {
    return Fail(kExitUsage, std::string(e.what()) + " (see 'thinfs " + name_ + " --help')");
  }
  if (Has("help")) {
    PrintUsage(std::cout);
    return kExitOk;
  }
  if (Has(kPositionalKey)) positional_values_ = Get<std::vector<std::string>>(kPositionalKey);
  if (positional_values_.size() < positionals_.size()) {
    return Fail(kExitUsage, "missing " + positionals_[positional_values_.size()].first +
                                " argument (see 'thinfs " + name_ + " --help')");
  }
  if (positional_values_.size() > positionals_.size()) {
    return Fail(kExitUsage, "unexpected argument '" + positional_values_[positionals_.size()] +
                                "' (see 'thinfs " + name_ + " --help')");
  }
  return std::nullopt;
}

void CommandLine::PrintUsage(std::ostream& out) const {
  out << "usage: thinfs " << name_ << " " << synopsis_ << "\n\n" << description_ << "\n";
  if (!positionals_.empty()) {
    out << "\nArguments:\n";
    for (const auto& [arg, help] : positionals_) {
      out << "  " << std::left << std::setw(38) << arg << help << "\n";
    }
  }
  out << "\n" << options_;
  if (!epilog_.empty()) out << "\n" << epilog_;
  out << "\n" << kExitCodesHelp;
}

int CommandLine::Fail(int code, const std::string& message) const {
  std::cerr << "thinfs " << name_ << ": " << message << std::endl;
  return code;
}

int CommandLine::Fail(const Status& status) const {
  return Fail(status.IsInvalidArgument() ? kExitUsage : kExitFailure, status.message());
}

std::optional<uint64_t> CommandLine::SizeOption(const char* option) const {
  Result<uint64_t> v = ParseSize(Get<std::string>(option));
  if (!v.ok()) {
    (void)Fail(kExitUsage, std::string("--") + option + ": " + v.status().message());
    return std::nullopt;
  }
  return *v;
}

std::string FormatTime(int64_t ns) {
  time_t secs = static_cast<time_t>(ns / 1000000000);
  struct tm tm;
  if (::gmtime_r(&secs, &tm) == nullptr) return std::to_string(ns) + " ns";
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int CatchToExitCode(const std::function<int()>& body) {
  try {
    return body();
  } catch (const po::error& e) {
    std::cerr << "thinfs: " << e.what() << std::endl;
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "thinfs: " << e.what() << std::endl;
    return kExitFailure;
  }
}

}  // namespace thinfs::tools
