// Autocast policy: the policy of every op, for CUDA and for the CPU, against a fixture of PyTorch's
// documented lists (tests/data/amp/pytorch_autocast_lists.json, written from the docs, not from our
// table); for every op with an autocast category on the CPU, the output dtype under Autocast(F16) and
// Autocast(BF16) is the category's (Lower: the autocast dtype; F32: F32; None: type promotion of the
// inputs), nothing changes outside autocast, autocast state is per device type, gradients reach F32
// parameters in F32, and the weight-cast cache lives exactly as long as the outermost region.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ampforge/amp/autocast.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/core/dispatch.h"

using namespace ampforge;

namespace {

struct Probe {
  // Runs the op on F32 inputs, or 16-bit ones, or (binary ops) one 16-bit and one F32 input.
  std::function<Tensor(DType lowp)> run;
  // The output dtype when autocast leaves the op alone (category None): type promotion of the inputs.
  // true: the 16-bit dtype; false: F32.
  bool none_gives_lowp = false;
};

std::map<std::string, Probe> probes() {
  auto f32 = [](Shape s) { return randn(s); };
  std::map<std::string, Probe> p;
  p["matmul"] = {[=](DType) { return matmul(f32({4, 5}), f32({5, 3})); }};
  p["linear"] = {[=](DType) { return linear(f32({4, 5}), f32({3, 5}), f32({3})); }};
  p["conv2d"] = {[=](DType) { return conv2d(f32({1, 2, 5, 5}), f32({3, 2, 3, 3})); }};
  p["exp"] = {[=](DType d) { return exp(f32({4}).to(d)); }, true};
  p["log"] = {[=](DType d) { return log(add(abs(f32({4})), 1.0).to(d)); }, true};
  p["rsqrt"] = {[=](DType d) { return rsqrt(add(abs(f32({4})), 1.0).to(d)); }, true};
  p["pow_scalar"] = {[=](DType d) { return pow(f32({4}).to(d), 2.0); }, true};
  p["pow"] = {[=](DType d) { return pow(add(abs(f32({4})), 1.0).to(d), f32({4}).to(d)); }, true};
  p["sum"] = {[=](DType d) { return sum(f32({4, 3}).to(d)); }, true};
  p["softmax"] = {[=](DType d) { return softmax(f32({4, 3}).to(d), 1); }, true};
  p["log_softmax"] = {[=](DType d) { return log_softmax(f32({4, 3}).to(d), 1); }, true};
  p["cross_entropy"] = {[=](DType d) {
    return cross_entropy(f32({4, 3}).to(d), Tensor::from_vector<int64_t>({0, 1, 2, 1}));
  }, true};
  p["bce_with_logits"] = {[=](DType d) { return binary_cross_entropy_with_logits(f32({4}).to(d), rand({4}).to(d)); },
                          true};
  p["attention"] = {[=](DType) {
    return scaled_dot_product_attention(f32({1, 2, 3, 4}), f32({1, 2, 5, 4}), f32({1, 2, 5, 3}));
  }};
  p["layer_norm"] = {[=](DType d) { return layer_norm(f32({4, 3}).to(d), Shape{3}); }, true};
  // Binary ops are in no list: one 16-bit and one F32 operand of the same rank give F32 by promotion.
  for (const char* name : {"add", "sub", "mul", "div", "maximum", "minimum"}) {
    std::string n = name;
    p[n] = {[=](DType d) {
      Tensor a = f32({4}).to(d), b = f32({4});
      if (n == "add") return add(a, b);
      if (n == "sub") return sub(a, b);
      if (n == "mul") return mul(a, b);
      if (n == "div") return div(a, add(abs(b), 1.0));
      if (n == "maximum") return maximum(a, b);
      return minimum(a, b);
    }};
  }
  p["where"] = {[=](DType d) { return where(gt(f32({4}), f32({4})), f32({4}).to(d), f32({4})); }};
  return p;
}

DType expected(AmpCategory c, DType lowp, const Probe& probe) {
  switch (c) {
    case AmpCategory::Lower: return lowp;
    case AmpCategory::F32: return DType::F32;
    case AmpCategory::None: break;
  }
  return probe.none_gives_lowp ? lowp : DType::F32;
}

OpId op_by_name(const std::string& name) {
  for (int i = 0; i < kNumOps; ++i)
    if (name == op_name(static_cast<OpId>(i))) return static_cast<OpId>(i);
  ADD_FAILURE() << "no op named " << name;
  return OpId::fill;
}

nlohmann::json load_fixture() {
  std::ifstream f(std::string(AMPFORGE_TEST_DATA_DIR) + "/amp/pytorch_autocast_lists.json");
  EXPECT_TRUE(f.good()) << "tests/data/amp/pytorch_autocast_lists.json is missing";
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(Autocast, PolicyMatchesPyTorchsListsPerDeviceType) {
  const nlohmann::json fx = load_fixture();
  const nlohmann::json& map = fx.at("ampforge_ops");
  for (const auto& [device, key] : {std::pair{DeviceType::CUDA, "cuda"}, std::pair{DeviceType::CPU, "cpu"}}) {
    std::map<std::string, std::string> listed;  // PyTorch op -> list name
    for (const char* list : {"lower_precision_fp", "fp32", "promote"})
      for (const auto& name : fx.at(key).at(list)) listed[name.get<std::string>()] = list;
    for (int i = 0; i < kNumOps; ++i) {
      const OpId op = static_cast<OpId>(i);
      const std::string n = op_name(op);
      ASSERT_TRUE(map.contains(n)) << "op '" << n << "' is not classified in the fixture's ampforge_ops: say which "
                                   << "PyTorch op it is (or null for an internal kernel)";
      const nlohmann::json& m = map.at(n);
      std::string want = "none";
      if (!m.is_null()) {
        const std::string torch_name = m.is_object() ? m.at(key).get<std::string>() : m.get<std::string>();
        if (listed.count(torch_name)) want = listed.at(torch_name);
      }
      const AmpCategory got = op_amp_category(op, device);
      const std::string got_s = got == AmpCategory::Lower ? "lower_precision_fp" : got == AmpCategory::F32 ? "fp32" : "none";
      EXPECT_EQ(got_s, want) << "op '" << n << "' on " << key;
    }
  }
}

TEST(Autocast, EveryCategorisedOpHasAProbe) {
  auto p = probes();
  for (int i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    if (op_amp_category(op, DeviceType::CUDA) == AmpCategory::None) continue;
    const std::string n = op_name(op);
    EXPECT_TRUE(p.count(n)) << "op '" << n << "' has an autocast category but no probe in this test";
  }
}

TEST(Autocast, OutputDtypesFollowTheTable) {
  for (DType lowp : {DType::F16, DType::BF16}) {
    for (auto& [name, probe] : probes()) {
      const OpId op = op_by_name(name);
      Tensor out;
      {
        amp::Autocast ac(kCPU, lowp);
        out = probe.run(lowp);
      }
      EXPECT_EQ(out.dtype(), expected(op_amp_category(op, DeviceType::CPU), lowp, probe))
          << name << " under autocast " << dtype_name(lowp);
    }
  }
}

TEST(Autocast, StateIsPerDeviceType) {
  // A CPU region, enabled or disabled, inside a CUDA one leaves CUDA autocast on (no GPU is needed: the
  // guard only sets this thread's state).
  amp::Autocast cuda(Device(DeviceType::CUDA, 0), DType::F16);
  EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CUDA));
  EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CPU));
  {
    amp::Autocast cpu(kCPU, DType::BF16);
    EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CPU));
    EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CUDA)) << "a CPU region turned CUDA autocast off";
    EXPECT_EQ(amp::autocast_dtype(DeviceType::CUDA), DType::F16);
    EXPECT_EQ(amp::autocast_dtype(DeviceType::CPU), DType::BF16);
  }
  {
    amp::Autocast off(kCPU, DType::BF16, false);
    EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CUDA));
  }
  EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CUDA));
  EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CPU));
  // CUDA autocast does not touch CPU tensors.
  EXPECT_EQ(matmul(randn({2, 3}), randn({3, 2})).dtype(), DType::F32);
}

TEST(Autocast, ZeroDimF32OperandsDoNotUpcastActivations) {
  // PyTorch: binary ops are in no autocast list, and type promotion lets a 0-dim tensor decide the result
  // only when no dimensioned operand is floating: f16 activations times an F32 0-dim tensor stay f16.
  for (DType lowp : {DType::F16, DType::BF16}) {
    amp::Autocast ac(kCPU, lowp);
    Tensor h = linear(randn({4, 5}), randn({3, 5}));  // lower precision
    ASSERT_EQ(h.dtype(), lowp);
    const Tensor s = full({}, 0.5);
    EXPECT_EQ(mul(h, s).dtype(), lowp);
    EXPECT_EQ(add(s, h).dtype(), lowp);
    EXPECT_EQ(div(h, s).dtype(), lowp);
    EXPECT_EQ(where(gt(h, s), h, s).dtype(), lowp);
    EXPECT_EQ(mul(h, randn({4, 3})).dtype(), DType::F32);  // a dimensioned F32 operand promotes
  }
}

TEST(Autocast, NothingChangesOutsideOrWhenDisabled) {
  Tensor a = randn({4, 5}), b = randn({5, 3});
  EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
  amp::Autocast on(kCPU, DType::F16);
  {
    amp::Autocast off(kCPU, DType::F16, false);
    EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
  }
  EXPECT_EQ(matmul(a, b).dtype(), DType::F16);
}

TEST(Autocast, UncategorisedOpsKeepTheirDtype) {
  amp::Autocast ac(kCPU, DType::BF16);
  Tensor h = randn({2, 3, 4, 4}).to(DType::BF16);
  EXPECT_EQ(relu(h).dtype(), DType::BF16);
  EXPECT_EQ(mean(h).dtype(), DType::BF16);
  EXPECT_EQ(relu(randn({3})).dtype(), DType::F32);
  Tensor w = ones({3}), bb = zeros({3}), rm = zeros({3}), rv = ones({3});
  EXPECT_EQ(batch_norm(h, w, bb, rm, rv, true).dtype(), DType::BF16);
}

TEST(Autocast, ComparisonsReturnBool) {  // (in no list: type promotion, Bool result)
  amp::Autocast ac(kCPU, DType::F16);
  EXPECT_EQ(lt(randn({3}).to(DType::F16), randn({3})).dtype(), DType::Bool);
}

TEST(Autocast, GradientsReachF32ParametersInF32AndCacheIsScoped) {
  Tensor w = randn({3, 5}).requires_grad_();
  Tensor x = randn({4, 5});
  {
    amp::Autocast ac(kCPU, DType::F16);
    Tensor y1 = linear(x, w);
    Tensor y2 = linear(x, w);  // second use: the cached F16 copy of w
    EXPECT_EQ(y1.dtype(), DType::F16);
    EXPECT_EQ(autograd::autocast_cache_size(), 1u);
    sum(add(y1, y2)).backward();
  }
  EXPECT_EQ(autograd::autocast_cache_size(), 0u);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::F32);
  // d/dw sum(2 * x @ w^T) = 2 * column sums of x, broadcast over rows (up to F16 rounding of x and w).
  auto g = w.grad().tolist<float>();
  auto xs = x.sum({0}).tolist<float>();
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 5; ++k) EXPECT_NEAR(g[r * 5 + k], 2 * xs[k], 2e-2 * (1 + std::abs(xs[k])));
}
