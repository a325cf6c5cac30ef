// `ampforge memory replay` and `memory explain` on PyTorch memory snapshots (tests/data/torch_snapshots/) as a user
// runs them: the table, JSON and chart, the budget's exit status, the oom explanation with its verified fix, and
// every bad input as one clear message with exit 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "ampforge/cli/cli_test_util.h"

namespace {
using ampforge::cli::testing::CmdResult;
using ampforge::cli::testing::run_ampforge;

std::string snap(const std::string& name) { return std::string(AMPFORGE_TEST_DATA_DIR) + "/torch_snapshots/" + name; }

nlohmann::json json_of(const std::string& args, int expect_code = 0) {
  return ampforge::cli::testing::run_ampforge_json(args + " --json", expect_code);
}

TEST(MemoryTorchCli, ReplayReportsEveryPolicyCalibrationAndSites) {
  const nlohmann::json j = json_of("memory replay " + snap("new_basic.pickle"));
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j.at("results").size(), 4u);
  const char* names[] = {"naive", "pytorch", "pytorch-expandable", "ampforge"};
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(j["results"][k]["policy"], names[k]);
  EXPECT_EQ(j["results"][1]["peak_reserved_bytes"], 704 << 20);
  EXPECT_EQ(j["results"][1]["min_budget_bytes"], 704 << 20);
  EXPECT_EQ(j["calibration"]["recorded_peak_reserved_bytes"], 704 << 20);
  EXPECT_EQ(j["calibration"]["replayed_peak_reserved_bytes"], 704 << 20);
  EXPECT_TRUE(j["calibration"]["segments_match"].get<bool>());
  EXPECT_EQ(j["top_sites"][0]["site"], "train.py:42 forward");
  const CmdResult t = run_ampforge("memory replay " + snap("new_basic.pickle"));
  EXPECT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("peak reserved  recorded 704.00 MiB  replayed 704.00 MiB  (equal)"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("train.py:57 backward"), std::string::npos) << t.out;
}

TEST(MemoryTorchCli, BudgetDecidesTheExitStatus) {
  const nlohmann::json tight = json_of("memory replay " + snap("new_basic.pickle") + " --policy pytorch --budget 703MiB", 1);
  EXPECT_FALSE(tight["results"][0]["fits_budget"].get<bool>());
  const nlohmann::json ok = json_of("memory replay " + snap("new_basic.pickle") + " --policy ampforge --budget 703MiB");
  EXPECT_TRUE(ok["results"][0]["fits_budget"].get<bool>());
}

TEST(MemoryTorchCli, SvgHasAPanelPerPolicyWithRoundTicks) {
  const std::string out = std::string(AMPFORGE_BINARY_DIR) + "/torch_replay_test.svg";
  std::filesystem::remove(out);
  const CmdResult r = run_ampforge("memory replay " + snap("oom.pickle") + " --svg " + out + " --budget 960MiB");
  EXPECT_EQ(r.code, 1) << "pytorch needs its 1000 MiB\n" << r.out;
  std::ifstream in(out);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(svg.find("<svg"), std::string::npos);
  for (const char* p : {">naive<", ">pytorch<", ">pytorch-expandable<", ">ampforge<", "budget 960 MiB"})
    EXPECT_NE(svg.find(p), std::string::npos) << p;
  // Tick labels: whole numbers or halves/quarters of a unit, never "555.50 MiB".
  const std::regex tick(R"(text-anchor="end">([0-9.]+)( [KMGT]iB)?</text>)");
  int ticks = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it) {
    const std::string v = (*it)[1];
    const auto dot = v.find('.');
    EXPECT_TRUE(dot == std::string::npos || v.substr(dot) == ".5" || v.substr(dot) == ".25" || v.substr(dot) == ".75") << v;
    ++ticks;
  }
  EXPECT_GE(ticks, 12);
}

TEST(MemoryTorchCli, ExplainNamesTheCauseAndAVerifiedFix) {
  const CmdResult r = run_ampforge("memory explain " + snap("oom.pickle"));
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* s : {"a request of 400.00 MiB (large pool) from train.py:61 optimizer_step", "CUDA reported free     100.00 MiB",
                        "free in the cache      450.00 MiB in 2 blocks; largest: 300.00 MiB on its pool and stream",
                        "(fragmentation)", "fails here too (reproduced)",
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: with it the run's peak reserved is 960.00 MiB: "
                        "it fits in 1.07 GiB"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  const nlohmann::json j = json_of("memory explain " + snap("oom.pickle"));
  ASSERT_EQ(j["ooms"].size(), 1u);
  EXPECT_EQ(j["ooms"][0]["fix"], "expandable_segments:True");
  EXPECT_EQ(j["ooms"][0]["cuda_free_bytes"], 100 << 20);
  const CmdResult none = run_ampforge("memory explain " + snap("new_basic.pickle"));
  EXPECT_EQ(none.code, 0);
  EXPECT_NE(none.out.find("recorded no out-of-memory error"), std::string::npos) << none.out;
}

TEST(MemoryTorchCli, BadInputIsOneMessageAndExit2) {
  // What torch.save writes (a zip archive), passed by mistake.
  const std::string zip = (ampforge::cli::testing::scratch_dir("ampforge_memtorch_test_") / "model.pt").string();
  {
    std::ofstream f(zip, std::ios::binary);
    f << std::string("PK\x03\x04\x14\x00\x00\x00archive/data.pkl", 28);
  }
  struct Case {
    std::string args, message;
  } cases[] = {
      {"memory replay " + zip, "is a zip archive (torch.save writes those"},
      {"memory replay " + snap("bad_truncated.pickle"), "a truncated file?"},
      {"memory replay " + snap("bad_global.pickle"), "opcode GLOBAL (0x63) is refused"},
      {"memory explain " + snap("bad_reduce.pickle"), "opcode REDUCE (0x52) is refused"},
      {"memory replay " + snap("bad_top_list.pickle"), "a memory snapshot is a dict"},
      {"memory replay " + snap("bad_no_traces.pickle"), "no 'device_traces'"},
      {"memory replay " + snap("bad_negative_size.pickle"), "'size' is negative"},
      {"memory replay " + snap("bad_absurd_size.pickle"), "more than any device holds"},
      {"memory replay " + snap("bad_unknown_free.pickle"), "which is not allocated"},
      {"memory replay " + snap("new_basic.pickle") + " --device 3", "device 3 is not in the snapshot"},
      {"memory replay " + snap("no_history.pickle"), "so there is no allocation history to replay"},
      {"memory explain " + snap("no_history.pickle"), "so there is no allocation history to replay"},
      {"memory replay " + snap("second_device.pickle") + " --device 0", "device 0 recorded no trace entries"},
      {"memory explain " + snap("oom.pickle") + " --device 1", "device 1 is not in the snapshot"},
      {"memory explain " + std::string(AMPFORGE_TEST_DATA_DIR) + "/memtrace/cnn.txt", "is not a PyTorch memory snapshot"},
      {"memory replay " + std::string(AMPFORGE_TEST_DATA_DIR) + "/memtrace/cnn.txt --device 0", "--device: only for"},
      {"memory replay " + snap("new_basic.pickle") + " --svg out.png", "must end in .svg"},
      {"memory replay " + std::string(AMPFORGE_TEST_DATA_DIR) + "/torch_snapshots", "is a directory"},
      {"memory report " + snap("new_basic.pickle"), "is a PyTorch memory snapshot; `memory report` draws ampforge's own"},
  };
  for (const Case& c : cases) {
    const CmdResult r = run_ampforge(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_LE(std::count(r.out.begin(), r.out.end(), '\n'), 2) << "one message: " << r.out;
  }
}

}  // namespace
