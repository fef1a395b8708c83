// Minimal leveled logging to stderr. MEGADECODE_LOG=debug|info|warn|error sets the level (default info).
#pragma once

#include <string>

#include "core/check.h"

namespace megadecode {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

bool log_enabled(LogLevel level);
void log_write(LogLevel level, const std::string& message);

template <typename... Args>
void log_info(const Args&... args) {
  if (log_enabled(LogLevel::kInfo)) log_write(LogLevel::kInfo, cat(args...));
}
template <typename... Args>
void log_warn(const Args&... args) {
  if (log_enabled(LogLevel::kWarn)) log_write(LogLevel::kWarn, cat(args...));
}
template <typename... Args>
void log_error(const Args&... args) {
  if (log_enabled(LogLevel::kError)) log_write(LogLevel::kError, cat(args...));
}
template <typename... Args>
void log_debug(const Args&... args) {
  if (log_enabled(LogLevel::kDebug)) log_write(LogLevel::kDebug, cat(args...));
}

}  // namespace megadecode
