// Optimizers: trajectories against PyTorch 1.13 (tests/data/optim_golden.json, written by
// scripts/gen_optim_golden.py), flat-buffer bookkeeping, GradScaler skips, and master weights with
// stochastic rounding of the BF16 model copy.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/half.h"
#include "ampforge/nn/layers.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/util/thread_pool.h"

using namespace ampforge;

namespace {

// The closed-form inputs of scripts/gen_optim_golden.py.
std::vector<Tensor> golden_params(const nlohmann::json& shapes) {
  std::vector<Tensor> ps;
  for (size_t k = 0; k < shapes.size(); ++k) {
    Shape s;
    int64_t n = 1;
    for (auto d : shapes[k]) {
      s.push_back(d.get<int64_t>());
      n *= d.get<int64_t>();
    }
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i + 1) + k));
    Tensor t = Tensor::from_vector(v, s);
    t.requires_grad_(true);
    ps.push_back(t);
  }
  return ps;
}

void set_golden_grads(std::vector<Tensor>& ps, int t) {
  for (size_t k = 0; k < ps.size(); ++k) {
    const int64_t n = ps[k].numel();
    std::vector<float> g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(std::cos(0.11 * i + 0.7 * t + k) * 0.5);
    ops::copy_(ps[k].grad(), Tensor::from_vector(g, ps[k].shape()));
  }
}

nlohmann::json load_golden() {
  std::ifstream f(std::string(AMPFORGE_TEST_DATA_DIR) + "/optim_golden.json");
  EXPECT_TRUE(f.good()) << "tests/data/optim_golden.json missing (scripts/gen_optim_golden.py writes it)";
  return nlohmann::json::parse(f);
}

std::unique_ptr<optim::Optimizer> make(const nlohmann::json& c, const std::vector<Tensor>& ps) {
  const auto& o = c["options"];
  if (c["optimizer"] == "adamw") {
    optim::AdamWOptions a;
    a.lr = o.value("lr", a.lr);
    a.weight_decay = o.value("weight_decay", a.weight_decay);
    a.eps = o.value("eps", a.eps);
    if (o.contains("betas")) {
      a.beta1 = o["betas"][0];
      a.beta2 = o["betas"][1];
    }
    return std::make_unique<optim::AdamW>(ps, a);
  }
  optim::SGDOptions s;
  s.lr = o.value("lr", s.lr);
  s.momentum = o.value("momentum", s.momentum);
  s.dampening = o.value("dampening", s.dampening);
  s.weight_decay = o.value("weight_decay", s.weight_decay);
  s.nesterov = o.value("nesterov", s.nesterov);
  return std::make_unique<optim::SGD>(ps, s);
}

std::vector<uint16_t> bits_of(const Tensor& bf16) {
  const auto* p = static_cast<const uint16_t*>(bf16.contiguous().data_ptr());
  return {p, p + bf16.numel()};
}

}  // namespace

TEST(Optimizer, TrajectoriesMatchPyTorch) {
  const nlohmann::json doc = load_golden();
  const int steps = doc["steps"];
  ASSERT_GE(doc["cases"].size(), 6u);
  for (const auto& c : doc["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<Tensor> ps = golden_params(doc["shapes"]);
    auto opt = make(c, ps);
    for (int t = 0; t < steps; ++t) {
      set_golden_grads(ps, t);
      opt->step();
      for (size_t k = 0; k < ps.size(); ++k) {
        const std::vector<float> got = ps[k].contiguous().tolist<float>();
        const auto& want = c["trajectory"][t][k];
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          const double w = want[i].get<double>();
          // F32 arithmetic in a possibly different association order than torch's: a few ulps.
          EXPECT_NEAR(got[i], w, 2e-6 + 2e-6 * std::abs(w)) << "step " << t << " param " << k << " element " << i;
        }
      }
    }
  }
}

TEST(Optimizer, ParametersAndGradientsViewFlatBuffers) {
  std::vector<Tensor> ps = golden_params(nlohmann::json::parse("[[3,4],[5]]"));
  optim::AdamW opt(ps);
  const auto& g = opt.param_groups()[0];
  EXPECT_GE(g.flat_params.numel(), 17);
  // Writing through the flat buffer is visible in the module's parameter handles.
  ops::copy_(g.flat_params, ops::zeros({g.flat_params.numel()}));
  for (const Tensor& p : ps)
    for (float v : p.contiguous().tolist<float>()) EXPECT_EQ(v, 0.0f);
  // zero_grad zeroes the one flat gradient buffer that every .grad views: each .grad reads as zeros, and the buffer
  // holds them once written (the zeros are written lazily: Tensor::mark_grad_zero).
  set_golden_grads(ps, 0);
  opt.zero_grad();
  opt.write_zero_grads();
  for (float v : g.flat_grads.tolist<float>()) EXPECT_EQ(v, 0.0f);
  set_golden_grads(ps, 1);
  opt.zero_grad();
  for (const Tensor& p : ps)
    for (float v : p.grad().contiguous().tolist<float>()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(ps[0].grad().storage(), g.flat_grads.storage());
}

// zero_grad only marks the gradients; backward copies over the mark and the first reader writes the zeros of the
// rest. A stale gradient must never come back: a parameter that backward does not reach in a step is stepped with
// a zero gradient (SGD without momentum leaves it unchanged), and its .grad reads zero.
TEST(Optimizer, LazilyZeroedGradientsNeverLeakAStaleValue) {
  std::vector<Tensor> ps = golden_params(nlohmann::json::parse("[[4],[3]]"));
  optim::SGDOptions o;
  o.lr = 0.5;
  optim::SGD opt(ps, o);
  // Step 1: both parameters get gradients.
  opt.zero_grad();
  ampforge::sum(ampforge::add(ampforge::mul(ps[0], 2.0), ampforge::sum(ps[1]))).backward();
  for (float v : ps[0].grad().tolist<float>()) EXPECT_EQ(v, 2.0f);
  for (float v : ps[1].grad().tolist<float>()) EXPECT_EQ(v, 4.0f);
  opt.step();
  // Step 2: only ps[0] (twice: the second backward adds to the first's copy).
  opt.zero_grad();
  const std::vector<float> p1 = ps[1].tolist<float>();
  ampforge::sum(ampforge::mul(ps[0], 3.0)).backward();
  ampforge::sum(ps[0]).backward();
  opt.step();
  EXPECT_EQ(ps[1].tolist<float>(), p1) << "stepped with the previous step's gradient";
  for (float v : ps[0].grad().tolist<float>()) EXPECT_EQ(v, 4.0f);
  for (float v : ps[1].grad().tolist<float>()) EXPECT_EQ(v, 0.0f);
  // The flat buffer holds the zeros as well once the optimizer read it.
  const Tensor& flat = opt.param_groups()[0].flat_grads;
  const std::vector<float> f = flat.tolist<float>();
  const int64_t off1 = ps[1].grad().offset() - flat.offset();
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(f[static_cast<size_t>(off1 + i)], 0.0f);
}

// shard() moves the gradients into new buffers: a gradient zero_grad marked must arrive there as zeros, not as the
// values the old buffer still held.
TEST(Optimizer, ShardingAfterZeroGradKeepsTheGradientsZero) {
  std::vector<Tensor> ps = golden_params(nlohmann::json::parse("[[5]]"));
  optim::SGD opt(ps, optim::SGDOptions{});
  opt.zero_grad();
  ampforge::sum(ampforge::mul(ps[0], 2.0)).backward();
  opt.zero_grad();
  opt.shard(0, 1);
  for (float v : ps[0].grad().tolist<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : opt.param_groups()[0].flat_grads.tolist<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(Optimizer, FoundInfSkipsTheStepAndKeepsTheStepCount) {
  std::vector<Tensor> ps = golden_params(nlohmann::json::parse("[[7]]"));
  optim::AdamW opt(ps);
  set_golden_grads(ps, 0);
  const std::vector<float> before = ps[0].tolist<float>();
  opt.step(ops::full({1}, 1.0));
  EXPECT_EQ(ps[0].tolist<float>(), before);
  EXPECT_EQ(opt.steps(), 0);
  opt.step(ops::full({1}, 0.0));
  EXPECT_NE(ps[0].tolist<float>(), before);
  EXPECT_EQ(opt.steps(), 1);
}

// ---- master weights and stochastic rounding -------------------------------------------------------

namespace {
// BF16 parameters (n elements) whose F32 masters are set to `value` exactly, with zero gradients.
struct Bf16Setup {
  std::vector<Tensor> params;
  std::unique_ptr<optim::SGD> opt;
};
Bf16Setup bf16_sgd(int64_t n, float value, bool stochastic, uint64_t seed, double lr = 0.0) {
  Bf16Setup s;
  Tensor p = ops::zeros({n}, DType::BF16);
  p.requires_grad_(true);
  s.params = {p};
  optim::SGDOptions o;
  o.lr = lr;
  o.rounding = {stochastic, seed};
  s.opt = std::make_unique<optim::SGD>(s.params, o);
  ops::copy_(s.opt->param_groups()[0].master, ops::full({s.opt->param_groups()[0].master.numel()}, value));
  return s;
}
}  // namespace

TEST(StochasticRounding, ScalarRuleIsExactAtTheExtremes) {
  const float x = 1.0f + 0x1p-10f;  // between BF16 1.0 and 1.0078125: an eighth of an ulp above 1.0
  const uint16_t lo = float_to_bf16_bits(1.0f), hi = static_cast<uint16_t>(lo + 1);
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0u), lo);
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0xffffu), hi);
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0xdfffu), lo);  // dropped bits 0x2000: carries at noise >= 0xe000
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0xe000u), hi);
  EXPECT_EQ(float_to_bf16_bits_stochastic(x, 0xffff0000u), lo);  // only the low 16 bits of the noise count
  // Representable values never move; negative values round in magnitude, symmetric with positive ones.
  EXPECT_EQ(float_to_bf16_bits_stochastic(1.5f, 0xffffu), float_to_bf16_bits(1.5f));
  EXPECT_EQ(float_to_bf16_bits_stochastic(-x, 0xffffu), static_cast<uint16_t>(hi | 0x8000u));
  // Inf stays Inf, NaN stays a (quiet) NaN.
  EXPECT_EQ(float_to_bf16_bits_stochastic(INFINITY, 0xffffu), 0x7f80u);
  EXPECT_EQ(float_to_bf16_bits_stochastic(-INFINITY, 0xffffu), 0xff80u);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits_stochastic(NAN, 0x1234u))));
}

TEST(StochasticRounding, ModelCopyIsUnbiasedAndOnlyTakesTheTwoNeighbours) {
  // 0.3 of an ulp above 1.0: round-to-nearest always gives 1.0 (bias -0.3 ulp); stochastic rounding gives
  // the upper neighbour for ~30% of the elements.
  const float ulp = 0x1p-7f;
  const float x = 1.0f + 0.3f * ulp;
  const int64_t n = 1 << 16;
  for (bool stochastic : {false, true}) {
    Bf16Setup s = bf16_sgd(n, x, stochastic, 42);
    for (Tensor& p : s.params) ops::copy_(p.grad(), ops::zeros({n}));
    s.opt->step();
    const std::vector<float> w = s.params[0].to(DType::F32).tolist<float>();
    double mean = 0;
    for (float v : w) {
      ASSERT_TRUE(v == 1.0f || v == 1.0f + ulp) << v;
      mean += v;
    }
    mean /= n;
    if (stochastic) {
      // Binomial(n, 0.3): standard error of the mean 0.0018 ulp; 5 sigma = 0.01 ulp.
      EXPECT_NEAR((mean - 1.0) / ulp, 0.3, 0.01);
    } else {
      EXPECT_EQ(mean, 1.0);
    }
  }
}

TEST(StochasticRounding, DeterministicPerSeedAndStepAndIndependentOfThreads) {
  const float x = 0.1f;  // not representable in BF16
  auto run = [&](uint64_t seed, int steps, int threads) {
    set_num_threads(threads);
    Bf16Setup s = bf16_sgd(100003, x, true, seed);
    ops::copy_(s.params[0].grad(), ops::zeros({100003}));
    std::vector<std::vector<uint16_t>> out;
    for (int t = 0; t < steps; ++t) {
      s.opt->step();
      out.push_back(bits_of(s.params[0]));
    }
    return out;
  };
  const int saved = get_num_threads();
  const auto a = run(7, 2, 1), b = run(7, 2, 2), c = run(8, 2, 2);
  set_num_threads(saved);
  EXPECT_EQ(a, b);          // thread count does not matter
  EXPECT_NE(a[0], a[1]);    // each step draws fresh noise
  EXPECT_NE(a[0], c[0]);    // the seed matters
}

TEST(StochasticRounding, TracksSmallUpdatesThatRoundToNearestHides) {
  // SGD moves the F32 master by 1/8 ulp per step. Round-to-nearest keeps the BF16 weight at its start for
  // the first few steps; with stochastic rounding the average weight follows the master.
  const float ulp = 0x1p-7f;
  const int64_t n = 1 << 14;
  const double lr = 1.0;
  const float grad = -ulp / 8;  // p -= lr * grad: +1/8 ulp per step
  for (bool stochastic : {false, true}) {
    Bf16Setup s = bf16_sgd(n, 1.0f, stochastic, 3, lr);
    for (int t = 0; t < 3; ++t) {
      ops::copy_(s.params[0].grad(), ops::full({n}, grad, DType::BF16));
      s.opt->step();
    }
    // Master: 1 + 3/8 ulp. Nearest: 1.0 exactly. Stochastic: mean 1 + 3/8 ulp.
    double mean = 0;
    for (float v : s.params[0].to(DType::F32).tolist<float>()) mean += v;
    mean /= n;
    if (stochastic)
      EXPECT_NEAR((mean - 1.0) / ulp, 0.375, 0.03);
    else
      EXPECT_EQ(mean, 1.0);
  }
}

TEST(StochasticRounding, NeedsBf16MasterWeights) {
  Tensor p = ops::zeros({4});
  p.requires_grad_(true);
  optim::AdamWOptions o;
  o.rounding.stochastic = true;
  EXPECT_THROW(optim::AdamW({p}, o), Error);
  Tensor h = ops::zeros({4}, DType::F16);
  h.requires_grad_(true);
  EXPECT_THROW(optim::AdamW({h}, o), Error);
  Tensor b = ops::zeros({4}, DType::BF16);
  b.requires_grad_(true);
  EXPECT_NO_THROW(optim::AdamW({b}, o));
}

// ---- device hyperparameters ---------------------------------------------------------------------------
// The mode the CUDA backend uses by default (step count and lr in a tensor the kernel reads and advances),
// run on the CPU: it must give exactly the host mode's trajectory, including skipped steps, lr changes,
// SGD's first-step momentum and the stochastic-rounding offsets.

namespace {
struct HyperRun {
  std::vector<std::vector<float>> params;  // after every step
  int64_t steps = 0;
};

HyperRun run_optimizer(const std::string& kind, bool device_hyper, bool bf16_master) {
  Tensor p = ops::to_dtype(ops::arange(0, 37, 1, DType::F32), bf16_master ? DType::BF16 : DType::F32);
  p = ops::mul_scalar(p, 0.01);
  p.requires_grad_(true);
  std::vector<Tensor> ps{p};
  std::unique_ptr<optim::Optimizer> opt;
  if (kind == "adamw") {
    optim::AdamWOptions o;
    o.lr = 0.05;
    o.rounding = {bf16_master, 11};
    opt = std::make_unique<optim::AdamW>(ps, o);
  } else {
    optim::SGDOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.nesterov = true;
    o.weight_decay = 0.01;
    o.rounding = {bf16_master, 11};
    opt = std::make_unique<optim::SGD>(ps, o);
  }
  opt->set_device_hyperparams(device_hyper);
  EXPECT_EQ(opt->device_hyperparams(), device_hyper);
  HyperRun r;
  // Skips at steps 0 (the very first: SGD's momentum initialisation must wait) and 3; an lr change at 4.
  for (int t = 0; t < 7; ++t) {
    Tensor g = ops::mul_scalar(ops::add_scalar(ops::arange(0, 37, 1, DType::F32), -18.0 + t), 0.1);
    ops::copy_(opt->param_groups()[0].flat_grads.narrow(0, 0, 37), ops::to_dtype(g, p.dtype()));
    if (t == 4) opt->param_groups()[0].lr *= 0.5;
    opt->step(ops::full({1}, (t == 0 || t == 3) ? 1.0 : 0.0));
    r.params.push_back(ops::to_dtype(ps[0].detach(), DType::F32).tolist<float>());
  }
  r.steps = opt->steps();
  return r;
}
}  // namespace

TEST(DeviceHyperparams, SameTrajectoryAsHostModeWithSkipsAndLrChanges) {
  for (const std::string kind : {"adamw", "sgd"}) {
    for (bool bf16 : {false, true}) {
      const HyperRun host = run_optimizer(kind, false, bf16), dev = run_optimizer(kind, true, bf16);
      EXPECT_EQ(host.steps, 5) << kind;
      EXPECT_EQ(dev.steps, host.steps) << kind;
      for (size_t t = 0; t < host.params.size(); ++t)
        EXPECT_EQ(dev.params[t], host.params[t]) << kind << (bf16 ? " bf16 master" : " f32") << " step " << t;
    }
  }
}

TEST(DeviceHyperparams, StateDictRoundTripsTheDeviceCount) {
  Tensor p = ops::ones({5});
  p.requires_grad_(true);
  optim::AdamW opt({p});
  opt.set_device_hyperparams(true);
  for (int t = 0; t < 3; ++t) opt.step(ops::full({1}, t == 1 ? 1.0 : 0.0));
  EXPECT_EQ(opt.steps(), 2);
  const auto state = opt.state_dict();
  Tensor q = ops::ones({5});
  q.requires_grad_(true);
  optim::AdamW other({q});
  other.set_device_hyperparams(true);
  other.load_state_dict(state);
  EXPECT_EQ(other.steps(), 2);
  other.set_device_hyperparams(false);  // back to host mode: the count comes along
  EXPECT_EQ(other.steps(), 2);
  EXPECT_EQ(other.param_groups()[0].step, 2);
}

TEST(DeviceHyperparams, BadHyperTensorIsAClearError) {
  Tensor p = ops::ones({4}), g = ops::ones({4}), m = ops::zeros({4}), v = ops::zeros({4});
  AdamWAttrs at;
  try {
    ops::adamw_step_(p, g, m, v, at, Tensor(), Tensor(), ops::zeros({2}, DType::F32));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device hyperparameters"), std::string::npos) << e.what();
  }
}

// ---- parameters that move or change after the optimizer was built ----------------------------------

namespace {
// Two Linear(3, 2) with the same weights; one step of SGD on sum(lin(x)).
std::vector<float> weights_of(const nn::Linear& l) {
  std::vector<float> v = ops::to_dtype(l.weight.detach(), DType::F32).contiguous().tolist<float>();
  for (float b : ops::to_dtype(l.bias.detach(), DType::F32).tolist<float>()) v.push_back(b);
  return v;
}
void sgd_iteration(nn::Linear& lin, optim::Optimizer& opt, DType dtype) {
  opt.zero_grad();
  sum(lin.forward(ops::to_dtype(Tensor::from_vector<float>({1, -2, 3, 0.5f, 4, -1}, Shape{2, 3}), dtype))).backward();
  opt.step();
}
}  // namespace

TEST(OptimizerBinding, ModuleToDtypeBeforeOrAfterBuildingTrainsIdentically) {
  for (DType dt : {DType::BF16, DType::F16}) {
    auto before = std::make_shared<nn::Linear>(3, 2);
    auto after = std::make_shared<nn::Linear>(3, 2);
    after->load_state_dict(before->state_dict());
    optim::SGDOptions o;
    o.lr = 0.25;
    o.momentum = 0.9;
    before->to(dt);
    optim::SGD opt_before(before->parameters(), o);
    optim::SGD opt_after(after->parameters(), o);
    after->to(dt);  // rebinds the parameters' storage away from the optimizer's flat buffer
    const std::vector<float> w0 = weights_of(*after);
    for (int it = 0; it < 3; ++it) {
      sgd_iteration(*before, opt_before, dt);
      sgd_iteration(*after, opt_after, dt);
    }
    EXPECT_NE(weights_of(*after), w0) << "the optimizer stepped a buffer the model no longer uses";
    EXPECT_EQ(weights_of(*after), weights_of(*before)) << dtype_name(dt);
    EXPECT_EQ(after->weight.grad().dtype(), dt);
    EXPECT_EQ(opt_after.param_groups()[0].flat_params.dtype(), dt);
  }
}

TEST(OptimizerBinding, LoadStateDictAfterBuildingReachesTheMasterWeights) {
  auto lin = std::make_shared<nn::Linear>(3, 2);
  lin->to(DType::F16);
  optim::SGDOptions o;
  o.lr = 0.1;
  optim::SGD opt(lin->parameters(), o);  // F32 master copies of the random initial weights
  lin->load_state_dict({{"weight", ops::full({2, 3}, 0.25)}, {"bias", ops::full({2}, -0.5)}});
  opt.zero_grad();
  opt.step();  // zero gradients: SGD without momentum or decay leaves the weights as loaded
  EXPECT_EQ(weights_of(*lin), (std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, -0.5f, -0.5f}));
}

TEST(OptimizerBinding, ParametersSplitAcrossDtypesAreAnError) {
  auto lin = std::make_shared<nn::Linear>(3, 2);
  optim::AdamW opt(lin->parameters());
  lin->weight.set_data(ops::to_dtype(lin->weight.detach(), DType::BF16));
  try {
    opt.zero_grad();
    FAIL() << "a group with F32 and BF16 parameters was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moved after the optimizer was built"), std::string::npos) << e.what();
  }
}
