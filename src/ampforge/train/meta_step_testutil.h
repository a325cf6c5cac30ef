// The meta device's check (meta_step_test.cpp, meta_step_slow_test.cpp): for a registered model, at two batch
// sizes, the peak allocated bytes of a training step on the meta device (standing for the CPU) equal those of
// the same step run for real on the CPU, within one allocator granule. Both run through the fit finder's probe
// (train/fit_probe.h: the same workload, optimizer, GradScaler and train_step), each in a fresh caching
// allocator with the same policy, so any allocation the meta path adds, drops or sizes differently (a missed
// output, a host read assumed wrongly) shows up.
//
// Sizes are the smallest that still run every layer: 32x32 images for the ResNets (layer4 at 1x1), 64x64 for
// YOLOv8 (three detection levels), 16 tokens for BERT, the registry's 28x28 for the small CNNs. The meta side
// takes milliseconds; the CPU side is a real step, dominated by building the model and by the CPU convolution's
// weight packing: the models whose CPU step takes more than about ten seconds on the 2-core build machine run
// under the `slow` label (meta_step_slow_test.cpp), the rest under `unit`. kMetaCheckedModels lists both groups;
// a unit test checks that together they are every registered model.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ampforge/memory/provider.h"
#include "ampforge/models/registry.h"
#include "ampforge/train/fit_probe.h"

namespace ampforge::train::testing {

inline const std::vector<std::string> kMetaUnitModels = {"cnn",     "resnet-small", "resnet18", "resnet34",
                                                          "resnet50", "yolov8n",     "yolov8s",  "yolov8m",
                                                          "bert-tiny", "bert-mini"};
inline const std::vector<std::string> kMetaSlowModels = {
    "resnet101",       "resnet152",       "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d",
    "wide_resnet50_2", "wide_resnet101_2", "yolov8l",        "yolov8x",          "bert-base"};

inline FitProbeSetup meta_check_setup(const std::string& model, Device device, DType precision = DType::F32) {
  FitProbeSetup s;
  s.cfg.model = model;
  s.cfg.precision = precision;
  s.cfg.optimizer = "sgd";  // one state buffer (momentum): a real step of the 100M-parameter models stays cheaper
  s.device = device;
  s.stands_for = DeviceType::CPU;
  s.budget = int64_t{64} << 30;  // a capacity, not memory: the CPU run takes only what it uses
  // One training step. The two-step confirmation is compared on the CPU in cli/memory_fit_test.cpp
  // (MetaStandingForTheCpuGivesTheCpusAnswer).
  s.steps = 1;
  const std::string& task = models::model_registry().at(model).task;
  if (task == "detection") s.image_size = 64;
  else if (task == "masked_lm") s.seq_len = 16;
  else if (model != "cnn" && model != "resnet-small") s.image_size = 32;
  return s;
}

// precision: the step's (F16 and BF16 under autocast; the CPU's 16-bit convolutions and SiLU batch norms take F32
// scratch from the allocator, which the meta kernels model: backends/meta/cpu_scratch.h).
inline void expect_meta_peak_equals_cpu(const std::string& model, DType precision = DType::F32) {
  for (const int64_t batch : {2, 3}) {
    const memory::FitProbe cpu = run_fit_probe(meta_check_setup(model, kCPU, precision), batch, true);
    const memory::FitProbe meta = run_fit_probe(meta_check_setup(model, kMeta, precision), batch, true);
    ASSERT_TRUE(cpu.fits) << cpu.oom_report;
    ASSERT_TRUE(meta.fits) << meta.oom_report;
    const auto granule = static_cast<int64_t>(memory::kHostGranule);
    std::printf("%-18s batch %lld: peak allocated cpu %lld, meta %lld (diff %lld B); during the step cpu %lld, meta "
                "%lld (diff %lld B); cpu %.2fs, meta %.2fs\n",
                model.c_str(), static_cast<long long>(batch), static_cast<long long>(cpu.peak_allocated),
                static_cast<long long>(meta.peak_allocated), static_cast<long long>(meta.peak_allocated - cpu.peak_allocated),
                static_cast<long long>(cpu.step_peak_allocated), static_cast<long long>(meta.step_peak_allocated),
                static_cast<long long>(meta.step_peak_allocated - cpu.step_peak_allocated), cpu.seconds, meta.seconds);
    EXPECT_GT(cpu.step_peak_allocated, 0);
    // The bound: one allocator granule, over the whole probe and over the step alone (at these small
    // sizes the whole probe's peak can be the optimizer's flattening of the parameters, before any step).
    EXPECT_LE(std::llabs(meta.peak_allocated - cpu.peak_allocated), granule)
        << model << " at batch " << batch << ": meta " << meta.peak_allocated << " vs cpu " << cpu.peak_allocated;
    EXPECT_LE(std::llabs(meta.step_peak_allocated - cpu.step_peak_allocated), granule)
        << model << " at batch " << batch << ": meta " << meta.step_peak_allocated << " vs cpu "
        << cpu.step_peak_allocated;
    // Stricter where nothing is assumed about values: the very same bytes. Only the masked-LM head depends on
    // them (meta gathers the expected number of masked rows, a real batch a random number).
    if (models::model_registry().at(model).task != "masked_lm") {
      EXPECT_EQ(meta.step_peak_allocated, cpu.step_peak_allocated) << model << " at batch " << batch;
      EXPECT_EQ(meta.peak_live, cpu.peak_live) << model << " at batch " << batch;
    }
    // The breakdown's persistent parts are the same tensors on both devices.
    EXPECT_EQ(meta.measure.parameters, cpu.measure.parameters);
    EXPECT_EQ(meta.measure.gradients, cpu.measure.gradients);
    EXPECT_EQ(meta.measure.optimizer_state, cpu.measure.optimizer_state);
    EXPECT_EQ(meta.measure.inputs, cpu.measure.inputs);
  }
}

inline std::string test_name(const ::testing::TestParamInfo<std::string>& i) {
  std::string n = i.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

}  // namespace ampforge::train::testing
