// Gathering for `ampforge doctor`. The Python probes start first and run while the libraries and GPUs are
// read, so a slow `import tensorflow` overlaps the rest.
#include "ampforge/hw/doctor.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "ampforge/util/build_info.h"
#include "ampforge/util/timer.h"

namespace ampforge::hw {

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Pass: return "PASS";
    case Verdict::Warn: return "WARN";
    case Verdict::Fail: return "FAIL";
    case Verdict::Skip: return "SKIP";
  }
  return "?";
}

int DoctorReport::count(Verdict v) const {
  int n = 0;
  for (const auto& c : checks) n += c.verdict == v;
  return n;
}

namespace {

// PCI bus ids compared as NVML's forms differ: "00000000:18:00.0" (v3 busId) vs "0000:18:00.0"; case ignored.
std::string normal_bus_id(const std::string& id) {
  std::string s;
  for (char ch : id) s += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const size_t colon = s.find(':');
  if (colon == std::string::npos) return s;
  size_t z = 0;
  while (z + 1 < colon && s[z] == '0') ++z;
  return s.substr(z);
}
bool same_bus_id(const std::string& a, const std::string& b) { return !a.empty() && normal_bus_id(a) == normal_bus_id(b); }

GpuReport read_gpu(NvmlDevice& d) {
  GpuReport g;
  g.index = d.index();
  g.name = d.name();
  g.uuid = d.uuid();
  g.bus_id = d.pci_bus_id();
  g.compute_capability = d.compute_capability();
  g.memory = d.memory();
  g.sm_clock_mhz = d.clock_mhz(nvml::kClockSm);
  g.sm_clock_max_mhz = d.max_clock_mhz(nvml::kClockSm);
  g.mem_clock_mhz = d.clock_mhz(nvml::kClockMem);
  g.mem_clock_max_mhz = d.max_clock_mhz(nvml::kClockMem);
  g.pcie_gen_idle = d.pcie_gen_current();
  g.pcie_width_idle = d.pcie_width_current();
  g.pcie_gen_max_gpu = d.pcie_gen_max_gpu();
  g.pcie_gen_max_system = d.pcie_gen_max_system();
  g.pcie_width_max = d.pcie_width_max();
  g.temperature_c = d.temperature_c();
  g.slowdown_c = d.temperature_threshold_c(nvml::kThresholdSlowdown);
  g.shutdown_c = d.temperature_threshold_c(nvml::kThresholdShutdown);
  g.fan_percent = d.fan_percent();
  g.power_mw = d.power_mw();
  g.power_limit_mw = d.power_limit_mw();
  g.throttle_reasons = d.clocks_event_reasons();
  g.ecc_enabled = d.ecc_enabled();
  g.ecc_corrected_volatile = d.ecc_errors(nvml::kMemoryErrorCorrected, nvml::kEccVolatile);
  g.ecc_uncorrected_volatile = d.ecc_errors(nvml::kMemoryErrorUncorrected, nvml::kEccVolatile);
  g.ecc_uncorrected_aggregate = d.ecc_errors(nvml::kMemoryErrorUncorrected, nvml::kEccAggregate);
  g.persistence_mode = d.persistence_mode();
  g.mig_mode = d.mig_mode();
  g.processes = d.processes();
  g.pcie_tx_kbps = d.pcie_throughput_kbps(nvml::kPcieTxBytes);
  g.pcie_rx_kbps = d.pcie_throughput_kbps(nvml::kPcieRxBytes);
  if (g.name.ok()) g.spec = find_gpu_spec(*g.name);
  return g;
}

void sync_status(GpuReport& g, const NvmlDevice& d) {
  g.lost = d.lost();
  g.error = d.error();
}

}  // namespace

DoctorReport run_doctor(const DoctorOptions& options) {
  const Stopwatch sw;
  DoctorReport r;
  r.ampforge_version = AMPFORGE_VERSION_STRING;
  r.alert_temp_c = options.alert_temp_c;
  PythonProbe python(options.python_timeout_s);
  r.host = probe_host();
  r.blas = options.blas;
  r.libraries = probe_libraries();

  auto nvml = Nvml::open();
  r.driver.nvml_library = nvml->library_path();
  if (!nvml->ok()) {
    r.driver.error = nvml->error();
    r.driver.driver_version = Field<std::string>::missing("no driver");
    r.driver.nvml_version = Field<std::string>::missing("no driver");
    r.driver.cuda_version = Field<int>::missing("no driver");
    r.driver.gpu_count = Field<unsigned>::missing("no driver");
  } else {
    r.driver.nvml_loaded = true;
    r.driver.driver_version = nvml->driver_version();
    r.driver.nvml_version = nvml->nvml_version();
    r.driver.cuda_version = nvml->cuda_driver_version();
    r.driver.gpu_count = nvml->device_count();
    std::vector<NvmlDevice> devices;
    const unsigned n = r.driver.gpu_count.ok() ? *r.driver.gpu_count : 0;
    for (unsigned i = 0; i < n; ++i) {
      auto dev = nvml->device(i);
      if (!dev.ok()) {
        GpuReport g;
        g.index = i;
        g.error = dev.na;
        g.lost = dev.na.find("lost") != std::string::npos || dev.na.find("(NVML error 15)") != std::string::npos;
        r.gpus.push_back(std::move(g));
        continue;
      }
      devices.push_back(*dev);
      r.gpus.push_back(read_gpu(devices.back()));
      sync_status(r.gpus.back(), devices.back());
    }

    // How the GPUs connect: NVLinks (and where each one ends) and the PCIe common ancestor of every pair.
    for (auto& d : devices)
      for (auto& g : r.gpus)
        if (g.index == d.index() && !g.lost) g.nvlinks = d.nvlinks();
    for (size_t i = 0; i < devices.size(); ++i)
      for (size_t j = i + 1; j < devices.size(); ++j) {
        const GpuReport* gi = nullptr;
        const GpuReport* gj = nullptr;
        for (const auto& g : r.gpus) {
          if (g.index == devices[i].index()) gi = &g;
          if (g.index == devices[j].index()) gj = &g;
        }
        if (gi == nullptr || gj == nullptr || gi->lost || gj->lost) continue;
        GpuPair pair;
        pair.a = gi->index;
        pair.b = gj->index;
        pair.pcie_ancestor = devices[i].common_ancestor(devices[j]);
        auto count_to = [](const GpuReport& from, const GpuReport& to) {
          unsigned n = 0;
          if (from.nvlinks.ok() && to.bus_id.ok())
            for (const auto& l : *from.nvlinks) n += l.active && same_bus_id(l.remote_bus_id, *to.bus_id);
          return n;
        };
        pair.nvlinks = std::max(count_to(*gi, *gj), count_to(*gj, *gi));
        r.topology.push_back(std::move(pair));
      }
    // An error (or a lost GPU) met by the NVLink and topology queries counts in each GPU's status too.
    for (auto& d : devices)
      for (auto& g : r.gpus)
        if (g.index == d.index()) sync_status(g, d);

    // Whether the CUDA runtime can use what NVML shows (the driver.cuda_devices check).
    std::unique_ptr<CudaRuntime> cuda;
    if (!r.gpus.empty()) {
      cuda = CudaRuntime::open();
      auto& cd = r.cuda_devices;
      cd.asked = cuda->loaded();
      cd.count = cuda->device_count();
      cd.status = cuda->count_status();
      if (!cuda->ok()) cd.error = cd.status != 0 ? cuda->error_text(cd.status) : cuda->error();
      if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) cd.visible_devices = v;
    }

    // Under load: only with a CUDA runtime that sees the GPU.
    for (auto& d : devices) {
      GpuReport* g = nullptr;
      for (auto& gr : r.gpus)
        if (gr.index == d.index()) g = &gr;
      if (!g || g->lost) continue;
      if (!g->bus_id.ok()) {
        g->link_busy_error = g->bandwidth_error = "the GPU's PCI bus id is unknown (" + g->bus_id.na + ")";
        continue;
      }
      if (!cuda) cuda = CudaRuntime::open();
      std::string why;
      auto cuda_dev = cuda->device_for_bus_id(*g->bus_id, &why);
      if (!cuda_dev) {
        g->link_busy_error = g->bandwidth_error = why;
        continue;
      }
      g->link_busy_error = cuda->with_link_busy(*cuda_dev, [&] {
        g->pcie_gen_busy = d.pcie_gen_current();
        g->pcie_width_busy = d.pcie_width_current();
        g->pcie_tx_kbps = d.pcie_throughput_kbps(nvml::kPcieTxBytes);
        g->pcie_rx_kbps = d.pcie_throughput_kbps(nvml::kPcieRxBytes);
      });
      if (options.measure_bandwidth) {
        g->bandwidth = cuda->measure_bandwidth(*cuda_dev, options.bandwidth_bytes, options.bandwidth_copies, &why);
        if (!g->bandwidth) g->bandwidth_error = why;
      } else {
        g->bandwidth_error = "skipped (--no-bandwidth)";
      }
      // The process list stays the one read before: our own copies made this process a GPU user, and NVML names
      // it by its pid in the host's PID namespace, which inside a container is not getpid().
      sync_status(*g, d);
    }
  }
  r.python = python.collect();
  evaluate_checks(r);
  r.elapsed_s = sw.seconds();
  return r;
}

}  // namespace ampforge::hw
