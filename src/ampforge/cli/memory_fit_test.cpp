// `ampforge memory fit` as a user runs it: the answer B under a small budget fits and B + 1 does not (each
// checked again in a fresh process with --batch), the breakdown adds up and matches the optimizer's state,
// and bad input is exit 2 with a message naming the flag.
#include <gtest/gtest.h>

#include "ampforge/cli/cli_test_util.h"
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace {
using ampforge::cli::testing::CmdResult;
using ampforge::cli::testing::run_ampforge;

nlohmann::json fit_json(const std::string& args, int expect_code = 0) {
  return ampforge::cli::testing::run_ampforge_json("memory fit " + args + " --json", expect_code);
}

int64_t sum_parts(const nlohmann::json& b) {
  int64_t s = 0;
  for (const char* k : {"parameters", "gradients", "optimizer_state", "inputs", "activations", "workspace",
                        "fragmentation"}) {
    EXPECT_GE(b.at(k).get<int64_t>(), 0) << k;
    s += b.at(k).get<int64_t>();
  }
  return s;
}
}  // namespace

TEST(MemoryFitCli, FindsTheLargestBatchUnderASmallBudget) {
  const int64_t budget = int64_t{64} << 20;
  nlohmann::json j = fit_json("--model cnn --budget 64MiB --threads 2");
  ASSERT_TRUE(j.is_object());
  const int64_t b = j.at("batch").get<int64_t>();
  ASSERT_GT(b, 1);
  EXPECT_TRUE(j.at("fits").get<bool>());
  EXPECT_FALSE(j.at("limited_by_max_batch").get<bool>());
  EXPECT_EQ(j.at("first_failing_batch").get<int64_t>(), b + 1);
  EXPECT_EQ(j.at("budget").get<int64_t>(), budget);
  // The probes include B (fits) and B + 1 (does not).
  bool saw_b = false, saw_next = false;
  for (const auto& p : j.at("probes")) {
    if (p.at("batch") == b) saw_b = p.at("fits").get<bool>();
    if (p.at("batch") == b + 1) saw_next = !p.at("fits").get<bool>();
    if (p.at("fits").get<bool>()) {
      EXPECT_LE(p.at("peak_reserved").get<int64_t>(), budget);
    }
  }
  EXPECT_TRUE(saw_b && saw_next) << j.dump(1);
  // The breakdown: parts add up to the total (peak reserved), within the budget.
  const nlohmann::json& bd = j.at("breakdown");
  EXPECT_EQ(sum_parts(bd), j.at("total").get<int64_t>());
  EXPECT_EQ(j.at("total").get<int64_t>(), j.at("peak_reserved").get<int64_t>());
  EXPECT_LE(j.at("total").get<int64_t>(), budget);
  EXPECT_NEAR(j.at("fraction_of_budget").get<double>(),
              static_cast<double>(j.at("total").get<int64_t>()) / static_cast<double>(budget), 1e-9);
  // fp32 AdamW: gradients as large as the flat parameters, two F32 moments each; buffers on top of params.
  EXPECT_EQ(bd.at("optimizer_state").get<int64_t>(), 2 * bd.at("gradients").get<int64_t>());
  EXPECT_GE(bd.at("parameters").get<int64_t>(), bd.at("gradients").get<int64_t>());
  EXPECT_EQ(bd.at("inputs").get<int64_t>(), b * (28 * 28 * 4 + 8));
  EXPECT_GT(bd.at("activations").get<int64_t>(), bd.at("inputs").get<int64_t>());

  // Each answer again in a fresh process: B fits (exit 0), B + 1 does not (exit 1, with the OOM report).
  nlohmann::json at_b = fit_json("--model cnn --budget 64MiB --threads 2 --batch " + std::to_string(b), 0);
  EXPECT_TRUE(at_b.value("fits", false));
  EXPECT_EQ(at_b.value("peak_reserved", int64_t{-1}), j.at("peak_reserved").get<int64_t>());
  CmdResult next = run_ampforge("memory fit --model cnn --budget 64MiB --threads 2 --batch " + std::to_string(b + 1));
  EXPECT_EQ(next.code, 1) << next.out;
  EXPECT_NE(next.out.find("does not fit"), std::string::npos) << next.out;
  EXPECT_NE(next.out.find("what to try"), std::string::npos) << next.out;
}

TEST(MemoryFitCli, HumanOutputHasTheBreakdown) {
  CmdResult r = run_ampforge("memory fit --model cnn --budget 32MiB --threads 2 --steps 1");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* s : {"probe  1 grow", "largest batch that fits:", "parameters", "gradients", "optimizer state",
                        "activations", "workspace/other", "fragmentation", "total (peak reserved)", "of budget"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(MemoryFitCli, MixedPrecisionAndOptimizerStates) {
  // bf16 master weights: BF16 gradients (2 bytes per parameter); F32 master + two F32 moments (12 bytes).
  nlohmann::json bf = fit_json("--model cnn --budget 64MiB --threads 2 --batch 8 --precision bf16 --master-weights");
  EXPECT_EQ(bf["breakdown"]["optimizer_state"].get<int64_t>(), 6 * bf["breakdown"]["gradients"].get<int64_t>());
  // fp16 autocast with a GradScaler; SGD with momentum keeps one F32 buffer.
  nlohmann::json sgd = fit_json("--model cnn --budget 64MiB --threads 2 --batch 8 --precision fp16 --optimizer sgd");
  EXPECT_EQ(sgd["breakdown"]["optimizer_state"].get<int64_t>(), sgd["breakdown"]["gradients"].get<int64_t>());
  EXPECT_EQ(sum_parts(sgd["breakdown"]), sgd["total"].get<int64_t>());
  nlohmann::json resnet = fit_json("--model resnet-small --budget 64MiB --threads 2 --batch 4");
  EXPECT_TRUE(resnet.value("fits", false));
}

TEST(MemoryFitCli, NotEvenBatchOneIsExit1WithTheReport) {
  CmdResult r = run_ampforge("memory fit --model cnn --budget 1MiB");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("batch 1 does not fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("out of memory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("what to try"), std::string::npos) << r.out;
  nlohmann::json j = fit_json("--model cnn --budget 1MiB", 1);
  EXPECT_EQ(j.value("batch", int64_t{-1}), 0);
  EXPECT_FALSE(j.value("fits", true));
  EXPECT_NE(j.value("oom_report", std::string()).find("out of memory"), std::string::npos);
}

TEST(MemoryFitCli, BadInputIsExit2WithAMessage) {
  struct Case {
    const char* args;
    const char* says;
  };
  for (const Case& c : {Case{"--model cnn --budget '16GB?'", "--budget"}, Case{"--model cnn --budget 16", ""},
                        Case{"--model cnn --budget 0", "--budget"}, Case{"--model cnn --budget 1.5GiB", "--budget"},
                        Case{"--model cnn --budget -1GiB", "--budget"}, Case{"--model nope --budget 1GiB", "cnn"},
                        Case{"--model cnn", "--budget"}, Case{"--budget 1GiB", "--model"},
                        Case{"--model cnn --budget 1GiB --precision fp8", "fp8"},
                        Case{"--model cnn --budget 1GiB --master-weights", "--master-weights"},
                        Case{"--model cnn --budget 1GiB --optimizer lion", "lion"},
                        Case{"--model cnn --budget 1GiB --max-batch 0", "--max-batch"},
                        Case{"--model cnn --budget 1GiB --steps 0", "--steps"}}) {
    CmdResult r = run_ampforge(std::string("memory fit ") + c.args);
    if (std::string(c.args) == "--model cnn --budget 16") {
      // A plain number is bytes: 16 bytes do not hold batch 1 (exit 1), which is not a parse error.
      EXPECT_EQ(r.code, 1) << c.args << "\n" << r.out;
      continue;
    }
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
  }
  CmdResult h = run_ampforge("memory fit --help");
  EXPECT_EQ(h.code, 0);
  for (const char* s : {"--max-batch", "--budget", "Time:", "Exit status"})
    EXPECT_NE(h.out.find(s), std::string::npos) << s;
}

// The meta device (backends/meta/meta.h): standing for the CPU it gives the CPU's answer, to the batch, without
// running a single kernel; standing for CUDA it plans a 16 GiB card for ResNet-50.
TEST(MemoryFitCli, MetaStandingForTheCpuGivesTheCpusAnswer) {
  nlohmann::json cpu = fit_json("--model cnn --budget 64MiB --threads 2 --optimizer sgd");
  nlohmann::json meta = fit_json("--model cnn --budget 64MiB --threads 2 --optimizer sgd --device meta --stands-for cpu");
  ASSERT_TRUE(cpu.is_object() && meta.is_object());
  EXPECT_EQ(meta.at("device"), "meta");
  EXPECT_EQ(meta.at("stands_for"), "cpu");
  EXPECT_EQ(meta.at("batch").get<int64_t>(), cpu.at("batch").get<int64_t>());
  EXPECT_LE(std::llabs(meta.at("peak_reserved").get<int64_t>() - cpu.at("peak_reserved").get<int64_t>()), 2 << 20);
  EXPECT_EQ(meta.at("breakdown").at("parameters"), cpu.at("breakdown").at("parameters"));
  EXPECT_EQ(meta.at("breakdown").at("optimizer_state"), cpu.at("breakdown").at("optimizer_state"));
}

TEST(MemoryFitCli, MetaPlansResNet50OnA16GiBCardInSeconds) {
  // The acceptance figure of issue #16: ResNet-50, FP32, 224x224, SGD with momentum (as the bench trains it) on a
  // 16 GiB card. With --recompute the answer is at least the brief's batch 256; without, what it is.
  nlohmann::json j =
      fit_json("--model resnet50 --device meta --budget 16GiB --precision fp32 --optimizer sgd --recompute");
  ASSERT_TRUE(j.is_object());
  std::printf("resnet50 fp32 sgd --recompute on 16GiB: batch %lld in %.1f s\n",
              static_cast<long long>(j.at("batch").get<int64_t>()), j.at("seconds").get<double>());
  EXPECT_GE(j.at("batch").get<int64_t>(), 256);
  EXPECT_EQ(j.at("stands_for"), "cuda");
  EXPECT_LE(j.at("total").get<int64_t>(), int64_t{16} << 30);
  EXPECT_EQ(sum_parts(j.at("breakdown")), j.at("total").get<int64_t>());
  nlohmann::json plain = fit_json("--model resnet50 --device meta --budget 16GiB --precision fp32 --optimizer sgd");
  std::printf("resnet50 fp32 sgd on 16GiB: batch %lld in %.1f s\n",
              static_cast<long long>(plain.at("batch").get<int64_t>()), plain.at("seconds").get<double>());
  EXPECT_GT(plain.at("batch").get<int64_t>(), 64);
  EXPECT_LT(plain.at("batch").get<int64_t>(), j.at("batch").get<int64_t>());
  EXPECT_GT(plain.at("breakdown").at("activations").get<int64_t>(), j.at("breakdown").at("activations").get<int64_t>());
  // The plain answer says what --recompute would give: the same search, the same figure.
  ASSERT_TRUE(plain.contains("with_recompute")) << plain.dump();
  EXPECT_EQ(plain.at("with_recompute").at("largest_batch"), j.at("batch"));
  EXPECT_FALSE(j.contains("with_recompute")) << "already recomputing";
}

TEST(MemoryFitCli, MetaBadInputIsExit2) {
  for (const char* args : {"--model cnn --budget 1GiB --device cuda", "--model cnn --budget 1GiB --device meta --stands-for tpu"}) {
    CmdResult r = run_ampforge(std::string("memory fit ") + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
  }
}
