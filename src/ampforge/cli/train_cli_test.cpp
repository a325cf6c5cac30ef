// `ampforge train` as a user runs it: --help, usage errors (exit 2), bad data (exit 2 naming the file),
// --json's keys, and Ctrl-C finishing the step, writing a checkpoint and exiting 130.
#include <gtest/gtest.h>

#include "ampforge/cli/cli_test_util.h"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "ampforge/backends/cpu/blas_kernels.h"
#include "ampforge/core/op_list.h"
#include "ampforge/core/safetensors.h"

namespace fs = std::filesystem;

namespace {
using ampforge::cli::testing::CmdResult;
using ampforge::cli::testing::read_text;
using ampforge::cli::testing::run_ampforge;
using ampforge::cli::testing::spawn_ampforge;
fs::path tmp(const std::string& name) { return ampforge::cli::testing::scratch_dir("ampforge_cli_test_") / name; }
}  // namespace

TEST(TrainCli, HelpAndUsageErrors) {
  CmdResult h = run_ampforge("train --help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("--precision"), std::string::npos);
  EXPECT_EQ(run_ampforge("--version").code, 0);
  EXPECT_EQ(run_ampforge("train --epochs abc").code, 2);
  EXPECT_EQ(run_ampforge("train --no-such-flag").code, 2);
  CmdResult bad = run_ampforge("train --precision fp8 --no-progress");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("fp8"), std::string::npos);
  for (const char* args : {"--accumulate -1", "--label-smoothing 1", "--lr-reference-batch -1", "--schedule nope",
                           "--optimizer adam", "--ema maybe", "--lrf 2", "--warmup-momentum 1", "--mosaic 1.5",
                           "--close-mosaic -1", "--mosaic 0.5", "--eval-batch -1"}) {
    CmdResult r = run_ampforge(std::string("train --dataset synthetic --no-progress ") + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    const std::string flag = std::string(args).substr(0, std::string(args).find(' '));
    EXPECT_NE(r.out.find(flag == "--schedule" ? "schedule" : flag), std::string::npos) << args << "\n" << r.out;
  }
}

TEST(TrainCli, AccumulationSmoothingAndDecayGroupsRun) {
  const CmdResult r = run_ampforge("train --dataset synthetic --synthetic-size 256 --batch 16 --accumulate 4 "
                                   "--label-smoothing 0.1 --no-decay-bias-norm --schedule linear --warmup 1 "
                                   "--lr 5e-4 --lr-reference-batch 32 --epochs 1 --json --no-progress",
                                   /*merge_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["steps"], 4) << "256 examples / (16 x 4) per step";
  EXPECT_EQ(j["task"], "classification");
  EXPECT_EQ(j["primary_metric"], "accuracy");
  for (const char* k : {"loss", "accuracy", "top5_accuracy"}) EXPECT_TRUE(j["eval"].contains(k)) << k;
  EXPECT_EQ(j["eval"]["accuracy"], j["test_accuracy"]);
}

TEST(InfoCli, SaysWhetherCudaIsUsableAndWhyNot) {
  CmdResult r = run_ampforge("info");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("CPU kernels: " + std::to_string(ampforge::kNumOps)), std::string::npos) << r.out;  // all on CPU
  // Either devices are listed, or the reason they are not is given in words.
  const bool devices = r.out.find("CUDA devices: ") != std::string::npos;
  const size_t why = r.out.find("CUDA: not available (");
  EXPECT_TRUE(devices || (why != std::string::npos && r.out.size() > why + 25)) << r.out;
}

// The BLAS line names the kernels that run; forcing weaker ones than the CPU allows is reported, never silent.
TEST(InfoCli, NamesTheBlasKernelsAndWarnsWhenTheyAreWeakerThanTheCpu) {
  CmdResult r = run_ampforge("info", true, "env -u OPENBLAS_CORETYPE -u AMPFORGE_BLAS_CORETYPE");
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_NE(r.out.find("BLAS: OpenBLAS"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("WARNING: these BLAS kernels"), std::string::npos) << "left alone, ampforge runs the best: " << r.out;
  const ampforge::cpu::CpuIsa isa = ampforge::cpu::host_isa();
  if (ampforge::cpu::openblas_core_rank(ampforge::cpu::best_openblas_core(isa)) > 0) {  // any x86-64 CPU since 2008
    r = run_ampforge("info", true, "OPENBLAS_CORETYPE=Prescott");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("kernels: Prescott (OPENBLAS_CORETYPE=Prescott set by the user)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("WARNING: these BLAS kernels are weaker than this CPU allows (" + ampforge::cpu::best_openblas_core(isa)),
              std::string::npos)
        << r.out;
  }
}

TEST(TrainCli, MissingDataIsExitCode2WithTheDirectory) {
  CmdResult r = run_ampforge("train --data-dir " + tmp("nowhere").string() + " --no-progress");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("nowhere"), std::string::npos) << r.out;
}

// A checkpoint path that cannot be written fails before training, naming the path: a directory, or a file in a
// directory that does not exist.
TEST(TrainCli, UnwritableSaveFailsBeforeTraining) {
  const fs::path dir = tmp("save_is_a_dir");
  fs::create_directories(dir);
  CmdResult r = run_ampforge("train --dataset synthetic --synthetic-size 64 --batch 16 --no-progress --save " + dir.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("cannot save checkpoints to '" + dir.string() + "': it is a directory"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("epoch"), std::string::npos) << "no training ran: " << r.out;
  const fs::path missing = tmp("no_such_dir") / "ckpt.safetensors";
  r = run_ampforge("train --dataset synthetic --synthetic-size 64 --batch 16 --no-progress --save " + missing.string());
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cannot save checkpoints to '" + missing.string() + "'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No such file or directory"), std::string::npos) << r.out;
}

TEST(TrainCli, JsonSummaryHasTheDocumentedKeys) {
  const CmdResult r = run_ampforge("train --dataset synthetic --synthetic-size 128 --batch 32 --epochs 1 --json --no-progress",
                                   /*merge_stderr=*/false);
  ASSERT_EQ(r.code, 0);
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"model", "precision", "epochs", "test_accuracy", "train_samples_per_sec", "wall_seconds",
                        "peak_memory_bytes", "loss_scale", "skipped_steps", "overflow_events"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["epochs"], 1);
}

// SIGINT is Ctrl-C; SIGTERM what docker, Kubernetes, systemd and Slurm send before SIGKILL; SIGUSR1 what mpirun
// forwards (train/trainer.h: install_stop_signals). The exit code is 128 + the signal, as a shell reports it.
void expect_stop_signal_writes_a_checkpoint(int sig, const std::string& stem) {
  const fs::path ckpt = tmp(stem + ".safetensors"), err = tmp(stem + ".err");
  const pid_t pid = spawn_ampforge({"train", "--dataset", "synthetic", "--synthetic-size", "100000", "--epochs", "5",
                                    "--batch", "64", "--no-progress", "--save", ckpt.string()},
                                   {}, err);
  ASSERT_GE(pid, 0);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  kill(pid, sig);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << "killed by a signal instead of exiting";
  EXPECT_EQ(WEXITSTATUS(st), 128 + sig);
  ASSERT_TRUE(fs::exists(ckpt));
  auto f = ampforge::load_safetensors(ckpt.string());
  EXPECT_TRUE(f.contains("model.0.weight"));
  for (const auto& e : fs::directory_iterator(ckpt.parent_path()))
    EXPECT_EQ(e.path().filename().string().find(stem + ".safetensors.tmp"), std::string::npos) << e.path();
  const std::string text = read_text(err);
  EXPECT_NE(text.find("stopping after this step"), std::string::npos) << text;
  EXPECT_NE(text.find("to continue: the same command with --resume " + ckpt.string()), std::string::npos) << text;
}

TEST(TrainCli, SigintWritesACheckpointAndExitsCleanly) { expect_stop_signal_writes_a_checkpoint(SIGINT, "sigint"); }

TEST(TrainCli, SigtermWritesACheckpointAndExitsCleanly) { expect_stop_signal_writes_a_checkpoint(SIGTERM, "sigterm"); }

TEST(TrainCli, Sigusr1WritesACheckpointAndExitsCleanly) { expect_stop_signal_writes_a_checkpoint(SIGUSR1, "sigusr1"); }

TEST(TrainCli, SecondSigintStopsAtOnce) {
  // Steps of seconds here (the first of batch 4096 took about 5 s), so the second Ctrl-C lands while the first
  // one's step still runs.
  const pid_t pid = spawn_ampforge({"train", "--dataset", "synthetic", "--synthetic-size", "100000", "--epochs", "5",
                                    "--batch", "4096", "--no-progress"});
  ASSERT_GE(pid, 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  kill(pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // signals do not queue: one at a time
  kill(pid, SIGINT);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "exit status " << (WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  EXPECT_EQ(WTERMSIG(st), SIGINT);
}
