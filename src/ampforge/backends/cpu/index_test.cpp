// Unit tests of embedding, dropout and scaled_dot_product_attention on the CPU: references, padding_idx,
// duplicate indices, the Philox stream contract, dropout statistics, thread-count independence, finite-
// difference gradients, bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ampforge/backends/cpu/gradcheck_testutil.h"

using namespace ampforge;
using namespace ampforge::testutil;

// ---- embedding ------------------------------------------------------------------------------------------

TEST(Embedding, GathersRowsForI64AndI32) {
  Tensor w = ops::reshape(ops::arange(0, 12, 1, DType::F32), {4, 3});
  Tensor idx = Tensor::from_vector<int64_t>({3, 0, 3, 1}, {2, 2});
  Tensor out = ops::embedding(idx, w);
  EXPECT_EQ(out.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(out.tolist<float>(), (std::vector<float>{9, 10, 11, 0, 1, 2, 9, 10, 11, 3, 4, 5}));
  Tensor idx32 = Tensor::from_vector<int32_t>({3, 0, 3, 1}, {2, 2});
  EXPECT_EQ(ops::embedding(idx32, w).tolist<float>(), out.tolist<float>());
}

TEST(Embedding, BackwardSumsDuplicatesAndSkipsPadding) {
  Tensor idx = Tensor::from_vector<int64_t>({2, 0, 2, 1, 2});
  Tensor g = ops::reshape(ops::arange(1, 11, 1, DType::F32), {5, 2});  // rows (1,2) (3,4) (5,6) (7,8) (9,10)
  Tensor gw = ops::embedding_backward(g, idx, 4, /*padding_idx=*/1);
  EXPECT_EQ(gw.tolist<float>(), (std::vector<float>{3, 4, 0, 0, 1 + 5 + 9, 2 + 6 + 10, 0, 0}));
  // Finite differences without padding (with padding_idx the forward still reads that row but, by
  // definition, its gradient is zero, so a numerical check would disagree there).
  Generator gen(21);
  Tensor w = leaf({4, 3}, gen);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return embedding(idx, in[0]); }, {w}, 1e-6,
                         "embedding");
  // Through autograd with padding: the padding row gets zero gradient.
  Tensor loss = sum(embedding(idx, w, 1));
  loss.backward();
  EXPECT_EQ(w.grad().tolist<double>()[3], 0.0);  // row 1
  EXPECT_EQ(w.grad().tolist<double>()[6], 3.0);  // row 2 used three times
}

TEST(Embedding, BackwardSameBitsForAnyThreadCount) {
  Generator gen(22);
  const int64_t V = 50, D = 64, n = 4000;
  std::vector<int64_t> iv(n);
  for (int64_t i = 0; i < n; ++i) iv[i] = (i * 31 + i / 7) % V;
  Tensor idx = Tensor::from_vector(iv);
  Tensor g = ops::randn({n, D}, DType::F32, kCPU, &gen);
  auto run = [&] { return ops::embedding_backward(g, idx, V, 3); };
  Tensor one = with_threads(1, run), two = with_threads(2, run);
  expect_bitwise_equal(one, two, "embedding_backward");
  Tensor gb = ops::to_dtype(g, DType::BF16);
  Tensor b1 = with_threads(1, [&] { return ops::embedding_backward(gb, idx, V); });
  Tensor b2 = with_threads(2, [&] { return ops::embedding_backward(gb, idx, V); });
  expect_bitwise_equal(b1, b2, "embedding_backward bf16");
}

TEST(Embedding, BadIndicesAreClearErrors) {
  Tensor w = ops::zeros({4, 3});
  std::string m = error_message([&] { ops::embedding(Tensor::from_vector<int64_t>({0, 4}), w); });
  EXPECT_NE(m.find("embedding"), std::string::npos) << m;
  EXPECT_NE(m.find("index 4"), std::string::npos) << m;
  EXPECT_NE(m.find("4 rows"), std::string::npos) << m;
  m = error_message([&] { ops::embedding(Tensor::from_vector<int64_t>({-2}), w); });
  EXPECT_NE(m.find("-2"), std::string::npos) << m;
  m = error_message([&] { ops::embedding(ops::zeros({2}), w); });
  EXPECT_NE(m.find("f32"), std::string::npos) << m;
  m = error_message([&] { ops::embedding(Tensor::from_vector<int64_t>({0}), w, 9); });
  EXPECT_NE(m.find("padding_idx"), std::string::npos) << m;
}

// ---- dropout --------------------------------------------------------------------------------------------

TEST(Dropout, FollowsThePhiloxContract) {
  Generator gen(1234);
  Tensor x = ops::randn({1001}, DType::F32, kCPU, &gen);
  const PhiloxState dst = gen.state();  // where dropout starts drawing
  ops::DropoutResult r = ops::dropout(x, 0.3, &gen);
  const auto xv = x.tolist<double>(), yv = r.out.tolist<double>();
  const auto mv = ops::to_dtype(r.mask, DType::F32).tolist<double>();
  const float keep = static_cast<float>(1.0 - 0.3);
  const float scale = static_cast<float>(1.0 / 0.7);
  for (int64_t i = 0; i < 1001; ++i) {
    const auto w = philox4x32(dst.seed, dst.offset + static_cast<uint64_t>(i / 4));
    const bool kept = uint_to_unit_float(w[i % 4]) < keep;
    ASSERT_EQ(mv[i] != 0, kept) << i;
    ASSERT_EQ(yv[i], kept ? static_cast<double>(static_cast<float>(xv[i]) * scale) : 0.0) << i;
  }
  EXPECT_EQ(gen.state().offset, dst.offset + (1001 + 3) / 4);  // reserved ceil(n / 4) counters
}

TEST(Dropout, KeepsAboutOneMinusP) {
  Generator gen(23);
  const int64_t n = 200000;
  Tensor x = ops::ones({n});
  for (double p : {0.1, 0.5, 0.9}) {
    ops::DropoutResult r = ops::dropout(x, p, &gen);
    const double kept = ops::sum(ops::to_dtype(r.mask, DType::F64)).item();
    const double sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(kept, n * (1 - p), 5 * sd) << "p = " << p;
    // The mean is preserved in expectation: sum(y) = kept / (1 - p).
    EXPECT_NEAR(ops::sum(r.out).item(), kept / (1 - p), 1e-2 * n);
  }
}

TEST(Dropout, SameNumbersForAnyThreadCount) {
  Generator gen(24);
  Tensor x = ops::randn({300001}, DType::F32, kCPU, &gen);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor xd = ops::to_dtype(x, dt);
    auto run = [&] {
      Generator g(77);
      auto r = ops::dropout(xd, 0.25, &g);
      return std::vector<Tensor>{r.out, r.mask};
    };
    auto one = with_threads(1, run), two = with_threads(2, run);
    expect_bitwise_equal(one[0], two[0], "dropout out");
    expect_bitwise_equal(one[1], two[1], "dropout mask");
  }
}

TEST(Dropout, IdentityZerosAndErrors) {
  Generator gen(25);
  Tensor x = ops::randn({64}, DType::F32, kCPU, &gen);
  EXPECT_TRUE(dropout(x, 0.5, /*training=*/false).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true).is_same(x));
  Tensor z = dropout(x, 1.0, true, &gen);
  for (double v : z.tolist<double>()) EXPECT_EQ(v, 0.0);
  const std::string m = error_message([&] { dropout(x, 1.5, true); });
  EXPECT_NE(m.find("dropout"), std::string::npos) << m;
  EXPECT_NE(m.find("1.5"), std::string::npos) << m;
  EXPECT_NE(error_message([&] { ops::dropout(x, -0.1); }).find("[0, 1]"), std::string::npos);
}

TEST(Dropout, GradientIsMaskOverKeep) {
  Generator gen(26);
  Tensor x = leaf({5, 6}, gen);
  Generator dg(5);
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) {
        dg.manual_seed(5);  // the same mask at every evaluation
        return dropout(in[0], 0.4, true, &dg);
      },
      {x}, 1e-6, "dropout");
}

// ---- scaled dot-product attention -------------------------------------------------------------------------

namespace {
// Naive attention on (B, T, D) F64 data with an optional causal and Bool mask (mask over (Tq, Tk)).
std::vector<double> attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<bool>& mask,
                                        bool causal) {
  const int64_t B = q.size(0), Tq = q.size(1), D = q.size(2), Tk = k.size(1), Dv = v.size(2);
  const auto qv = q.tolist<double>(), kv = k.tolist<double>(), vv = v.tolist<double>();
  std::vector<double> out(static_cast<size_t>(B * Tq * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i) {
      std::vector<double> s(Tk);
      double m = -INFINITY;
      for (int64_t j = 0; j < Tk; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qv[(b * Tq + i) * D + d] * kv[(b * Tk + j) * D + d];
        const bool allowed = (!causal || j <= i) && (mask.empty() || mask[i * Tk + j]);
        s[j] = allowed ? dot / std::sqrt(static_cast<double>(D)) : -INFINITY;
        m = std::max(m, s[j]);
      }
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - m));
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t d = 0; d < Dv; ++d) out[(b * Tq + i) * Dv + d] += s[j] / z * vv[(b * Tk + j) * Dv + d];
    }
  return out;
}
}  // namespace

TEST(Attention, MatchesReferenceWithCausalAndMask) {
  Generator gen(27);
  Tensor q = ops::randn({2, 4, 3}, DType::F64, kCPU, &gen), k = ops::randn({2, 5, 3}, DType::F64, kCPU, &gen);
  Tensor v = ops::randn({2, 5, 2}, DType::F64, kCPU, &gen);
  std::vector<bool> mv(20);
  for (size_t i = 0; i < mv.size(); ++i) mv[i] = (i % 3) != 1 || i % 5 == 0;
  Tensor mask = Tensor::from_vector<bool>(mv, {4, 5});
  expect_close(scaled_dot_product_attention(q, k, v), Tensor::from_vector(attention_reference(q, k, v, {}, false), {2, 4, 2}),
               1e-12, 1e-12, "plain");
  expect_close(scaled_dot_product_attention(q, k, v, Tensor(), true),
               Tensor::from_vector(attention_reference(q, k, v, {}, true), {2, 4, 2}), 1e-12, 1e-12, "causal");
  expect_close(scaled_dot_product_attention(q, k, v, mask, true),
               Tensor::from_vector(attention_reference(q, k, v, mv, true), {2, 4, 2}), 1e-12, 1e-12, "causal+mask");
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  Generator gen(28);
  Tensor q = leaf({1, 2, 3, 4}, gen), k = leaf({1, 2, 3, 4}, gen), v = leaf({1, 2, 3, 2}, gen);
  Tensor mask = Tensor::from_vector<bool>({true, false, true, true, true, false, true, true, true}, {3, 3});
  for (bool causal : {false, true}) {
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], causal ? Tensor() : mask, causal, 0.7);
        },
        {q, k, v}, 1e-6, causal ? "attention causal" : "attention mask");
  }
}

TEST(Attention, BadInputsAreClearErrors) {
  Tensor q = ops::zeros({2, 3, 4}), k = ops::zeros({2, 5, 4}), v = ops::zeros({2, 5, 6});
  std::string m = error_message([&] { scaled_dot_product_attention(q, ops::zeros({2, 5, 3}), v); });
  EXPECT_NE(m.find("scaled_dot_product_attention"), std::string::npos) << m;
  m = error_message([&] { scaled_dot_product_attention(q, k, v, ops::zeros({3, 5})); });
  EXPECT_NE(m.find("Bool"), std::string::npos) << m;
  m = error_message([&] { scaled_dot_product_attention(q, k, v, ops::ones({4, 5}, DType::Bool)); });
  EXPECT_NE(m.find("[4, 5]"), std::string::npos) << m;
}
