#include "fs/log.h"

#include <syslog.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace thinfs::fs {
namespace {

// Read on every Log() call from any FUSE worker; written at start-up.
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
// Same: flipped once when the daemon detaches.
std::atomic<bool> g_syslog{false};

int SyslogPriority(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return LOG_ERR;
    case LogLevel::kWarning:
      return LOG_WARNING;
    case LogLevel::kInfo:
      return LOG_INFO;
    case LogLevel::kDebug:
      return LOG_DEBUG;
  }
  return LOG_INFO;
}

const char* LevelTag(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "E";
    case LogLevel::kWarning:
      return "W";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kDebug:
      return "D";
  }
  return "?";
}

}  // namespace

Result<LogLevel> ParseLogLevel(const std::string& name) {
  if (name == "error") return LogLevel::kError;
  if (name == "warning" || name == "warn") return LogLevel::kWarning;
  if (name == "info") return LogLevel::kInfo;
  if (name == "debug") return LogLevel::kDebug;
  return Status::InvalidArgument("unknown log level '" + name +
                                 "' (expected error, warning, info or debug)");
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

void SetLogSink(LogSink sink) {
  if (sink == LogSink::kSyslog) {
    openlog("thinfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
    g_syslog.store(true);
  } else {
    g_syslog.store(false);
  }
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(); }

void Log(LogLevel level, const char* fmt, ...) {
  if (!LogEnabled(level)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_syslog.load()) {
    syslog(SyslogPriority(level), "%s", msg);
    return;
  }
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm local{};
  localtime_r(&ts.tv_sec, &local);
  char when[32];
  strftime(when, sizeof when, "%H:%M:%S", &local);
  // One fprintf per message so that lines from concurrent workers do not
  // interleave (stdio locks the stream per call).
  fprintf(stderr, "%s %s.%06ld thinfs[%d]: %s\n", LevelTag(level), when, ts.tv_nsec / 1000,
          static_cast<int>(getpid()), msg);
}

}  // namespace thinfs::fs
