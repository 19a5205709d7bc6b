// ProgressLine: a one-line progress report on stderr for long commands
// (check, dump, restore, send, receive), shown only when stderr is a terminal, so that
// scripts and logs stay quiet.
//
// Thread safety: single-threaded.

#ifndef THINFS_TOOLS_PROGRESS_H_
#define THINFS_TOOLS_PROGRESS_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "core/size.h"

namespace thinfs::tools {

class ProgressLine {
 public:
  // `verb` prefixes each phase ("checking " + "block map").
  explicit ProgressLine(std::string verb) : verb_(std::move(verb)), tty_(::isatty(2) == 1) {}
  ~ProgressLine() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
  }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // `done` of `total` units of `phase`; total 0 when unknown. Redraws only
  // when the percentage (or, without a total, the count by 64Ki) changes.
  void Show(const char* phase, uint64_t done, uint64_t total) {
    if (!tty_) return;
    const uint64_t step = total > 0 ? done * 100 / total : done >> 16;
    if (shown_ && phase == last_phase_ && step == last_step_) return;
    shown_ = true;
    last_phase_ = phase;
    last_step_ = step;
    if (total > 0) {
      std::fprintf(stderr, "\r\033[K%s%s: %llu%%", verb_.c_str(), phase,
                   static_cast<unsigned long long>(step));
    } else {
      std::fprintf(stderr, "\r\033[K%s%s: %llu", verb_.c_str(), phase,
                   static_cast<unsigned long long>(done));
    }
    std::fflush(stderr);
  }

  // "VERB PHASE: 1.5 GiB of 4 GiB" (total 0: without "of").
  void ShowBytes(const char* phase, uint64_t done, uint64_t total) {
    if (!tty_) return;
    shown_ = true;
    if (total > 0) {
      std::fprintf(stderr, "\r\033[K%s%s: %s of %s", verb_.c_str(), phase, FormatSize(done).c_str(),
                   FormatSize(total).c_str());
    } else {
      std::fprintf(stderr, "\r\033[K%s%s: %s", verb_.c_str(), phase, FormatSize(done).c_str());
    }
    std::fflush(stderr);
  }

 private:
  const std::string verb_;
  const bool tty_;
  bool shown_ = false;
  const char* last_phase_ = nullptr;
  uint64_t last_step_ = 0;
};

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_PROGRESS_H_
