// train_step's device-decision mode (read_loss = false), which the CUDA trainer uses, run on the CPU with
// the optimizer's device hyperparameters: the same steps as the host-decision mode, bit for bit, including
// GradScaler skips and a non-finite loss without a scaler.
#include <gtest/gtest.h>

#include <cmath>

#include "ampforge/core/generator.h"
#include "ampforge/models/models.h"
#include "ampforge/ops/ops.h"
#include "ampforge/tasks/classification.h"
#include "ampforge/train/recipe.h"
#include "ampforge/train/step.h"

using namespace ampforge;

namespace {

struct Trace {
  std::vector<float> losses;
  std::vector<float> params;
  int64_t optimizer_steps = 0, scaler_skips = 0;
  double scale = 0;
};

Trace run(bool read_loss, DType precision, double lr, int steps, double clip = 0, const char* optimizer = "adamw") {
  manual_seed(3);
  models::ModelOptions mo;
  mo.image_size = 12;
  nn::ModulePtr model = models::small_cnn(mo);
  model->train();
  train::TrainConfig cfg;
  cfg.lr = lr;
  cfg.optimizer = optimizer;
  cfg.momentum = 0;
  std::unique_ptr<optim::Optimizer> opt = train::make_optimizer(cfg, *model);
  if (!read_loss) opt->set_device_hyperparams(true);
  amp::GradScaler scaler(train::grad_scaler_options(precision));
  Generator gen(5);
  tasks::ClassificationTask task;
  Trace t;
  for (int s = 0; s < steps; ++s) {
    Tensor x = ops::randn({8, 1, 12, 12}, DType::F32, kCPU, &gen);
    std::vector<int64_t> labels;
    for (int i = 0; i < 8; ++i) labels.push_back((s + 3 * i) % 10);
    Tensor y = Tensor::from_vector<int64_t>(labels);
    train::StepOptions so;
    so.precision = precision;
    so.read_loss = read_loss;
    so.clip_grad_norm = clip;
    const data::Batch batch{x, y, Tensor()};
    const train::StepResult r = train::train_step(*model, task, *opt, scaler, std::span<const data::Batch>(&batch, 1), so);
    t.losses.push_back(static_cast<float>(r.loss_tensor.item()));
    if (read_loss) EXPECT_EQ(static_cast<float>(r.loss), t.losses.back());
    else EXPECT_TRUE(std::isnan(r.loss));
  }
  for (const Tensor& p : model->parameters()) {
    const std::vector<float> v = ops::contiguous(ops::to_dtype(p.detach(), DType::F32)).tolist<float>();
    t.params.insert(t.params.end(), v.begin(), v.end());
  }
  t.optimizer_steps = opt->steps();
  t.scaler_skips = scaler.skipped_steps();
  t.scale = scaler.get_scale();
  return t;
}

}  // namespace

TEST(TrainStep, DeviceDecisionsGiveTheSameStepsF32) {
  const Trace a = run(true, DType::F32, 1e-3, 4), b = run(false, DType::F32, 1e-3, 4);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.optimizer_steps, 4);
  EXPECT_EQ(b.optimizer_steps, 4);
}

TEST(TrainStep, DeviceDecisionsGiveTheSameStepsWithGradScaler) {
  // F16 autocast with a GradScaler whose first scale (65536) overflows: skips and backoffs happen, and the
  // device-side count must agree with the host-side one.
  const Trace a = run(true, DType::F16, 1e-3, 5), b = run(false, DType::F16, 1e-3, 5);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.scaler_skips, b.scaler_skips);
  EXPECT_EQ(a.optimizer_steps + a.scaler_skips, 5);
  EXPECT_EQ(b.optimizer_steps, a.optimizer_steps);
  EXPECT_EQ(a.scale, b.scale);
}

TEST(TrainStep, DeviceClippingMatchesHostClipping) {
  const Trace a = run(true, DType::F32, 1e-2, 3, 0.5), b = run(false, DType::F32, 1e-2, 3, 0.5);
  ASSERT_EQ(a.params.size(), b.params.size());
  // The norm is summed in F32 on the device (in double on the host): the clip factors differ by rounding.
  for (size_t i = 0; i < a.params.size(); ++i) EXPECT_NEAR(a.params[i], b.params[i], 1e-5) << i;
}

TEST(TrainStep, NonFiniteLossWithoutScalerSkipsTheUpdateOnTheDevice) {
  // SGD with lr 1e30 makes the loss non-finite within a few steps; the device must skip exactly those
  // updates (the host mode would not even run backward for them).
  const Trace t = run(false, DType::F32, 1e30, 6, 0, "sgd");
  ASSERT_EQ(t.losses.size(), 6u);
  EXPECT_TRUE(std::isfinite(t.losses[0]));
  int non_finite = 0;
  for (float l : t.losses) non_finite += std::isfinite(l) ? 0 : 1;
  EXPECT_GT(non_finite, 0);
  EXPECT_EQ(t.optimizer_steps, 6 - non_finite);
}
