#include "ampforge/hw/monitor.h"

#include <ctime>
#include <functional>
#include <optional>

#include <fmt/format.h>

namespace ampforge::hw {

MonitorSampler::MonitorSampler(Nvml& nvml) {
  auto count = nvml.device_count();
  if (!count.ok()) {
    unavailable_[0] = count.na;
    return;
  }
  for (unsigned i = 0; i < *count; ++i) {
    auto d = nvml.device(i);
    if (!d.ok()) {
      unavailable_[i] = d.na;
      continue;
    }
    Dev dev{*d, {}, {}, false};
    auto n = dev.device.name();
    auto u = dev.device.uuid();
    dev.name = n.ok() ? *n : fmt::format("GPU {}", i);
    dev.uuid = u.ok() ? *u : "";
    devices_.push_back(std::move(dev));
  }
}

unsigned MonitorSampler::live_gpu_count() const {
  unsigned n = 0;
  for (const auto& d : devices_) n += !d.reported_lost;
  return n;
}

std::vector<MonitorSample> MonitorSampler::sample(double elapsed_s) {
  std::vector<MonitorSample> out;
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  for (auto& d : devices_) {
    if (d.reported_lost) continue;
    MonitorSample s;
    s.unix_time = static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
    s.elapsed_s = elapsed_s;
    s.gpu = d.device.index();
    s.name = d.name;
    s.uuid = d.uuid;
    NvmlDevice& g = d.device;
    s.temperature_c = g.temperature_c();
    s.fan_percent = g.fan_percent();
    s.power_mw = g.power_mw();
    s.power_limit_mw = g.power_limit_mw();
    s.sm_clock_mhz = g.clock_mhz(nvml::kClockSm);
    s.mem_clock_mhz = g.clock_mhz(nvml::kClockMem);
    auto util = g.utilization();
    s.gpu_util_percent = util.ok() ? Field<unsigned>::of(util->gpu) : Field<unsigned>::missing(util.na);
    s.mem_util_percent = util.ok() ? Field<unsigned>::of(util->memory) : Field<unsigned>::missing(util.na);
    auto mem = g.memory();
    s.memory_used_bytes = mem.ok() ? Field<uint64_t>::of(mem->used) : Field<uint64_t>::missing(mem.na);
    s.memory_total_bytes = mem.ok() ? Field<uint64_t>::of(mem->total) : Field<uint64_t>::missing(mem.na);
    s.pcie_tx_kbps = g.pcie_throughput_kbps(nvml::kPcieTxBytes);
    s.pcie_rx_kbps = g.pcie_throughput_kbps(nvml::kPcieRxBytes);
    s.throttle_mask = g.clocks_event_reasons();
    s.lost = g.lost();
    s.error = g.error();
    if (s.lost) d.reported_lost = true;
    out.push_back(std::move(s));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------

std::vector<Alert> AlertTracker::update(const std::vector<MonitorSample>& samples) {
  std::vector<Alert> alerts;
  for (const auto& s : samples) {
    State& st = state_[s.gpu];
    GpuSummary& sum = summary_[s.gpu];
    sum.name = s.name;
    const double dt = st.last_elapsed >= 0 ? s.elapsed_s - st.last_elapsed : 0;
    st.last_elapsed = s.elapsed_s;
    if (s.lost) {
      sum.lost = true;
      alerts.push_back({s.gpu, "lost", fmt::format("GPU {} ({}) is lost: {}", s.gpu, s.name, s.error)});
      continue;
    }
    ++sum.samples;
    sum.observed_s += dt;
    if (s.temperature_c.ok()) {
      const unsigned t = *s.temperature_c;
      if (!sum.max_temperature_c || t > *sum.max_temperature_c) sum.max_temperature_c = t;
      const bool hot = t >= alert_temp_c_;
      if (hot && !st.hot)
        alerts.push_back({s.gpu, "temperature",
                          fmt::format("GPU {} temperature {} °C >= {:.0f} °C", s.gpu, t, alert_temp_c_)});
      st.hot = hot;
    }
    if (s.power_mw.ok()) {
      const double w = *s.power_mw / 1000.0;
      if (!sum.max_power_w || w > *sum.max_power_w) sum.max_power_w = w;
    }
    if (s.throttle_mask.ok()) {
      const uint64_t active = *s.throttle_mask & throttle_reasons_active_mask();
      if (active) sum.throttled_s += dt;
      const uint64_t appeared = active & ~st.active_reasons;
      if (appeared) {
        std::string names;
        for (const auto& n : throttle_reason_names(appeared)) names += (names.empty() ? "" : ", ") + n;
        alerts.push_back({s.gpu, "throttle", fmt::format("GPU {} throttling: {}", s.gpu, names)});
      }
      st.active_reasons = active;
    }
  }
  for (const auto& a : alerts) ++summary_[a.gpu].alerts;
  total_alerts_ += static_cast<int>(alerts.size());
  return alerts;
}

// ---------------------------------------------------------------------------------------------------------

namespace {

template <class T, class Conv>
std::string val(const Field<T>& f, Conv conv) {
  return f.ok() ? conv(*f) : std::string("n/a");
}

std::string reasons(const Field<uint64_t>& m) {
  if (!m.ok()) return "n/a";
  std::string s;
  for (const auto& n : throttle_reason_names(*m)) s += (s.empty() ? "" : "|") + n;
  return s.empty() ? "none" : s;
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

template <class T, class Conv>
std::string csv(const Field<T>& f, Conv conv) {
  return f.ok() ? conv(*f) : std::string();
}

std::string clock_time(double unix_time) {
  const time_t t = static_cast<time_t>(unix_time);
  tm local{};
  localtime_r(&t, &local);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &local);
  return buf;
}

}  // namespace

std::string monitor_line(const MonitorSample& s, bool colour) {
  if (s.lost) return fmt::format("{} GPU{} LOST: {}", clock_time(s.unix_time), s.gpu, s.error);
  const auto u = [](unsigned v) { return std::to_string(v); };
  std::string temp = val(s.temperature_c, [](unsigned v) { return fmt::format("{}C", v); });
  std::string thr = reasons(s.throttle_mask);
  if (colour && s.throttle_mask.ok() && (*s.throttle_mask & throttle_reasons_active_mask()))
    thr = "\033[33m" + thr + "\033[0m";
  return fmt::format(
      "{} GPU{} {:>4} fan {:>4} power {:>6}/{:<4}W SM {:>4} MEM {:>5} MHz util {:>3}% mem {:>6}/{:<6}MiB "
      "PCIe TX {:>6} RX {:>6} MB/s throttle {}",
      clock_time(s.unix_time), s.gpu, temp, val(s.fan_percent, [](unsigned v) { return fmt::format("{}%", v); }),
      val(s.power_mw, [](unsigned v) { return fmt::format("{:.1f}", v / 1000.0); }),
      val(s.power_limit_mw, [](unsigned v) { return fmt::format("{:.0f}", v / 1000.0); }), val(s.sm_clock_mhz, u),
      val(s.mem_clock_mhz, u), val(s.gpu_util_percent, u),
      val(s.memory_used_bytes, [](uint64_t b) { return std::to_string(b >> 20); }),
      val(s.memory_total_bytes, [](uint64_t b) { return std::to_string(b >> 20); }),
      val(s.pcie_tx_kbps, [](unsigned v) { return fmt::format("{:.1f}", v / 1000.0); }),
      val(s.pcie_rx_kbps, [](unsigned v) { return fmt::format("{:.1f}", v / 1000.0); }), thr);
}

std::string monitor_csv_header() {
  return "unix_time,elapsed_s,gpu,uuid,name,temperature_c,fan_percent,power_w,power_limit_w,sm_clock_mhz,"
         "mem_clock_mhz,gpu_util_percent,mem_util_percent,memory_used_mib,memory_total_mib,pcie_tx_kbps,pcie_rx_kbps,"
         "throttle_mask,throttle_reasons,status";
}

std::string monitor_csv_row(const MonitorSample& s) {
  const auto u = [](unsigned v) { return std::to_string(v); };
  const auto w = [](unsigned mw) { return fmt::format("{:.3f}", mw / 1000.0); };
  const auto mib = [](uint64_t b) { return std::to_string(b >> 20); };
  return fmt::format("{:.3f},{:.3f},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}", s.unix_time, s.elapsed_s, s.gpu,
                     csv_escape(s.uuid), csv_escape(s.name), csv(s.temperature_c, u), csv(s.fan_percent, u),
                     csv(s.power_mw, w), csv(s.power_limit_mw, w), csv(s.sm_clock_mhz, u), csv(s.mem_clock_mhz, u),
                     csv(s.gpu_util_percent, u), csv(s.mem_util_percent, u), csv(s.memory_used_bytes, mib),
                     csv(s.memory_total_bytes, mib), csv(s.pcie_tx_kbps, u), csv(s.pcie_rx_kbps, u),
                     csv(s.throttle_mask, [](uint64_t m) { return std::to_string(m); }),
                     s.throttle_mask.ok() ? reasons(s.throttle_mask) : "", s.lost ? "lost" : "ok");
}

nlohmann::json monitor_json(const MonitorSample& s) {
  using nlohmann::json;
  auto j = json{{"unix_time", s.unix_time}, {"elapsed_s", s.elapsed_s}, {"gpu", s.gpu}, {"uuid", s.uuid}, {"name", s.name}};
  auto put = [&](const char* k, const auto& f, auto conv) { j[k] = f.ok() ? json(conv(*f)) : json(nullptr); };
  const auto same = [](auto v) { return v; };
  put("temperature_c", s.temperature_c, same);
  put("fan_percent", s.fan_percent, same);
  put("power_w", s.power_mw, [](unsigned mw) { return mw / 1000.0; });
  put("power_limit_w", s.power_limit_mw, [](unsigned mw) { return mw / 1000.0; });
  put("sm_clock_mhz", s.sm_clock_mhz, same);
  put("mem_clock_mhz", s.mem_clock_mhz, same);
  put("gpu_util_percent", s.gpu_util_percent, same);
  put("mem_util_percent", s.mem_util_percent, same);
  put("memory_used_mib", s.memory_used_bytes, [](uint64_t b) { return b >> 20; });
  put("memory_total_mib", s.memory_total_bytes, [](uint64_t b) { return b >> 20; });
  put("pcie_tx_kbps", s.pcie_tx_kbps, same);
  put("pcie_rx_kbps", s.pcie_rx_kbps, same);
  put("throttle_mask", s.throttle_mask, same);
  put("throttle_reasons", s.throttle_mask, [](uint64_t m) { return throttle_reason_names(m); });
  j["status"] = s.lost ? "lost" : "ok";
  j["error"] = s.error.empty() ? json(nullptr) : json(s.error);
  return j;
}

std::string prometheus_text(const std::vector<MonitorSample>& latest) {
  struct Metric {
    const char* name;
    const char* help;
    std::function<std::optional<double>(const MonitorSample&)> get;
  };
  auto from = [](auto member, double scale) {
    return [member, scale](const MonitorSample& s) -> std::optional<double> {
      const auto& f = s.*member;
      if (!f.ok()) return std::nullopt;
      return static_cast<double>(*f) * scale;
    };
  };
  const Metric metrics[] = {
      {"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", from(&MonitorSample::temperature_c, 1)},
      {"DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", from(&MonitorSample::fan_percent, 1)},
      {"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", from(&MonitorSample::power_mw, 1e-3)},
      {"DCGM_FI_DEV_POWER_MGMT_LIMIT", "Enforced power limit (in W).", from(&MonitorSample::power_limit_mw, 1e-3)},
      {"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", from(&MonitorSample::sm_clock_mhz, 1)},
      {"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", from(&MonitorSample::mem_clock_mhz, 1)},
      {"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", from(&MonitorSample::gpu_util_percent, 1)},
      {"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", from(&MonitorSample::mem_util_percent, 1)},
      {"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", from(&MonitorSample::memory_used_bytes, 1.0 / 1048576)},
      {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe TX throughput (in KB/s).", from(&MonitorSample::pcie_tx_kbps, 1)},
      {"DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe RX throughput (in KB/s).", from(&MonitorSample::pcie_rx_kbps, 1)},
      {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bit mask).",
       from(&MonitorSample::throttle_mask, 1)},
  };
  auto label_escape = [](const std::string& v) {
    std::string o;
    for (char c : v) {
      if (c == '\\' || c == '"') o += '\\';
      if (c == '\n') {
        o += "\\n";
        continue;
      }
      o += c;
    }
    return o;
  };
  std::string out;
  for (const auto& m : metrics) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n", m.name, m.help, m.name);
    for (const auto& s : latest) {
      if (s.lost) continue;
      auto v = m.get(s);
      if (!v) continue;  // n/a: the series is absent, as Prometheus expects
      out += fmt::format("{}{{gpu=\"{}\",UUID=\"{}\",device=\"nvidia{}\",modelName=\"{}\"}} {}\n", m.name, s.gpu,
                         label_escape(s.uuid), s.gpu, label_escape(s.name), *v);
    }
  }
  out += "# HELP ampforge_gpu_lost 1 when the GPU has fallen off the bus.\n# TYPE ampforge_gpu_lost gauge\n";
  for (const auto& s : latest)
    out += fmt::format("ampforge_gpu_lost{{gpu=\"{}\",UUID=\"{}\",device=\"nvidia{}\",modelName=\"{}\"}} {}\n", s.gpu,
                       label_escape(s.uuid), s.gpu, label_escape(s.name), s.lost ? 1 : 0);
  return out;
}

std::string monitor_summary_text(const AlertTracker& tracker, double elapsed_s) {
  std::string out = fmt::format("Summary ({:.1f} s, {} alert{}):\n", elapsed_s, tracker.total_alerts(),
                                tracker.total_alerts() == 1 ? "" : "s");
  for (const auto& [gpu, s] : tracker.summary()) {
    out += fmt::format("  GPU{} {}: {} samples, max temperature {}, max power {}, throttled {:.1f} s of {:.1f} s{}\n", gpu,
                       s.name, s.samples, s.max_temperature_c ? fmt::format("{} °C", *s.max_temperature_c) : "n/a",
                       s.max_power_w ? fmt::format("{:.1f} W", *s.max_power_w) : "n/a", s.throttled_s, s.observed_s,
                       s.lost ? ", LOST" : "");
  }
  return out;
}

}  // namespace ampforge::hw
