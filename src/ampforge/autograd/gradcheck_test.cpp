// Tests of the finite-difference gradient checker itself: it must pass correct backward formulas and
// catch wrong ones (wrong scale, permuted gradient), naming the input and the element.
#include "ampforge/autograd/gradcheck.h"

#include <gtest/gtest.h>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
using autograd::gradcheck;

namespace {

// y = 2x with a backward that returns `factor` * g, optionally transposed (2-D inputs).
Tensor scaled_with_backward(const Tensor& x, double factor, bool transpose_grad) {
  Tensor out = ops::mul_scalar(x, 2.0);
  autograd::record("TestBackward", {x}, {out}, [factor, transpose_grad](const autograd::Grads& g) -> autograd::Grads {
    Tensor gi = ops::mul_scalar(g[0], factor);
    if (transpose_grad) gi = ops::contiguous(ops::permute(gi, {1, 0}));
    return {gi};
  });
  return out;
}

}  // namespace

TEST(Gradcheck, PassesCorrectFormulas) {
  Tensor a = randn({3, 4}).requires_grad_();
  Tensor b = ops::rand({4}, DType::F32, kCPU, nullptr, 0.5, 2.0).requires_grad_();
  auto r = gradcheck([](const std::vector<Tensor>& x) { return div(exp(x[0]), x[1]) * sum(x[1]); }, {a, b});
  EXPECT_TRUE(r.ok) << r.message;
  ASSERT_EQ(r.inputs.size(), 2u);
  for (const auto& i : r.inputs) EXPECT_LT(i.max_rel_err, gradcheck_tolerance().rtol);
  EXPECT_EQ(a.dtype(), DType::F32) << "the caller's inputs are not changed";
}

TEST(Gradcheck, CatchesAWrongScaleAndNamesTheElement) {
  Tensor x = randn({2, 3}).requires_grad_();
  auto r = gradcheck([](const std::vector<Tensor>& in) { return scaled_with_backward(in[0], 2.001, false); }, {x});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("input 0"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("element"), std::string::npos) << r.message;
  EXPECT_NEAR(r.inputs[0].analytic_at_worst / r.inputs[0].numerical_at_worst, 2.001 / 2.0, 1e-9);
}

TEST(Gradcheck, CatchesAPermutedGradient) {
  // A square input whose gradient is transposed: every element has the right magnitude distribution but
  // the wrong position. The random weights W make the check see it.
  Tensor x = randn({3, 3}).requires_grad_();
  auto r = gradcheck([](const std::vector<Tensor>& in) { return scaled_with_backward(in[0], 2.0, true); }, {x});
  EXPECT_FALSE(r.ok) << "a transposed gradient must not pass";
  auto ok = gradcheck([](const std::vector<Tensor>& in) { return scaled_with_backward(in[0], 2.0, false); }, {x});
  EXPECT_TRUE(ok.ok) << ok.message;
}

TEST(Gradcheck, OnlyInputsThatRequireGradAreChecked) {
  Tensor x = randn({4}).requires_grad_();
  Tensor y = randn({4});  // not checked
  Tensor idx = Tensor::from_vector<int64_t>({1, 0, 3});
  auto r = gradcheck(
      [](const std::vector<Tensor>& in) {
        EXPECT_EQ(in[2].dtype(), DType::I64);  // integer inputs pass through
        return mul(in[0], in[1]) + tanh(in[0]);
      },
      {x, y, idx});
  EXPECT_TRUE(r.ok) << r.message;
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0].index, 0);
}

TEST(Gradcheck, KeepsDenseLayouts) {
  // A channels-last input stays channels-last in F64, so the kernels' strided paths are the ones checked.
  Tensor x = ops::contiguous(randn({2, 3, 2, 2}), MemoryFormat::ChannelsLast).requires_grad_();
  bool saw_channels_last = false;
  auto r = gradcheck(
      [&](const std::vector<Tensor>& in) {
        saw_channels_last = saw_channels_last || in[0].suggest_memory_format() == MemoryFormat::ChannelsLast;
        return sigmoid(in[0]);
      },
      {x});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_TRUE(saw_channels_last);
}

// split/chunk have one backward for all pieces: pieces without a gradient count as zeros, and a channels-last
// input gets a channels-last gradient.
TEST(ShapeGradients, SplitAndChunkWithAnUnusedPiece) {
  Tensor x = ops::contiguous(randn({2, 7, 3, 2}), MemoryFormat::ChannelsLast).requires_grad_();
  auto r = gradcheck(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> c = chunk(in[0], 3, 1);  // 3 + 3 + 1 channels; the middle one unused
        std::vector<Tensor> s = split(in[0], 4, 1);  // 4 + 3
        return add(mul(sigmoid(c[0]), c[0]), add(mul(sum(c[2]), sum(c[2])), sum(mul(s[1], s[1]))));
      },
      {x});
  EXPECT_TRUE(r.ok) << r.message;
  std::vector<Tensor> c = chunk(x, 2, 1);
  sum(mul(c[1], c[1])).backward();
  EXPECT_TRUE(x.grad().is_contiguous(MemoryFormat::ChannelsLast));
  const std::vector<float> g = ops::contiguous(x.grad()).tolist<float>(), v = ops::contiguous(x).tolist<float>();
  for (size_t i = 0; i < g.size(); ++i) {
    const int64_t ch = static_cast<int64_t>(i / 6) % 7;  // NCHW order: 3 x 2 elements per channel
    EXPECT_EQ(g[i], ch < 4 ? 0.0f : 2 * v[i]) << i;
  }
}

TEST(ToleranceTable, MatchesTheDocumentedNumbers) {
  // DESIGN.md: F32 eps 2^-23, BF16 2^-8 unit roundoff, F16 2^-11 (unit roundoff).
  static_assert(tolerance(DType::F32).eps == 1.0 / (1 << 23));
  static_assert(tolerance(DType::BF16).unit_roundoff == 1.0 / (1 << 8));
  static_assert(tolerance(DType::F16).unit_roundoff == 1.0 / (1 << 11));
  static_assert(tolerance(DType::F32).rtol == tolerance(DType::F32).factor * tolerance(DType::F32).eps);
  static_assert(tolerance(DType::I64).rtol == 0);
  // eps is the real gap above 1 in each format.
  EXPECT_EQ(static_cast<float>(1.0f + static_cast<float>(tolerance(DType::F32).eps)) - 1.0f, tolerance(DType::F32).eps);
  EXPECT_EQ(static_cast<float>(Half(1.0f + static_cast<float>(tolerance(DType::F16).eps))) - 1.0f, tolerance(DType::F16).eps);
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + static_cast<float>(tolerance(DType::BF16).eps))) - 1.0f,
            tolerance(DType::BF16).eps);
  EXPECT_EQ(static_cast<float>(Half(1.0f + static_cast<float>(tolerance(DType::F16).unit_roundoff))), 1.0f)
      << "a tie rounds to even: 1 + u rounds back to 1";
}

TEST(ToleranceTable, CloseRule) {
  std::vector<double> e = {1.0, -2.0, 0.0, 4.0};
  std::vector<double> a = {1.0 + 1e-7, -2.0, 1e-6, 4.0};
  auto r = tolerance_close(4, [&](int64_t i) { return a[i]; }, [&](int64_t i) { return e[i]; }, 1e-6, 1e-6);
  EXPECT_TRUE(r.ok);  // 1e-6 at a zero element is within atol * scale (scale 4)
  a[3] = 4.0 + 1e-4;
  r = tolerance_close(4, [&](int64_t i) { return a[i]; }, [&](int64_t i) { return e[i]; }, 1e-6, 1e-6);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.worst, 3);
  a[3] = NAN;
  r = tolerance_close(4, [&](int64_t i) { return a[i]; }, [&](int64_t i) { return e[i]; }, 1, 1);
  EXPECT_FALSE(r.ok) << "NaN never matches a number";
}
