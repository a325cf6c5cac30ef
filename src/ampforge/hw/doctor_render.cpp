// Rendering the doctor report: --json (schema "ampforge.doctor/2", documented in docs/DOCTOR.md and
// docs/doctor.schema.json) and the human table. A missing value is null in JSON, with its reason under "na";
// the table prints it as "n/a (reason)".
#include <fmt/format.h>

#include "ampforge/hw/doctor.h"
#include "ampforge/hw/versions.h"

namespace ampforge::hw {

namespace {

using nlohmann::json;

template <class T, class Conv>
void put(json& obj, json& na, const char* key, const Field<T>& f, Conv conv) {
  if (f.ok()) {
    obj[key] = conv(*f);
  } else {
    obj[key] = nullptr;
    na[key] = f.na;
  }
}
template <class T>
void put(json& obj, json& na, const char* key, const Field<T>& f) {
  put(obj, na, key, f, [](const T& v) { return json(v); });
}

json str_or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

json library_json(const LibraryInfo& l) {
  return json{{"found", l.found},
              {"path", str_or_null(l.path)},
              {"version", str_or_null(l.version)},
              {"built_for_cuda", l.built_for_cuda ? json(cuda_version_string(*l.built_for_cuda)) : json(nullptr)},
              {"error", str_or_null(l.error)}};
}

json framework_json(const FrameworkInfo& f) {
  return json{{"installed", f.installed ? json(*f.installed) : json(nullptr)},
              {"version", str_or_null(f.version)},
              {"cuda", f.cuda ? json(*f.cuda) : json(nullptr)},
              {"cudnn", f.cudnn ? json(*f.cudnn) : json(nullptr)},
              {"timed_out", f.timed_out},
              {"error", str_or_null(f.error)}};
}

json gpu_json(const GpuReport& g) {
  json o, na = json::object();
  o["index"] = g.index;
  put(o, na, "name", g.name);
  put(o, na, "uuid", g.uuid);
  put(o, na, "pci_bus_id", g.bus_id);
  put(o, na, "compute_capability", g.compute_capability,
      [](const std::pair<int, int>& cc) { return json(fmt::format("{}.{}", cc.first, cc.second)); });
  put(o, na, "memory_total_bytes", g.memory, [](const nvml::Memory& m) { return json(m.total); });
  put(o, na, "memory_used_bytes", g.memory, [](const nvml::Memory& m) { return json(m.used); });
  put(o, na, "sm_clock_mhz", g.sm_clock_mhz);
  put(o, na, "sm_clock_max_mhz", g.sm_clock_max_mhz);
  put(o, na, "mem_clock_mhz", g.mem_clock_mhz);
  put(o, na, "mem_clock_max_mhz", g.mem_clock_max_mhz);
  json p, pna = json::object();
  put(p, pna, "gen_idle", g.pcie_gen_idle);
  put(p, pna, "width_idle", g.pcie_width_idle);
  put(p, pna, "gen_busy", g.pcie_gen_busy);
  put(p, pna, "width_busy", g.pcie_width_busy);
  p["read_under_load"] = g.link_read_busy();
  if (!g.link_read_busy()) pna["read_under_load"] = g.link_busy_error.empty() ? "unknown" : g.link_busy_error;
  put(p, pna, "gen_max_gpu", g.pcie_gen_max_gpu);
  put(p, pna, "gen_max_system", g.pcie_gen_max_system);
  put(p, pna, "width_max", g.pcie_width_max);
  put(p, pna, "tx_kbps", g.pcie_tx_kbps);
  put(p, pna, "rx_kbps", g.pcie_rx_kbps);
  p["h2d_gbps"] = g.bandwidth ? json(g.bandwidth->h2d_gbps) : json(nullptr);
  p["d2h_gbps"] = g.bandwidth ? json(g.bandwidth->d2h_gbps) : json(nullptr);
  if (!g.bandwidth) pna["bandwidth"] = g.bandwidth_error.empty() ? "not measured" : g.bandwidth_error;
  p["na"] = pna;
  o["pcie"] = p;
  put(o, na, "temperature_c", g.temperature_c);
  put(o, na, "slowdown_c", g.slowdown_c);
  put(o, na, "shutdown_c", g.shutdown_c);
  put(o, na, "fan_percent", g.fan_percent);
  put(o, na, "power_w", g.power_mw, [](unsigned mw) { return json(mw / 1000.0); });
  put(o, na, "power_limit_w", g.power_limit_mw, [](unsigned mw) { return json(mw / 1000.0); });
  put(o, na, "throttle_mask", g.throttle_reasons);
  put(o, na, "throttle_reasons", g.throttle_reasons, [](uint64_t m) { return json(throttle_reason_names(m)); });
  json e, ena = json::object();
  put(e, ena, "enabled", g.ecc_enabled);
  put(e, ena, "corrected_volatile", g.ecc_corrected_volatile);
  put(e, ena, "uncorrected_volatile", g.ecc_uncorrected_volatile);
  put(e, ena, "uncorrected_aggregate", g.ecc_uncorrected_aggregate);
  e["na"] = ena;
  o["ecc"] = e;
  put(o, na, "persistence_mode", g.persistence_mode);
  put(o, na, "processes", g.processes, [](const std::vector<GpuProcess>& ps) {
    json a = json::array();
    for (const auto& p : ps)
      a.push_back({{"pid", p.pid}, {"used_bytes", p.used_bytes ? json(*p.used_bytes) : json(nullptr)}, {"kind", p.kind}});
    return a;
  });
  put(o, na, "nvlinks", g.nvlinks, [](const std::vector<NvLink>& ls) {
    json a = json::array();
    for (const auto& l : ls)
      a.push_back({{"link", l.link}, {"active", l.active}, {"remote_bus_id", str_or_null(l.remote_bus_id)}});
    return a;
  });
  if (g.spec)
    o["spec"] = {{"key", g.spec->key},
                 {"name", g.spec->name},
                 {"fp32_tflops", g.spec->fp32_tflops},
                 {"tf32_tensor_tflops", g.spec->tf32_tensor_tflops ? json(*g.spec->tf32_tensor_tflops) : json(nullptr)},
                 {"fp16_tensor_fp32acc_tflops", g.spec->fp16_tensor_fp32acc_tflops},
                 {"memory_gb", g.spec->memory_gb},
                 {"memory_bandwidth_gbps", g.spec->memory_bandwidth_gbps},
                 {"pcie_gen", g.spec->pcie_gen},
                 {"source", g.spec->source}};
  else
    o["spec"] = nullptr;
  o["lost"] = g.lost;
  o["error"] = str_or_null(g.error);
  o["na"] = na;
  return o;
}

}  // namespace

json doctor_report_json(const DoctorReport& r) {
  json j;
  j["schema"] = "ampforge.doctor/2";
  j["ampforge_version"] = r.ampforge_version;
  j["elapsed_s"] = r.elapsed_s;
  j["exit_code"] = r.exit_code();
  j["summary"] = {{"pass", r.count(Verdict::Pass)},
                  {"warn", r.count(Verdict::Warn)},
                  {"fail", r.count(Verdict::Fail)},
                  {"skip", r.count(Verdict::Skip)}};
  json d, dna = json::object();
  d["found"] = r.driver.nvml_loaded;
  d["nvml_library"] = str_or_null(r.driver.nvml_library);
  d["error"] = str_or_null(r.driver.error);
  put(d, dna, "version", r.driver.driver_version);
  put(d, dna, "nvml_version", r.driver.nvml_version);
  put(d, dna, "cuda_version", r.driver.cuda_version, [](int v) { return json(cuda_version_string(v)); });
  put(d, dna, "gpu_count", r.driver.gpu_count);
  d["na"] = dna;
  j["driver"] = d;
  const auto& l = r.libraries;
  j["libraries"] = {{"cudart", library_json(l.cudart)},
                    {"cudnn", library_json(l.cudnn)},
                    {"cublas", library_json(l.cublas)},
                    {"nccl", library_json(l.nccl)}};
  json h, hna = json::object();
  put(h, hna, "cpu_model", r.host.cpu_model);
  put(h, hna, "logical_cpus", r.host.logical_cpus);
  put(h, hna, "ram_total_bytes", r.host.ram_total_bytes);
  put(h, hna, "ram_available_bytes", r.host.ram_available_bytes);
  put(h, hna, "cpu_governor", r.host.cpu_governor);
  put(h, hna, "kernel", r.host.kernel);
  h["na"] = hna;
  j["host"] = h;
  if (r.blas.known)
    j["blas"] = {{"library", r.blas.library}, {"version", r.blas.version}, {"loaded_core", r.blas.loaded_core}, {"core", r.blas.core},
                 {"cpu_best", r.blas.cpu_best}, {"source", r.blas.source}, {"below_cpu", r.blas.below_cpu},
                 {"note", r.blas.note}};  // `products` is in the check's message (fields come only with a new schema)
  j["python"] = {{"found", r.python.found},
                 {"executable", str_or_null(r.python.executable)},
                 {"version", str_or_null(r.python.version)},
                 {"error", str_or_null(r.python.error)},
                 {"timeout_s", r.python.timeout_s},
                 {"torch", framework_json(r.python.torch)},
                 {"tensorflow", framework_json(r.python.tensorflow)}};
  j["gpus"] = json::array();
  for (const auto& g : r.gpus) j["gpus"].push_back(gpu_json(g));
  j["topology"] = json::array();
  for (const auto& p : r.topology) {
    json t, tna = json::object();
    t["gpus"] = {p.a, p.b};
    t["nvlinks"] = p.nvlinks;
    put(t, tna, "pcie_path", p.pcie_ancestor, [](int level) { return json(topology_level_name(level)); });
    t["na"] = tna;
    j["topology"].push_back(t);
  }
  j["checks"] = json::array();
  for (const auto& c : r.checks)
    j["checks"].push_back({{"id", c.id},
                           {"gpu", c.gpu ? json(*c.gpu) : json(nullptr)},
                           {"status", verdict_name(c.verdict)},
                           {"message", c.message},
                           {"fix", str_or_null(c.fix)}});
  return j;
}

// ---------------------------------------------------------------------------------------------------------
// Table

namespace {

struct Painter {
  bool on;
  std::string paint(const std::string& s, const char* code) const {
    return on ? fmt::format("\033[{}m{}\033[0m", code, s) : s;
  }
  std::string verdict(Verdict v) const {
    switch (v) {
      case Verdict::Pass: return paint("PASS", "32");
      case Verdict::Warn: return paint("WARN", "33");
      case Verdict::Fail: return paint("FAIL", "1;31");
      case Verdict::Skip: return paint("SKIP", "2");
    }
    return "?";
  }
  std::string na(const std::string& why) const { return paint("n/a" + (why.empty() ? "" : " (" + why + ")"), "2"); }
};

template <class T, class Conv>
std::string show(const Field<T>& f, const Painter& p, Conv conv) {
  return f.ok() ? conv(*f) : p.na(f.na);
}

void row(std::string& out, const std::string& key, const std::string& value) {
  out += fmt::format("  {:<22} {}\n", key, value);
}

std::string library_line(const LibraryInfo& l, const Painter& p) {
  if (!l.found) return p.na("not found");
  std::string s = l.version.empty() ? p.na(l.error) : l.version;
  if (l.built_for_cuda) s += fmt::format(" (built for CUDA {})", cuda_version_string(*l.built_for_cuda));
  return s + "  " + p.paint(l.path, "2");
}

std::string framework_line(const FrameworkInfo& f, const Painter& p) {
  if (f.installed == false) return "not installed";
  std::string s = f.version.empty() ? p.na(f.error.empty() ? "unknown" : f.error) : f.version;
  if (f.cuda) s += f.cuda->empty() ? ", CPU-only build" : ", CUDA " + *f.cuda;
  if (f.cudnn) s += ", cuDNN " + *f.cudnn;
  if (!f.version.empty() && !f.error.empty()) s += fmt::format(" {}", p.na(f.error));
  return s;
}

std::string mib(uint64_t b) { return fmt::format("{} MiB", b >> 20); }

}  // namespace

std::string doctor_report_text(const DoctorReport& r, bool colour) {
  const Painter p{colour};
  std::string out = p.paint(fmt::format("ampforge doctor {}", r.ampforge_version), "1") + "\n\n";
  out += p.paint("Driver and libraries", "1") + "\n";
  if (r.driver.nvml_loaded) {
    row(out, "NVIDIA driver", show(r.driver.driver_version, p, [](const std::string& s) { return s; }) + "  " +
                                   p.paint(r.driver.nvml_library, "2"));
    row(out, "CUDA (driver supports)", show(r.driver.cuda_version, p, [](int v) { return cuda_version_string(v); }));
    row(out, "NVML", show(r.driver.nvml_version, p, [](const std::string& s) { return s; }));
  } else {
    row(out, "NVIDIA driver", p.paint("not found", "1;31") + ": " + r.driver.error);
  }
  row(out, "CUDA runtime", library_line(r.libraries.cudart, p));
  row(out, "cuDNN", library_line(r.libraries.cudnn, p));
  row(out, "cuBLAS", library_line(r.libraries.cublas, p));
  row(out, "NCCL", library_line(r.libraries.nccl, p));

  out += fmt::format("\n{}\n", p.paint("Host", "1"));
  row(out, "CPU", show(r.host.cpu_model, p, [](const std::string& s) { return s; }) +
                      (r.host.logical_cpus.ok() ? fmt::format(", {} logical CPUs", *r.host.logical_cpus) : ""));
  row(out, "RAM", show(r.host.ram_total_bytes, p, [](uint64_t b) { return fmt::format("{:.1f} GiB", b / 1073741824.0); }) +
                      (r.host.ram_available_bytes.ok() ? fmt::format(" ({:.1f} GiB available)", *r.host.ram_available_bytes / 1073741824.0) : ""));
  row(out, "CPU governor", show(r.host.cpu_governor, p, [](const std::string& s) { return s; }));
  row(out, "Kernel", show(r.host.kernel, p, [](const std::string& s) { return s; }));
  if (r.blas.known)
    row(out, "BLAS", r.blas.library.empty()
                         ? p.na(r.blas.note)
                         : fmt::format("{}, {} kernels  {}", r.blas.version, r.blas.core, p.paint(r.blas.note, "2")));

  out += fmt::format("\n{}\n", p.paint("Python", "1"));
  if (!r.python.found) {
    row(out, "python3", p.na(r.python.error));
  } else {
    row(out, "python3", r.python.version + "  " + p.paint(r.python.executable, "2"));
    row(out, "PyTorch", framework_line(r.python.torch, p));
    row(out, "TensorFlow", framework_line(r.python.tensorflow, p));
  }

  for (const auto& g : r.gpus) {
    out += fmt::format("\n{}\n", p.paint(fmt::format("GPU {}: {}", g.index, g.name.ok() ? *g.name : "n/a"), "1"));
    if (g.lost) row(out, "status", p.paint("LOST", "1;31") + ": " + g.error);
    row(out, "UUID", show(g.uuid, p, [](const std::string& s) { return s; }));
    row(out, "PCI bus", show(g.bus_id, p, [](const std::string& s) { return s; }));
    row(out, "compute capability", show(g.compute_capability, p, [](const auto& cc) { return fmt::format("{}.{}", cc.first, cc.second); }));
    row(out, "memory", show(g.memory, p, [](const nvml::Memory& m) { return fmt::format("{} used of {}", mib(m.used), mib(m.total)); }));
    row(out, "SM clock", show(g.sm_clock_mhz, p, [](unsigned v) { return fmt::format("{} MHz", v); }) + " / max " +
                             show(g.sm_clock_max_mhz, p, [](unsigned v) { return fmt::format("{} MHz", v); }));
    row(out, "memory clock", show(g.mem_clock_mhz, p, [](unsigned v) { return fmt::format("{} MHz", v); }) + " / max " +
                                 show(g.mem_clock_max_mhz, p, [](unsigned v) { return fmt::format("{} MHz", v); }));
    auto genw = [&](const Field<unsigned>& gen, const Field<unsigned>& w) {
      if (!gen.ok() || !w.ok()) return p.na(!gen.ok() ? gen.na : w.na);
      return fmt::format("Gen{} x{}", *gen, *w);
    };
    row(out, "PCIe link (idle)", genw(g.pcie_gen_idle, g.pcie_width_idle));
    row(out, "PCIe link (under load)", g.link_read_busy() ? genw(g.pcie_gen_busy, g.pcie_width_busy) : p.na(g.link_busy_error));
    row(out, "PCIe max (GPU)", show(g.pcie_gen_max_gpu, p, [](unsigned v) { return fmt::format("Gen{}", v); }) +
                                   (g.spec ? fmt::format("  (spec: Gen{})", g.spec->pcie_gen) : ""));
    row(out, "PCIe max (GPU+slot)", genw(g.pcie_gen_max_system, g.pcie_width_max));
    row(out, "PCIe throughput", "TX " + show(g.pcie_tx_kbps, p, [](unsigned v) { return fmt::format("{:.1f} MB/s", v / 1e3); }) +
                                    ", RX " + show(g.pcie_rx_kbps, p, [](unsigned v) { return fmt::format("{:.1f} MB/s", v / 1e3); }));
    row(out, "copy bandwidth", g.bandwidth ? fmt::format("H2D {:.1f} GB/s, D2H {:.1f} GB/s (pinned, {} x {} MiB)", g.bandwidth->h2d_gbps,
                                                         g.bandwidth->d2h_gbps, g.bandwidth->copies, g.bandwidth->bytes >> 20)
                                           : p.na(g.bandwidth_error));
    row(out, "temperature", show(g.temperature_c, p, [](unsigned v) { return fmt::format("{} °C", v); }) + " (slowdown " +
                                show(g.slowdown_c, p, [](unsigned v) { return fmt::format("{} °C", v); }) + ", shutdown " +
                                show(g.shutdown_c, p, [](unsigned v) { return fmt::format("{} °C", v); }) + ")");
    row(out, "fan", show(g.fan_percent, p, [](unsigned v) { return fmt::format("{}%", v); }));
    row(out, "power", show(g.power_mw, p, [](unsigned v) { return fmt::format("{:.1f} W", v / 1000.0); }) + " / limit " +
                          show(g.power_limit_mw, p, [](unsigned v) { return fmt::format("{:.0f} W", v / 1000.0); }));
    row(out, "clock-event reasons", show(g.throttle_reasons, p, [](uint64_t m) {
          std::string s;
          for (const auto& n : throttle_reason_names(m)) s += (s.empty() ? "" : ", ") + n;
          return s.empty() ? std::string("none") : s;
        }));
    row(out, "ECC", show(g.ecc_enabled, p, [](bool e) { return std::string(e ? "enabled" : "disabled"); }) +
                        (g.ecc_enabled.ok() && *g.ecc_enabled
                             ? ", uncorrected (volatile) " + show(g.ecc_uncorrected_volatile, p, [](uint64_t v) { return std::to_string(v); })
                             : std::string()));
    row(out, "persistence mode", show(g.persistence_mode, p, [](bool e) { return std::string(e ? "on" : "off"); }));
    row(out, "processes", show(g.processes, p, [](const std::vector<GpuProcess>& ps) {
          if (ps.empty()) return std::string("none");
          std::string s;
          for (const auto& q : ps)
            s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", q.pid, q.used_bytes ? mib(*q.used_bytes) : "n/a");
          return s;
        }));
    row(out, "NVLink", show(g.nvlinks, p, [](const std::vector<NvLink>& ls) {
          if (ls.empty()) return std::string("none");
          unsigned up = 0;
          for (const auto& l : ls) up += l.active;
          std::string s = fmt::format("{} of {} up", up, ls.size());
          if (up == 0) return s + " (no NVLink in use)";
          for (const auto& l : ls)
            if (!l.active) s += fmt::format(", link {} down", l.link);
          return s;
        }));
    row(out, "spec database", g.spec ? fmt::format("{}: FP32 {} TFLOPS, FP16 tensor (FP32 acc) {} TFLOPS, {} GB/s", g.spec->name,
                                                   g.spec->fp32_tflops, g.spec->fp16_tensor_fp32acc_tflops,
                                                   g.spec->memory_bandwidth_gbps)
                                     : p.na("board not in the database"));
  }

  if (!r.topology.empty()) {
    out += fmt::format("\n{}\n", p.paint("Topology (GPU pairs)", "1"));
    for (const auto& t : r.topology)
      row(out, fmt::format("GPU {} <-> GPU {}", t.a, t.b),
          t.nvlinks > 0 ? fmt::format("NVLink x{}", t.nvlinks)
                        : "PCIe " + show(t.pcie_ancestor, p, [](int level) { return std::string(topology_level_name(level)); }));
  }
  out += fmt::format("\n{}\n", p.paint("Checks", "1"));
  for (const auto& c : r.checks) {
    out += fmt::format("  {}  {:<26} {}\n", p.verdict(c.verdict), c.id, c.message);
    if (!c.fix.empty() && c.verdict != Verdict::Pass) out += fmt::format("        {:<26} {}\n", "", p.paint("fix: " + c.fix, "36"));
  }
  out += fmt::format("\n{} PASS, {} WARN, {} FAIL, {} SKIP in {:.1f} s\n", r.count(Verdict::Pass), r.count(Verdict::Warn),
                     r.count(Verdict::Fail), r.count(Verdict::Skip), r.elapsed_s);
  if (!r.driver.nvml_loaded)
    out += "No NVIDIA GPU driver was found: the GPU checks above could not run. Install the NVIDIA driver (see "
           "driver.present) and run doctor again.\n";
  return out;
}

}  // namespace ampforge::hw
