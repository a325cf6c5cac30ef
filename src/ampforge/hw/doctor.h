// `ampforge doctor`: gather what the machine has (driver, CUDA libraries, GPUs, host, Python frameworks),
// then judge it with checks, each PASS / WARN / FAIL / SKIP with one line of explanation and a fix.
// Gathering (run_doctor) touches the machine; judging (evaluate_checks) is a pure function of the gathered
// report, so each rule is unit-testable. The --json form and every check are documented in docs/DOCTOR.md.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/hw/field.h"
#include "ampforge/hw/gpu_specs.h"
#include "ampforge/hw/host_probe.h"
#include "ampforge/hw/libraries.h"
#include "ampforge/hw/nvml.h"
#include "ampforge/hw/pcie.h"
#include "ampforge/hw/python_probe.h"

namespace ampforge::hw {

enum class Verdict { Pass, Warn, Fail, Skip };
const char* verdict_name(Verdict v);  // "PASS", ...

struct CheckResult {
  std::string id;          // "driver.cuda_runtime", "gpu0.pcie_link", ...
  std::optional<unsigned> gpu;
  Verdict verdict;
  std::string message;     // one line: what was found
  std::string fix;         // one line: what to do (empty for PASS)
};

struct GpuReport {
  unsigned index = 0;
  Field<std::string> name, uuid, bus_id;
  Field<std::pair<int, int>> compute_capability;
  Field<nvml::Memory> memory;
  Field<unsigned> sm_clock_mhz, sm_clock_max_mhz, mem_clock_mhz, mem_clock_max_mhz;
  // The link as read while idle, and again while host-to-device copies keep it busy (when that was possible).
  Field<unsigned> pcie_gen_idle, pcie_width_idle;
  Field<unsigned> pcie_gen_busy, pcie_width_busy;
  std::string link_busy_error;  // why the link could not be read under load
  Field<unsigned> pcie_gen_max_gpu, pcie_gen_max_system, pcie_width_max;
  Field<unsigned> pcie_tx_kbps, pcie_rx_kbps;
  Field<unsigned> temperature_c, slowdown_c, shutdown_c;
  Field<unsigned> fan_percent;
  Field<unsigned> power_mw, power_limit_mw;
  Field<uint64_t> throttle_reasons;
  Field<bool> ecc_enabled;
  Field<uint64_t> ecc_corrected_volatile, ecc_uncorrected_volatile, ecc_uncorrected_aggregate;
  Field<bool> persistence_mode;
  Field<NvmlDevice::Mig> mig_mode;  // for the gpuN.mig check only (not in the JSON schema's GPU fields)
  Field<std::vector<GpuProcess>> processes;
  Field<std::vector<NvLink>> nvlinks;  // empty: the GPU has no NVLink
  std::optional<BandwidthResult> bandwidth;
  std::string bandwidth_error;
  const GpuSpec* spec = nullptr;
  bool lost = false;
  std::string error;  // the first per-GPU error (GPU_IS_LOST or another failure)

  // The link as the checks see it: under load when that was read, else idle.
  const Field<unsigned>& pcie_gen() const { return pcie_gen_busy.ok() ? pcie_gen_busy : pcie_gen_idle; }
  const Field<unsigned>& pcie_width() const { return pcie_width_busy.ok() ? pcie_width_busy : pcie_width_idle; }
  bool link_read_busy() const { return pcie_gen_busy.ok(); }
};

// How two GPUs reach each other (the brief's NVLink-vs-PCIe question; what NCCL's rings will use).
struct GpuPair {
  unsigned a = 0, b = 0;          // GPU indices, a < b
  unsigned nvlinks = 0;           // active NVLinks of GPU a whose other end is GPU b (or b's to a)
  Field<int> pcie_ancestor;       // nvml::kTopology* (PIX ... SYS)
};

struct DriverReport {
  bool nvml_loaded = false;  // NVML opened and initialised
  std::string nvml_library;
  std::string error;  // why NVML is unusable
  Field<std::string> driver_version, nvml_version;
  Field<int> cuda_version;  // the newest CUDA the driver supports (12040 = 12.4)
  Field<unsigned> gpu_count;
};

// What the CUDA runtime makes of the GPUs the driver shows: NVML talks to the kernel module, the runtime to the
// user-mode driver (libcuda) and the device nodes, and either can work without the other (an HGX board without
// its fabric manager, a container started without the GPUs' device nodes, CUDA_VISIBLE_DEVICES hiding them).
// Asked only when NVML shows a GPU and a CUDA runtime is installed.
struct CudaDevicesReport {
  bool asked = false;
  int count = 0;       // devices the runtime sees (after CUDA_VISIBLE_DEVICES)
  int status = 0;      // cudaGetDeviceCount's cudaError_t (0: success)
  std::string error;   // why the runtime is unusable ("" when it sees a device)
  std::optional<std::string> visible_devices;  // CUDA_VISIBLE_DEVICES when set (even empty: that hides every GPU)
};

// The CPU BLAS kernels (filled by the caller from backends/cpu/blas_kernels.h: hw sits below the backends).
struct BlasReport {
  bool known = false;       // false: nobody filled it in (the check is skipped)
  std::string library;      // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
  std::string version;      // "OpenBLAS 0.3.21"
  std::string loaded_core;  // chosen by OpenBLAS at load
  std::string core;         // running now
  std::string cpu_best;     // the strongest core this CPU can run
  std::string source;       // "openblas", "user-env", "ampforge", "kept", "unavailable"
  std::string note;
  bool below_cpu = false;   // the running kernels are weaker than the CPU allows
  std::string products;     // which library runs ampforge's F32 / BF16 products (cpu::cpu_gemm_summary()); "" unknown
};

struct DoctorOptions {
  BlasReport blas;
  double alert_temp_c = 80;
  double python_timeout_s = 6;
  bool measure_bandwidth = true;
  size_t bandwidth_bytes = 64u << 20;
  int bandwidth_copies = 8;
};

struct DoctorReport {
  std::string ampforge_version;
  DriverReport driver;
  CudaDevicesReport cuda_devices;
  LibrariesReport libraries;
  HostInfo host;
  BlasReport blas;
  PythonReport python;
  std::vector<GpuReport> gpus;
  std::vector<GpuPair> topology;  // every pair of GPUs that answered (two GPUs or more)
  std::vector<CheckResult> checks;
  double alert_temp_c = 80;
  double elapsed_s = 0;

  int count(Verdict v) const;
  int exit_code() const { return count(Verdict::Fail) > 0 ? 1 : 0; }
};

DoctorReport run_doctor(const DoctorOptions& options);
// Fills report.checks from the gathered facts.
void evaluate_checks(DoctorReport& report);

nlohmann::json doctor_report_json(const DoctorReport& report);
std::string doctor_report_text(const DoctorReport& report, bool colour);

// Minimum versions of the Python frameworks (the project brief).
inline constexpr const char* kMinTorchVersion = "2.0.1";
inline constexpr const char* kMinTensorflowVersion = "2.12.0";
// A GPU within this many degrees of its slowdown threshold fails the temperature check.
inline constexpr unsigned kSlowdownMarginC = 5;

}  // namespace ampforge::hw
