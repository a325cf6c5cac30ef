#include "ampforge/hw/host_probe.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

namespace ampforge::hw {

namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\n");
  const auto e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::optional<std::string> read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return std::nullopt;
  return trim(line);
}

}  // namespace

HostInfo probe_host() {
  HostInfo h;
  h.cpu_model = Field<std::string>::missing("/proc/cpuinfo has no model name");
  if (std::ifstream f("/proc/cpuinfo"); f) {
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) {
          h.cpu_model = Field<std::string>::of(trim(line.substr(colon + 1)));
          break;
        }
      }
    }
  } else {
    h.cpu_model = Field<std::string>::missing("/proc/cpuinfo is not readable");
  }
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  h.logical_cpus = n > 0 ? Field<int>::of(static_cast<int>(n)) : Field<int>::missing("sysconf failed");

  h.ram_total_bytes = Field<uint64_t>::missing("/proc/meminfo is not readable");
  h.ram_available_bytes = Field<uint64_t>::missing("/proc/meminfo has no MemAvailable");
  if (std::ifstream f("/proc/meminfo"); f) {
    std::string key;
    uint64_t kb = 0;
    std::string unit;
    while (f >> key >> kb) {
      std::getline(f, unit);
      if (key == "MemTotal:") h.ram_total_bytes = Field<uint64_t>::of(kb * 1024);
      if (key == "MemAvailable:") h.ram_available_bytes = Field<uint64_t>::of(kb * 1024);
    }
  }

  std::map<std::string, int> governors;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/devices/system/cpu", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("cpu", 0) != 0 || name.size() < 4 || !std::isdigit(static_cast<unsigned char>(name[3]))) continue;
    if (auto g = read_first_line(entry.path().string() + "/cpufreq/scaling_governor")) ++governors[*g];
  }
  if (governors.empty()) {
    h.cpu_governor = Field<std::string>::missing("no cpufreq in /sys (VM or container, or a driver without governors)");
  } else if (governors.size() == 1) {
    h.cpu_governor = Field<std::string>::of(governors.begin()->first);
  } else {
    std::string s;
    for (const auto& [g, count] : governors) s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", g, count);
    h.cpu_governor = Field<std::string>::of(s);
  }

  utsname u{};
  if (::uname(&u) == 0)
    h.kernel = Field<std::string>::of(fmt::format("{} {} {}", u.sysname, u.release, u.machine));
  else
    h.kernel = Field<std::string>::missing("uname failed");
  return h;
}

}  // namespace ampforge::hw
