#include "ampforge/util/error.h"

namespace ampforge {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidArgument: return "invalid argument";
    case ErrorKind::NotImplemented: return "not implemented";
    case ErrorKind::OutOfMemory: return "out of memory";
    case ErrorKind::Io: return "I/O error";
    case ErrorKind::Interrupted: return "interrupted";
    case ErrorKind::Internal: return "internal error";
  }
  return "error";
}

namespace detail {
void throw_error(ErrorKind kind, const char* file, int line, const char* cond, std::string msg) {
  if (kind == ErrorKind::Internal) {
    // Internal errors carry the location: they are bugs and the reporter needs to find them.
    msg = fmt::format("internal error at {}:{}: {}{}{} (this is a bug in ampforge; please report it)", file, line,
                      cond ? "`" : "", cond ? cond : "", cond ? "` failed: " + msg : msg);
  }
  throw Error(kind, std::move(msg));
}
}  // namespace detail

}  // namespace ampforge
