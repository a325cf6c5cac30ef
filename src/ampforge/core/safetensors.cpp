// safetensors reader/writer. See safetensors.h for the format and the contract (atomic save, full
// validation on load). Byte order: the format is little-endian and so is every host ampforge supports
// (static_assert below), so tensor bytes are copied as they are.
#include "ampforge/core/safetensors.h"

#include <atomic>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ampforge/util/error.h"

namespace ampforge {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
// Every ampforge dtype has a safetensors name (guarded below, so a new dtype cannot be forgotten).
constexpr DTypeName kDTypeNames[] = {{DType::F32, "F32"}, {DType::F16, "F16"}, {DType::BF16, "BF16"},
                                     {DType::F64, "F64"}, {DType::I32, "I32"}, {DType::I64, "I64"},
                                     {DType::U8, "U8"},   {DType::Bool, "BOOL"}};
static_assert(sizeof(kDTypeNames) / sizeof(kDTypeNames[0]) == kNumDTypes, "safetensors: a dtype lacks a name");

std::string errno_text() { return std::strerror(errno); }

// Removes the temporary file unless released (the success path renames it away first).
class TmpFileGuard {
 public:
  explicit TmpFileGuard(std::string path) : path_(std::move(path)) {}
  ~TmpFileGuard() {
    if (fd_ >= 0) ::close(fd_);
    if (!released_) ::unlink(path_.c_str());
  }
  TmpFileGuard(const TmpFileGuard&) = delete;
  TmpFileGuard& operator=(const TmpFileGuard&) = delete;
  void set_fd(int fd) { fd_ = fd; }
  int fd() const { return fd_; }
  void close_fd() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) AF_THROW(Io, "safetensors: closing '{}' failed: {}", path_, errno_text());
  }
  void release() { released_ = true; }

 private:
  std::string path_;
  int fd_ = -1;
  bool released_ = false;
};

// Writes into the temporary file `tmp` of a save of `path`.
void write_all(int fd, const void* data, size_t n, const std::string& tmp, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      const bool full = errno == ENOSPC || errno == EDQUOT;
      AF_THROW(Io, "save_safetensors: writing '{}' failed: {}{}", tmp, errno_text(),
               full ? fmt::format(" (the disk holding '{}' is full; '{}' is unchanged and the temporary file is "
                                  "removed: free some space and save again)", path, path)
                    : fmt::format(" ('{}' is unchanged)", path));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Bytes of `t` in row-major order (a gather for non-contiguous views).
std::vector<char> contiguous_bytes(const Tensor& t) {
  const int64_t n = t.numel(), es = t.element_size();
  std::vector<char> out(static_cast<size_t>(n * es));
  if (n == 0) return out;
  const char* base = static_cast<const char*>(t.storage()->data()) + t.offset() * es;
  if (t.is_contiguous()) {
    std::memcpy(out.data(), base, out.size());
    return out;
  }
  const Shape& s = t.shape();
  const Strides& st = t.strides();
  const int nd = s.size();
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  int64_t off = 0;  // element offset of idx
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out.data() + i * es, base + off * es, static_cast<size_t>(es));
    for (int d = nd - 1; d >= 0; --d) {  // odometer increment, keeping `off` in step
      if (++idx[d] < s[d]) {
        off += st[d];
        break;
      }
      off -= st[d] * (s[d] - 1);
      idx[d] = 0;
    }
  }
  return out;
}

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  AF_THROW(Io, "safetensors file '{}': {}", path, what);
}

DType parse_dtype(const std::string& path, const std::string& tensor, const std::string& name) {
  for (const auto& e : kDTypeNames)
    if (name == e.name) return e.dtype;
  bad_file(path, fmt::format("tensor '{}' has unknown dtype '{}' (expected one of F32, F16, BF16, F64, I32, I64, "
                             "U8, BOOL)",
                             tensor, name));
}

class FileReader {
 public:
  explicit FileReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      if (errno == ENOENT) bad_file(path, "no such file");
      bad_file(path, "cannot open: " + errno_text());
    }
    struct stat sb {};
    if (::fstat(fd_, &sb) != 0) bad_file(path, "cannot stat: " + errno_text());
    if (!S_ISREG(sb.st_mode)) bad_file(path, "not a regular file");
    size_ = static_cast<uint64_t>(sb.st_size);
  }
  ~FileReader() { ::close(fd_); }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  uint64_t size() const { return size_; }
  void read_at(uint64_t pos, void* dst, uint64_t n) {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(pos));
      if (r < 0) {
        if (errno == EINTR) continue;
        bad_file(path_, "read failed: " + errno_text());
      }
      if (r == 0) bad_file(path_, fmt::format("unexpected end of file at byte {}", pos));
      p += r;
      pos += static_cast<uint64_t>(r);
      n -= static_cast<uint64_t>(r);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

}  // namespace

const char* safetensors_dtype_name(DType d) {
  for (const auto& e : kDTypeNames)
    if (e.dtype == d) return e.name;
  AF_THROW(Internal, "safetensors_dtype_name: dtype {} has no name", static_cast<int>(d));
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& p) { return p.first == name; });
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& p : tensors)
    if (p.first == name) return p.second;
  AF_THROW(InvalidArgument, "safetensors: no tensor named '{}' ({} tensors in the file)", name, tensors.size());
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Validate everything before touching the file system.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json md = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header["__metadata__"] = md;
  }
  uint64_t pos = 0;
  for (const auto& [name, t] : tensors) {
    AF_CHECK(!name.empty() && name != "__metadata__", "save_safetensors('{}'): invalid tensor name '{}'", path, name);
    AF_CHECK(!header.contains(name), "save_safetensors('{}'): tensor name '{}' appears twice", path, name);
    AF_CHECK(t.defined(), "save_safetensors('{}'): tensor '{}' is undefined", path, name);
    AF_CHECK(t.device().is_cpu(),
             "save_safetensors('{}'): tensor '{}' is on {}; only CPU tensors can be saved for now (copy it with "
             ".to(kCPU) first)",
             path, name, t.device().str());
    const uint64_t nb = static_cast<uint64_t>(t.nbytes());
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())}, {"shape", t.shape().vec()}, {"data_offsets", {pos, pos + nb}}};
    pos += nb;
  }
  std::string hdr = header.dump();
  hdr.append((8 - hdr.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned (as the reference writer)
  const uint64_t hlen = hdr.size();

  // Unique per process and per thread (two threads of one process may save the same path), and per call.
  static std::atomic<uint64_t> serial{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}.{}", path, static_cast<long>(::getpid()),
                                      static_cast<long>(::gettid()), serial.fetch_add(1));
  TmpFileGuard guard(tmp);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) AF_THROW(Io, "save_safetensors: cannot create '{}': {}", tmp, errno_text());
  guard.set_fd(fd);
  write_all(fd, &hlen, 8, tmp, path);
  write_all(fd, hdr.data(), hdr.size(), tmp, path);
  for (const auto& [name, t] : tensors) {
    const std::vector<char> bytes = contiguous_bytes(t);
    write_all(fd, bytes.data(), bytes.size(), tmp, path);
  }
  if (::fsync(fd) != 0) AF_THROW(Io, "save_safetensors: fsync of '{}' failed: {}", tmp, errno_text());
  guard.close_fd();
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    AF_THROW(Io, "save_safetensors: renaming '{}' to '{}' failed: {}", tmp, path, errno_text());
  guard.release();
  // The rename is durable only once the directory entry is on disk.
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) AF_THROW(Io, "save_safetensors: cannot open directory '{}' to sync it: {}", dir, errno_text());
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) AF_THROW(Io, "save_safetensors: fsync of directory '{}' failed: {}", dir, std::strerror(err));
}

SafetensorsFile load_safetensors(const std::string& path) {
  FileReader f(path);
  const uint64_t fsize = f.size();
  if (fsize < 8) bad_file(path, fmt::format("file is {} bytes, shorter than the 8-byte header length", fsize));
  uint64_t hlen = 0;
  f.read_at(0, &hlen, 8);
  if (hlen > kSafetensorsMaxHeaderBytes)
    bad_file(path, fmt::format("header length {} is absurd (limit {} bytes): corrupt or not a safetensors file", hlen,
                               kSafetensorsMaxHeaderBytes));
  if (hlen > fsize - 8)
    bad_file(path, fmt::format("header length {} goes beyond the end of the file ({} bytes)", hlen, fsize));
  std::string hdr(static_cast<size_t>(hlen), '\0');
  f.read_at(8, hdr.data(), hlen);

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(hdr);
  } catch (const nlohmann::json::exception& e) {
    bad_file(path, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) bad_file(path, "header is not a JSON object");

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) bad_file(path, "__metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) bad_file(path, fmt::format("__metadata__ value of '{}' is not a string", k));
        out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) bad_file(path, fmt::format("entry '{}' is not an object", name));
    if (!v.contains("dtype") || !v["dtype"].is_string())
      bad_file(path, fmt::format("tensor '{}' has no string 'dtype'", name));
    if (!v.contains("shape") || !v["shape"].is_array())
      bad_file(path, fmt::format("tensor '{}' has no 'shape' array", name));
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      bad_file(path, fmt::format("tensor '{}' has no 'data_offsets' [begin, end]", name));
    Entry e;
    e.name = name;
    e.dtype = parse_dtype(path, name, v["dtype"].get<std::string>());
    const auto& sh = v["shape"];
    if (sh.size() > static_cast<size_t>(kMaxDims))
      bad_file(path, fmt::format("tensor '{}' has {} dims; ampforge supports at most {}", name, sh.size(), kMaxDims));
    uint64_t numel = 1;
    for (const auto& d : sh) {
      if (!d.is_number_unsigned()) bad_file(path, fmt::format("tensor '{}' has a shape entry that is not a size: {}", name, d.dump()));
      const uint64_t dv = d.get<uint64_t>();
      if (dv > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dv, &numel))
        bad_file(path, fmt::format("tensor '{}' has an absurd shape {}", name, sh.dump()));
      e.shape.push_back(static_cast<int64_t>(dv));
    }
    for (const auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) bad_file(path, fmt::format("tensor '{}' has a non-integer data offset", name));
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    uint64_t want = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &want))
      bad_file(path, fmt::format("tensor '{}' has an absurd shape {}", name, sh.dump()));
    if (e.end < e.begin)
      bad_file(path, fmt::format("tensor '{}' has data_offsets [{}, {}] with end before begin", name, e.begin, e.end));
    if (e.end - e.begin != want)
      bad_file(path, fmt::format("tensor '{}' ({} {}) needs {} bytes but its data_offsets [{}, {}] span {}", name,
                                 v["dtype"].get<std::string>(), sh.dump(), want, e.begin, e.end, e.end - e.begin));
    entries.push_back(std::move(e));
  }

  // The tensors must tile the data section exactly: no overlap, no hole, nothing missing at the end.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_start = 8 + hlen, data_size = fsize - data_start;
  uint64_t prev_end = 0;
  std::string prev_name;
  for (const Entry& e : entries) {
    if (e.begin < prev_end)
      bad_file(path, fmt::format("tensors '{}' and '{}' overlap (data_offsets begin {} < previous end {})", prev_name,
                                 e.name, e.begin, prev_end));
    if (e.begin > prev_end)
      bad_file(path, fmt::format("hole in the data before tensor '{}' (begins at {}, previous data ends at {})", e.name,
                                 e.begin, prev_end));
    if (e.end > data_size)
      bad_file(path, fmt::format("truncated: tensor '{}' needs data up to byte {} but the data section has {} bytes",
                                 e.name, e.end, data_size));
    prev_end = e.end;
    prev_name = e.name;
  }
  if (prev_end != data_size)
    bad_file(path, fmt::format("{} unexpected bytes after the last tensor (data section {} bytes, tensors end at {})",
                               data_size - prev_end, data_size, prev_end));

  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype, kCPU);
    if (e.end > e.begin) f.read_at(data_start + e.begin, t.data_ptr(), e.end - e.begin);
    if (e.dtype == DType::Bool) {  // any other byte value would be undefined behaviour as a C++ bool
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      for (int64_t i = 0; i < t.numel(); ++i)
        if (p[i] > 1) bad_file(path, fmt::format("BOOL tensor '{}' holds byte {} at element {}", e.name, p[i], i));
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace ampforge
