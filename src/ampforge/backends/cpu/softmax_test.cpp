// Unit tests of softmax, log_softmax, cross_entropy and binary_cross_entropy_with_logits on the CPU: naive
// F64 references, numerical stability, 16-bit inputs, finite-difference gradients, label smoothing with
// ignore_index, thread-count independence, bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ampforge/backends/cpu/gradcheck_testutil.h"
#include "ampforge/backends/cpu/vec_math.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

// Softmax of a (outer, D, inner) row space in logical order, in F64.
std::vector<double> softmax_reference(const std::vector<double>& x, const Shape& s, int dim, bool log) {
  int64_t outer = 1, inner = 1, D = s[dim];
  for (int d = 0; d < dim; ++d) outer *= s[d];
  for (int d = dim + 1; d < s.size(); ++d) inner *= s[d];
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return (o * D + j) * inner + i; };
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < D; ++j) m = std::max(m, x[at(j)]);
      for (int64_t j = 0; j < D; ++j) sum += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < D; ++j) y[at(j)] = log ? x[at(j)] - m - std::log(sum) : std::exp(x[at(j)] - m) / sum;
    }
  return y;
}

// Per-row cross entropy of logits (N, C) in F64 with PyTorch's label-smoothing formula; ignored rows give 0.
std::vector<double> ce_reference(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t C, double eps,
                                 int64_t ignore) {
  std::vector<double> out;
  for (size_t n = 0; n < t.size(); ++n) {
    if (t[n] == ignore) {
      out.push_back(0);
      continue;
    }
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[n * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[n * C + c] - m);
    const double lse = m + std::log(s);
    double smooth = 0;
    for (int64_t c = 0; c < C; ++c) smooth += lse - x[n * C + c];
    out.push_back((1 - eps) * (lse - x[n * C + t[n]]) + eps * smooth / C);
  }
  return out;
}

}  // namespace

TEST(Softmax, MatchesReferenceOnEveryDim) {
  Generator gen(11);
  const Shape s{3, 4, 5};
  Tensor x = ops::mul_scalar(ops::randn(s, DType::F64, kCPU, &gen), 3.0);
  for (int dim = 0; dim < 3; ++dim) {
    for (bool log : {false, true}) {
      Tensor y = log ? ops::log_softmax(x, dim) : ops::softmax(x, dim);
      expect_close(y, Tensor::from_vector(softmax_reference(x.tolist<double>(), s, dim, log), s), 1e-14, 1e-13,
                   (log ? "log_softmax dim " : "softmax dim ") + std::to_string(dim));
    }
  }
  // Negative dim and a non-contiguous input.
  Tensor xt = x.permute({2, 0, 1});
  expect_close(ops::softmax(xt, -1), ops::softmax(ops::contiguous(xt), 2), 0, 0, "permuted");
}

TEST(Softmax, StableForLargeInputs) {
  Tensor x = Tensor::from_vector<float>({1000, 1001, 1002, -1000}, {1, 4});
  const auto y = ops::softmax(x, 1).tolist<double>();
  const auto ly = ops::log_softmax(x, 1).tolist<double>();
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0), z = 1 + e1 + e2;
  EXPECT_NEAR(y[2], 1 / z, 1e-6);
  EXPECT_NEAR(y[0], e2 / z, 1e-6);
  EXPECT_EQ(y[3], 0.0);
  EXPECT_NEAR(ly[2], -std::log(z), 1e-5);
  EXPECT_TRUE(std::isfinite(ly[3]));
  EXPECT_NEAR(ly[3], -2002 - std::log(z), 1e-2);
}

TEST(Softmax, HalfInputs) {
  Generator gen(12);
  Tensor x = ops::randn({7, 33}, DType::F32, kCPU, &gen);
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor xh = ops::to_dtype(x, dt);
    Tensor ref = ops::softmax(ops::to_dtype(xh, DType::F64), 1);
    Tensor y = ops::softmax(xh, 1);
    EXPECT_EQ(y.dtype(), dt);
    const double u = dt == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    expect_close(y, ref, u, 2 * u, "16-bit softmax");
    expect_close(ops::log_softmax(xh, 0), ops::log_softmax(ops::to_dtype(xh, DType::F64), 0), 4 * u, 2 * u,
                 "16-bit log_softmax dim 0");
  }
}

TEST(Softmax, GradientsMatchFiniteDifferences) {
  Generator gen(13);
  for (int dim : {0, 1, 2}) {
    Tensor x = leaf({2, 3, 4}, gen);
    expect_gradients_match([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {x}, 1e-6,
                           "softmax dim " + std::to_string(dim));
    expect_gradients_match([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {x}, 1e-6,
                           "log_softmax dim " + std::to_string(dim));
  }
}

TEST(Softmax, BadDimIsAnError) {
  const std::string m = error_message([] { ops::softmax(ops::zeros({2, 3}), 2); });
  EXPECT_NE(m.find("softmax"), std::string::npos) << m;
  EXPECT_NE(error_message([] { ops::softmax(ops::zeros({2, 3}, DType::I64), 1); }).find("floating-point"),
            std::string::npos);
}

// ---- cross entropy -------------------------------------------------------------------------------------

TEST(CrossEntropy, MatchesReferenceWithSmoothingAndIgnoreIndex) {
  Generator gen(14);
  const int64_t N = 6, C = 5;
  Tensor x = ops::mul_scalar(ops::randn({N, C}, DType::F64, kCPU, &gen), 2.0);
  const std::vector<int64_t> tv = {0, 4, -100, 2, 3, -100};
  Tensor t = Tensor::from_vector<int64_t>(tv);
  for (double eps : {0.0, 0.1}) {
    const auto ref = ce_reference(x.tolist<double>(), tv, C, eps, -100);
    double sum = 0;
    for (double v : ref) sum += v;
    CrossEntropyAttrs at{-100, eps, Reduction::None};
    expect_close(ops::cross_entropy(x, t, at).loss, Tensor::from_vector(ref), 1e-13, 1e-13, "none");
    at.reduction = Reduction::Sum;
    EXPECT_NEAR(ops::cross_entropy(x, t, at).loss.item(), sum, 1e-12);
    at.reduction = Reduction::Mean;  // divides by the 4 non-ignored targets
    EXPECT_NEAR(ops::cross_entropy(x, t, at).loss.item(), sum / 4, 1e-12);
  }
  // A custom ignore_index that is a valid class.
  CrossEntropyAttrs at{2, 0.2, Reduction::Mean};
  const std::vector<int64_t> tv2 = {0, 4, 1, 2, 3, 2};
  const auto ref = ce_reference(x.tolist<double>(), tv2, C, 0.2, 2);
  double sum = 0;
  for (double v : ref) sum += v;
  EXPECT_NEAR(ops::cross_entropy(x, Tensor::from_vector<int64_t>(tv2), at).loss.item(), sum / 4, 1e-12);
}

TEST(CrossEntropy, SpatialTargetsMatchFlattenedRows) {
  Generator gen(15);
  const int64_t N = 2, C = 3, H = 2, W = 2;
  Tensor x = ops::randn({N, C, H, W}, DType::F64, kCPU, &gen);
  Tensor t = Tensor::from_vector<int64_t>({0, 1, 2, 1, 2, -100, 0, 0}, {N, H, W});
  // (N, C, H, W) -> (N*H*W, C) rows.
  Tensor rows = ops::reshape(ops::contiguous(ops::permute(x, {0, 2, 3, 1})), {N * H * W, C});
  CrossEntropyAttrs at{-100, 0.15, Reduction::None};
  Tensor a = ops::cross_entropy(x, t, at).loss;
  EXPECT_EQ(a.shape(), (Shape{N, H, W}));
  expect_close(ops::reshape(a, {N * H * W}), ops::cross_entropy(rows, ops::reshape(t, {N * H * W}), at).loss, 1e-14,
               1e-14, "spatial");
}

TEST(CrossEntropy, GradientsMatchFiniteDifferences) {
  Generator gen(16);
  Tensor t = Tensor::from_vector<int64_t>({1, 3, -100, 0});
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    for (double eps : {0.0, 0.25}) {
      Tensor x = leaf({4, 5}, gen);
      CrossEntropyAttrs at{-100, eps, red};
      expect_gradients_match([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, at); }, {x}, 1e-6,
                             "cross_entropy");
    }
  }
  Tensor x4 = leaf({2, 3, 2, 2}, gen);
  Tensor t4 = Tensor::from_vector<int64_t>({0, 1, 2, 1, 2, -100, 0, 0}, {2, 2, 2});
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t4, {-100, 0.1, Reduction::Mean}); }, {x4},
      1e-6, "cross_entropy spatial");
}

TEST(CrossEntropy, OutOfRangeTargetNamesValueAndClassCount) {
  Tensor x = ops::zeros({3, 5});
  const std::string m = error_message([&] { ops::cross_entropy(x, Tensor::from_vector<int64_t>({0, 7, 1}), {}); });
  EXPECT_NE(m.find("cross_entropy"), std::string::npos) << m;
  EXPECT_NE(m.find("7"), std::string::npos) << m;
  EXPECT_NE(m.find("5 classes"), std::string::npos) << m;
  EXPECT_NE(error_message([&] { ops::cross_entropy(x, Tensor::from_vector<int64_t>({0, -1, 1}), {}); }).find("-1"),
            std::string::npos);
  // Wrong target shape and dtype.
  std::string s = error_message([&] { ops::cross_entropy(x, Tensor::from_vector<int64_t>({0, 1}), {}); });
  EXPECT_NE(s.find("[3]"), std::string::npos) << s;
  s = error_message([&] { ops::cross_entropy(x, ops::zeros({3}), {}); });
  EXPECT_NE(s.find("f32"), std::string::npos) << s;
  s = error_message([&] { ops::cross_entropy(x, Tensor::from_vector<int64_t>({0, 1, 2}), {-100, 1.5, Reduction::Mean}); });
  EXPECT_NE(s.find("label_smoothing"), std::string::npos) << s;
}

TEST(CrossEntropy, SameBitsForAnyThreadCount) {
  Generator gen(17);
  Tensor x = ops::randn({5000, 37}, DType::F32, kCPU, &gen);
  std::vector<int64_t> tv(5000);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = static_cast<int64_t>((i * 7) % 37);
  Tensor t = Tensor::from_vector(tv);
  auto run = [&] {
    Tensor l = ops::cross_entropy(x, t, {-100, 0.1, Reduction::Mean}).loss;
    Tensor s = ops::cross_entropy(x, t, {-100, 0.1, Reduction::Sum}).loss;
    return std::vector<Tensor>{l, s};
  };
  auto one = with_threads(1, run), two = with_threads(2, run);
  for (size_t i = 0; i < one.size(); ++i) expect_bitwise_equal(one[i], two[i], "cross_entropy");
}

// ---- binary cross entropy with logits ------------------------------------------------------------------

TEST(BceWithLogits, MatchesReferenceAndIsStable) {
  Generator gen(18);
  Tensor x = ops::mul_scalar(ops::randn({4, 6}, DType::F64, kCPU, &gen), 4.0);
  Tensor t = ops::rand({4, 6}, DType::F64, kCPU, &gen);
  const auto xv = x.tolist<double>(), tv = t.tolist<double>();
  std::vector<double> ref;
  double sum = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    // -(t log sigmoid(x) + (1 - t) log sigmoid(-x)), with an accurate log-sigmoid
    auto log_sigmoid = [](double z) { return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z)); };
    ref.push_back(-(tv[i] * log_sigmoid(xv[i]) + (1 - tv[i]) * log_sigmoid(-xv[i])));
    sum += ref.back();
  }
  expect_close(ops::bce_with_logits(x, t, Reduction::None), Tensor::from_vector(ref, x.shape()), 1e-12, 1e-10, "none");
  EXPECT_NEAR(ops::bce_with_logits(x, t, Reduction::Sum).item(), sum, 1e-10);
  EXPECT_NEAR(ops::bce_with_logits(x, t, Reduction::Mean).item(), sum / 24, 1e-11);
  // Large logits: the naive log(sigmoid) form overflows; the stable form gives |x| or 0.
  Tensor big = Tensor::from_vector<float>({100, -100, 100});
  Tensor bt = Tensor::from_vector<float>({0, 0, 1});
  const auto l = ops::bce_with_logits(big, bt, Reduction::None).tolist<double>();
  EXPECT_NEAR(l[0], 100.0, 1e-4);
  EXPECT_NEAR(l[1], 0.0, 1e-6);
  EXPECT_NEAR(l[2], 0.0, 1e-6);
}

TEST(BceWithLogits, GradientsMatchFiniteDifferences) {
  Generator gen(19);
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    Tensor x = leaf({3, 4}, gen, 2.0);
    Tensor t = ops::rand({3, 4}, DType::F64, kCPU, &gen);
    t.requires_grad_();
    expect_gradients_match(
        [red](const std::vector<Tensor>& in) { return binary_cross_entropy_with_logits(in[0], in[1], red); }, {x, t},
        1e-6, "bce");
  }
}

TEST(BceWithLogits, ShapeMismatchIsAnError) {
  const std::string m = error_message([] { ops::bce_with_logits(ops::zeros({2, 3}), ops::zeros({3, 2}), Reduction::Mean); });
  EXPECT_NE(m.find("binary_cross_entropy_with_logits"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 2]"), std::string::npos) << m;
}

// softmax / log_softmax over a dim that is not the last run through column tiles, over short last-dim rows
// through blocks of rows (softmax.cpp); each element must get the bits of the plain row-at-a-time formula
// (max, exp(x - m) by vmath, the sum in double in eight lanes, 1 / sum in double or vmath's log of the sum),
// computed here for a (3, D, 300) input
// over dim 1 and over dim 2 of its transpose, with -inf, a whole -inf row, NaN and large values mixed in, for D
// from 1 to past the tiles' limits, F32 and BF16, and any thread count.
namespace {
std::vector<float> reference_softmax(const std::vector<float>& x, int64_t rows, int64_t D, bool log) {
  std::vector<float> out(x.size());
  std::vector<float> o(static_cast<size_t>(D));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * D;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < D; ++j) m = xr[j] > m ? xr[j] : m;
    for (int64_t j = 0; j < D; ++j)
      if (xr[j] != xr[j]) m = xr[j];
    for (int64_t j = 0; j < D; ++j) o[j] = xr[j] - m;
    cpu::vmath::exp(o.data(), o.data(), D);
    // The sum in double in eight lanes (j mod 8 while eight remain), added ((0+1)+(2+3))+((4+5)+(6+7)), then the rest.
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0}, rest = 0;
    const int64_t D8 = D / 8 * 8;
    for (int64_t j = 0; j < D; ++j) (j < D8 ? lane[j % 8] : rest) += static_cast<double>(o[j]);
    const double sum = (((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]))) + rest;
    float ls = static_cast<float>(sum);
    cpu::vmath::log(&ls, &ls, 1);
    for (int64_t j = 0; j < D; ++j)
      out[r * D + j] = log ? (xr[j] - m) - ls : o[j] * static_cast<float>(1.0 / sum);
  }
  return out;
}
}  // namespace

TEST(Softmax, TiledPathsGiveTheRowFormulasBits) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (int64_t D : {1, 5, 16, 33, 64, 65, 700}) {
      for (DType dt : {DType::F32, DType::BF16}) {
        Generator gen(static_cast<uint64_t>(D * 7 + threads));
        std::vector<float> v = ops::mul_scalar(ops::randn({3, 300, D}, DType::F32, kCPU, &gen), 8.0).tolist<float>();
        v[5] = -std::numeric_limits<float>::infinity();
        v[static_cast<size_t>(300 * D + 7)] = std::numeric_limits<float>::quiet_NaN();
        v[11] = 1e30f;
        for (int64_t j = 0; j < D; ++j) v[static_cast<size_t>(2 * 300 * D + 42 * D + j)] = -std::numeric_limits<float>::infinity();
        const Tensor rows = ops::to_dtype(Tensor::from_vector(v, {3, 300, D}), dt);  // (3, 300, D): rows along D
        const std::vector<float> rv = ops::to_dtype(rows, DType::F32).tolist<float>();
        const Tensor cols = ops::contiguous(rows.transpose(1, 2));                    // (3, D, 300): over dim 1
        for (bool log : {false, true}) {
          const std::vector<float> want =
              ops::to_dtype(ops::to_dtype(Tensor::from_vector(reference_softmax(rv, 900, D, log), {3, 300, D}), dt),
                            DType::F32).tolist<float>();
          const Tensor a = log ? ops::log_softmax(rows, 2) : ops::softmax(rows, 2);
          const Tensor b = ops::contiguous((log ? ops::log_softmax(cols, 1) : ops::softmax(cols, 1)).transpose(1, 2));
          for (const auto& [got_t, path] : {std::pair{a, "last dim"}, std::pair{b, "dim 1"}}) {
            const std::vector<float> got = ops::to_dtype(got_t, DType::F32).tolist<float>();
            ASSERT_EQ(got.size(), want.size());
            for (size_t i = 0; i < got.size(); ++i) {
              if (std::isnan(got[i]) && std::isnan(want[i])) continue;
              uint32_t gb, wb;
              std::memcpy(&gb, &got[i], 4);
              std::memcpy(&wb, &want[i], 4);
              ASSERT_EQ(gb, wb) << (log ? "log_softmax" : "softmax") << " over " << path << ", D " << D << " "
                                << dtype_name(dt) << ", threads " << threads << ", at " << i << ": " << got[i]
                                << " vs " << want[i];
            }
          }
        }
      }
    }
  }
  set_num_threads(2);
}
