#include "ampforge/util/file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "ampforge/util/error.h"

namespace ampforge {

void write_file_atomically(const std::string& path, std::string_view bytes, const char* what) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) AF_THROW(Io, "cannot write the {} '{}' ({}): {}", what, path, tmp, std::strerror(errno));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) {
      f.close();
      std::remove(tmp.c_str());
      AF_THROW(Io, "writing the {} '{}' failed (disk full?)", what, path);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    AF_THROW(Io, "cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  }
}

}  // namespace ampforge
