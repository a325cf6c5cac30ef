// Autocast policy: for every op with an autocast category, the output dtype under Autocast(F16) and
// Autocast(BF16) is the category's (Lower: the autocast dtype; F32: F32; Promote: widest input), ops
// outside the table keep their input dtype, nothing changes outside autocast, gradients reach F32
// parameters in F32, and the weight-cast cache lives exactly as long as the outermost region.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "ampforge/amp/autocast.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/core/dispatch.h"

using namespace ampforge;

namespace {

struct Probe {
  // Runs the op on F32 inputs (and for Promote ops, one 16-bit and one F32 input) and returns the output.
  std::function<Tensor(DType lowp)> run;
};

std::map<std::string, Probe> probes() {
  auto f32 = [](Shape s) { return randn(s); };
  std::map<std::string, Probe> p;
  p["matmul"] = {[=](DType) { return matmul(f32({4, 5}), f32({5, 3})); }};
  p["linear"] = {[=](DType) { return linear(f32({4, 5}), f32({3, 5}), f32({3})); }};
  p["conv2d"] = {[=](DType) { return conv2d(f32({1, 2, 5, 5}), f32({3, 2, 3, 3})); }};
  p["exp"] = {[=](DType d) { return exp(f32({4}).to(d)); }};
  p["log"] = {[=](DType d) { return log(add(abs(f32({4})), 1.0).to(d)); }};
  p["rsqrt"] = {[=](DType d) { return rsqrt(add(abs(f32({4})), 1.0).to(d)); }};
  p["pow_scalar"] = {[=](DType d) { return pow(f32({4}).to(d), 2.0); }};
  p["pow"] = {[=](DType d) { return pow(add(abs(f32({4})), 1.0).to(d), f32({4}).to(d)); }};
  p["sum"] = {[=](DType d) { return sum(f32({4, 3}).to(d)); }};
  p["softmax"] = {[=](DType d) { return softmax(f32({4, 3}).to(d), 1); }};
  p["log_softmax"] = {[=](DType d) { return log_softmax(f32({4, 3}).to(d), 1); }};
  p["cross_entropy"] = {[=](DType d) {
    return cross_entropy(f32({4, 3}).to(d), Tensor::from_vector<int64_t>({0, 1, 2, 1}));
  }};
  p["bce_with_logits"] = {[=](DType d) { return binary_cross_entropy_with_logits(f32({4}).to(d), rand({4}).to(d)); }};
  p["attention"] = {[=](DType) {
    return scaled_dot_product_attention(f32({1, 2, 3, 4}), f32({1, 2, 5, 4}), f32({1, 2, 5, 3}));
  }};
  p["layer_norm"] = {[=](DType d) { return layer_norm(f32({4, 3}).to(d), Shape{3}); }};
  // Promote: one 16-bit and one F32 operand give F32; two 16-bit operands stay 16-bit.
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

DType expected(AmpCategory c, DType lowp) {
  switch (c) {
    case AmpCategory::Lower: return lowp;
    case AmpCategory::F32: return DType::F32;
    case AmpCategory::Promote: return DType::F32;  // probes mix a 16-bit and an F32 operand
    case AmpCategory::None: break;
  }
  return DType::F32;
}

}  // namespace

TEST(Autocast, EveryCategorisedOpHasAProbe) {
  auto p = probes();
  for (int i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    const AmpCategory c = op_amp_category(op);
    if (c == AmpCategory::None) continue;
    // comparisons promote too, but return Bool: covered by ComparisonsReturnBool.
    const std::string n = op_name(op);
    if (n == "eq" || n == "ne" || n == "lt" || n == "le" || n == "gt" || n == "ge") continue;
    EXPECT_TRUE(p.count(n)) << "op '" << n << "' has an autocast category but no probe in this test";
  }
}

TEST(Autocast, OutputDtypesFollowTheTable) {
  for (DType lowp : {DType::F16, DType::BF16}) {
    for (auto& [name, probe] : probes()) {
      OpId op = OpId::fill;
      for (int i = 0; i < kNumOps; ++i)
        if (name == op_name(static_cast<OpId>(i))) op = static_cast<OpId>(i);
      Tensor out;
      {
        amp::Autocast ac(kCPU, lowp);
        out = probe.run(lowp);
      }
      EXPECT_EQ(out.dtype(), expected(op_amp_category(op), lowp))
          << name << " under autocast " << dtype_name(lowp);
    }
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

TEST(Autocast, ComparisonsReturnBool) {
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
