// `ampforge bench` as a user runs it: the JSON schema, the Markdown and SVG files, the gain over FP32, the
// peer's cells (through a stand-in interpreter that answers as the peer script does, so the plumbing is
// checked without PyTorch), failures shown per cell, and usage errors (exit 2).
#include <gtest/gtest.h>

#include "ampforge/backends/cpu/conv_onednn.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/cli/cli_test_util.h"
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {
using ampforge::cli::testing::CmdResult;
using ampforge::cli::testing::read_text;
using ampforge::cli::testing::run_ampforge;
using ampforge::cli::testing::spawn_ampforge;
fs::path tmp(const std::string& name) { return ampforge::cli::testing::scratch_dir("ampforge_bench_test_") / name; }
}  // namespace

TEST(BenchCli, JsonMarkdownAndSvgOfTheMeasuredCells) {
  const fs::path md = tmp("table.md"), svg = tmp("chart.svg");
  const CmdResult r = run_ampforge("bench --models cnn --precisions fp32,bf16 --batch cnn=16 --warmup 0 --steps 2 --peer none "
                          "--threads 1 --json --markdown " + md.string() + " --svg " + svg.string(),
                          /*with_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schema"], "ampforge-bench v1");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["threads"], 1);
  // Which library runs ampforge's products and convolutions on the CPU (the peer's OpenBLAS kernels are in "blas"):
  // the text this process gives, up to the times of the BF16 measurement (bf16_compute.h), which the child made anew.
  auto untimed = [](std::string s) {
    if (const size_t p = s.find(" (measured: "); p != std::string::npos) s.erase(p);
    return s;
  };
  ASSERT_TRUE(j["cpu_products"].is_string());
  ASSERT_TRUE(j["cpu_convolutions"].is_string());
  EXPECT_EQ(untimed(j["cpu_products"]), untimed(ampforge::cpu::cpu_gemm_summary()));
  EXPECT_EQ(untimed(j["cpu_convolutions"]), untimed(ampforge::cpu::cpu_conv_summary()));
  EXPECT_EQ(j["settings"]["steps"], 2);
  EXPECT_TRUE(j["peer"].is_null());
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    EXPECT_EQ(row["model"], "cnn");
    EXPECT_EQ(row["batch"], 16);
    EXPECT_EQ(row["input"], "1x28x28");
    const auto& a = row["ampforge"];
    ASSERT_FALSE(a.contains("error")) << a;
    EXPECT_EQ(a["step_seconds"].size(), 2u);
    EXPECT_GT(a["samples_per_sec"].get<double>(), 0);
    EXPECT_NEAR(a["samples_per_sec"].get<double>(), 16.0 / (a["ms_per_step"].get<double>() * 1e-3), 1e-6);
    EXPECT_GT(a["peak_allocated_bytes"].get<int64_t>(), 0);
    EXPECT_GE(a["peak_reserved_bytes"].get<int64_t>(), a["peak_allocated_bytes"].get<int64_t>());
    EXPECT_EQ(a["parameters"], 421738);  // the small CNN for 1x28x28, 10 classes
    EXPECT_TRUE(std::isfinite(a["last_loss"].get<double>()));
    EXPECT_EQ(a["timer"], "host clock");
    EXPECT_TRUE(row["peer"].is_null());
    EXPECT_TRUE(row["ratio"].is_null());
    EXPECT_TRUE(row["reference"].is_null()) << "the brief has no figure for the small CNN";
  }
  EXPECT_TRUE(j["rows"][0]["gain_vs_fp32_percent"].is_null());
  const double fp32 = j["rows"][0]["ampforge"]["samples_per_sec"], bf16 = j["rows"][1]["ampforge"]["samples_per_sec"];
  EXPECT_NEAR(j["rows"][1]["gain_vs_fp32_percent"].get<double>(), 100.0 * (bf16 / fp32 - 1.0), 1e-9);

  const std::string m = read_text(md);
  EXPECT_NE(m.find("| cnn | fp32 | 16 | 1x28x28 |"), std::string::npos) << m;
  EXPECT_NE(m.find("| cnn | bf16 | 16 | 1x28x28 |"), std::string::npos) << m;
  // The SVG is XML (parsed by Python's expat) with one bar per measured cell: two ampforge cells, no peer.
  const std::string check = "python3 -c \"import sys,xml.etree.ElementTree as E; r=E.parse(sys.argv[1]).getroot(); "
                            "print(sum(1 for e in r.iter() if e.get('class')=='bar'))\" " + svg.string();
  FILE* p = popen(check.c_str(), "r");
  char buf[64] = {0};
  ASSERT_NE(fgets(buf, sizeof buf, p), nullptr);
  EXPECT_EQ(pclose(p), 0);
  EXPECT_EQ(std::atoi(buf), 2) << read_text(svg);
}

// --profile: one more step per cell under the profiler, not timed; its report is on stderr and in each cell's
// JSON (the phases of one step, the ops with the convolutions among them); without the flag there is none.
TEST(BenchCli, ProfileReportsOneExtraStepPerCell) {
  const CmdResult r = run_ampforge("bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 --peer none "
                                   "--threads 1 --json --profile", /*with_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 1u);
  const auto& a = j["rows"][0]["ampforge"];
  EXPECT_EQ(a["step_seconds"].size(), 1u) << "the profiled step is not a timed one";
  ASSERT_TRUE(a.contains("profile")) << a;
  const auto& p = a["profile"];
  EXPECT_EQ(p["step"]["steps"], 1);
  EXPECT_GT(p["step"]["forward_ns"].get<int64_t>(), 0);
  EXPECT_GT(p["step"]["backward_ns"].get<int64_t>(), 0);
  EXPECT_GT(p["step"]["optimizer_ns"].get<int64_t>(), 0);
  bool conv = false;
  for (const auto& op : p["ops"]) conv = conv || op["name"] == "conv2d";
  EXPECT_TRUE(conv) << p["ops"];
  const CmdResult text = run_ampforge("bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 --peer none "
                                      "--threads 1 --profile", /*with_stderr=*/true);
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("one profiled step (not timed)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("conv2d"), std::string::npos) << text.out;
  const CmdResult plain = run_ampforge("bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 --peer none "
                                       "--threads 1 --json", /*with_stderr=*/false);
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_FALSE(nlohmann::json::parse(plain.out)["rows"][0]["ampforge"].contains("profile"));
}

// --profile asks the peer for torch.profiler's view of one more step too, and prints it after ours.
TEST(BenchCli, ProfileAsksThePeerForItsOwnProfile) {
  const fs::path py = tmp("fake_python_profile"), args = tmp("profile_args");
  {
    std::ofstream f(py);
    f << "#!/bin/sh\nARGS_FILE=" << args.string() << "\n"
      << R"SH(if [ "$1" = "-c" ]; then echo 2.14.1-fake; exit 0; fi
echo "$*" >> "$ARGS_FILE"
case "$*" in
  *--profile*) p=', "profile": {"step_ms": 40.0, "ops": [{"name": "aten::convolution_backward", "calls": 2, "self_ms": 10.0, "total_ms": 10.5}]}';;
  *) p='';;
esac
echo "{\"torch\": \"2.14.1\", \"results\": {\"nchw\": {\"seconds\": [0.04], \"median\": 0.04, \"mean\": 0.04, \"samples_per_sec\": 200.0, \"parameters\": 421738, \"last_loss\": 2.3$p}}, \"best\": \"nchw\"}"
)SH";
  }
  ::chmod(py.c_str(), 0755);
  const std::string base = "bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 --threads 1 "
                           "--no-compile --peer " + py.string();
  fs::remove(args);
  const CmdResult text = run_ampforge(base + " --profile", /*with_stderr=*/true);
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(read_text(args).find("--profile"), std::string::npos) << read_text(args);
  EXPECT_NE(text.out.find("cnn fp32 batch 8, PyTorch: one profiled step (torch.profiler, not timed), 40.0 ms"),
            std::string::npos) << text.out;
  EXPECT_NE(text.out.find("aten::convolution_backward"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("25.0%"), std::string::npos) << text.out;
  const CmdResult js = run_ampforge(base + " --profile --json", false);
  ASSERT_EQ(js.code, 0) << js.out;
  EXPECT_EQ(nlohmann::json::parse(js.out)["rows"][0]["peer"]["profile"]["ops"][0]["name"],
            "aten::convolution_backward") << js.out;
  fs::remove(args);
  const CmdResult plain = run_ampforge(base + " --json", false);
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(read_text(args).find("--profile"), std::string::npos) << read_text(args);
  EXPECT_FALSE(nlohmann::json::parse(plain.out)["rows"][0]["peer"].contains("profile"));
  fs::remove(args);
  fs::remove(py);
}

// A stand-in for the peer's interpreter: answers the torch probe, and the peer script's invocation with the
// JSON the script prints (0.5 s per step; fp16 fails as PyTorch 1.13's CPU autocast does), so the ratio and
// the failure display can be checked exactly.
TEST(BenchCli, PeerCellsRatiosAndPeerFailuresAreShown) {
  const fs::path py = tmp("fake_python");
  {
    std::ofstream f(py);
    f << "#!/bin/sh\n"
         "if [ \"$1\" = \"-c\" ]; then echo 9.9.9-fake; exit 0; fi\n"
         "case \"$*\" in *torch_bench_peer.py*) ;; *) exit 3;; esac\n"
         "case \"$*\" in *\"--precision fp16\"*) echo '{\"error\": \"fake peer: no float16 here\"}'; exit 0;; esac\n"
         "echo '{\"torch\": \"9.9.9-fake\", \"results\": {\"nchw\": {\"seconds\": [0.5, 0.5], \"median\": 0.5, "
         "\"mean\": 0.5, \"samples_per_sec\": 16.0, \"parameters\": 421738, \"last_loss\": 2.3}}, \"best\": \"nchw\"}'\n";
  }
  ::chmod(py.c_str(), 0755);
  const CmdResult r = run_ampforge("bench --models cnn --precisions fp32,fp16 --batch cnn=8 --warmup 0 --steps 1 --threads 1 "
                          "--json --peer " + py.string(),
                          false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["peer"]["torch"], "9.9.9-fake");
  ASSERT_EQ(j["rows"].size(), 2u);
  const auto& fp32 = j["rows"][0];
  EXPECT_EQ(fp32["peer"]["samples_per_sec"], 16.0);
  EXPECT_EQ(fp32["peer"]["memory_format"], "nchw");
  EXPECT_NEAR(fp32["ratio"].get<double>(), fp32["ampforge"]["samples_per_sec"].get<double>() / 16.0, 1e-9);
  const auto& fp16 = j["rows"][1];
  EXPECT_EQ(fp16["peer"]["error"], "fake peer: no float16 here");
  EXPECT_TRUE(fp16["ratio"].is_null());
  EXPECT_FALSE(fp16["ampforge"].contains("error")) << "ampforge's CPU autocast runs fp16";
  // The terminal table names the peer's failure next to the cell.
  const CmdResult t = run_ampforge("bench --models cnn --precisions fp16 --batch cnn=8 --warmup 0 --steps 1 --threads 1 "
                          "--peer " + py.string(),
                          false);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("PyTorch: fake peer: no float16 here"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("PyTorch 9.9.9-fake"), std::string::npos) << t.out;
}

// --rounds N: N alternating measurements per cell; every round's ratio is listed and the row is the median
// round's (its ratio is ours / peer of one and the same round). The stand-in peer answers 16, 4 and 64 samples/s
// in turn, so the three ratios are far apart whatever ampforge's own speed does.
TEST(BenchCli, RoundsKeepTheMedianRoundAndListEveryRatio) {
  const fs::path py = tmp("fake_python_rounds"), count = tmp("peer_calls");
  fs::remove(count);
  {
    std::ofstream f(py);
    f << "#!/bin/sh\n"
         "if [ \"$1\" = \"-c\" ]; then echo 9.9.9-fake; exit 0; fi\n"
         "n=$(cat " << count.string() << " 2>/dev/null || echo 0); n=$((n + 1)); echo $n > " << count.string() << "\n"
         "case $n in 1) r=16.0;; 2) r=4.0;; *) r=64.0;; esac\n"
         "echo \"{\\\"torch\\\": \\\"9.9.9-fake\\\", \\\"results\\\": {\\\"nchw\\\": {\\\"seconds\\\": [0.5], "
         "\\\"median\\\": 0.5, \\\"mean\\\": 0.5, \\\"samples_per_sec\\\": $r, \\\"parameters\\\": 421738, "
         "\\\"last_loss\\\": 2.3}}, \\\"best\\\": \\\"nchw\\\"}\"\n";
  }
  ::chmod(py.c_str(), 0755);
  const CmdResult r = run_ampforge("bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 --threads 1 "
                                   "--rounds 3 --json --no-compile --peer " + py.string(), false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 1u);
  const auto& row = j["rows"][0];
  ASSERT_EQ(row["round_ratios"].size(), 3u) << row;
  EXPECT_TRUE(row["peer_compiled"].is_null()) << "--no-compile";
  std::vector<double> ratios = row["round_ratios"].get<std::vector<double>>();
  std::sort(ratios.begin(), ratios.end());
  EXPECT_NEAR(row["ratio"].get<double>(), ratios[1], 1e-9) << row;
  EXPECT_NEAR(row["ratio"].get<double>(),
              row["ampforge"]["samples_per_sec"].get<double>() / row["peer"]["samples_per_sec"].get<double>(), 1e-9);
  EXPECT_EQ(read_text(count), "3\n") << "one peer run per round";
  fs::remove(count);
  const CmdResult t = run_ampforge("bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 --threads 1 "
                                   "--rounds 2 --no-compile --peer " + py.string(), false);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("rounds (ampforge and PyTorch alternating"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("  cnn fp32: "), std::string::npos) << t.out;
  EXPECT_EQ(run_ampforge("bench --models cnn --rounds 0 --peer none", false).code, 2);
}

// The torch.compile column: a PyTorch 2.x peer is run a second time with --compile, in the memory format its eager
// run found faster, once per cell after the rounds; its rate and ratio get columns of their own (table, JSON,
// Markdown), and a compile failure is that cell's message while the eager cell and ampforge's stay.
TEST(BenchCli, CompiledPeerColumnAndItsFailureAreShown) {
  const fs::path py = tmp("fake_python_compile"), args = tmp("peer_args");
  fs::remove(args);
  {
    std::ofstream f(py);
    f << "#!/bin/sh\nARGS_FILE=" << args.string() << "\n"
      << R"SH(if [ "$1" = "-c" ]; then echo 2.14.1-fake; exit 0; fi
echo "$*" >> "$ARGS_FILE"
case "$*" in
  *bf16*--compile*) echo '{"torch": "2.14.1", "results": {}, "error": "InductorError: fake compile failure"}'; exit 0;;
  *--compile*) r=40.0;;
  *) r=20.0;;
esac
echo "{\"torch\": \"2.14.1\", \"results\": {\"channels_last\": {\"seconds\": [0.5], \"median\": 0.5, \"mean\": 0.5, \"samples_per_sec\": $r, \"parameters\": 421738, \"last_loss\": 2.3}}, \"best\": \"channels_last\"}"
)SH";
  }
  ::chmod(py.c_str(), 0755);
  const CmdResult r = run_ampforge("bench --models cnn --precisions fp32,bf16 --batch cnn=8 --warmup 0 --steps 1 "
                                   "--threads 1 --json --peer " + py.string(), false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 2u);
  const auto& fp32 = j["rows"][0];
  ASSERT_TRUE(fp32["peer_compiled"].is_object()) << fp32;
  EXPECT_EQ(fp32["peer_compiled"]["samples_per_sec"], 40.0);
  EXPECT_NEAR(fp32["ratio_compiled"].get<double>(), fp32["ampforge"]["samples_per_sec"].get<double>() / 40.0, 1e-9);
  EXPECT_NEAR(fp32["ratio"].get<double>(), fp32["ampforge"]["samples_per_sec"].get<double>() / 20.0, 1e-9);
  const auto& bf16 = j["rows"][1];
  EXPECT_EQ(bf16["peer_compiled"]["error"], "InductorError: fake compile failure") << bf16;
  EXPECT_TRUE(bf16["ratio_compiled"].is_null());
  EXPECT_EQ(bf16["peer"]["samples_per_sec"], 20.0) << "the eager cell stays";
  EXPECT_TRUE(bf16["ampforge"].contains("samples_per_sec")) << "ampforge's cell stays";
  // The compiled run is told the eager run's faster memory format.
  const std::string calls = read_text(args);
  EXPECT_NE(calls.find("--compile --memory-format channels_last"), std::string::npos) << calls;
  // The terminal table and the Markdown file carry the columns and the failure.
  const fs::path md = tmp("compiled.md");
  const CmdResult t = run_ampforge("bench --models cnn --precisions fp32,bf16 --batch cnn=8 --warmup 0 --steps 1 "
                                   "--threads 1 --markdown " + md.string() + " --peer " + py.string(), false);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("compiled"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("PyTorch compiled: InductorError: fake compile failure"), std::string::npos) << t.out;
  const std::string m = read_text(md);
  EXPECT_NE(m.find("PyTorch compiled samples/s"), std::string::npos) << m;
  EXPECT_NE(m.find("failed: InductorError"), std::string::npos) << m;
  fs::remove(args);
  fs::remove(md);
}

// --peer-seconds: on the CPU the peer is told to stop timing after that many seconds of steps (default 20; 0 = all
// --steps), and a peer cell that timed fewer steps than asked says so under the table.
TEST(BenchCli, SlowPeerStepsAreCappedAndSaidSo) {
  const fs::path py = tmp("fake_python_capped"), args = tmp("capped_args");
  {
    std::ofstream f(py);
    f << "#!/bin/sh\nARGS_FILE=" << args.string() << "\n"
      << R"SH(if [ "$1" = "-c" ]; then echo 2.14.1-fake; exit 0; fi
echo "$*" >> "$ARGS_FILE"
case "$*" in
  *--max-seconds*) s='[30.0]';;
  *) s='[30.0, 30.0, 30.0]';;
esac
echo "{\"torch\": \"2.14.1\", \"results\": {\"nchw\": {\"seconds\": $s, \"median\": 30.0, \"mean\": 30.0, \"samples_per_sec\": 0.25, \"parameters\": 421738, \"last_loss\": 2.3}}, \"skipped\": {\"channels_last\": \"not timed: its warm-up step took 61.0 s, nchw's 31.0 s (--max-seconds 20)\"}, \"best\": \"nchw\"}"
)SH";
  }
  ::chmod(py.c_str(), 0755);
  const std::string base = "bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 3 --threads 1 "
                           "--no-compile --peer " + py.string();
  fs::remove(args);
  const CmdResult d = run_ampforge(base, false);
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_NE(read_text(args).find("--max-seconds 20"), std::string::npos) << read_text(args);
  EXPECT_NE(d.out.find("cnn fp32 PyTorch: 1 of 3 timed steps (30.0 s each: --peer-seconds stopped it); "
                       "channels_last not timed: its warm-up step took 61.0 s, nchw's 31.0 s (--max-seconds 20)"),
            std::string::npos) << d.out;
  const fs::path md = tmp("capped.md");
  fs::remove(args);
  const CmdResult m = run_ampforge(base + " --markdown " + md.string(), false);
  ASSERT_EQ(m.code, 0) << m.out;
  EXPECT_NE(read_text(md).find("cnn fp32 PyTorch: 1 of 3 timed steps"), std::string::npos) << read_text(md);
  fs::remove(md);
  fs::remove(args);
  const CmdResult five = run_ampforge(base + " --peer-seconds 2.5", false);
  ASSERT_EQ(five.code, 0) << five.out;
  EXPECT_NE(read_text(args).find("--max-seconds 2.5"), std::string::npos) << read_text(args);
  fs::remove(args);
  const CmdResult all = run_ampforge(base + " --peer-seconds 0", false);
  ASSERT_EQ(all.code, 0) << all.out;
  EXPECT_EQ(read_text(args).find("--max-seconds"), std::string::npos) << read_text(args);
  EXPECT_EQ(all.out.find("of 3 timed steps"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("cnn fp32 PyTorch: channels_last not timed"), std::string::npos) << all.out;
  const CmdResult js = run_ampforge(base + " --json", false);
  ASSERT_EQ(js.code, 0) << js.out;
  const auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["rows"][0]["peer"]["skipped"],
            "channels_last not timed: its warm-up step took 61.0 s, nchw's 31.0 s (--max-seconds 20)") << js.out;
  const CmdResult bad = run_ampforge(base + " --peer-seconds -1");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--peer-seconds must be between 0 and 1e6"), std::string::npos) << bad.out;
  fs::remove(args);
}

// --interleave: the peer runs beside ampforge (--serve), announces it is warmed up, and takes exactly one step per
// timed step of ours (none in the warm-up); its result object ends the conversation. A peer that dies mid-way is a
// failed peer cell, not a hang; a peer that refuses the cell before its warm-up (PyTorch 1.13's CPU autocast has no
// float16) is a failed cell with the peer's reason; --interleave without a peer is a usage error.
// On a CPU the default table is fp32 and bf16 (CPU autocast's 16-bit type); fp16 is measured when asked for.
TEST(BenchCli, CpuDefaultPrecisionsAreFp32AndBf16) {
  const CmdResult r =
      run_ampforge("bench --models cnn --batch cnn=4 --warmup 0 --steps 1 --threads 1 --peer none --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 2u) << r.out;
  EXPECT_EQ(j["rows"][0]["precision"], "fp32");
  EXPECT_EQ(j["rows"][1]["precision"], "bf16");
}

TEST(BenchCli, InterleaveAsksThePeerForOneStepAfterEachOfOurs) {
  const fs::path py = tmp("fake_python_serve"), count = tmp("serve_steps");
  fs::remove(count);
  {
    std::ofstream f(py);
    f << "#!/bin/sh\n"
         "if [ \"$1\" = \"-c\" ]; then echo 9.9.9-fake; exit 0; fi\n"
         "case \"$*\" in *--serve*) ;; *) exit 3;; esac\n"
         "case \"$*\" in *\"--precision bf16\"*) echo '{\"ready\": true}'; read l; exit 7;; esac\n"
         "case \"$*\" in *\"--precision fp16\"*) echo '{\"torch\": \"9.9.9-fake\", \"results\": {}, \"error\": "
         "\"AutocastCPU only support Bfloat16\"}'; exit 0;; esac\n"
         "echo '{\"ready\": true, \"formats\": [\"nchw\"]}'\n"
         "n=0\n"
         "while read l; do [ \"$l\" = step ] || break; n=$((n + 1)); echo '{\"seconds\": {\"nchw\": 0.25}}'; done\n"
         "echo $n > " << count.string() << "\n"
         "echo '{\"torch\": \"9.9.9-fake\", \"results\": {\"nchw\": {\"seconds\": [0.25, 0.25, 0.25], \"median\": 0.25, "
         "\"mean\": 0.25, \"samples_per_sec\": 32.0, \"parameters\": 421738, \"last_loss\": 2.3}}, \"best\": \"nchw\"}'\n";
  }
  ::chmod(py.c_str(), 0755);
  const CmdResult r = run_ampforge("bench --models cnn --precisions fp32,bf16,fp16 --batch cnn=8 --warmup 1 --steps 3 "
                                   "--threads 1 --interleave --json --peer " + py.string(), false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["settings"]["interleaved"], true);
  ASSERT_EQ(j["rows"].size(), 3u);
  const auto& fp32 = j["rows"][0];
  EXPECT_EQ(fp32["peer"]["samples_per_sec"], 32.0) << fp32;
  EXPECT_NEAR(fp32["ratio"].get<double>(), fp32["ampforge"]["samples_per_sec"].get<double>() / 32.0, 1e-9);
  EXPECT_EQ(fp32["ampforge"]["step_seconds"].size(), 3u);
  EXPECT_EQ(read_text(count), "3\n") << "one peer step per timed step of ours, none in the warm-up";
  const auto& bf16 = j["rows"][1];
  EXPECT_TRUE(bf16["peer"].contains("error")) << bf16;
  EXPECT_TRUE(bf16["ratio"].is_null());
  EXPECT_FALSE(bf16["ampforge"].contains("error"));
  const auto& fp16 = j["rows"][2];
  EXPECT_EQ(fp16["peer"]["error"], "AutocastCPU only support Bfloat16") << fp16;
  EXPECT_FALSE(fp16["ampforge"].contains("error"));
  const CmdResult none = run_ampforge("bench --models cnn --interleave --peer none");
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.out.find("--interleave"), std::string::npos) << none.out;
}

TEST(BenchCli, AFailedCellIsReportedAndTheExitCodeSaysNothingRan) {
  // TF32 is a CUDA mode: on the CPU that cell fails with the reason, and with no cell measured the exit is 1.
  const CmdResult r = run_ampforge("bench --models cnn --precisions tf32 --warmup 0 --steps 1 --peer none --json", false);
  EXPECT_EQ(r.code, 1) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 1u);
  EXPECT_NE(j["rows"][0]["ampforge"]["error"].get<std::string>().find("CUDA"), std::string::npos);
}

// Ctrl-C, or SIGTERM (`timeout`, a batch system's time limit), once the first cell has started: it finishes, no
// other cell starts, and the cells measured are reported; exit code 128 + the signal.
void expect_stop_finishes_the_cell(int sig, const std::string& stem, const std::string& by) {
  const fs::path err = tmp(stem + ".err"), out = tmp(stem + ".json"), md = tmp(stem + ".md");
  const pid_t pid = spawn_ampforge({"bench", "--models", "cnn,resnet-small", "--precisions", "fp32,bf16", "--peer",
                                    "none", "--json", "--markdown", md.string()},
                                   out, err);
  ASSERT_GE(pid, 0);
  for (int i = 0; i < 1200 && read_text(err).find("bench [1/4]") == std::string::npos; ++i) usleep(50000);
  ASSERT_NE(read_text(err).find("bench [1/4]"), std::string::npos) << read_text(err);
  kill(pid, sig);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << read_text(err);
  EXPECT_EQ(WEXITSTATUS(st), 128 + sig);
  const auto j = nlohmann::json::parse(read_text(out));
  EXPECT_EQ(j["interrupted"], true);
  EXPECT_EQ(j["interrupted_by"], by);
  EXPECT_EQ(j["cells_asked"], 4);
  ASSERT_GE(j["rows"].size(), 1u);
  EXPECT_LT(j["rows"].size(), 4u);
  EXPECT_EQ(j["rows"][0]["model"], "cnn");
  EXPECT_TRUE(j["rows"][0]["ampforge"].contains("samples_per_sec")) << read_text(err);  // measured, not an error
  EXPECT_NE(read_text(md).find("interrupted (" + by + "): measured"), std::string::npos);
}

TEST(BenchCli, CtrlCFinishesTheCellThenReportsTheCellsMeasured) {
  expect_stop_finishes_the_cell(SIGINT, "interrupted", "Ctrl-C");
}

TEST(BenchCli, SigtermFinishesTheCellThenReportsTheCellsMeasured) {
  expect_stop_finishes_the_cell(SIGTERM, "terminated", "SIGTERM");
}

TEST(BenchCli, HelpAndUsageErrors) {
  const CmdResult h = run_ampforge("bench --help");
  EXPECT_EQ(h.code, 0);
  for (const char* flag : {"--models", "--precisions", "--device", "--batch", "--peer", "--json", "--markdown", "--svg",
                           "--cuda-graphs", "--full", "--interleave"})
    EXPECT_NE(h.out.find(flag), std::string::npos) << flag;
  struct Case {
    const char* args;
    const char* says;
  };
  for (const Case& c : {Case{"--models nope", "resnet50"}, Case{"--models cnn --precisions fp8", "fp8"},
                        Case{"--models cnn --batch cnn=0", "cnn=0"}, Case{"--models cnn --batch cnn", "MODEL=N"},
                        Case{"--models cnn --batch resnet50=4", "resnet50"},
                        Case{"--models cnn --device tpu", "--device"}, Case{"--models cnn --nchw --channels-last", "nchw"},
                        Case{"--models cnn --peer /nonexistent/python", "/nonexistent/python"}}) {
    const CmdResult r = run_ampforge(std::string("bench --steps 1 --warmup 0 ") + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
  }
}

// A peer interpreter that runs but has no torch (a plain python3): ampforge's cells are still measured, and each
// peer cell names the interpreter and the command that installs the peer; the exit code is ampforge's (0).
TEST(BenchCli, PeerWithoutTorchStillMeasuresAmpforge) {
  const fs::path py = tmp("python_without_torch");
  {
    std::ofstream f(py);
    f << "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n";
  }
  ::chmod(py.c_str(), 0755);
  const CmdResult r = run_ampforge("bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 --threads 1 "
                                   "--json --peer " + py.string(), false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 1u);
  EXPECT_GT(j["rows"][0]["ampforge"]["samples_per_sec"].get<double>(), 0);
  const std::string err = j["rows"][0]["peer"]["error"].get<std::string>();
  EXPECT_NE(err.find("torch is not installed in " + py.string()), std::string::npos) << err;
  EXPECT_NE(err.find("scripts/setup --peer"), std::string::npos) << err;
}

// --interleave is refused on a GPU (its steps are timed with CUDA events) before the peer is looked for: the error
// names --interleave, not the interpreter. Without a GPU the device check answers first (skipped).
TEST(BenchCli, InterleaveIsRefusedOnCudaBeforeThePeerIsLookedFor) {
  const CmdResult r = run_ampforge("bench --models cnn --device cuda --interleave --peer /nonexistent/python");
  EXPECT_EQ(r.code, 2) << r.out;
  if (r.out.find("no such CUDA device") != std::string::npos) GTEST_SKIP() << "no CUDA device: " << r.out;
  EXPECT_NE(r.out.find("--interleave is for the CPU"), std::string::npos) << r.out;
}

TEST(BenchCli, ThePeerScriptIsValidPython) {
  // The script itself needs torch to run; its syntax is checked everywhere.
  const std::string cmd = "python3 -m py_compile " AMPFORGE_SOURCE_DIR "/bench/peer/torch_bench_peer.py 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[512] = {0};
  const std::string out = fgets(buf, sizeof buf, p) ? buf : "";
  EXPECT_EQ(pclose(p), 0) << out;
}

// --max-batch: the column is the fit finder's answer on the meta device, the same as `memory fit` gives.
TEST(BenchCli, MaxBatchColumnIsTheFitFindersAnswer) {
  const CmdResult r = run_ampforge("bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 --peer none "
                                   "--threads 1 --max-batch --budget 64MiB --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["settings"]["max_batch"]["budget_bytes"], int64_t{64} << 20);
  const auto& mb = j["rows"][0]["max_batch"];
  ASSERT_TRUE(mb.contains("batch")) << mb;
  const CmdResult fit = run_ampforge("memory fit --model cnn --budget 64MiB --optimizer sgd --device meta "
                                     "--stands-for cpu --threads 1 --json", false);
  ASSERT_EQ(fit.code, 0) << fit.out;
  EXPECT_EQ(mb["batch"], nlohmann::json::parse(fit.out)["batch"]);
  EXPECT_FALSE(mb["limited"].get<bool>());
  // The table has the column; without --max-batch the JSON says null.
  const CmdResult t = run_ampforge("bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 --peer none "
                                   "--threads 1 --max-batch --budget 64MiB");
  EXPECT_NE(t.out.find("max batch"), std::string::npos) << t.out;
  const CmdResult none = run_ampforge("bench --models cnn --precisions fp32 --batch cnn=8 --warmup 0 --steps 1 "
                                      "--peer none --threads 1 --json", false);
  EXPECT_TRUE(nlohmann::json::parse(none.out)["rows"][0]["max_batch"].is_null());
  EXPECT_TRUE(nlohmann::json::parse(none.out)["settings"]["max_batch"].is_null());
  for (const char* args : {"--max-batch", "--budget 1GiB", "--max-batch --budget lots"}) {
    const CmdResult bad = run_ampforge(std::string("bench --models cnn --steps 1 --warmup 0 --peer none ") + args);
    EXPECT_EQ(bad.code, 2) << args << "\n" << bad.out;
  }
}
