#include "ampforge/util/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "ampforge/util/error.h"

namespace ampforge {

void write_file_atomically(const std::string& path, std::string_view bytes, const char* what) {
  // Unique per process, thread and call: two threads writing the same path never share a temporary file.
  static std::atomic<uint64_t> serial{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}.{}", path, static_cast<long>(::getpid()),
                                      static_cast<long>(::syscall(SYS_gettid)), serial.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) AF_THROW(Io, "cannot write the {} '{}' ({}): {}", what, path, tmp, std::strerror(errno));
  // POSIX calls rather than a stream: the error of the call that failed (ENOSPC, EDQUOT, EIO) is known.
  auto fail = [&](const char* step) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    AF_THROW(Io, "{} the {} '{}' failed: {} ('{}' is unchanged{})", step, what, path, std::strerror(err), path,
             err == ENOSPC || err == EDQUOT ? "; the disk is full" : "");
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("writing");
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    AF_THROW(Io, "closing the {} '{}' failed: {} ('{}' is unchanged)", what, path, std::strerror(err), path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    AF_THROW(Io, "cannot rename '{}' to '{}': {}", tmp, path, std::strerror(err));
  }
}

void check_readable_file(const std::string& path, const char* what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) AF_THROW(Io, "cannot open the {} '{}': {}", what, path, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) AF_THROW(InvalidArgument, "'{}' is a directory, not a {}", path, what);
  if (::access(path.c_str(), R_OK) != 0) AF_THROW(Io, "cannot open the {} '{}': {}", what, path, std::strerror(errno));
}

std::string excerpt_for_message(std::string_view bytes, size_t max) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

}  // namespace ampforge
