// Errors. Two tiers, so that a reader can tell them apart at the call site:
//   AF_CHECK(cond, fmt, args...)      a user error (bad shape, bad file, bad flag): throws ampforge::Error
//                                     with kind InvalidArgument; the CLI maps it to exit code 2.
//   AF_ASSERT(cond, fmt, args...)     an internal invariant: throws kind Internal ("this is a bug").
// Messages say what was expected, what was found and, where it helps, what to do.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace ampforge {

enum class ErrorKind {
  InvalidArgument,  // the caller passed something wrong (shapes, dtypes, values, flags)
  NotImplemented,   // e.g. an (op, device) pair without a kernel
  OutOfMemory,      // an allocator could not satisfy a request
  Io,               // files: missing, unreadable, corrupt, truncated
  Interrupted,      // the user asked to stop (SIGINT)
  Internal,         // a broken invariant inside ampforge: a bug
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message) : std::runtime_error(std::move(message)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, const char* cond, std::string msg);
}  // namespace detail

}  // namespace ampforge

// Throw an Error of the given kind with a formatted message.
#define AF_THROW(kind, ...) \
  ::ampforge::detail::throw_error(::ampforge::ErrorKind::kind, __FILE__, __LINE__, nullptr, ::fmt::format(__VA_ARGS__))

#define AF_CHECK(cond, ...)                                                                                   \
  do {                                                                                                        \
    if (!(cond)) [[unlikely]]                                                                                 \
      ::ampforge::detail::throw_error(::ampforge::ErrorKind::InvalidArgument, __FILE__, __LINE__, nullptr,    \
                                      ::fmt::format(__VA_ARGS__));                                            \
  } while (0)

#define AF_ASSERT(cond, ...)                                                                                  \
  do {                                                                                                        \
    if (!(cond)) [[unlikely]]                                                                                 \
      ::ampforge::detail::throw_error(::ampforge::ErrorKind::Internal, __FILE__, __LINE__, #cond,             \
                                      ::fmt::format(__VA_ARGS__));                                            \
  } while (0)
