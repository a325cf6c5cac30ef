// GradScaler: scripted overflow trajectories, skipped steps leave everything bit-identical, the error
// cases PyTorch raises, and state_dict round trips.
//
// Source of the expected trajectories: PyTorch's update rule, as documented for
// torch.cuda.amp.GradScaler.update() and implemented by aten's _amp_update_scale_ (PyTorch 1.13):
// on an iteration with Inf/NaN gradients the step is skipped, scale *= backoff_factor and the growth
// tracker resets to 0; otherwise the tracker counts clean iterations and when it reaches growth_interval
// scale *= growth_factor and the tracker resets. (PyTorch 1.13 has no CPU kernels for these ops, so the
// tables below are that rule applied by hand; each row says why.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ampforge/amp/grad_scaler.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"

using namespace ampforge;

namespace {
std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = ops::contiguous(t);
  const uint8_t* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}
}  // namespace

TEST(GradScaler, ScriptedOverflowTrajectory) {
  manual_seed(1);
  Tensor w = randn({4}).requires_grad_();
  optim::AdamW opt({w}, {});
  amp::GradScalerOptions so;
  so.init_scale = 8;
  so.growth_interval = 3;
  amp::GradScaler scaler(so);
  const std::vector<bool> overflow{false, false, true, false, false, true, false, false, false, false};
  // scale after update():
  //  0,1 clean (tracker 1,2) -> 8, 8;  2 inf -> 4 (tracker 0);  3,4 clean (1,2) -> 4, 4;  5 inf -> 2;
  //  6,7 clean (1,2) -> 2, 2;  8 clean: tracker reaches 3 = interval -> 4 (tracker 0);  9 clean (1) -> 4.
  const std::vector<double> scales{8, 8, 4, 4, 4, 2, 2, 2, 4, 4};
  const std::vector<int64_t> trackers{1, 2, 0, 1, 2, 0, 1, 2, 0, 1};
  for (size_t step = 0; step < overflow.size(); ++step) {
    opt.zero_grad();
    Tensor x = randn({4});
    if (overflow[step]) x = where(gt(x, full({4}, 1e9)), x, full({4}, INFINITY));  // every element Inf
    Tensor loss = sum(mul(w, x));
    scaler.scale(loss).backward();
    auto before_w = bytes_of(w);
    auto before_state = opt.state_dict();
    std::vector<std::vector<uint8_t>> before_bytes;
    for (auto& [n, t] : before_state) before_bytes.push_back(bytes_of(t));
    const bool stepped = scaler.step(opt);
    EXPECT_EQ(stepped, !overflow[step]) << "step " << step;
    if (!stepped) {
      EXPECT_EQ(bytes_of(w), before_w) << "a skipped step changed the parameters";
      auto after = opt.state_dict();
      for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(bytes_of(after[i].second), before_bytes[i]) << after[i].first;
    } else {
      EXPECT_NE(bytes_of(w), before_w);
    }
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), scales[step]) << "step " << step;
    EXPECT_EQ(scaler.growth_tracker(), trackers[step]) << "step " << step;
  }
  EXPECT_EQ(scaler.skipped_steps(), 2);
  EXPECT_EQ(opt.steps(), 8);
}

TEST(GradScaler, DefaultsArePyTorchs) {
  amp::GradScaler s;
  EXPECT_EQ(s.options().init_scale, 65536.0);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_EQ(s.get_scale(), 65536.0);
}

TEST(GradScaler, UnscaleDividesGradients) {
  Tensor w = ones({3}).requires_grad_();
  optim::AdamW opt({w}, {});
  amp::GradScalerOptions so;
  so.init_scale = 1024;
  amp::GradScaler scaler(so);
  scaler.scale(sum(mul(w, Tensor::from_vector<float>({1, 2, 3})))).backward();
  EXPECT_EQ(w.grad().tolist<float>(), (std::vector<float>{1024, 2048, 3072}));
  scaler.unscale_(opt);
  EXPECT_EQ(w.grad().tolist<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_THROW(scaler.unscale_(opt), Error);  // twice before update()
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_THROW(scaler.step(opt), Error);  // twice before update()
  EXPECT_THROW(scaler.unscale_(opt), Error);  // after step()
  scaler.update();
  EXPECT_THROW(scaler.update(), Error);  // no inf checks recorded since
}

TEST(GradScaler, StepWithoutScaleIsAnError) {
  Tensor w = ones({3}).requires_grad_();
  optim::AdamW opt({w}, {});
  amp::GradScaler scaler;
  EXPECT_THROW(scaler.step(opt), Error);
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Tensor w = ones({3}).requires_grad_();
  optim::AdamW opt({w}, {});
  amp::GradScalerOptions so;
  so.enabled = false;
  amp::GradScaler scaler(so);
  Tensor loss = sum(w);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(scaler.state_dict().empty());
}

TEST(GradScaler, StateDictRoundTripAndValidation) {
  amp::GradScalerOptions so;
  so.init_scale = 512;
  amp::GradScaler a(so);
  Tensor w = ones({2}).requires_grad_();
  optim::AdamW opt({w}, {});
  a.scale(sum(w)).backward();
  a.step(opt);
  a.update();
  auto sd = a.state_dict();
  amp::GradScaler b;
  b.load_state_dict(sd);
  EXPECT_EQ(b.get_scale(), 512.0);
  EXPECT_EQ(b.growth_tracker(), 1);
  auto missing = sd;
  missing.erase("_growth_tracker");
  EXPECT_THROW(b.load_state_dict(missing), Error);
  auto other_version = sd;
  other_version["version"] = 99;
  EXPECT_THROW(b.load_state_dict(other_version), Error);
  EXPECT_THROW(b.load_state_dict({}), Error);
}

TEST(GradScaler, LoadsPyTorchStateDictsAndRejectsBadValues) {
  // torch.cuda.amp.GradScaler().state_dict() after some steps: exactly these five keys, no "version".
  const std::map<std::string, double> torch_sd{{"scale", 32768.0}, {"growth_factor", 2.0}, {"backoff_factor", 0.5},
                                               {"growth_interval", 2000.0}, {"_growth_tracker", 17.0}};
  amp::GradScaler b;
  b.load_state_dict(torch_sd);
  EXPECT_EQ(b.get_scale(), 32768.0);
  EXPECT_EQ(b.growth_tracker(), 17);
  const std::vector<std::pair<const char*, double>> bad{
      {"scale", 0.0},           {"scale", -1.0},          {"scale", INFINITY},         {"scale", NAN},
      {"growth_factor", 1.0},   {"growth_factor", NAN},   {"backoff_factor", 1.0},     {"backoff_factor", 0.0},
      {"growth_interval", 0.0}, {"growth_interval", 2.5}, {"_growth_tracker", -1.0},   {"_growth_tracker", 2000.0},
      {"_growth_tracker", 0.5}};
  for (const auto& [key, value] : bad) {
    auto sd = torch_sd;
    sd[key] = value;
    amp::GradScaler c;
    try {
      c.load_state_dict(sd);
      ADD_FAILURE() << key << " = " << value << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

TEST(GradScaler, LoadedStateWaitsForTheLossDevice) {
  // Loaded before any scale(): nothing is created yet (a resumed CUDA run must get its state on the GPU,
  // where the first scaled loss lives); the values are reported and used as soon as the state exists.
  amp::GradScaler b;
  b.load_state_dict({{"scale", 256.0}, {"growth_factor", 2.0}, {"backoff_factor", 0.5}, {"growth_interval", 2000.0},
                     {"_growth_tracker", 3.0}, {"version", 1.0}});
  EXPECT_EQ(b.get_scale(), 256.0);
  EXPECT_EQ(b.growth_tracker(), 3);
  Tensor w = ones({2}).requires_grad_();
  optim::AdamW opt({w}, {});
  b.scale(sum(w)).backward();
  b.step(opt);
  b.update();
  EXPECT_EQ(b.get_scale(), 256.0);
  EXPECT_EQ(b.growth_tracker(), 4);
}

TEST(GradScaler, NanGradientsAreSkippedToo) {
  Tensor w = ones({2}).requires_grad_();
  optim::AdamW opt({w}, {});
  amp::GradScaler scaler;
  scaler.scale(sum(mul(w, full({2}, NAN)))).backward();
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST(GradScaler, F16GradientsAreUnscaledIntoF32MasterGradients) {
  // Master weights with F16 parameters (train --master-weights --precision fp16): the scaled gradients
  // (1e-8 and 3e-8 times 65536: normal F16 numbers) must come out of unscaling as 1e-8 and 3e-8, which F16
  // cannot hold (2^-24 = 6e-8 is its smallest subnormal): unscaling in place in F16 flushes the first to
  // zero and doubles the second.
  Tensor w = ops::to_dtype(Tensor::from_vector<float>({1e-3f, 1e-3f}), DType::F16);
  w.requires_grad_(true);
  optim::SGDOptions so;
  so.lr = 1.0;
  optim::SGD opt({w}, so);
  const std::vector<float> master0 = opt.param_groups()[0].master.narrow(0, 0, 2).tolist<float>();
  amp::GradScaler scaler;
  const Tensor c = Tensor::from_vector<float>({1e-8f, 3e-8f});
  scaler.scale(sum(mul(w, c))).backward();
  EXPECT_EQ(w.grad().dtype(), DType::F16);
  scaler.unscale_(opt);
  const Tensor g = opt.grad_buffers()[0];  // what clipping and the step see
  ASSERT_EQ(g.dtype(), DType::F32);
  const std::vector<float> gv = g.narrow(0, 0, 2).tolist<float>();
  for (int i = 0; i < 2; ++i) {
    const double want = static_cast<double>(c.tolist<float>()[i]);
    // The only rounding: the scaled gradient to F16 (relative 2^-11).
    EXPECT_NEAR(gv[i], want, want * 1e-3) << "element " << i;
  }
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  const std::vector<float> master1 = opt.param_groups()[0].master.narrow(0, 0, 2).tolist<float>();
  // master -= lr * g, one F32 rounding at the master's magnitude (1e-3: half an ulp is 5.8e-11).
  for (int i = 0; i < 2; ++i)
    EXPECT_NEAR(static_cast<double>(master0[i]) - master1[i], gv[i], 6e-11) << "element " << i;
  // The model copy is the master rounded to F16.
  const Tensor rounded = ops::to_dtype(opt.param_groups()[0].master.narrow(0, 0, 2), DType::F16);
  EXPECT_EQ(bytes_of(w), bytes_of(rounded));
  // The next iteration's gradients are in the F16 buffer again.
  opt.zero_grad();
  EXPECT_EQ(opt.grad_buffers()[0].dtype(), DType::F16);
}

TEST(GradScaler, F16MasterGradientsSkipOnOverflow) {
  Tensor w = ops::to_dtype(Tensor::from_vector<float>({1, 2}), DType::F16);
  w.requires_grad_(true);
  optim::SGD opt({w}, {});
  amp::GradScaler scaler;
  const std::vector<uint8_t> before = bytes_of(w);
  // 1e4 * 65536 overflows F16: the step must be skipped and the scale backed off.
  scaler.scale(sum(mul(w, Tensor::from_vector<float>({1e4f, 1})))).backward();
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(bytes_of(w), before);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}
