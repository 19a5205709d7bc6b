// Logging for the FUSE daemon.
//
// In the foreground the daemon logs to stderr; once it has detached it logs
// through syslog(3) (facility LOG_DAEMON, ident "thinfs"). Messages below the
// configured level are dropped. libfuse's own messages are routed here too.
//
// Thread safety: Log() may be called from any thread. SetLogSink() and
// SetLogLevel() are meant for start-up, before the FUSE loop runs, but are
// safe to call at any time.

#ifndef THINFS_FS_LOG_H_
#define THINFS_FS_LOG_H_

#include <string>

#include "core/status.h"

namespace thinfs::fs {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

enum class LogSink { kStderr, kSyslog };

// Parses "error", "warning" (or "warn"), "info", "debug". kInvalidArgument
// otherwise.
Result<LogLevel> ParseLogLevel(const std::string& name);

void SetLogLevel(LogLevel level);
// Switching to kSyslog opens the syslog connection.
void SetLogSink(LogSink sink);
bool LogEnabled(LogLevel level);

// printf-style; a trailing newline is added.
void Log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace thinfs::fs

#define THINFS_LOG_ERROR(...) ::thinfs::fs::Log(::thinfs::fs::LogLevel::kError, __VA_ARGS__)
#define THINFS_LOG_WARNING(...) ::thinfs::fs::Log(::thinfs::fs::LogLevel::kWarning, __VA_ARGS__)
#define THINFS_LOG_INFO(...) ::thinfs::fs::Log(::thinfs::fs::LogLevel::kInfo, __VA_ARGS__)
#define THINFS_LOG_DEBUG(...)                                              \
  do {                                                                     \
    if (::thinfs::fs::LogEnabled(::thinfs::fs::LogLevel::kDebug))          \
      ::thinfs::fs::Log(::thinfs::fs::LogLevel::kDebug, __VA_ARGS__);      \
  } while (0)

#endif  // THINFS_FS_LOG_H_
