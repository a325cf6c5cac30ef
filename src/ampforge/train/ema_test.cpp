// The weight average (train/ema.h): Ultralytics' decay ramp, the update arithmetic on parameters and buffers,
// integer entries left alone, evaluation on the average with the weights restored, and restoring a saved
// average by name.
#include "ampforge/train/ema.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ampforge/nn/layers.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;

namespace {

std::shared_ptr<nn::Sequential> small_net() {
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(1, 2, 3), std::make_shared<nn::BatchNorm2d>(2)});
}

const Tensor& entry(const nn::NamedTensors& s, const std::string& name) {
  for (const auto& [n, t] : s)
    if (n == name) return t;
  throw std::runtime_error("no " + name);
}

}  // namespace

TEST(ModelEma, DecayRampsAsUltralytics) {
  auto net = small_net();
  train::ModelEma ema(*net, {true, 0.9999, 2000});
  EXPECT_NEAR(ema.decay_at(1), 0.9999 * (1 - std::exp(-1.0 / 2000)), 1e-15);
  EXPECT_NEAR(ema.decay_at(2000), 0.9999 * (1 - std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(ema.decay_at(100000), 0.9999, 1e-12);
  train::ModelEma flat(*net, {true, 0.5, 0});
  EXPECT_EQ(flat.decay_at(1), 0.5);
  EXPECT_THROW(train::ModelEma(*net, {true, 1.0, 0}), Error);
}

TEST(ModelEma, UpdateAveragesFloatEntriesOnly) {
  auto net = small_net();
  train::ModelEma ema(*net, {true, 0.5, 0});
  const nn::NamedTensors before = net->state_dict();
  const float w0 = entry(before, "0.weight").tolist<float>()[0];
  const float rm0 = entry(before, "1.running_mean").tolist<float>()[0];
  // Move the weights and a BatchNorm buffer; the average goes half way.
  ops::fill_(entry(net->state_dict(), "0.weight").detach(), 1.0);
  ops::fill_(entry(net->state_dict(), "1.running_mean").detach(), 3.0);
  ema.update(*net);
  EXPECT_EQ(ema.updates(), 1);
  EXPECT_NEAR(entry(ema.state(), "0.weight").tolist<float>()[0], 0.5 * w0 + 0.5, 1e-6);
  EXPECT_NEAR(entry(ema.state(), "1.running_mean").tolist<float>()[0], 0.5 * rm0 + 1.5, 1e-6);
  for (const auto& [n, t] : ema.state()) EXPECT_TRUE(dtype_is_float(t.dtype())) << n << " is averaged";
  // The full state dict has every entry; the integer counter is the model's own.
  const nn::NamedTensors full = ema.full_state_dict(*net);
  EXPECT_EQ(full.size(), net->state_dict().size());
}

TEST(ModelEma, AppliedSwapsTheAverageInAndRestoresTheWeights) {
  auto net = small_net();
  train::ModelEma ema(*net, {true, 0.5, 0});
  ops::fill_(entry(net->state_dict(), "0.weight").detach(), 2.0);
  const float avg = [&] {
    ema.update(*net);
    return entry(ema.state(), "0.weight").tolist<float>()[0];
  }();
  {
    const train::ModelEma::Applied a = ema.apply_to(*net);
    EXPECT_EQ(entry(net->state_dict(), "0.weight").tolist<float>()[0], avg);
  }
  EXPECT_EQ(entry(net->state_dict(), "0.weight").tolist<float>()[0], 2.0f) << "restored";
}

TEST(ModelEma, LoadRestoresByNameAndRejectsAnotherModel) {
  auto net = small_net();
  train::ModelEma ema(*net, {true, 0.5, 0});
  ops::fill_(entry(net->state_dict(), "0.weight").detach(), 4.0);
  ema.update(*net);
  const nn::NamedTensors saved = ema.full_state_dict(*net);
  nn::NamedTensors reversed(saved.rbegin(), saved.rend());  // a file's order is not the model's
  train::ModelEma other(*small_net(), {true, 0.5, 0});
  other.load(reversed, 7);
  EXPECT_EQ(other.updates(), 7);
  EXPECT_EQ(entry(other.state(), "0.weight").tolist<float>(), entry(ema.state(), "0.weight").tolist<float>());
  nn::NamedTensors missing = saved;
  missing.erase(missing.begin());
  EXPECT_THROW(other.load(missing, 1), Error);
  auto wide = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(1, 3, 3), std::make_shared<nn::BatchNorm2d>(3)});
  EXPECT_THROW(train::ModelEma(*wide, {true, 0.5, 0}).load(saved, 1), Error) << "shapes differ";
}
