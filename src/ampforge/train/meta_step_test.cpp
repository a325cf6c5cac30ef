// The check that makes the meta device trustworthy for memory planning (backends/meta/meta.h): for every
// registered model, at two batch sizes, the peak allocated bytes of training steps on the meta device (standing
// for the CPU) equal those of the same steps run for real on the CPU, within one allocator granule. Both run
// through the fit finder's probe (train/fit_probe.h: the same workload, optimizer, GradScaler and train_step),
// each in a fresh caching allocator with the same policy, so any allocation the meta path adds, drops or sizes
// differently (a missed output, a host read assumed wrongly) shows up here.
//
// Sizes are the smallest that still run every layer: 32x32 images for the ResNets (layer4 at 1x1), 64x64 for
// YOLOv8 (three detection levels), 16 tokens for BERT, the registry's 28x28 for the small CNNs.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "ampforge/memory/provider.h"
#include "ampforge/models/registry.h"
#include "ampforge/train/fit_probe.h"

namespace ampforge::train {
namespace {

FitProbeSetup setup_for(const std::string& model, Device device) {
  FitProbeSetup s;
  s.cfg.model = model;
  s.cfg.optimizer = "sgd";  // one state buffer (momentum): a real step of the 100M-parameter models stays cheap
  s.device = device;
  s.stands_for = DeviceType::CPU;
  s.budget = int64_t{64} << 30;  // a capacity, not memory: the CPU run takes only what it uses
  s.steps = 2;                   // the second step starts from the first one's cache and state
  const std::string& task = models::model_registry().at(model).task;
  if (task == "detection") s.image_size = 64;
  else if (task == "masked_lm") s.seq_len = 16;
  else if (model != "cnn" && model != "resnet-small") s.image_size = 32;
  return s;
}

class MetaStep : public ::testing::TestWithParam<std::string> {};

TEST_P(MetaStep, PeakAllocatedEqualsTheCpuStepsWithinOneGranule) {
  const std::string model = GetParam();
  for (const int64_t batch : {2, 3}) {
    const memory::FitProbe cpu = run_fit_probe(setup_for(model, kCPU), batch, true);
    const memory::FitProbe meta = run_fit_probe(setup_for(model, kMeta), batch, true);
    ASSERT_TRUE(cpu.fits) << cpu.oom_report;
    ASSERT_TRUE(meta.fits) << meta.oom_report;
    const auto granule = static_cast<int64_t>(memory::kHostGranule);
    std::printf("%-18s batch %lld: peak allocated cpu %lld, meta %lld (diff %lld B); during the steps cpu %lld, meta "
                "%lld (diff %lld B); cpu %.2fs, meta %.2fs\n",
                model.c_str(), static_cast<long long>(batch), static_cast<long long>(cpu.peak_allocated),
                static_cast<long long>(meta.peak_allocated), static_cast<long long>(meta.peak_allocated - cpu.peak_allocated),
                static_cast<long long>(cpu.step_peak_allocated), static_cast<long long>(meta.step_peak_allocated),
                static_cast<long long>(meta.step_peak_allocated - cpu.step_peak_allocated), cpu.seconds, meta.seconds);
    EXPECT_GT(cpu.step_peak_allocated, 0);
    // The bound: one allocator granule, over the whole probe and over the steps alone (at these small
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

INSTANTIATE_TEST_SUITE_P(EveryRegisteredModel, MetaStep, ::testing::ValuesIn(models::names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace ampforge::train
