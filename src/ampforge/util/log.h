// Minimal leveled logging to stderr. Level from AMPFORGE_LOG (error|warn|info|debug), default warn.
#pragma once

#include <string_view>

#include <fmt/format.h>

namespace ampforge {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, std::string_view message);

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (static_cast<int>(level) <= static_cast<int>(log_level())) log_write(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ampforge
