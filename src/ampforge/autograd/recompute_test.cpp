// Recompute mode (autograd/node.h, RecomputeGuard): cheap activations are rebuilt in backward instead of kept.
// The gradients must be bit-identical to the default's (the rebuilt tensors are the same kernels on the same
// inputs), the activation memory lower, and misuse (a second backward) a clear error.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/backends/meta/meta.h"
#include "ampforge/core/generator.h"
#include "ampforge/models/registry.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"

namespace ampforge {
namespace {

struct StepRun {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per parameter, in order
  std::vector<std::vector<float>> running;  // BatchNorm running statistics after the step
};

// One forward/backward of `model` (fresh, same seed) on a fixed batch, with or without recompute mode.
StepRun run_step(const std::string& model, int64_t size, bool recompute) {
  manual_seed(7);
  models::ModelOptions mo = models::model_registry().at(model).defaults;
  mo.image_size = size;
  mo.num_classes = 10;
  nn::ModulePtr m = models::create(model, mo);
  m->train();
  Generator g(3);
  const Tensor x = ops::randn({2, mo.in_channels, size, size}, DType::F32, kCPU, &g).contiguous(MemoryFormat::ChannelsLast);
  const Tensor y = Tensor::from_vector<int64_t>({3, 7});
  Tensor loss;
  {
    autograd::RecomputeGuard rg(recompute);
    loss = cross_entropy((*m)(x), y);
  }
  loss.backward();
  StepRun r;
  r.loss = loss.item();
  for (auto& [name, p] : m->named_parameters()) r.grads.push_back(p.grad().tolist<float>());
  for (auto& [name, b] : m->named_buffers())
    if (b.is_floating_point()) r.running.push_back(b.tolist<float>());
  return r;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Recompute, GradientsAndRunningStatisticsAreBitIdentical) {
  // Basic blocks (resnet18) and bottlenecks with downsampling (resnet50): batch norm, relu, residual sums.
  for (const std::string& model : {std::string("resnet18"), std::string("resnet50"), std::string("resnet-small")}) {
    const int64_t size = model == "resnet-small" ? 28 : 32;
    const StepRun plain = run_step(model, size, false), re = run_step(model, size, true);
    EXPECT_EQ(plain.loss, re.loss) << model;
    ASSERT_EQ(plain.grads.size(), re.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_TRUE(bit_equal(plain.grads[i], re.grads[i])) << model << " #" << i;
    // The running statistics were updated once, by the forward: rebuilding does not touch them.
    ASSERT_EQ(plain.running.size(), re.running.size());
    for (size_t i = 0; i < plain.running.size(); ++i) EXPECT_TRUE(bit_equal(plain.running[i], re.running[i])) << model;
  }
}

// Live bytes after the forward pass of ResNet-50 at 64x64 on the meta device (standing for the CPU).
int64_t forward_live_bytes(bool recompute) {
  meta::MetaSession session(meta::MetaOptions::stand_for(DeviceType::CPU));
  models::ModelOptions mo = models::model_registry().at("resnet50").defaults;
  mo.image_size = 64;
  nn::ModulePtr m = models::create("resnet50", mo);
  m->to(kMeta);
  m->train();
  const Tensor x = ops::randn({8, 3, 64, 64}, DType::F32, kMeta).contiguous(MemoryFormat::ChannelsLast);
  const int64_t before = session.allocator().stats().requested.current;
  Tensor loss;
  {
    autograd::RecomputeGuard rg(recompute);
    loss = cross_entropy((*m)(x), ops::zeros({8}, DType::I64, kMeta));
  }
  const int64_t live = session.allocator().stats().requested.current - before;
  loss.backward();
  return live;
}

TEST(Recompute, KeepsLessActivationMemory) {
  const int64_t plain = forward_live_bytes(false), re = forward_live_bytes(true);
  std::printf("resnet50 8x3x64x64 forward: %lld bytes live, %lld with recompute (%.0f%%)\n",
              static_cast<long long>(plain), static_cast<long long>(re), 100.0 * static_cast<double>(re) / static_cast<double>(plain));
  // Per bottleneck, the three batch-norm inputs are kept instead of those plus two relu outputs and the block's
  // output: about half.
  EXPECT_LT(re, plain * 2 / 3);
}

TEST(Recompute, ASecondBackwardIsAClearError) {
  nn::ModulePtr m = models::create("resnet-small");
  m->train();
  const Tensor x = ops::randn({2, 1, 28, 28});
  Tensor loss;
  {
    autograd::RecomputeGuard rg;
    loss = sum((*m)(x));
  }
  loss.backward();
  try {
    loss.backward();
    ADD_FAILURE() << "a second backward ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second"), std::string::npos) << e.what();
  }
}

TEST(Recompute, OnlyInsideTheGuard) {
  EXPECT_FALSE(autograd::recompute_enabled());
  {
    autograd::RecomputeGuard on;
    EXPECT_TRUE(autograd::recompute_enabled());
    {
      autograd::RecomputeGuard off(false);
      EXPECT_FALSE(autograd::recompute_enabled());
    }
    EXPECT_TRUE(autograd::recompute_enabled());
  }
  EXPECT_FALSE(autograd::recompute_enabled());
}

}  // namespace
}  // namespace ampforge
