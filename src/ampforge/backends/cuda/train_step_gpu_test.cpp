// A few training steps of a small MLP (Linear, ReLU, GELU, cross_entropy, AdamW) on CUDA against
// the same steps on the CPU: exercises autograd, the optimizer's flat buffers and GradScaler on the
// device end to end. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "ampforge/ampforge.h"
#include "ampforge/backends/cuda/gpu_testutil.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

struct Result {
  std::vector<double> losses;
  std::vector<Tensor> params;  // on the CPU
  double scale = 0;
};

Result train_mlp(Device dev, bool amp) {
  manual_seed(42);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(20, 64), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(64, 32),
      std::make_shared<nn::GELU>(), std::make_shared<nn::Linear>(32, 5)});
  model->to(dev);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-2;
  optim::AdamW opt(model->parameters(), adamw);
  amp::GradScaler scaler(amp::GradScalerOptions{.enabled = amp});
  Generator data_gen(7);
  Tensor x = ops::to_device(ops::randn(Shape{48, 20}, DType::F32, kCPU, &data_gen), dev);
  std::vector<int64_t> labels;
  for (int i = 0; i < 48; ++i) labels.push_back((i * 7) % 5);
  Tensor y = ops::to_device(Tensor::from_vector<int64_t>(labels), dev);
  Result r;
  for (int step = 0; step < 4; ++step) {
    Tensor loss;
    {
      amp::Autocast ac(dev, DType::F16, amp);
      loss = cross_entropy((*model)(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
    r.losses.push_back(loss.item());
  }
  for (const Tensor& p : model->parameters()) r.params.push_back(ops::to_device(p.detach(), kCPU));
  r.scale = scaler.get_scale();
  return r;
}

}  // namespace

TEST(CudaTraining, F32StepsMatchTheCpu) {
  AF_SKIP_WITHOUT_CUDA();
  const Result c = train_mlp(kCPU, false), g = train_mlp(kCuda0, false);
  ASSERT_EQ(c.losses.size(), g.losses.size());
  for (size_t i = 0; i < c.losses.size(); ++i)
    EXPECT_NEAR(g.losses[i], c.losses[i], 1e-4 * std::max(1.0, std::abs(c.losses[i]))) << "step " << i;
  EXPECT_LT(g.losses.back(), g.losses.front()) << "the loss goes down";
  // Four Adam steps amplify rounding differences of the gradients where they are near zero; parameters
  // are compared with a bound 64x the F32 table's.
  for (size_t i = 0; i < c.params.size(); ++i) expect_matches_cpu(g.params[i], c.params[i], "parameter " + std::to_string(i), 64);
}

TEST(CudaTraining, MixedPrecisionStepsWithGradScaler) {
  AF_SKIP_WITHOUT_CUDA();
  const Result c = train_mlp(kCPU, true), g = train_mlp(kCuda0, true);
  for (size_t i = 0; i < c.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(g.losses[i])) << "step " << i;
    // F16 activations: the F16 row of the table, scaled for the chain of ops in a forward pass
    EXPECT_NEAR(g.losses[i], c.losses[i], 2e-2 * std::max(1.0, std::abs(c.losses[i]))) << "step " << i;
  }
  EXPECT_EQ(g.scale, c.scale) << "the same steps were skipped (none) and the scale evolved alike";
}
