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

// The path of an executable regular file: `program` itself when it names a path (contains '/'), else the first of
// that name in $PATH (default /usr/local/bin:/usr/bin:/bin; an empty entry is the current directory); "" when there
// is none.
std::string find_program(const std::string& program);
// Throws InvalidArgument "<who>: '<program>' is not a program on PATH" (or "... is not an executable file" for a
// path) unless find_program finds it: what a command that starts another program (launch, profile) checks before
// starting anything.
void check_program(const std::string& program, const char* who);

}  // namespace ampforge
