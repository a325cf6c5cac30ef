#include "ampforge/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "ampforge/util/error.h"

namespace ampforge::data {

IdxArray read_idx_u8(const std::string& path) {
  AF_CHECK(!path.empty(), "IDX: empty file name");
  if (!std::filesystem::exists(path)) AF_THROW(Io, "IDX file '{}' does not exist", path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) AF_THROW(Io, "cannot open IDX file '{}'", path);
  std::unique_ptr<gzFile_s, int (*)(gzFile)> guard(f, gzclose);
  auto read_exact = [&](void* dst, size_t n, const char* what) {
    size_t got = 0;
    while (got < n) {
      int r = gzread(f, static_cast<char*>(dst) + got, static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30)));
      if (r < 0) {
        int err = 0;
        AF_THROW(Io, "IDX file '{}': read error in {} ({})", path, what, gzerror(f, &err));
      }
      if (r == 0) AF_THROW(Io, "IDX file '{}' is truncated: expected {} bytes of {}, got {}", path, n, what, got);
      got += static_cast<size_t>(r);
    }
  };
  unsigned char magic[4];
  read_exact(magic, 4, "the magic number");
  if (magic[0] != 0 || magic[1] != 0)
    AF_THROW(Io, "'{}' is not an IDX file: the magic number starts with {:02x} {:02x}, expected 00 00", path, magic[0],
             magic[1]);
  if (magic[2] != 0x08)
    AF_THROW(Io, "IDX file '{}' holds type code 0x{:02x}; only unsigned bytes (0x08) are supported", path, magic[2]);
  const int ndim = magic[3];
  if (ndim < 1 || ndim > 4) AF_THROW(Io, "IDX file '{}' declares {} dimensions (expected 1 to 4)", path, ndim);
  IdxArray a;
  uint64_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    unsigned char b[4];
    read_exact(b, 4, "the dimension sizes");
    const uint32_t s = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
    a.shape.push_back(s);
    total *= s;
    if (total > (uint64_t{1} << 34)) AF_THROW(Io, "IDX file '{}' declares an absurd size (over 16 GiB)", path);
  }
  // The sizes are only the file's claim: read in pieces, so a truncated or lying file fails after reading what
  // it holds instead of first allocating up to 16 GiB (gzip gives no size to check against up front).
  constexpr uint64_t kPiece = uint64_t{16} << 20;
  a.data.reserve(static_cast<size_t>(std::min(total, kPiece)));
  while (a.data.size() < total) {
    const size_t at = a.data.size();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPiece, total - at));
    a.data.resize(at + n);
    read_exact(a.data.data() + at, n, "the data");
  }
  unsigned char extra;
  if (gzread(f, &extra, 1) > 0)
    AF_THROW(Io, "IDX file '{}' has trailing bytes after the {} declared elements", path, total);
  return a;
}

}  // namespace ampforge::data
