// Reading environment variables with defaults and strict parsing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ampforge {

std::optional<std::string> env_get(const char* name);
// Integer variable; a value that is not an integer raises an InvalidArgument error naming the variable.
int64_t env_int(const char* name, int64_t fallback);
bool env_flag(const char* name, bool fallback);

}  // namespace ampforge
