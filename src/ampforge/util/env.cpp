#include "ampforge/util/env.h"

#include <sys/stat.h>
#include <unistd.h>

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

std::string find_program(const std::string& program) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.empty()) return {};
  if (program.find('/') != std::string::npos) return executable(program) ? program : std::string();
  const std::string path = env_get("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > begin ? path.substr(begin, end - begin) : std::string(".");
    const std::string candidate = dir + "/" + program;
    if (executable(candidate)) return candidate;
    begin = end + 1;
  }
  return {};
}

void check_program(const std::string& program, const char* who) {
  AF_CHECK(!find_program(program).empty(), "{}: '{}' is not {}", who, program,
           program.find('/') == std::string::npos ? "a program on PATH" : "an executable file");
}

}  // namespace ampforge
