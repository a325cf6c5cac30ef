#include "ampforge/util/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "ampforge/util/env.h"

namespace ampforge {
namespace {
LogLevel parse_level() {
  auto v = env_get("AMPFORGE_LOG");
  if (!v) return LogLevel::Warn;
  if (*v == "error") return LogLevel::Error;
  if (*v == "info") return LogLevel::Info;
  if (*v == "debug") return LogLevel::Debug;
  return LogLevel::Warn;
}
std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(parse_level())};
  return level;
}
}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_ref().load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { level_ref().store(static_cast<int>(level)); }

void log_write(LogLevel level, std::string_view message) {
  static std::mutex m;
  static const char* names[] = {"error", "warning", "info", "debug"};
  std::lock_guard<std::mutex> lk(m);
  std::fprintf(stderr, "ampforge %s: %.*s\n", names[static_cast<int>(level)], static_cast<int>(message.size()),
               message.data());
}

}  // namespace ampforge
