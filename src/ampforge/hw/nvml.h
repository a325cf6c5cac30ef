// NVML, loaded at run time. Only the types and functions ampforge uses are declared here, from NVIDIA's
// documented C ABI (NVML API Reference, nvml.h): enums are passed as int (their C representation), opaque
// handles as pointers, structs with the documented member order.
//
// Contract: nothing here throws for a hardware condition. A function the library does not export, or one
// that answers NOT_SUPPORTED, gives a Field without a value. GPU_IS_LOST marks that device lost: later
// queries on it answer "GPU is lost" without calling the driver again.
//
// The library is AMPFORGE_NVML_LIBRARY when set (tests point it at a fake), else libnvidia-ml.so.1 (the
// name the driver installs), else libnvidia-ml.so.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ampforge/hw/dynlib.h"
#include "ampforge/hw/field.h"

namespace ampforge::hw {

namespace nvml {
using Return = int;  // nvmlReturn_t
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNoPermission = 4;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorGpuIsLost = 15;
// What a function removed from the driver answers (NVML's deprecation notices: functions deprecated in CUDA 13.0,
// nvmlDeviceGetTemperature and nvmlDeviceGetCurrentClocksThrottleReasons among them, are removed in CUDA 14.0).
inline constexpr Return kErrorDeprecated = 26;
inline constexpr Return kErrorUnknown = 999;

struct DeviceSt;
using Device = DeviceSt*;  // nvmlDevice_t

struct Memory {  // nvmlMemory_t (v1), bytes
  unsigned long long total, free, used;
};
struct Temperature {  // nvmlTemperature_v1_t, for nvmlDeviceGetTemperatureV
  unsigned int version;  // kTemperatureV1
  int sensorType;        // nvmlTemperatureSensors_t
  int temperature;       // °C
};
// NVML_STRUCT_VERSION(Temperature, 1): the struct's size with the version number in the top byte.
inline constexpr unsigned kTemperatureV1 = static_cast<unsigned>(sizeof(Temperature)) | (1u << 24);
struct Utilization {  // nvmlUtilization_t, percent over the last sample period
  unsigned int gpu, memory;
};
struct ProcessInfo {  // nvmlProcessInfo_t as taken by the _v3 process queries
  unsigned int pid;
  unsigned long long usedGpuMemory;  // bytes; NVML_VALUE_NOT_AVAILABLE when unknown
  unsigned int gpuInstanceId, computeInstanceId;
};
struct PciInfo {  // nvmlPciInfo_t (v3)
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

// nvmlClockType_t
inline constexpr int kClockGraphics = 0, kClockSm = 1, kClockMem = 2;
// nvmlTemperatureSensors_t / nvmlTemperatureThresholds_t
inline constexpr int kTemperatureGpu = 0;
inline constexpr int kThresholdShutdown = 0, kThresholdSlowdown = 1, kThresholdMemMax = 2, kThresholdGpuMax = 3;
// nvmlPcieUtilCounter_t
inline constexpr int kPcieTxBytes = 0, kPcieRxBytes = 1;
// nvmlMemoryErrorType_t / nvmlEccCounterType_t / nvmlEnableState_t
inline constexpr int kMemoryErrorCorrected = 0, kMemoryErrorUncorrected = 1;
inline constexpr int kEccVolatile = 0, kEccAggregate = 1;
inline constexpr int kFeatureDisabled = 0, kFeatureEnabled = 1;
inline constexpr unsigned long long kValueNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE (as unsigned long long)

// nvmlGpuTopologyLevel_t: the closest common ancestor of two GPUs on the PCIe tree (nvidia-smi topo's PIX, PXB,
// PHB, NODE, SYS).
inline constexpr int kTopologyInternal = 0, kTopologySingle = 10, kTopologyMultiple = 20, kTopologyHostBridge = 30,
                     kTopologyNode = 40, kTopologySystem = 50;
inline constexpr unsigned kNvLinkMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS (NVML 12.x)

// nvmlClocksEventReasons (nvmlClocksThrottleReasons before driver 535), bit flags.
inline constexpr uint64_t kReasonGpuIdle = 0x1;
inline constexpr uint64_t kReasonApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kReasonSwPowerCap = 0x4;
inline constexpr uint64_t kReasonHwSlowdown = 0x8;
inline constexpr uint64_t kReasonSyncBoost = 0x10;
inline constexpr uint64_t kReasonSwThermalSlowdown = 0x20;
inline constexpr uint64_t kReasonHwThermalSlowdown = 0x40;
inline constexpr uint64_t kReasonHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kReasonDisplayClockSetting = 0x100;

// name, return type, parameter list. Pairs with a suffix come with the older name as a fallback.
#define AMPFORGE_NVML_FUNCTIONS(X)                                                                   \
  X(nvmlInit_v2, Return, (void))                                                                     \
  X(nvmlInit, Return, (void))                                                                        \
  X(nvmlShutdown, Return, (void))                                                                    \
  X(nvmlErrorString, const char*, (Return))                                                          \
  X(nvmlSystemGetDriverVersion, Return, (char*, unsigned int))                                       \
  X(nvmlSystemGetNVMLVersion, Return, (char*, unsigned int))                                         \
  X(nvmlSystemGetCudaDriverVersion_v2, Return, (int*))                                               \
  X(nvmlSystemGetCudaDriverVersion, Return, (int*))                                                  \
  X(nvmlDeviceGetCount_v2, Return, (unsigned int*))                                                  \
  X(nvmlDeviceGetCount, Return, (unsigned int*))                                                     \
  X(nvmlDeviceGetHandleByIndex_v2, Return, (unsigned int, Device*))                                  \
  X(nvmlDeviceGetHandleByIndex, Return, (unsigned int, Device*))                                     \
  X(nvmlDeviceGetName, Return, (Device, char*, unsigned int))                                        \
  X(nvmlDeviceGetUUID, Return, (Device, char*, unsigned int))                                        \
  X(nvmlDeviceGetPciInfo_v3, Return, (Device, PciInfo*))                                             \
  X(nvmlDeviceGetCudaComputeCapability, Return, (Device, int*, int*))                                \
  X(nvmlDeviceGetMemoryInfo, Return, (Device, Memory*))                                              \
  X(nvmlDeviceGetUtilizationRates, Return, (Device, Utilization*))                                   \
  X(nvmlDeviceGetClockInfo, Return, (Device, int, unsigned int*))                                    \
  X(nvmlDeviceGetMaxClockInfo, Return, (Device, int, unsigned int*))                                 \
  X(nvmlDeviceGetCurrPcieLinkGeneration, Return, (Device, unsigned int*))                            \
  X(nvmlDeviceGetMaxPcieLinkGeneration, Return, (Device, unsigned int*))                             \
  X(nvmlDeviceGetGpuMaxPcieLinkGeneration, Return, (Device, unsigned int*))                          \
  X(nvmlDeviceGetCurrPcieLinkWidth, Return, (Device, unsigned int*))                                 \
  X(nvmlDeviceGetMaxPcieLinkWidth, Return, (Device, unsigned int*))                                  \
  X(nvmlDeviceGetPcieThroughput, Return, (Device, int, unsigned int*))                               \
  X(nvmlDeviceGetTemperatureV, Return, (Device, Temperature*))                                       \
  X(nvmlDeviceGetTemperature, Return, (Device, int, unsigned int*))                                  \
  X(nvmlDeviceGetTemperatureThreshold, Return, (Device, int, unsigned int*))                         \
  X(nvmlDeviceGetFanSpeed, Return, (Device, unsigned int*))                                          \
  X(nvmlDeviceGetPowerUsage, Return, (Device, unsigned int*))                                        \
  X(nvmlDeviceGetEnforcedPowerLimit, Return, (Device, unsigned int*))                                \
  X(nvmlDeviceGetCurrentClocksEventReasons, Return, (Device, unsigned long long*))                   \
  X(nvmlDeviceGetCurrentClocksThrottleReasons, Return, (Device, unsigned long long*))                \
  X(nvmlDeviceGetEccMode, Return, (Device, int*, int*))                                              \
  X(nvmlDeviceGetTotalEccErrors, Return, (Device, int, int, unsigned long long*))                    \
  X(nvmlDeviceGetPersistenceMode, Return, (Device, int*))                                            \
  X(nvmlDeviceGetMigMode, Return, (Device, unsigned int*, unsigned int*))                            \
  X(nvmlDeviceGetComputeRunningProcesses_v3, Return, (Device, unsigned int*, ProcessInfo*))          \
  X(nvmlDeviceGetGraphicsRunningProcesses_v3, Return, (Device, unsigned int*, ProcessInfo*))          \
  X(nvmlDeviceGetTopologyCommonAncestor, Return, (Device, Device, int*))                             \
  X(nvmlDeviceGetNvLinkState, Return, (Device, unsigned int, int*))                                  \
  X(nvmlDeviceGetNvLinkRemotePciInfo_v2, Return, (Device, unsigned int, PciInfo*))

struct Api {
#define AMPFORGE_NVML_DECLARE(name, ret, params) ret(*name) params = nullptr;
  AMPFORGE_NVML_FUNCTIONS(AMPFORGE_NVML_DECLARE)
#undef AMPFORGE_NVML_DECLARE
};
}  // namespace nvml

// Names of the set bits of a clocks-event (throttle) reason mask: "gpu_idle", "sw_power_cap", ...
std::vector<std::string> throttle_reason_names(uint64_t mask);
// The reasons that cost performance while the GPU works: power cap, thermal, hardware slowdowns.
uint64_t throttle_reasons_active_mask();

// One NVLink of a GPU: its index, whether it is up, and the PCI bus id of the device at its other end (another
// GPU, or an NVSwitch) when NVML gives it.
struct NvLink {
  unsigned link = 0;
  bool active = false;
  std::string remote_bus_id;
};

// nvidia-smi topo's name for a common-ancestor level: PIX (one PCIe switch), PXB (several switches), PHB (the host
// bridge), NODE (the CPU's NUMA node: host bridges of one CPU), SYS (across CPUs), or "SELF".
const char* topology_level_name(int level);

struct GpuProcess {
  unsigned int pid = 0;
  std::optional<uint64_t> used_bytes;
  std::string kind;  // "compute" or "graphics"
};

class Nvml;

// One GPU's handle. Queries never throw; see the file comment.
class NvmlDevice {
 public:
  NvmlDevice(const Nvml* lib, unsigned index, nvml::Device handle) : lib_(lib), index_(index), h_(handle) {}
  unsigned index() const { return index_; }
  bool lost() const { return lost_; }
  const std::string& error() const { return error_; }  // first per-GPU error other than "not supported"

  Field<std::string> name();
  Field<std::string> uuid();
  Field<std::string> pci_bus_id();
  Field<std::pair<int, int>> compute_capability();
  Field<nvml::Memory> memory();
  Field<nvml::Utilization> utilization();
  Field<unsigned> clock_mhz(int clock_type);
  Field<unsigned> max_clock_mhz(int clock_type);
  Field<unsigned> pcie_gen_current();
  Field<unsigned> pcie_gen_max_system();  // GPU and slot together (nvmlDeviceGetMaxPcieLinkGeneration)
  Field<unsigned> pcie_gen_max_gpu();     // the GPU alone (nvmlDeviceGetGpuMaxPcieLinkGeneration)
  Field<unsigned> pcie_width_current();
  Field<unsigned> pcie_width_max();
  Field<unsigned> pcie_throughput_kbps(int counter);  // KB/s over a 20 ms window
  Field<unsigned> temperature_c();
  Field<unsigned> temperature_threshold_c(int threshold);
  Field<unsigned> fan_percent();
  Field<unsigned> power_mw();
  Field<unsigned> power_limit_mw();
  Field<uint64_t> clocks_event_reasons();
  Field<bool> ecc_enabled();
  Field<uint64_t> ecc_errors(int error_type, int counter_type);
  Field<bool> persistence_mode();
  // MIG mode (NVML_DEVICE_MIG_ENABLE = 1): whether it is on now, and whether it will be after the next GPU reset.
  struct Mig {
    bool current = false, pending = false;
  };
  Field<Mig> mig_mode();
  Field<std::vector<GpuProcess>> processes();
  // The closest common ancestor with another GPU on the PCIe tree (nvml::kTopology*).
  Field<int> common_ancestor(const NvmlDevice& other);
  // The GPU's NVLinks, from link 0 up to the first that NVML says does not exist; an empty list: no NVLink.
  Field<std::vector<NvLink>> nvlinks();

 private:
  template <class T, class Fn, class... A>
  Field<T> get(Fn fn, const char* fname, A... args);
  template <class T>
  Field<T> fail(nvml::Return r, const char* fname);
  Field<std::string> get_string(nvml::Return (*fn)(nvml::Device, char*, unsigned), const char* fname);

  const Nvml* lib_;
  unsigned index_;
  nvml::Device h_;
  bool lost_ = false;
  std::string error_;
};

class Nvml {
 public:
  // Loads and initialises NVML. Never throws: when the library is absent or nvmlInit fails, ok() is false and
  // error() says why (with the library names tried).
  static std::unique_ptr<Nvml> open();
  ~Nvml();

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string library_path() const { return lib_.path(); }
  const nvml::Api& api() const { return api_; }
  std::string error_string(nvml::Return r) const;

  Field<std::string> driver_version();
  Field<std::string> nvml_version();
  Field<int> cuda_driver_version();  // e.g. 12040 for CUDA 12.4
  Field<unsigned> device_count();
  // A handle for device `index`; an error (e.g. GPU lost during enumeration) gives a Field without a value.
  Field<NvmlDevice> device(unsigned index);

 private:
  DynLib lib_;
  nvml::Api api_;
  bool ok_ = false;
  std::string error_;
};

}  // namespace ampforge::hw
