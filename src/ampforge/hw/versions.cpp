#include "ampforge/hw/versions.h"

#include <cctype>

#include <fmt/format.h>

namespace ampforge::hw {

std::optional<Version> Version::parse(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i < text.size() && (text[i] == 'v' || text[i] == 'V')) ++i;
  if (i >= text.size() || !std::isdigit(static_cast<unsigned char>(text[i]))) return std::nullopt;
  Version v;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    long part = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      part = part * 10 + (text[i] - '0');
      if (part > 1000000000L) return std::nullopt;
      ++i;
    }
    v.parts.push_back(static_cast<int>(part));
    if (i + 1 < text.size() && text[i] == '.' && std::isdigit(static_cast<unsigned char>(text[i + 1])))
      ++i;
    else
      break;
  }
  return v;
}

Version Version::from_cuda_int(int v) { return Version{{v / 1000, (v % 1000) / 10}}; }

std::string Version::str() const {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) s += '.';
    s += std::to_string(parts[i]);
  }
  return s;
}

int compare(const Version& a, const Version& b) {
  const size_t n = std::max(a.parts.size(), b.parts.size());
  for (size_t i = 0; i < n; ++i) {
    const int x = i < a.parts.size() ? a.parts[i] : 0;
    const int y = i < b.parts.size() ? b.parts[i] : 0;
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

std::string cuda_version_string(int cuda_int) { return Version::from_cuda_int(cuda_int).str(); }

// Source: NVIDIA CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding Driver Versions" (Table 3,
// Linux x86_64, the GA release of each minor version) and "CUDA Toolkit and Minimum Required Driver Version
// for CUDA Minor Version Compatibility" (Table 2): 13.x >= 580, 12.x >= 525.60.13, 11.x >= 450.80.02.
// An "Update" release of a minor version can require a slightly newer driver than its GA; the runtime
// reports only major.minor, so the GA row is what can be checked.
const std::vector<CudaDriverRequirement>& cuda_driver_table() {
  static const std::vector<CudaDriverRequirement> table = {
      {13, 0, "580.65.06", "580"},
      {12, 9, "575.51.03", "525.60.13"},
      {12, 8, "570.26", "525.60.13"},
      {12, 6, "560.28.03", "525.60.13"},
      {12, 5, "555.42.02", "525.60.13"},
      {12, 4, "550.54.14", "525.60.13"},
      {12, 3, "545.23.06", "525.60.13"},
      {12, 2, "535.54.03", "525.60.13"},
      {12, 1, "530.30.02", "525.60.13"},
      {12, 0, "525.60.13", "525.60.13"},
      {11, 8, "520.61.05", "450.80.02"},
      {11, 7, "515.43.04", "450.80.02"},
      {11, 6, "510.39.01", "450.80.02"},
      {11, 5, "495.29.05", "450.80.02"},
      {11, 4, "470.42.01", "450.80.02"},
      {11, 3, "465.19.01", "450.80.02"},
      {11, 2, "460.27.03", "450.80.02"},
      {11, 1, "455.23", "450.80.02"},
      {11, 0, "450.51.05", "450.51.05"},
      {10, 2, "440.33", "440.33"},
      {10, 1, "418.39", "418.39"},
      {10, 0, "410.48", "410.48"},
  };
  return table;
}

std::optional<CudaDriverRequirement> cuda_driver_requirement(int cuda_major, int cuda_minor) {
  for (const auto& r : cuda_driver_table())
    if (r.cuda_major == cuda_major && r.cuda_minor == cuda_minor) return r;
  // A minor release missing from the table (12.7 was never released) takes the next older row of its major.
  for (const auto& r : cuda_driver_table())
    if (r.cuda_major == cuda_major && r.cuda_minor < cuda_minor) {
      const auto& newest = cuda_driver_table().front();
      if (cuda_major > newest.cuda_major || (cuda_major == newest.cuda_major && cuda_minor > newest.cuda_minor))
        return std::nullopt;
      return r;
    }
  return std::nullopt;
}

namespace {
// The minimum driver for CUDA minor-version compatibility is one per major (Table 2: 13.x >= 580, ...): it holds
// for a minor release newer than the table too (a CUDA 13.1 runtime on driver 580, which supports 13.0).
// (The x.0 rows give their own GA driver, which for 11.0 is below 11.x's 450.80.02: a later row of the major is
// preferred.)
std::optional<std::string_view> minor_compat_driver(int cuda_major) {
  std::optional<std::string_view> ga_row;
  for (const auto& r : cuda_driver_table()) {
    if (r.cuda_major != cuda_major) continue;
    if (r.cuda_minor > 0) return r.min_driver_minor;
    ga_row = r.min_driver_minor;
  }
  return ga_row;
}
}  // namespace

DriverFit driver_fits_cuda(const Version& driver, int cuda_int, std::optional<int> driver_cuda_int) {
  const Version cuda = Version::from_cuda_int(cuda_int);
  // The driver's own statement (nvmlSystemGetCudaDriverVersion) is authoritative when present.
  if (driver_cuda_int) {
    const Version supported = Version::from_cuda_int(*driver_cuda_int);
    if (supported >= cuda) return DriverFit::Full;
    const auto compat = minor_compat_driver(cuda.major());
    if (compat && supported.major() == cuda.major() && driver >= *Version::parse(*compat))
      return DriverFit::MinorCompat;
    return DriverFit::TooOld;
  }
  auto req = cuda_driver_requirement(cuda.major(), cuda.minor());
  if (!req) return DriverFit::Unknown;
  if (driver >= *Version::parse(req->min_driver)) return DriverFit::Full;
  if (driver >= *Version::parse(req->min_driver_minor)) return DriverFit::MinorCompat;
  return DriverFit::TooOld;
}

}  // namespace ampforge::hw
