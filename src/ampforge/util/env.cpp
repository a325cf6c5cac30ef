#include "ampforge/util/env.h"

#include <cstdlib>

#include "ampforge/util/error.h"

namespace ampforge {

std::optional<std::string> env_get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int64_t env_int(const char* name, int64_t fallback) {
  auto v = env_get(name);
  if (!v || v->empty()) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  AF_CHECK(end != nullptr && *end == '\0', "environment variable {}: expected an integer, got '{}'", name, *v);
  return x;
}

bool env_flag(const char* name, bool fallback) {
  auto v = env_get(name);
  if (!v || v->empty()) return fallback;
  return !(*v == "0" || *v == "false" || *v == "off" || *v == "no");
}

}  // namespace ampforge
