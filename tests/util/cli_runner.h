// Runs the built `thinfs` binary (THINFS_BINARY, defined by
// tests/CMakeLists.txt) and captures its exit code and output: shared by the
// CLI tests.

#ifndef THINFS_TESTS_UTIL_CLI_RUNNER_H_
#define THINFS_TESTS_UTIL_CLI_RUNNER_H_

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/util/pool_test_util.h"

namespace thinfs::testing {

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the program at `path` with `args`, stdin from /dev/null, capturing
// output.
inline CliRun RunProgram(const std::string& path, const std::vector<std::string>& args) {
  TempDir io;
  const std::string out_path = io.Sub("out"), err_path = io.Sub("err");
  pid_t pid = ::fork();
  if (pid == 0) {
    int in = ::open("/dev/null", O_RDONLY);
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || out < 0 || err < 0) ::_exit(127);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(path.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(path.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFileOrDie(out_path);
  r.err = ReadFileOrDie(err_path);
  return r;
}

// Runs THINFS_BINARY with `args`.
inline CliRun Thinfs(const std::vector<std::string>& args) { return RunProgram(THINFS_BINARY, args); }

inline std::string Describe(const CliRun& r) {
  return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "stderr:\n" + r.err;
}

}  // namespace thinfs::testing

#endif  // THINFS_TESTS_UTIL_CLI_RUNNER_H_
