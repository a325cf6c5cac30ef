// `ampforge monitor`: periodic samples of every GPU (temperature, fan, power, clocks, utilisation, memory,
// PCIe traffic, throttle reasons), alerts on threshold crossings, and the line / CSV / JSONL / Prometheus
// forms of a sample. The formats are documented in docs/DOCTOR.md ("monitor").
//
// A GPU that answers GPU_IS_LOST is reported once (an alert) and not sampled again; the others go on.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/hw/field.h"
#include "ampforge/hw/nvml.h"

namespace ampforge::hw {

struct MonitorSample {
  double unix_time = 0;  // seconds since the epoch
  double elapsed_s = 0;  // since monitoring started
  unsigned gpu = 0;
  std::string name, uuid;
  Field<unsigned> temperature_c, fan_percent, power_mw, power_limit_mw, sm_clock_mhz, mem_clock_mhz;
  Field<unsigned> gpu_util_percent, mem_util_percent, pcie_tx_kbps, pcie_rx_kbps;
  Field<uint64_t> memory_used_bytes, memory_total_bytes, throttle_mask;
  bool lost = false;
  std::string error;
};

class MonitorSampler {
 public:
  explicit MonitorSampler(Nvml& nvml);
  unsigned gpu_count() const { return static_cast<unsigned>(devices_.size()); }
  unsigned live_gpu_count() const;
  // One sample per GPU not yet lost. A GPU found lost in this round gives a sample with lost = true.
  std::vector<MonitorSample> sample(double elapsed_s);
  // GPUs whose handle could not be had at start (index -> reason).
  const std::map<unsigned, std::string>& unavailable() const { return unavailable_; }

 private:
  struct Dev {
    NvmlDevice device;
    std::string name, uuid;
    bool reported_lost = false;
  };
  std::vector<Dev> devices_;
  std::map<unsigned, std::string> unavailable_;
};

struct Alert {
  unsigned gpu;
  std::string kind;     // "temperature", "throttle", "lost", "error"
  std::string message;
};

struct GpuSummary {
  std::string name;
  int samples = 0;
  std::optional<unsigned> max_temperature_c;
  std::optional<double> max_power_w;
  double throttled_s = 0;  // time with a power / thermal / hardware slowdown reason active
  double observed_s = 0;
  int alerts = 0;
  bool lost = false;
};

// Turns a stream of samples into alerts (on crossings, not on every sample) and a summary.
class AlertTracker {
 public:
  explicit AlertTracker(double alert_temp_c) : alert_temp_c_(alert_temp_c) {}
  std::vector<Alert> update(const std::vector<MonitorSample>& samples);
  const std::map<unsigned, GpuSummary>& summary() const { return summary_; }
  int total_alerts() const { return total_alerts_; }

 private:
  struct State {
    bool hot = false;
    uint64_t active_reasons = 0;
    double last_elapsed = -1;
  };
  double alert_temp_c_;
  std::map<unsigned, State> state_;
  std::map<unsigned, GpuSummary> summary_;
  int total_alerts_ = 0;
};

std::string monitor_line(const MonitorSample& s, bool colour);
std::string monitor_csv_header();
std::string monitor_csv_row(const MonitorSample& s);
nlohmann::json monitor_json(const MonitorSample& s);
// Prometheus text exposition (format 0.0.4), metric names as NVIDIA's DCGM exporter uses them.
std::string prometheus_text(const std::vector<MonitorSample>& latest);
std::string monitor_summary_text(const AlertTracker& tracker, double elapsed_s);

}  // namespace ampforge::hw
