// `ampforge monitor` against the fake NVML scenarios (-c 3 -l 0.1), its logs and plot, and a scrape of its
// Prometheus endpoint over loopback.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ampforge/hw/cli_test_util.h"

namespace ampforge::hw {
namespace {

using testing::fake_env;
using testing::run_ampforge;

int count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

// Sample lines of one GPU ("HH:MM:SS GPU<n> ..."), not the summary's.
int samples(const std::string& out, int gpu) {
  const std::regex line("(^|\n)[0-9]{2}:[0-9]{2}:[0-9]{2} GPU" + std::to_string(gpu) + " ");
  return static_cast<int>(std::distance(std::sregex_iterator(out.begin(), out.end(), line), std::sregex_iterator()));
}

testing::CliResult monitor(const std::string& scenario, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"monitor", "-c", "3", "-l", "0.1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_ampforge(args, fake_env(scenario));
}

TEST(Monitor, HealthyH200NoAlerts) {
  auto r = monitor("healthy_h200");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(samples(r.out, 0), 3) << r.out;
  EXPECT_EQ(count(r.out, "ALERT"), 0);
  EXPECT_NE(r.out.find("fan  n/a"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max temperature 38 °C"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("throttle gpu_idle"), std::string::npos);
  EXPECT_LT(r.seconds, 5);
}

TEST(Monitor, HotGpuAlertsOncePerCrossing) {
  auto r = monitor("hot");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(count(r.out, "ALERT GPU 0 temperature 87 °C >= 80 °C"), 1) << r.out;
  EXPECT_EQ(count(r.out, "ALERT GPU 0 throttling: sw_power_cap, sw_thermal, hw_thermal"), 1) << r.out;
  EXPECT_NE(r.out.find("2 alerts"), std::string::npos);
  // Throttled from the first sample on: two intervals of about 0.1 s are counted.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("throttled ([0-9.]+) s of ([0-9.]+) s")));
  EXPECT_GT(std::stod(m[1]), 0.1);
  EXPECT_EQ(m[1], m[2]);
}

TEST(Monitor, AlertThresholdIsConfigurable) {
  auto r = monitor("hot", {"--alert-temp", "95"});
  EXPECT_EQ(count(r.out, "ALERT GPU 0 temperature"), 0);
  EXPECT_EQ(count(r.out, "throttling"), 1);
}

TEST(Monitor, OtherScenariosRunWithoutAlerts) {
  for (const char* s : {"rtx4080_gen3x8", "fanless", "old_driver"}) {
    auto r = monitor(s);
    EXPECT_EQ(r.exit_code, 0) << s << "\n" << r.out << r.err;
    EXPECT_EQ(samples(r.out, 0), 3) << s;
  }
}

TEST(Monitor, GpuLostMidwayIsReportedAndOthersContinue) {
  auto r = monitor("lost");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(samples(r.out, 0), 3) << r.out;
  EXPECT_EQ(samples(r.out, 1), 2) << r.out;  // the first sample, then the LOST line; nothing after
  EXPECT_EQ(count(r.out, "GPU1 LOST"), 1) << r.out;
  EXPECT_EQ(count(r.out, "ALERT GPU 1 (NVIDIA H200) is lost"), 1) << r.out;
  EXPECT_NE(r.out.find("LOST\n"), std::string::npos);  // in the summary
}

// gpu-check's run on the lent GPU machine (one H200 SXM in a virtual machine, driver 580), as there with fewer,
// faster samples: no fan, no PCIe throughput counters, clocks held for being idle. No alert, every line JSON.
TEST(Monitor, H200AloneInAVirtualMachineLogsJsonl) {
  const std::string jsonl = ::testing::TempDir() + "/mon_h200_vm.jsonl";
  auto r = monitor("h200_vm", {"--jsonl", jsonl});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(samples(r.out, 0), 3) << r.out;
  EXPECT_EQ(count(r.out, "ALERT"), 0) << r.out;
  std::ifstream f(jsonl);
  std::string line;
  int objects = 0;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["temperature_c"], 31);
    EXPECT_TRUE(j["fan_percent"].is_null());
    EXPECT_TRUE(j["pcie_tx_kbps"].is_null());
    EXPECT_DOUBLE_EQ(j["power_w"].get<double>(), 76.0);
    EXPECT_EQ(j["throttle_reasons"], nlohmann::json::array({"gpu_idle"}));
    EXPECT_EQ(j["status"], "ok");
    EXPECT_TRUE(j["error"].is_null()) << j["error"];
    ++objects;
  }
  EXPECT_EQ(objects, 3);
}

TEST(Monitor, PartialNvmlShowsNa) {
  auto env = fake_env("healthy_h200");
  env["AMPFORGE_NVML_LIBRARY"] = AMPFORGE_FAKE_NVML_PARTIAL;
  auto r = run_ampforge({"monitor", "-c", "3", "-l", "0.1"}, env);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(samples(r.out, 0), 3);
  EXPECT_NE(r.out.find("power  121.0/n/a W"), std::string::npos) << r.out;  // no nvmlDeviceGetEnforcedPowerLimit
  EXPECT_NE(r.out.find("PCIe TX    n/a RX    n/a"), std::string::npos);
  EXPECT_NE(r.out.find("throttle n/a"), std::string::npos);
}

TEST(Monitor, NoDriverExitsOneWithAMessage) {
  auto env = fake_env("healthy_h200");
  env["AMPFORGE_NVML_LIBRARY"] = "/nonexistent/libnvidia-ml.so.1";
  auto r = run_ampforge({"monitor", "-c", "1"}, env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no NVIDIA GPU driver found"), std::string::npos) << r.err;
}

TEST(Monitor, CsvAndJsonlLogsPlotToSvg) {
  const std::string dir = ::testing::TempDir();
  const std::string csv = dir + "/mon.csv", jsonl = dir + "/mon.jsonl", svg = dir + "/mon.svg";
  auto r = monitor("lost", {"--csv", csv});
  EXPECT_EQ(r.exit_code, 1);
  std::ifstream f(csv);
  std::string header, line;
  std::getline(f, header);
  EXPECT_EQ(header.rfind("unix_time,elapsed_s,gpu,uuid,name,temperature_c,", 0), 0u) << header;
  int rows = 0, lost = 0;
  while (std::getline(f, line)) {
    ++rows;
    lost += line.find(",lost") != std::string::npos;
  }
  EXPECT_EQ(rows, 5);  // GPU0 x3, GPU1 once, GPU1 lost once
  EXPECT_EQ(lost, 1);

  auto r2 = run_ampforge({"monitor", "-c", "3", "-l", "0.1", "--jsonl", jsonl}, fake_env("hot"));
  EXPECT_EQ(r2.exit_code, 1);
  std::ifstream jf(jsonl);
  int objects = 0;
  while (std::getline(jf, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["temperature_c"], 87);
    EXPECT_TRUE(j["fan_percent"] == 100);
    EXPECT_EQ(j["throttle_reasons"].size(), 3u);
    ++objects;
  }
  EXPECT_EQ(objects, 3);

  for (const auto& log : {csv, jsonl}) {
    std::remove(svg.c_str());
    auto p = run_ampforge({"monitor", "--plot", log, "--out", svg}, fake_env("healthy_h200"));
    EXPECT_EQ(p.exit_code, 0) << p.out << p.err;
    std::stringstream ss;
    ss << std::ifstream(svg).rdbuf();
    const std::string s = ss.str();
    EXPECT_EQ(s.rfind("<svg", 0), 0u);
    EXPECT_NE(s.find("Temperature"), std::string::npos);
    EXPECT_NE(s.find("Power"), std::string::npos);
    EXPECT_NE(s.find("Clocks"), std::string::npos);
    EXPECT_GE(count(s, "<polyline"), 4) << log;  // temperature, power, SM and memory clock lines
  }
  // Not a monitor log: a usage/input error.
  const std::string junk = dir + "/junk.txt";
  std::ofstream(junk) << "hello\nworld\n";
  EXPECT_EQ(run_ampforge({"monitor", "--plot", junk, "--out", svg}, fake_env("healthy_h200")).exit_code, 2);
  EXPECT_EQ(run_ampforge({"monitor", "--plot", dir + "/missing.csv", "--out", svg}, fake_env("healthy_h200")).exit_code, 2);
}

TEST(Monitor, UsageErrorsExitTwo) {
  auto env = fake_env("healthy_h200");
  EXPECT_EQ(run_ampforge({"monitor", "--csv", "a.csv", "--jsonl", "b.jsonl"}, env).exit_code, 2);
  EXPECT_EQ(run_ampforge({"monitor", "-l", "0"}, env).exit_code, 2);
  EXPECT_EQ(run_ampforge({"monitor", "-c", "1", "--prometheus", "nowhere:port"}, env).exit_code, 2);
  EXPECT_EQ(run_ampforge({"monitor", "--plot", "x.csv"}, env).exit_code, 2);  // --plot needs --out
  EXPECT_EQ(run_ampforge({"monitor", "--help"}, env).exit_code, 0);
}

std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ::send(fd, req.data(), req.size(), 0);
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return resp;
}

TEST(Monitor, PrometheusEndpointIsScrapedOverLoopback) {
  testing::Spawned p({"monitor", "-l", "0.1", "--prometheus", "127.0.0.1:0"}, fake_env("hot"));
  std::smatch m;
  const std::regex serving("serving Prometheus metrics on http://127\\.0\\.0\\.1:([0-9]+)/metrics");
  while (p.elapsed() < 10 && !std::regex_search(p.out, m, serving) && p.pump(0.05)) {
  }
  ASSERT_TRUE(std::regex_search(p.out, m, serving)) << p.out << p.err;
  const int port = std::stoi(m[1]);
  // Wait for the first sample to be published.
  while (p.elapsed() < 10 && samples(p.out, 0) == 0 && p.pump(0.05)) {
  }
  const std::string resp = http_get(port, "/metrics");
  EXPECT_EQ(resp.rfind("HTTP/1.1 200 OK", 0), 0u) << resp;
  EXPECT_NE(resp.find("# TYPE DCGM_FI_DEV_GPU_TEMP gauge"), std::string::npos) << resp;
  EXPECT_NE(resp.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-fa4e0000-0000-4000-8000-000000004090\",device=\"nvidia0\","
                      "modelName=\"NVIDIA GeForce RTX 4090\"} 87"),
            std::string::npos)
      << resp;
  EXPECT_NE(resp.find("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\""), std::string::npos);
  EXPECT_NE(resp.find("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu=\"0\""), std::string::npos);
  EXPECT_NE(resp.find("} 100\n"), std::string::npos);  // fan speed
  EXPECT_EQ(http_get(port, "/other").rfind("HTTP/1.1 404", 0), 0u);
  // Ctrl-C: a clean exit with a summary.
  ::kill(p.pid(), SIGINT);
  auto r = p.finish(10);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;  // the hot GPU raised alerts
  EXPECT_NE(r.out.find("interrupted"), std::string::npos);
  EXPECT_NE(r.out.find("Summary"), std::string::npos);
  EXPECT_NE(r.out.find("max temperature 87 °C"), std::string::npos);
}

TEST(Monitor, PrometheusBindsToLoopbackByDefault) {
  testing::Spawned p({"monitor", "-l", "0.1", "--prometheus", "0"}, fake_env("healthy_h200"));
  std::smatch m;
  const std::regex serving("serving Prometheus metrics on http://([0-9.]+):([0-9]+)/metrics");
  while (p.elapsed() < 10 && !std::regex_search(p.out, m, serving) && p.pump(0.05)) {
  }
  ASSERT_TRUE(std::regex_search(p.out, m, serving)) << p.out << p.err;
  EXPECT_EQ(m[1], "127.0.0.1");
  ::kill(p.pid(), SIGINT);
  EXPECT_EQ(p.finish(10).exit_code, 0);
}

}  // namespace
}  // namespace ampforge::hw
