#include "ampforge/hw/nvml.h"

#include <cstring>

#include <fmt/format.h>

#include "ampforge/util/env.h"

namespace ampforge::hw {

namespace {
struct ReasonName {
  uint64_t bit;
  const char* name;
};
constexpr ReasonName kReasonNames[] = {
    {nvml::kReasonGpuIdle, "gpu_idle"},
    {nvml::kReasonApplicationsClocksSetting, "applications_clocks"},
    {nvml::kReasonSwPowerCap, "sw_power_cap"},
    {nvml::kReasonHwSlowdown, "hw_slowdown"},
    {nvml::kReasonSyncBoost, "sync_boost"},
    {nvml::kReasonSwThermalSlowdown, "sw_thermal"},
    {nvml::kReasonHwThermalSlowdown, "hw_thermal"},
    {nvml::kReasonHwPowerBrakeSlowdown, "hw_power_brake"},
    {nvml::kReasonDisplayClockSetting, "display_clocks"},
};
}  // namespace

std::vector<std::string> throttle_reason_names(uint64_t mask) {
  std::vector<std::string> out;
  uint64_t known = 0;
  for (const auto& r : kReasonNames) {
    known |= r.bit;
    if (mask & r.bit) out.emplace_back(r.name);
  }
  if (mask & ~known) out.push_back(fmt::format("other_0x{:x}", mask & ~known));
  return out;
}

uint64_t throttle_reasons_active_mask() {
  return nvml::kReasonSwPowerCap | nvml::kReasonHwSlowdown | nvml::kReasonSwThermalSlowdown |
         nvml::kReasonHwThermalSlowdown | nvml::kReasonHwPowerBrakeSlowdown;
}

// ---------------------------------------------------------------------------------------------------------
// NvmlDevice

template <class T>
Field<T> NvmlDevice::fail(nvml::Return r, const char* fname) {
  switch (r) {
    case nvml::kErrorNotSupported: return Field<T>::missing("not supported");
    case nvml::kErrorNoPermission: return Field<T>::missing("no permission");
    // A function this driver no longer serves is a missing reading, not a fault of the GPU.
    case nvml::kErrorDeprecated: return Field<T>::missing(fmt::format("{} removed from this driver", fname));
    case nvml::kErrorGpuIsLost:
      lost_ = true;
      if (error_.empty()) error_ = fmt::format("{}: GPU is lost", fname);
      return Field<T>::missing("GPU is lost");
    default: {
      std::string msg = fmt::format("{}: {}", fname, lib_->error_string(r));
      if (error_.empty()) error_ = msg;
      return Field<T>::missing(msg);
    }
  }
}

template <class T, class Fn, class... A>
Field<T> NvmlDevice::get(Fn fn, const char* fname, A... args) {
  if (!fn) return Field<T>::missing(fmt::format("{} not in this NVML", fname));
  if (lost_) return Field<T>::missing("GPU is lost");
  T out{};
  nvml::Return r = fn(h_, args..., &out);
  if (r != nvml::kSuccess) return fail<T>(r, fname);
  return Field<T>::of(out);
}

Field<std::string> NvmlDevice::get_string(nvml::Return (*fn)(nvml::Device, char*, unsigned), const char* fname) {
  if (!fn) return Field<std::string>::missing(fmt::format("{} not in this NVML", fname));
  if (lost_) return Field<std::string>::missing("GPU is lost");
  char buf[256] = {};
  nvml::Return r = fn(h_, buf, sizeof(buf) - 1);
  if (r != nvml::kSuccess) return fail<std::string>(r, fname);
  return Field<std::string>::of(std::string(buf, strnlen(buf, sizeof(buf))));
}

#define AMPFORGE_FN(name) lib_->api().name, #name

Field<std::string> NvmlDevice::name() { return get_string(AMPFORGE_FN(nvmlDeviceGetName)); }
Field<std::string> NvmlDevice::uuid() { return get_string(AMPFORGE_FN(nvmlDeviceGetUUID)); }

Field<std::string> NvmlDevice::pci_bus_id() {
  auto f = get<nvml::PciInfo>(AMPFORGE_FN(nvmlDeviceGetPciInfo_v3));
  if (!f.ok()) return Field<std::string>::missing(f.na);
  return Field<std::string>::of(std::string(f->busId, strnlen(f->busId, sizeof(f->busId))));
}

Field<std::pair<int, int>> NvmlDevice::compute_capability() {
  const auto fn = lib_->api().nvmlDeviceGetCudaComputeCapability;
  if (!fn) return Field<std::pair<int, int>>::missing("nvmlDeviceGetCudaComputeCapability not in this NVML");
  if (lost_) return Field<std::pair<int, int>>::missing("GPU is lost");
  int major = 0, minor = 0;
  nvml::Return r = fn(h_, &major, &minor);
  if (r != nvml::kSuccess) return fail<std::pair<int, int>>(r, "nvmlDeviceGetCudaComputeCapability");
  return Field<std::pair<int, int>>::of({major, minor});
}

Field<nvml::Memory> NvmlDevice::memory() { return get<nvml::Memory>(AMPFORGE_FN(nvmlDeviceGetMemoryInfo)); }
Field<nvml::Utilization> NvmlDevice::utilization() {
  return get<nvml::Utilization>(AMPFORGE_FN(nvmlDeviceGetUtilizationRates));
}
Field<unsigned> NvmlDevice::clock_mhz(int t) { return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetClockInfo), t); }
Field<unsigned> NvmlDevice::max_clock_mhz(int t) { return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetMaxClockInfo), t); }
Field<unsigned> NvmlDevice::pcie_gen_current() { return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetCurrPcieLinkGeneration)); }
Field<unsigned> NvmlDevice::pcie_gen_max_system() {
  return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetMaxPcieLinkGeneration));
}
Field<unsigned> NvmlDevice::pcie_gen_max_gpu() { return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetGpuMaxPcieLinkGeneration)); }
Field<unsigned> NvmlDevice::pcie_width_current() { return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetCurrPcieLinkWidth)); }
Field<unsigned> NvmlDevice::pcie_width_max() { return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetMaxPcieLinkWidth)); }
Field<unsigned> NvmlDevice::pcie_throughput_kbps(int counter) {
  return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetPcieThroughput), counter);
}
Field<unsigned> NvmlDevice::temperature_c() {
  // nvmlDeviceGetTemperatureV (drivers >= 565) first: nvmlDeviceGetTemperature is deprecated since CUDA 13.0 and
  // removed in 14.0. Any failure of the new one other than a lost GPU falls back to the old one, which then
  // gives the reason (an older driver, a struct version it does not know, ...).
  if (const auto v = lib_->api().nvmlDeviceGetTemperatureV; v != nullptr && !lost_) {
    nvml::Temperature t{nvml::kTemperatureV1, nvml::kTemperatureGpu, 0};
    const nvml::Return r = v(h_, &t);
    if (r == nvml::kSuccess && t.temperature >= 0) return Field<unsigned>::of(static_cast<unsigned>(t.temperature));
    if (r == nvml::kErrorGpuIsLost) return fail<unsigned>(r, "nvmlDeviceGetTemperatureV");
  }
  return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetTemperature), nvml::kTemperatureGpu);
}
Field<unsigned> NvmlDevice::temperature_threshold_c(int threshold) {
  return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetTemperatureThreshold), threshold);
}
Field<unsigned> NvmlDevice::fan_percent() { return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetFanSpeed)); }
Field<unsigned> NvmlDevice::power_mw() { return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetPowerUsage)); }
Field<unsigned> NvmlDevice::power_limit_mw() { return get<unsigned>(AMPFORGE_FN(nvmlDeviceGetEnforcedPowerLimit)); }

Field<uint64_t> NvmlDevice::clocks_event_reasons() {
  // The "clocks event" name replaced "throttle" in driver 535; older drivers export only the old one.
  Field<unsigned long long> f;
  if (lib_->api().nvmlDeviceGetCurrentClocksEventReasons)
    f = get<unsigned long long>(AMPFORGE_FN(nvmlDeviceGetCurrentClocksEventReasons));
  else
    f = get<unsigned long long>(AMPFORGE_FN(nvmlDeviceGetCurrentClocksThrottleReasons));
  if (!f.ok()) return Field<uint64_t>::missing(f.na);
  return Field<uint64_t>::of(*f);
}

Field<bool> NvmlDevice::ecc_enabled() {
  const auto fn = lib_->api().nvmlDeviceGetEccMode;
  if (!fn) return Field<bool>::missing("nvmlDeviceGetEccMode not in this NVML");
  if (lost_) return Field<bool>::missing("GPU is lost");
  int current = 0, pending = 0;
  nvml::Return r = fn(h_, &current, &pending);
  if (r != nvml::kSuccess) return fail<bool>(r, "nvmlDeviceGetEccMode");
  return Field<bool>::of(current == nvml::kFeatureEnabled);
}

Field<uint64_t> NvmlDevice::ecc_errors(int error_type, int counter_type) {
  auto f = get<unsigned long long>(AMPFORGE_FN(nvmlDeviceGetTotalEccErrors), error_type, counter_type);
  if (!f.ok()) return Field<uint64_t>::missing(f.na);
  return Field<uint64_t>::of(*f);
}

Field<bool> NvmlDevice::persistence_mode() {
  auto f = get<int>(AMPFORGE_FN(nvmlDeviceGetPersistenceMode));
  if (!f.ok()) return Field<bool>::missing(f.na);
  return Field<bool>::of(*f == nvml::kFeatureEnabled);
}

Field<NvmlDevice::Mig> NvmlDevice::mig_mode() {
  const auto fn = lib_->api().nvmlDeviceGetMigMode;
  if (!fn) return Field<Mig>::missing("nvmlDeviceGetMigMode not in this NVML");
  if (lost_) return Field<Mig>::missing("GPU is lost");
  unsigned current = 0, pending = 0;
  const nvml::Return r = fn(h_, &current, &pending);
  if (r != nvml::kSuccess) return fail<Mig>(r, "nvmlDeviceGetMigMode");
  return Field<Mig>::of(Mig{current == 1, pending == 1});
}

Field<std::vector<GpuProcess>> NvmlDevice::processes() {
  std::vector<GpuProcess> out;
  bool any_answered = false;
  std::string why;
  struct Query {
    nvml::Return (*fn)(nvml::Device, unsigned*, nvml::ProcessInfo*);
    const char* name;
    const char* kind;
  };
  const Query queries[] = {
      {lib_->api().nvmlDeviceGetComputeRunningProcesses_v3, "nvmlDeviceGetComputeRunningProcesses_v3", "compute"},
      {lib_->api().nvmlDeviceGetGraphicsRunningProcesses_v3, "nvmlDeviceGetGraphicsRunningProcesses_v3", "graphics"},
  };
  for (const auto& q : queries) {
    if (!q.fn) {
      why = fmt::format("{} not in this NVML", q.name);
      continue;
    }
    if (lost_) return Field<std::vector<GpuProcess>>::missing("GPU is lost");
    // The count can grow between the sizing call and the read: retry a few times with room to spare.
    std::vector<nvml::ProcessInfo> infos(16);
    nvml::Return r = nvml::kErrorInsufficientSize;
    unsigned count = 0;
    for (int attempt = 0; attempt < 4 && r == nvml::kErrorInsufficientSize; ++attempt) {
      count = static_cast<unsigned>(infos.size());
      r = q.fn(h_, &count, infos.data());
      if (r == nvml::kErrorInsufficientSize) infos.resize(static_cast<size_t>(count) * 2 + 8);
    }
    if (r != nvml::kSuccess) {
      auto f = fail<int>(r, q.name);
      why = f.na;
      if (lost_) return Field<std::vector<GpuProcess>>::missing(why);
      continue;
    }
    any_answered = true;
    for (unsigned i = 0; i < count && i < infos.size(); ++i) {
      GpuProcess p;
      p.pid = infos[i].pid;
      if (infos[i].usedGpuMemory != nvml::kValueNotAvailable) p.used_bytes = infos[i].usedGpuMemory;
      p.kind = q.kind;
      out.push_back(p);
    }
  }
  if (!any_answered) return Field<std::vector<GpuProcess>>::missing(why);
  return Field<std::vector<GpuProcess>>::of(std::move(out));
}

Field<int> NvmlDevice::common_ancestor(const NvmlDevice& other) {
  const auto fn = lib_->api().nvmlDeviceGetTopologyCommonAncestor;
  if (!fn) return Field<int>::missing("nvmlDeviceGetTopologyCommonAncestor not in this NVML");
  if (lost_ || other.lost_) return Field<int>::missing("GPU is lost");
  int level = 0;
  const nvml::Return r = fn(h_, other.h_, &level);
  // GPU_IS_LOST here may be either GPU's: it does not mark this one lost (each one's own next query tells).
  if (r == nvml::kErrorGpuIsLost) return Field<int>::missing("GPU is lost");
  if (r != nvml::kSuccess) return fail<int>(r, "nvmlDeviceGetTopologyCommonAncestor");
  return Field<int>::of(level);
}

Field<std::vector<NvLink>> NvmlDevice::nvlinks() {
  const auto state = lib_->api().nvmlDeviceGetNvLinkState;
  if (!state) return Field<std::vector<NvLink>>::missing("nvmlDeviceGetNvLinkState not in this NVML");
  std::vector<NvLink> out;
  for (unsigned link = 0; link < nvml::kNvLinkMaxLinks; ++link) {
    if (lost_) return Field<std::vector<NvLink>>::missing("GPU is lost");
    int active = 0;
    const nvml::Return r = state(h_, link, &active);
    // NOT_SUPPORTED: no NVLink at all; INVALID_ARGUMENT / NOT_FOUND: past the GPU's last link.
    if (r == nvml::kErrorNotSupported || r == nvml::kErrorInvalidArgument || r == nvml::kErrorNotFound) break;
    if (r == nvml::kErrorGpuIsLost) return fail<std::vector<NvLink>>(r, "nvmlDeviceGetNvLinkState");
    // Another error (a virtual machine's view of a fabric it does not have, a driver without the fabric manager)
    // leaves NVLink unknown without counting against the GPU's status.
    if (r != nvml::kSuccess)
      return Field<std::vector<NvLink>>::missing(fmt::format("nvmlDeviceGetNvLinkState: {}", lib_->error_string(r)));
    NvLink l;
    l.link = link;
    l.active = active == nvml::kFeatureEnabled;
    if (const auto remote = lib_->api().nvmlDeviceGetNvLinkRemotePciInfo_v2; remote != nullptr && l.active) {
      nvml::PciInfo pci{};
      if (remote(h_, link, &pci) == nvml::kSuccess) l.remote_bus_id = std::string(pci.busId, strnlen(pci.busId, sizeof(pci.busId)));
    }
    out.push_back(std::move(l));
  }
  return Field<std::vector<NvLink>>::of(std::move(out));
}

#undef AMPFORGE_FN

const char* topology_level_name(int level) {
  switch (level) {
    case nvml::kTopologyInternal: return "SELF";
    case nvml::kTopologySingle: return "PIX";
    case nvml::kTopologyMultiple: return "PXB";
    case nvml::kTopologyHostBridge: return "PHB";
    case nvml::kTopologyNode: return "NODE";
    case nvml::kTopologySystem: return "SYS";
    default: return "?";
  }
}

// ---------------------------------------------------------------------------------------------------------
// Nvml

std::unique_ptr<Nvml> Nvml::open() {
  auto n = std::unique_ptr<Nvml>(new Nvml());
  std::vector<std::string> names;
  if (auto p = env_get("AMPFORGE_NVML_LIBRARY"); p && !p->empty())
    names.push_back(*p);
  else
    names = {"libnvidia-ml.so.1", "libnvidia-ml.so"};
  n->lib_ = DynLib::open_first(names);
  if (!n->lib_.loaded()) {
    n->error_ = fmt::format("NVML could not be loaded ({})", n->lib_.error());
    return n;
  }
#define AMPFORGE_NVML_RESOLVE(name, ret, params) \
  n->api_.name = n->lib_.function<decltype(n->api_.name)>(#name);
  AMPFORGE_NVML_FUNCTIONS(AMPFORGE_NVML_RESOLVE)
#undef AMPFORGE_NVML_RESOLVE
  auto init = n->api_.nvmlInit_v2 ? n->api_.nvmlInit_v2 : n->api_.nvmlInit;
  if (!init) {
    n->error_ = fmt::format("{} exports neither nvmlInit_v2 nor nvmlInit", n->lib_.path());
    return n;
  }
  nvml::Return r = init();
  if (r != nvml::kSuccess) {
    n->error_ = fmt::format("nvmlInit failed: {}{}", n->error_string(r),
                            r == nvml::kErrorDriverNotLoaded ? " (the NVIDIA kernel module is not loaded)" : "");
    return n;
  }
  n->ok_ = true;
  return n;
}

Nvml::~Nvml() {
  if (ok_ && api_.nvmlShutdown) api_.nvmlShutdown();
}

std::string Nvml::error_string(nvml::Return r) const {
  if (api_.nvmlErrorString) {
    const char* s = api_.nvmlErrorString(r);
    if (s) return fmt::format("{} (NVML error {})", s, r);
  }
  return fmt::format("NVML error {}", r);
}

Field<std::string> Nvml::driver_version() {
  if (!api_.nvmlSystemGetDriverVersion) return Field<std::string>::missing("nvmlSystemGetDriverVersion not in this NVML");
  char buf[96] = {};
  nvml::Return r = api_.nvmlSystemGetDriverVersion(buf, sizeof(buf) - 1);
  if (r != nvml::kSuccess) return Field<std::string>::missing(error_string(r));
  return Field<std::string>::of(buf);
}

Field<std::string> Nvml::nvml_version() {
  if (!api_.nvmlSystemGetNVMLVersion) return Field<std::string>::missing("nvmlSystemGetNVMLVersion not in this NVML");
  char buf[96] = {};
  nvml::Return r = api_.nvmlSystemGetNVMLVersion(buf, sizeof(buf) - 1);
  if (r != nvml::kSuccess) return Field<std::string>::missing(error_string(r));
  return Field<std::string>::of(buf);
}

Field<int> Nvml::cuda_driver_version() {
  auto fn = api_.nvmlSystemGetCudaDriverVersion_v2 ? api_.nvmlSystemGetCudaDriverVersion_v2
                                                   : api_.nvmlSystemGetCudaDriverVersion;
  if (!fn) return Field<int>::missing("nvmlSystemGetCudaDriverVersion not in this NVML");
  int v = 0;
  nvml::Return r = fn(&v);
  if (r != nvml::kSuccess) return Field<int>::missing(error_string(r));
  return Field<int>::of(v);
}

Field<unsigned> Nvml::device_count() {
  auto fn = api_.nvmlDeviceGetCount_v2 ? api_.nvmlDeviceGetCount_v2 : api_.nvmlDeviceGetCount;
  if (!fn) return Field<unsigned>::missing("nvmlDeviceGetCount not in this NVML");
  unsigned c = 0;
  nvml::Return r = fn(&c);
  if (r != nvml::kSuccess) return Field<unsigned>::missing(error_string(r));
  return Field<unsigned>::of(c);
}

Field<NvmlDevice> Nvml::device(unsigned index) {
  auto fn = api_.nvmlDeviceGetHandleByIndex_v2 ? api_.nvmlDeviceGetHandleByIndex_v2 : api_.nvmlDeviceGetHandleByIndex;
  if (!fn) return Field<NvmlDevice>::missing("nvmlDeviceGetHandleByIndex not in this NVML");
  nvml::Device h = nullptr;
  nvml::Return r = fn(index, &h);
  if (r != nvml::kSuccess) return Field<NvmlDevice>::missing(error_string(r));
  return Field<NvmlDevice>::of(NvmlDevice(this, index, h));
}

}  // namespace ampforge::hw
