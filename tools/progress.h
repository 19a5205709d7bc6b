// ProgressLine: a one-line progress indicator on stderr for long commands
// (check, send, receive). Shown only when stderr is a terminal, so that
// scripts and pipes stay quiet; erased when done.
//
// Thread safety: single-threaded.

#ifndef THINFS_TOOLS_PROGRESS_H_
#define THINFS_TOOLS_PROGRESS_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "core/size.h"

namespace thinfs::tools {

class ProgressLine {
 public:
  // `verb` starts the line: "checking", "sending", ...
  explicit ProgressLine(const char* verb) : verb_(verb), tty_(::isatty(2) == 1) {}
  ~ProgressLine() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
  }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // "VERB PHASE: 42%" when total > 0, else "VERB PHASE: done".
  void Show(const char* phase, uint64_t done, uint64_t total) {
    if (!tty_) return;
    shown_ = true;
    if (total > 0) {
      std::fprintf(stderr, "\r\033[K%s %s: %llu%%", verb_, phase,
                   static_cast<unsigned long long>(done * 100 / total));
    } else {
      std::fprintf(stderr, "\r\033[K%s %s: %llu", verb_, phase,
                   static_cast<unsigned long long>(done));
    }
    std::fflush(stderr);
  }
  // "VERB PHASE: 1.5 GiB of 4 GiB" (total 0: without "of").
  void ShowBytes(const char* phase, uint64_t done, uint64_t total) {
    if (!tty_) return;
    shown_ = true;
    if (total > 0) {
      std::fprintf(stderr, "\r\033[K%s %s: %s of %s", verb_, phase, FormatSize(done).c_str(),
                   FormatSize(total).c_str());
    } else {
      std::fprintf(stderr, "\r\033[K%s %s: %s", verb_, phase, FormatSize(done).c_str());
    }
    std::fflush(stderr);
  }

 private:
  const char* const verb_;
  const bool tty_;
  bool shown_ = false;
};

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_PROGRESS_H_
