// `ampforge monitor`: one line per GPU per interval, alerts on crossings, CSV / JSONL logs, a Prometheus
// endpoint, and `--plot LOG --out FILE.svg`. Ctrl-C ends it with a summary.
// Exit status: 0 when no alert fired, 1 when one did (or no GPU could be monitored), 2 for usage errors.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "ampforge/cli/commands.h"
#include "ampforge/hw/monitor.h"
#include "ampforge/hw/prometheus.h"
#include "ampforge/hw/svg_plot.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"
#include "ampforge/util/timer.h"

namespace ampforge::cli {

namespace {

std::atomic<bool> g_interrupted{false};
void monitor_on_sigint(int) { g_interrupted = true; }

struct MonitorArgs {
  double interval = 1.0;
  long count = 0;  // 0: until Ctrl-C
  std::string csv, jsonl, prometheus, plot, out;
  double alert_temp = 80;
};

bool use_colour() {
  auto no_colour = env_get("NO_COLOR");
  return ::isatty(STDOUT_FILENO) && !(no_colour && !no_colour->empty());
}

int run_plot(const MonitorArgs& a) {
  AF_CHECK(!a.out.empty(), "--plot needs --out FILE.svg");
  const auto points = hw::read_monitor_log(a.plot);
  const std::string svg = hw::render_monitor_svg(points, "ampforge monitor: " + a.plot);
  std::ofstream f(a.out);
  if (!f || !(f << svg) || !f.flush()) AF_THROW(Io, "cannot write '{}'", a.out);
  std::printf("wrote %s (%zu samples)\n", a.out.c_str(), points.size());
  return 0;
}

int run_monitor(const MonitorArgs& a) {
  // Ctrl-C (and SIGTERM) end the loop cleanly with a summary; installed first so no window kills us outright.
  struct sigaction sa {};
  sa.sa_handler = monitor_on_sigint;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  const bool colour = use_colour();
  auto nvml = hw::Nvml::open();
  if (!nvml->ok()) {
    std::fprintf(stderr, "ampforge monitor: no NVIDIA GPU driver found: %s\n"
                         "Install the NVIDIA driver (then nvidia-smi should list your GPU); `ampforge doctor` says which.\n",
                 nvml->error().c_str());
    return 1;
  }
  hw::MonitorSampler sampler(*nvml);
  for (const auto& [i, why] : sampler.unavailable()) std::fprintf(stderr, "GPU %u: unavailable: %s\n", i, why.c_str());
  if (sampler.gpu_count() == 0) {
    std::fprintf(stderr, "ampforge monitor: the driver reports no GPU to monitor\n");
    return 1;
  }
  std::ofstream csv, jsonl;
  if (!a.csv.empty()) {
    csv.open(a.csv);
    if (!csv) AF_THROW(Io, "cannot write '{}'", a.csv);
    csv << hw::monitor_csv_header() << "\n";
  }
  if (!a.jsonl.empty()) {
    jsonl.open(a.jsonl);
    if (!jsonl) AF_THROW(Io, "cannot write '{}'", a.jsonl);
  }
  std::unique_ptr<hw::MetricsServer> server;
  if (!a.prometheus.empty()) {
    server = std::make_unique<hw::MetricsServer>(a.prometheus);
    std::printf("serving Prometheus metrics on http://%s:%d/metrics\n", server->host().c_str(), server->port());
    std::fflush(stdout);
  }

  hw::AlertTracker tracker(a.alert_temp);
  const Stopwatch sw;
  for (long k = 0; (a.count == 0 || k < a.count) && !g_interrupted.load(); ++k) {
    // Ticks on a fixed schedule (k * interval), so sampling time does not drift the log.
    const double due = k * a.interval;
    while (sw.seconds() < due && !g_interrupted.load())
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.02, due - sw.seconds())));
    if (g_interrupted.load()) break;
    const auto samples = sampler.sample(sw.seconds());
    for (const auto& s : samples) {
      std::printf("%s\n", hw::monitor_line(s, colour).c_str());
      if (csv.is_open()) csv << hw::monitor_csv_row(s) << "\n";
      if (jsonl.is_open()) jsonl << hw::monitor_json(s).dump() << "\n";
    }
    for (const auto& al : tracker.update(samples))
      std::printf("%s%s\n", colour ? "\033[1;31mALERT\033[0m " : "ALERT ", al.message.c_str());
    if (csv.is_open()) csv.flush();
    if (jsonl.is_open()) jsonl.flush();
    if (server) server->publish(hw::prometheus_text(samples));
    std::fflush(stdout);
    if (sampler.live_gpu_count() == 0) {
      std::printf("no GPU left to monitor\n");
      break;
    }
  }
  if (g_interrupted.load()) std::printf("\ninterrupted\n");
  std::printf("%s", hw::monitor_summary_text(tracker, sw.seconds()).c_str());
  std::fflush(stdout);
  return tracker.total_alerts() > 0 ? 1 : 0;
}

}  // namespace

Command add_monitor_command(CLI::App& app) {
  auto* sub = app.add_subcommand("monitor", "Watch GPU temperature, power, clocks, PCIe traffic and throttling; alert, log, serve Prometheus");
  auto a = std::make_shared<MonitorArgs>();
  sub->add_option("-l,--interval", a->interval, "Seconds between samples")->check(CLI::Range(0.05, 86400.0))->capture_default_str();
  sub->add_option("-c,--count", a->count, "Number of samples per GPU (default: until Ctrl-C)")->check(CLI::Range(1L, 1000000000L));
  auto* csv = sub->add_option("--csv", a->csv, "Also write samples to FILE as CSV");
  auto* jsonl = sub->add_option("--jsonl", a->jsonl, "Also write samples to FILE as JSON lines");
  csv->excludes(jsonl);
  sub->add_option("--alert-temp", a->alert_temp, "Alert when a GPU reaches this temperature (°C)")
      ->check(CLI::Range(20.0, 120.0))
      ->capture_default_str();
  sub->add_option("--prometheus", a->prometheus, "Serve metrics at [ADDR:]PORT/metrics (default address 127.0.0.1)");
  auto* plot = sub->add_option("--plot", a->plot, "Draw temperature, power and clocks from a monitor log (CSV/JSONL)");
  sub->add_option("--out", a->out, "SVG file written by --plot")->needs(plot);
  plot->excludes(csv)->excludes(jsonl);
  sub->footer("Exit status: 0 when no alert fired, 1 when one did (or no GPU could be monitored), 2 for usage errors.");
  return {sub, [a] { return a->plot.empty() ? run_monitor(*a) : run_plot(*a); }};
}

}  // namespace ampforge::cli
