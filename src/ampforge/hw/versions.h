// Versions: parsing and comparing dotted versions, and which NVIDIA driver each CUDA release needs.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ampforge::hw {

// A dotted version, "570.124.06" or "2.0.1+cu118". Compares numerically, field by field; missing fields are 0.
struct Version {
  std::vector<int> parts;

  static std::optional<Version> parse(std::string_view text);  // nullopt when it does not start with a digit
  // CUDA's integer encoding, 1000*major + 10*minor (12040 -> 12.4).
  static Version from_cuda_int(int v);
  int major() const { return parts.empty() ? 0 : parts[0]; }
  int minor() const { return parts.size() < 2 ? 0 : parts[1]; }
  std::string str() const;
  friend int compare(const Version& a, const Version& b);
  friend bool operator<(const Version& a, const Version& b) { return compare(a, b) < 0; }
  friend bool operator>=(const Version& a, const Version& b) { return compare(a, b) >= 0; }
  friend bool operator==(const Version& a, const Version& b) { return compare(a, b) == 0; }
};

std::string cuda_version_string(int cuda_int);  // 12040 -> "12.4"

struct CudaDriverRequirement {
  int cuda_major, cuda_minor;
  std::string_view min_driver;        // Linux x86_64 driver that the release (GA) requires
  std::string_view min_driver_minor;  // minimum for CUDA minor-version compatibility within the major
};

// The table (CUDA 10.0 .. 13.0), newest first.
const std::vector<CudaDriverRequirement>& cuda_driver_table();
// The row for a CUDA release; for a release newer than the table, nullopt.
std::optional<CudaDriverRequirement> cuda_driver_requirement(int cuda_major, int cuda_minor);

// Is `driver` new enough for CUDA `cuda_int`? Full: driver >= the release's minimum. MinorCompat: runs under
// CUDA minor-version compatibility (same major; PTX JIT of newer PTX and some new features fail). TooOld.
// Unknown: the release is not in the table.
enum class DriverFit { Full, MinorCompat, TooOld, Unknown };
DriverFit driver_fits_cuda(const Version& driver, int cuda_int, std::optional<int> driver_cuda_int);

}  // namespace ampforge::hw
