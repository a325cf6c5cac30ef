// End to end on the CPU: `ampforge train --profile --trace` on a real (synthetic-data) training run, and
// `ampforge profile -- COMMAND` without a GPU.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "ampforge/profiler/device.h"
#include "ampforge/profiler/trace_check.h"

namespace ampforge::profiler {
namespace {

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `ampforge ARGS` through the shell, capturing stdout and stderr in files.
CliRun ampforge(const std::string& args, const std::string& tag) {
  const std::string dir = ::testing::TempDir();
  const std::string out = dir + "/af_prof_" + tag + ".out", err = dir + "/af_prof_" + tag + ".err";
  const std::string cmd = std::string(AMPFORGE_BINARY_DIR) + "/bin/ampforge " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

const char* kTrainArgs = "train --dataset synthetic --synthetic-size 256 --batch 32 --epochs 1 --no-progress";

TEST(ProfilerCli, TrainProfileOnCpuPrintsReportAndWritesATraceThatNests) {
  const std::string trace_path = ::testing::TempDir() + "/af_prof_train_trace.json";
  std::remove(trace_path.c_str());
  const CliRun r = ampforge(std::string(kTrainArgs) + " --profile --json --trace " + trace_path, "train");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("top ops by self time"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step time: 8 steps"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no CUDA activity was observed"), std::string::npos) << r.err;

  const nlohmann::json summary = nlohmann::json::parse(r.out);
  ASSERT_TRUE(summary.contains("profile")) << r.out;
  const nlohmann::json& p = summary["profile"];
  const int64_t wall = p["wall_ns"].get<int64_t>();
  EXPECT_GT(wall, 0);
  EXPECT_EQ(p["step"]["steps"], 8);
  // Op self-times never add up to more than the wall time (ops run on the main thread, one at a time).
  EXPECT_GT(p["op_self_ns"].get<int64_t>(), 0);
  EXPECT_LE(p["op_self_ns"].get<int64_t>(), wall);
  // The step split (data + forward + backward + optimizer) covers at least 95% of the step time.
  EXPECT_GE(p["step"]["coverage"].get<double>(), 0.95) << p["step"].dump();
  EXPECT_LE(p["step"]["step_ns"].get<int64_t>(), wall);
  bool conv = false;
  for (const auto& op : p["ops"]) conv |= op["name"] == "conv2d" && op["calls"].get<int>() > 0;
  EXPECT_TRUE(conv) << "conv2d missing from the op table";
  EXPECT_GT(p["memory"]["peak_allocated_bytes"].get<int64_t>(), 0);

  const nlohmann::json trace = nlohmann::json::parse(slurp(trace_path));  // throws if it does not parse
  const testing::TraceCheck chk = testing::check_trace(trace);
  EXPECT_EQ(chk.error, "");
  EXPECT_GT(chk.complete_events, 100u);
  EXPECT_LE(chk.op_self_ns, wall);
  int steps = 0, phases = 0, counters = 0;
  for (const auto& ev : trace["traceEvents"]) {
    if (ev["ph"] == "X" && ev["cat"] == "step") ++steps;
    if (ev["ph"] == "X" && ev["cat"] == "phase") ++phases;
    if (ev["ph"] == "C") ++counters;
  }
  EXPECT_EQ(steps, 8);
  EXPECT_GE(phases, 8 * 4);  // forward, backward, two optimizer ranges per step (+ eval)
  EXPECT_GT(counters, 0);
  std::remove(trace_path.c_str());
}

TEST(ProfilerCli, ProfileStepsLimitsTheWindow) {
  const CliRun r = ampforge(std::string(kTrainArgs) + " --profile-steps 2:5 --profile --json", "steps");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json p = nlohmann::json::parse(r.out)["profile"];
  EXPECT_EQ(p["step"]["steps"], 3);
  const CliRun bad = ampforge(std::string(kTrainArgs) + " --profile-steps 5:2", "badsteps");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--profile-steps"), std::string::npos) << bad.err;
}

TEST(ProfilerCli, ProfileCommandWithoutGpuSaysSoAndKeepsTheExitCode) {
  if (probe_cuda().present) GTEST_SKIP() << "a GPU is present: covered by the gpu tests";
  const CliRun r = ampforge("profile -- sh -c 'exit 3'", "exit3");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.out.find("no CUDA activity was observed: no GPU / driver"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("there is no CUDA activity to observe"), std::string::npos) << r.err;

  const CliRun usage = ampforge("profile", "usage");
  EXPECT_EQ(usage.exit_code, 2);

  // An ampforge child with --profile hands its host ranges to the parent.
  const std::string child = std::string(AMPFORGE_BINARY_DIR) + "/bin/ampforge " + kTrainArgs + " --profile";
  const CliRun merged = ampforge("profile --json -- " + child, "merged");
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  const nlohmann::json j = nlohmann::json::parse(merged.out);  // the child prints nothing on stdout
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_GT(j["op_calls"].get<int64_t>(), 0);
  EXPECT_EQ(j["step"]["steps"], 8);
  EXPECT_FALSE(j["device"]["observed"].get<bool>());
}

}  // namespace
}  // namespace ampforge::profiler
