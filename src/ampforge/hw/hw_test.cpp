// Unit tests of the hw pieces that need no subprocess: versions and the driver table, the spec database,
// PCIe rates, check rules on hand-made reports, the alert tracker, the Prometheus text, the SVG plot, and
// the subprocess deadline.
#include <fstream>

#include <gtest/gtest.h>

#include "ampforge/hw/doctor.h"
#include "ampforge/hw/monitor.h"
#include "ampforge/hw/pcie.h"
#include "ampforge/hw/subprocess.h"
#include "ampforge/hw/svg_plot.h"
#include "ampforge/hw/versions.h"
#include "ampforge/util/error.h"
#include "ampforge/util/timer.h"

namespace ampforge::hw {
namespace {

TEST(HwVersions, ParseAndCompare) {
  EXPECT_EQ(Version::parse("570.124.06")->str(), "570.124.6");
  EXPECT_EQ(Version::parse("2.0.1+cu118")->str(), "2.0.1");
  EXPECT_EQ(Version::parse("v2.12.0-rc1")->str(), "2.12.0");
  EXPECT_FALSE(Version::parse("abc"));
  EXPECT_FALSE(Version::parse(""));
  EXPECT_TRUE(*Version::parse("2.0.0") < *Version::parse("2.0.1"));
  EXPECT_TRUE(*Version::parse("2.10") >= *Version::parse("2.9.9"));  // numeric, not lexical
  EXPECT_TRUE(*Version::parse("2.0") == *Version::parse("2.0.0"));
  EXPECT_EQ(cuda_version_string(12040), "12.4");
  EXPECT_EQ(cuda_version_string(11080), "11.8");
}

TEST(HwVersions, DriverTable) {
  EXPECT_EQ(cuda_driver_requirement(12, 1)->min_driver, "530.30.02");
  EXPECT_EQ(cuda_driver_requirement(13, 0)->min_driver, "580.65.06");
  EXPECT_EQ(cuda_driver_requirement(12, 7)->min_driver, "560.28.03");  // 12.7 was never released
  EXPECT_FALSE(cuda_driver_requirement(13, 1));                        // newer than the table
  EXPECT_FALSE(cuda_driver_requirement(9, 0));
  const auto v = [](const char* s) { return *Version::parse(s); };
  EXPECT_EQ(driver_fits_cuda(v("535.104.05"), 12020, std::nullopt), DriverFit::Full);
  EXPECT_EQ(driver_fits_cuda(v("535.104.05"), 12040, std::nullopt), DriverFit::MinorCompat);
  EXPECT_EQ(driver_fits_cuda(v("470.57.02"), 12040, std::nullopt), DriverFit::TooOld);
  EXPECT_EQ(driver_fits_cuda(v("470.57.02"), 12040, 11040), DriverFit::TooOld);
  EXPECT_EQ(driver_fits_cuda(v("570.124.06"), 12040, 12080), DriverFit::Full);
  EXPECT_EQ(driver_fits_cuda(v("550.54.14"), 12080, 12040), DriverFit::MinorCompat);
  EXPECT_EQ(driver_fits_cuda(v("999.0"), 14000, std::nullopt), DriverFit::Unknown);
  // The GPU machine's driver 580 supports CUDA 13.0; a 13.x runtime newer than the table runs on it under
  // minor-version compatibility (13.x >= 580), not "too old".
  EXPECT_EQ(driver_fits_cuda(v("580.95.05"), 13000, 13000), DriverFit::Full);
  EXPECT_EQ(driver_fits_cuda(v("580.95.05"), 13010, 13000), DriverFit::MinorCompat);
  EXPECT_EQ(driver_fits_cuda(v("575.51.03"), 13000, 12090), DriverFit::TooOld);
  // 11.x minor-version compatibility needs 450.80.02, above 11.0's own GA driver.
  EXPECT_EQ(driver_fits_cuda(v("450.80.02"), 11080, 11000), DriverFit::MinorCompat);
  EXPECT_EQ(driver_fits_cuda(v("450.51.05"), 11040, 11000), DriverFit::TooOld);
}

TEST(HwSpecs, LookupAndCorrectedNumbers) {
  const GpuSpec* s = find_gpu_spec("NVIDIA GeForce RTX 4080");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->memory_gb, 16);
  EXPECT_EQ(s->memory_bandwidth_gbps, 716.8);
  EXPECT_EQ(s->fp32_tflops, 48.7);
  EXPECT_EQ(s->fp16_tensor_fp32acc_tflops, 97.5);
  EXPECT_EQ(find_gpu_spec("NVIDIA GeForce RTX 4080 SUPER"), nullptr);
  EXPECT_EQ(find_gpu_spec("NVIDIA GeForce RTX 3090")->fp16_tensor_fp32acc_tflops, 71.0);
  EXPECT_EQ(find_gpu_spec("NVIDIA GeForce RTX 3080 Ti"), nullptr);
  EXPECT_EQ(find_gpu_spec("NVIDIA TITAN RTX")->memory_bandwidth_gbps, 672);
  EXPECT_FALSE(find_gpu_spec("NVIDIA TITAN RTX")->tf32_tensor_tflops);
  EXPECT_EQ(find_gpu_spec("NVIDIA H200")->fp16_tensor_fp32acc_tflops, 989.4);
  EXPECT_EQ(find_gpu_spec("NVIDIA H200")->memory_gb, 141);
  EXPECT_EQ(find_gpu_spec("NVIDIA H200")->pcie_gen, 5);
  EXPECT_EQ(find_gpu_spec("NVIDIA A100-SXM4-80GB")->key, "a100-sxm4-80gb");
  EXPECT_EQ(find_gpu_spec("NVIDIA A100-SXM4-40GB")->key, "a100-sxm4-40gb");
  EXPECT_EQ(find_gpu_spec("NVIDIA A100 80GB PCIe")->key, "a100-pcie-80gb");
  EXPECT_EQ(find_gpu_spec("NVIDIA H100 80GB HBM3")->key, "h100-sxm");
  EXPECT_EQ(find_gpu_spec("NVIDIA H100 PCIe")->key, "h100-pcie");
  EXPECT_EQ(find_gpu_spec("NVIDIA L40S")->key, "l40s");
  EXPECT_EQ(find_gpu_spec("NVIDIA GeForce GTX 1080"), nullptr);
  for (const auto& spec : gpu_specs()) {
    EXPECT_FALSE(spec.source.empty()) << spec.key;
    EXPECT_GT(spec.fp32_tflops, 0) << spec.key;
    EXPECT_GT(spec.fp16_tensor_fp32acc_tflops, spec.fp32_tflops) << spec.key;
    EXPECT_GE(spec.pcie_gen, 3) << spec.key;
    EXPECT_EQ(find_gpu_spec_by_key(spec.key), &spec);
  }
}

TEST(HwPcie, TheoreticalRates) {
  EXPECT_NEAR(pcie_link_gbps(3, 16), 15.75, 0.01);
  EXPECT_NEAR(pcie_link_gbps(4, 16), 31.51, 0.01);
  EXPECT_NEAR(pcie_link_gbps(5, 16), 63.02, 0.01);
  EXPECT_NEAR(pcie_link_gbps(3, 8), 7.88, 0.01);
  EXPECT_NEAR(pcie_link_gbps(1, 16), 4.0, 1e-9);
  EXPECT_EQ(pcie_link_gbps(9, 16), 0);
}

TEST(HwNvml, ThrottleReasonNames) {
  EXPECT_EQ(throttle_reason_names(0), std::vector<std::string>{});
  EXPECT_EQ(throttle_reason_names(0x64), (std::vector<std::string>{"sw_power_cap", "sw_thermal", "hw_thermal"}));
  EXPECT_EQ(throttle_reason_names(0x1001), (std::vector<std::string>{"gpu_idle", "other_0x1000"}));
  EXPECT_FALSE(throttle_reasons_active_mask() & nvml::kReasonGpuIdle);
}

// A report with one GPU whose link and bandwidth are set by hand.
DoctorReport one_gpu(unsigned gen, unsigned width, bool busy, std::optional<double> h2d) {
  DoctorReport r;
  r.driver.nvml_loaded = true;
  r.driver.driver_version = Field<std::string>::of("570.124.06");
  r.driver.gpu_count = Field<unsigned>::of(1);
  GpuReport g;
  g.name = Field<std::string>::of("NVIDIA GeForce RTX 4080");
  g.spec = find_gpu_spec(*g.name);
  (busy ? g.pcie_gen_busy : g.pcie_gen_idle) = Field<unsigned>::of(gen);
  (busy ? g.pcie_width_busy : g.pcie_width_idle) = Field<unsigned>::of(width);
  g.pcie_gen_max_system = Field<unsigned>::of(4);
  g.pcie_gen_max_gpu = Field<unsigned>::of(4);
  g.pcie_width_max = Field<unsigned>::of(16);
  if (h2d) g.bandwidth = BandwidthResult{*h2d, *h2d + 1, 64u << 20, 8};
  if (!busy) g.link_busy_error = "no CUDA runtime";
  r.gpus.push_back(g);
  evaluate_checks(r);
  return r;
}

Verdict verdict(const DoctorReport& r, const std::string& id) {
  for (const auto& c : r.checks)
    if (c.id == id) return c.verdict;
  ADD_FAILURE() << "no check " << id;
  return Verdict::Skip;
}

TEST(HwChecks, BlasKernelsWeakerThanTheCpuWarn) {
  DoctorReport r;
  evaluate_checks(r);
  for (const auto& c : r.checks) EXPECT_NE(c.id, "host.blas_kernels") << "no BLAS facts given: no check";
  r.blas = BlasReport{.known = true, .library = "OpenBLAS 0.3.21 DYNAMIC_ARCH", .version = "OpenBLAS 0.3.21",
                      .loaded_core = "Prescott",
                      .core = "Cooperlake", .cpu_best = "Cooperlake", .source = "ampforge", .note = "re-selected",
                      .below_cpu = false, .products = ""};
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "host.blas_kernels"), Verdict::Pass);
  r.blas.core = "Prescott";
  r.blas.source = "user-env";
  r.blas.below_cpu = true;
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "host.blas_kernels"), Verdict::Warn);
  for (const auto& c : r.checks)
    if (c.id == "host.blas_kernels") {
      EXPECT_NE(c.fix.find("OPENBLAS_CORETYPE=Cooperlake"), std::string::npos) << c.fix;
    }
  // Where ampforge's own products run elsewhere, the message says so (the kernels still serve F64 and other programs).
  r.blas.products = "F32 on oneDNN 2.6.3 (avx512_core_bf16) SGEMM";
  evaluate_checks(r);
  for (const auto& c : r.checks)
    if (c.id == "host.blas_kernels") {
      EXPECT_NE(c.message.find("ampforge's products: F32 on oneDNN"), std::string::npos) << c.message;
    }
  r.blas.source = "unavailable";
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "host.blas_kernels"), Verdict::Skip);
}

TEST(HwChecks, PcieLinkUnderLoadAndIdle) {
  EXPECT_EQ(verdict(one_gpu(4, 16, true, std::nullopt), "gpu0.pcie_link"), Verdict::Pass);
  EXPECT_EQ(verdict(one_gpu(3, 16, true, std::nullopt), "gpu0.pcie_link"), Verdict::Fail);
  // Idle GPUs drop their link generation to save power (an idle H200 sits at Gen1): not judged without a load.
  EXPECT_EQ(verdict(one_gpu(1, 16, false, std::nullopt), "gpu0.pcie_link"), Verdict::Skip);
  // Fewer lanes is not power saving.
  EXPECT_EQ(verdict(one_gpu(4, 8, false, std::nullopt), "gpu0.pcie_link"), Verdict::Fail);
}

TEST(HwChecks, BandwidthAgainstTheLink) {
  EXPECT_EQ(verdict(one_gpu(4, 16, true, 25.0), "gpu0.pcie_bandwidth"), Verdict::Pass);   // 79% of 31.5
  EXPECT_EQ(verdict(one_gpu(4, 16, true, 15.0), "gpu0.pcie_bandwidth"), Verdict::Warn);   // 48%
  EXPECT_EQ(verdict(one_gpu(4, 16, true, 6.0), "gpu0.pcie_bandwidth"), Verdict::Fail);    // 19%
  EXPECT_EQ(verdict(one_gpu(4, 16, true, std::nullopt), "gpu0.pcie_bandwidth"), Verdict::Skip);
}

TEST(HwChecks, SlotSlowerThanGpuWarns) {
  DoctorReport r = one_gpu(3, 16, true, std::nullopt);
  r.gpus[0].pcie_gen_max_system = Field<unsigned>::of(3);
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.pcie_slot"), Verdict::Warn);
  EXPECT_EQ(verdict(r, "gpu0.pcie_link"), Verdict::Pass);  // at the slot's best
}

std::string message(const DoctorReport& r, const std::string& id) {
  for (const auto& c : r.checks)
    if (c.id == id) return c.message;
  return "";
}

// In a virtual machine the port above the GPU is the hypervisor's: NVML's GPU+slot maximum can be below what the
// link is seen running at, or 0. Such a maximum is not believed: the GPU's own maximum judges the link and the
// bandwidth, and the slot is not judged.
TEST(HwChecks, VirtualPortBelowTheLinkIsNotBelieved) {
  for (unsigned slot : {0u, 1u, 3u}) {
    DoctorReport r = one_gpu(4, 16, true, 25.0);
    r.gpus[0].pcie_gen_max_system = Field<unsigned>::of(slot);
    evaluate_checks(r);
    EXPECT_EQ(verdict(r, "gpu0.pcie_link"), Verdict::Pass) << slot;
    EXPECT_NE(message(r, "gpu0.pcie_link").find("maximum Gen4 x16, from the GPU)"), std::string::npos)
        << message(r, "gpu0.pcie_link");
    EXPECT_EQ(verdict(r, "gpu0.pcie_slot"), Verdict::Skip) << slot;
    EXPECT_EQ(verdict(r, "gpu0.pcie_bandwidth"), Verdict::Pass) << message(r, "gpu0.pcie_bandwidth");  // of Gen4
    EXPECT_NE(message(r, "gpu0.pcie_bandwidth").find("of Gen4 x16"), std::string::npos);
  }
  // A width maximum below the running width: the spec database's lanes instead.
  DoctorReport r = one_gpu(4, 16, true, 25.0);
  r.gpus[0].pcie_width_max = Field<unsigned>::of(1);
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.pcie_link"), Verdict::Pass);
  EXPECT_NE(message(r, "gpu0.pcie_bandwidth").find("of Gen4 x16"), std::string::npos) << message(r, "gpu0.pcie_bandwidth");
  // A real slot limit (the link at the slot's best) is still a warning.
  r = one_gpu(3, 16, true, std::nullopt);
  r.gpus[0].pcie_gen_max_system = Field<unsigned>::of(3);
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.pcie_slot"), Verdict::Warn);
}

std::vector<NvLink> links(unsigned n, unsigned up) {
  std::vector<NvLink> out;
  for (unsigned i = 0; i < n; ++i) out.push_back(NvLink{i, i < up, {}});
  return out;
}

// An SXM GPU alone in a virtual machine (no NVSwitch fabric there), or a PCIe board with NVLink ports and no
// bridge, reports links none of which is up: no NVLink in use, not a fault. Some down of several is a warning,
// and so is none up where another GPU of the machine has NVLinks up.
TEST(HwChecks, NvlinksNoneUpIsNotAWarning) {
  DoctorReport r = one_gpu(5, 16, true, std::nullopt);
  r.gpus[0].nvlinks = Field<std::vector<NvLink>>::of(links(18, 0));
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.nvlink"), Verdict::Skip) << message(r, "gpu0.nvlink");
  r.gpus[0].nvlinks = Field<std::vector<NvLink>>::of(links(18, 17));
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.nvlink"), Verdict::Warn);
  EXPECT_NE(message(r, "gpu0.nvlink").find("NVLink 17 down (17 of 18 up)"), std::string::npos) << message(r, "gpu0.nvlink");
  GpuReport other = r.gpus[0];
  other.index = 1;
  other.nvlinks = Field<std::vector<NvLink>>::of(links(18, 18));
  r.gpus[0].nvlinks = Field<std::vector<NvLink>>::of(links(18, 0));
  r.gpus.push_back(other);
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.nvlink"), Verdict::Warn) << message(r, "gpu0.nvlink");
  EXPECT_EQ(verdict(r, "gpu1.nvlink"), Verdict::Pass);
}

TEST(HwChecks, MigModeOnOrPendingWarns) {
  DoctorReport r = one_gpu(5, 16, true, std::nullopt);
  for (const auto& c : r.checks) EXPECT_NE(c.id, "gpu0.mig") << "MIG not supported (not read): no check";
  r.gpus[0].mig_mode = Field<NvmlDevice::Mig>::of({false, false});
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.mig"), Verdict::Pass);
  r.gpus[0].mig_mode = Field<NvmlDevice::Mig>::of({true, true});
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.mig"), Verdict::Warn);
  r.gpus[0].mig_mode = Field<NvmlDevice::Mig>::of({false, true});
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.mig"), Verdict::Warn);
  EXPECT_NE(message(r, "gpu0.mig").find("after the next GPU reset"), std::string::npos);
  EXPECT_EQ(r.exit_code(), 0);
}

TEST(HwChecks, EccCounts) {
  DoctorReport r = one_gpu(4, 16, true, std::nullopt);
  auto& g = r.gpus[0];
  g.ecc_enabled = Field<bool>::of(true);
  g.ecc_uncorrected_volatile = Field<uint64_t>::of(0);
  g.ecc_uncorrected_aggregate = Field<uint64_t>::of(2);
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.ecc"), Verdict::Warn);
  g.ecc_uncorrected_volatile = Field<uint64_t>::of(1);
  evaluate_checks(r);
  EXPECT_EQ(verdict(r, "gpu0.ecc"), Verdict::Fail);
  EXPECT_EQ(r.exit_code(), 1);
}

TEST(HwPython, ProbeOutputParsing) {
  PythonReport py;
  FrameworkInfo f;
  parse_python_probe_output(
      "{\"python\": \"3.11.2\"}\nnoise printed by a framework\n{\"installed\": true}\n{\"version\": \"2.1.0\"}\n"
      "{\"version\": \"2.1.0+cu121\", \"cuda\": \"12.1\", \"cudnn\": \"8902\"}\n",
      f, py);
  EXPECT_EQ(py.version, "3.11.2");
  EXPECT_EQ(f.installed, true);
  EXPECT_EQ(f.version, "2.1.0+cu121");
  EXPECT_EQ(f.cuda, "12.1");
  EXPECT_EQ(f.cudnn, "8902");
}

TEST(HwSubprocess, DeadlineKillsTheProcessGroup) {
  const Stopwatch sw;
  auto r = run_subprocess({"sh", "-c", "echo started; sleep 30 & sleep 30"}, 0.3);
  EXPECT_TRUE(r.started);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.out, "started\n");
  EXPECT_LT(sw.seconds(), 3);
  auto ok = run_subprocess({"sh", "-c", "echo hi; exit 3"}, 5);
  EXPECT_FALSE(ok.timed_out);
  EXPECT_EQ(ok.exit_code, 3);
  EXPECT_EQ(ok.out, "hi\n");
  auto missing = run_subprocess({"/nonexistent/program"}, 1);
  EXPECT_FALSE(missing.started);
}

// The conversation `ampforge bench --interleave` has with its peer: a line in, a line out, then end of input lets the
// program finish and print the rest; a program that died takes writes without a SIGPIPE, and a silent one times out.
TEST(HwSubprocess, InteractiveLinesBothWays) {
  Subprocess p({"sh", "-c", "while read l; do [ \"$l\" = quit ] && break; echo \"got $l\"; done; echo extra; echo end"},
               false, true);
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.write_line("a b"));
  EXPECT_EQ(p.read_line(5).value_or("<none>"), "got a b");
  ASSERT_TRUE(p.write_line("c"));
  EXPECT_EQ(p.read_line(5).value_or("<none>"), "got c");
  ASSERT_TRUE(p.write_line("quit"));
  EXPECT_EQ(p.read_line(5).value_or("<none>"), "extra");
  const SubprocessResult r = p.wait(5);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "end\n");

  Subprocess dead({"sh", "-c", "exit 0"}, false, true);
  ASSERT_TRUE(dead.started());
  EXPECT_FALSE(dead.read_line(5).has_value());  // end of output
  EXPECT_FALSE(dead.timed_out());
  bool wrote = true;
  for (int i = 0; i < 50 && wrote; ++i) wrote = dead.write_line(std::string(4096, 'x'));  // no SIGPIPE kills us
  EXPECT_FALSE(wrote);

  Subprocess silent({"sh", "-c", "sleep 30"}, false, true);
  const Stopwatch sw;
  EXPECT_FALSE(silent.read_line(0.2).has_value());
  EXPECT_TRUE(silent.timed_out());
  EXPECT_LT(sw.seconds(), 3);
}

MonitorSample sample(double t, unsigned temp, uint64_t reasons) {
  MonitorSample s;
  s.elapsed_s = t;
  s.name = "NVIDIA H200";
  s.uuid = "GPU-1";
  s.temperature_c = Field<unsigned>::of(temp);
  s.power_mw = Field<unsigned>::of(300000);
  s.throttle_mask = Field<uint64_t>::of(reasons);
  s.fan_percent = Field<unsigned>::missing("not supported");
  return s;
}

TEST(HwMonitor, AlertsOnCrossingsOnly) {
  AlertTracker t(80);
  EXPECT_TRUE(t.update({sample(0, 70, 0x1)}).empty());
  auto a = t.update({sample(1, 81, 0x1)});
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "temperature");
  EXPECT_TRUE(t.update({sample(2, 85, 0x1)}).empty());  // still hot: no new alert
  EXPECT_TRUE(t.update({sample(3, 70, 0x1)}).empty());  // cooled
  EXPECT_EQ(t.update({sample(4, 82, 0x1)}).size(), 1u);  // crossed again
  auto th = t.update({sample(5, 82, 0x4)});
  ASSERT_EQ(th.size(), 1u);
  EXPECT_EQ(th[0].message, "GPU 0 throttling: sw_power_cap");
  EXPECT_TRUE(t.update({sample(6, 82, 0x4)}).empty());
  EXPECT_EQ(t.update({sample(7, 82, 0x24)}).size(), 1u);  // a new reason appears
  const auto& s = t.summary().at(0);
  EXPECT_EQ(*s.max_temperature_c, 85u);
  EXPECT_DOUBLE_EQ(s.throttled_s, 3.0);
  EXPECT_DOUBLE_EQ(s.observed_s, 7.0);
  EXPECT_EQ(t.total_alerts(), 4);
}

TEST(HwMonitor, PrometheusTextOmitsNaSeries) {
  const std::string text = prometheus_text({sample(0, 55, 0x4)});
  EXPECT_NE(text.find("# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-1\",device=\"nvidia0\",modelName=\"NVIDIA H200\"} 55\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\",UUID=\"GPU-1\",device=\"nvidia0\",modelName=\"NVIDIA H200\"} 300\n"),
            std::string::npos);
  EXPECT_EQ(text.find("DCGM_FI_DEV_FAN_SPEED{"), std::string::npos);  // n/a: no series, only its HELP/TYPE
  EXPECT_NE(text.find("ampforge_gpu_lost{gpu=\"0\""), std::string::npos);
}

TEST(HwMonitor, CsvRowsRoundTripThroughThePlotReader) {
  const std::string path = ::testing::TempDir() + "/hw_unit.csv";
  {
    std::ofstream f(path);
    f << monitor_csv_header() << "\n";
    for (int i = 0; i < 5; ++i) f << monitor_csv_row(sample(i * 0.5, 60 + i, 0)) << "\n";
  }
  auto pts = read_monitor_log(path);
  ASSERT_EQ(pts.size(), 5u);
  EXPECT_DOUBLE_EQ(pts[4].t, 2.0);
  EXPECT_EQ(*pts[4].temperature_c, 64);
  EXPECT_EQ(*pts[0].power_w, 300);
  EXPECT_FALSE(pts[0].sm_clock_mhz);
  const std::string svg = render_monitor_svg(pts, "t<1>");
  EXPECT_NE(svg.find("t&lt;1&gt;"), std::string::npos);
  EXPECT_NE(svg.find("n/a (no values in the log)"), std::string::npos);  // the clocks panel
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_THROW(read_monitor_log(path + ".missing"), Error);
}

}  // namespace
}  // namespace ampforge::hw
