// Test helper: environment variables set for a scope. Header-only, for the test binaries (any module's tests
// may use it: util is the bottom layer).
#pragma once

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

namespace ampforge::testutil {

// Sets (or, with nullopt, unsets) environment variables until destroyed, then restores them.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::optional<std::string>>& vars) {
    for (const auto& [k, v] : vars) set(k, v);
  }
  // One variable: ScopedEnv env("AMPFORGE_CPU_CONV", "im2col"). (A braced one-entry map is ambiguous with two
  // string literals: std::map's iterator-pair constructor also matches.)
  ScopedEnv(const std::string& name, std::optional<std::string> value) { set(name, value); }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::string& k, const std::optional<std::string>& v) {
    if (!saved_.count(k)) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (v) ::setenv(k.c_str(), v->c_str(), 1);
    else ::unsetenv(k.c_str());
  }

  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace ampforge::testutil
