// Unit tests of batch_norm and layer_norm on the CPU: naive F64 references, hand-computed running statistics,
// NCHW vs channels-last, 16-bit inputs, finite-difference gradients, thread-count independence, bad inputs.
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/format.h>

#include "ampforge/backends/cpu/gradcheck_testutil.h"
#include "ampforge/backends/cpu/norm_paths.h"
#include "ampforge/backends/meta/meta.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

// Naive batch norm over (N, C, S) data in logical (NCHW) order: returns y, and per-channel biased var.
struct BnRef {
  std::vector<double> y, mean, var;
};
BnRef bn_reference(const std::vector<double>& x, int64_t N, int64_t C, int64_t S, const std::vector<double>& w,
                   const std::vector<double>& b, double eps) {
  BnRef r;
  r.y.resize(x.size());
  for (int64_t c = 0; c < C; ++c) {
    double m = 0, v = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) m += x[(n * C + c) * S + s];
    m /= static_cast<double>(N * S);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) v += std::pow(x[(n * C + c) * S + s] - m, 2);
    v /= static_cast<double>(N * S);
    r.mean.push_back(m);
    r.var.push_back(v);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = (n * C + c) * S + s;
        r.y[i] = (x[i] - m) / std::sqrt(v + eps) * w[c] + b[c];
      }
  }
  return r;
}

}  // namespace

TEST(BatchNorm, TrainingMatchesNaiveReference) {
  Generator gen(1);
  const int64_t N = 3, C = 4, H = 5, W = 6;
  Tensor x = ops::add_scalar(ops::randn({N, C, H, W}, DType::F64, kCPU, &gen), 3.0);
  Tensor w = ops::randn({C}, DType::F64, kCPU, &gen), b = ops::randn({C}, DType::F64, kCPU, &gen);
  Tensor rm = ops::zeros({C}, DType::F64), rv = ops::ones({C}, DType::F64);
  ops::BatchNormResult r = ops::batch_norm(x, w, b, rm, rv, {true, 0.1, 1e-5});
  BnRef ref = bn_reference(x.tolist<double>(), N, C, H * W, w.tolist<double>(), b.tolist<double>(), 1e-5);
  expect_close(r.out, Tensor::from_vector(ref.y, x.shape()), 1e-12, 1e-12, "y");
  expect_close(r.save_mean, Tensor::from_vector(ref.mean), 1e-12, 1e-12, "save_mean");
  std::vector<double> invstd, new_rm, new_rv;
  const double M = static_cast<double>(N * H * W);
  for (int64_t c = 0; c < C; ++c) {
    invstd.push_back(1.0 / std::sqrt(ref.var[c] + 1e-5));
    new_rm.push_back(0.1 * ref.mean[c]);
    new_rv.push_back(0.9 + 0.1 * ref.var[c] * M / (M - 1));
  }
  expect_close(r.save_invstd, Tensor::from_vector(invstd), 1e-12, 1e-12, "save_invstd");
  expect_close(rm, Tensor::from_vector(new_rm), 1e-12, 1e-12, "running_mean");
  expect_close(rv, Tensor::from_vector(new_rv), 1e-12, 1e-12, "running_var");
}

TEST(BatchNorm, RunningStatsHandComputed) {
  // Channel 0: 1, 2, 3, 4 -> mean 2.5, unbiased var 5/3. Channel 1: 0, 0, 0, 8 -> mean 2, unbiased var 16.
  Tensor x = Tensor::from_vector<float>({1, 0, 2, 0, 3, 0, 4, 8}, {4, 2});
  Tensor rm = Tensor::from_vector<float>({0, 0}), rv = Tensor::from_vector<float>({1, 1});
  ops::BatchNormResult r = ops::batch_norm(x, Tensor(), Tensor(), rm, rv, {true, 0.1, 0.0});
  EXPECT_EQ(r.save_mean.dtype(), DType::F32);
  const auto m = rm.tolist<double>(), v = rv.tolist<double>();
  EXPECT_NEAR(m[0], 0.25, 1e-7);
  EXPECT_NEAR(m[1], 0.2, 1e-7);
  EXPECT_NEAR(v[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-6);
  EXPECT_NEAR(v[1], 0.9 + 0.1 * 16.0, 1e-6);
  // Normalised with the BIASED variance: channel 1 values (0 - 2) / sqrt(12).
  EXPECT_NEAR(r.out.tolist<double>()[1], -2.0 / std::sqrt(12.0), 1e-6);
  // A second step moves the running stats again from the updated values.
  ops::batch_norm(x, Tensor(), Tensor(), rm, rv, {true, 0.5, 0.0});
  EXPECT_NEAR(rm.tolist<double>()[0], 0.5 * 0.25 + 0.5 * 2.5, 1e-6);
}

TEST(BatchNorm, EvalUsesRunningStats) {
  Generator gen(2);
  Tensor x = ops::randn({2, 3, 4, 4}, DType::F64, kCPU, &gen);
  Tensor w = Tensor::from_vector<double>({1.5, -0.5, 2.0}), b = Tensor::from_vector<double>({0.1, 0.2, 0.3});
  Tensor rm = Tensor::from_vector<double>({0.5, -1.0, 0.0}), rv = Tensor::from_vector<double>({2.0, 0.5, 1.0});
  ops::BatchNormResult r = ops::batch_norm(x, w, b, rm, rv, {false, 0.1, 1e-3});
  const auto xv = x.tolist<double>(), yv = r.out.tolist<double>();
  const double m[3] = {0.5, -1.0, 0.0}, v[3] = {2.0, 0.5, 1.0}, ww[3] = {1.5, -0.5, 2.0}, bb[3] = {0.1, 0.2, 0.3};
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = static_cast<int>((i / 16) % 3);
    ASSERT_NEAR(yv[i], (xv[i] - m[c]) / std::sqrt(v[c] + 1e-3) * ww[c] + bb[c], 1e-12);
  }
  EXPECT_EQ(rm.tolist<double>()[0], 0.5);  // eval leaves the running stats alone
}

TEST(BatchNorm, ChannelsLastMatchesNchw) {
  Generator gen(3);
  const Shape s{8, 16, 7, 9};
  Tensor x = ops::randn(s, DType::F32, kCPU, &gen);
  Tensor w = ops::randn({16}, DType::F32, kCPU, &gen), b = ops::randn({16}, DType::F32, kCPU, &gen);
  Tensor g = ops::randn(s, DType::F32, kCPU, &gen);
  Tensor xcl = ops::contiguous(x, MemoryFormat::ChannelsLast);
  Tensor rm1 = ops::zeros({16}), rv1 = ops::ones({16}), rm2 = ops::zeros({16}), rv2 = ops::ones({16});
  const BatchNormAttrs at{true, 0.1, 1e-5};
  auto a = ops::batch_norm(x, w, b, rm1, rv1, at);
  auto c = ops::batch_norm(xcl, w, b, rm2, rv2, at);
  EXPECT_TRUE(c.out.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_FALSE(c.out.is_contiguous());
  // Different summation orders in double, rounded to float: equal to within a few float ulps.
  expect_close(c.out, a.out, 1e-6, 1e-6, "y");
  expect_close(c.save_mean, a.save_mean, 1e-7, 1e-7, "mean");
  expect_close(c.save_invstd, a.save_invstd, 1e-7, 1e-7, "invstd");
  expect_close(rv2, rv1, 1e-7, 1e-7, "running_var");
  auto da = ops::batch_norm_backward(g, x, w, a.save_mean, a.save_invstd, at, {true, true, true});
  auto dc = ops::batch_norm_backward(ops::contiguous(g, MemoryFormat::ChannelsLast), xcl, w, c.save_mean,
                                     c.save_invstd, at, {true, true, true});
  EXPECT_TRUE(dc.grad_input.is_contiguous(MemoryFormat::ChannelsLast));
  expect_close(dc.grad_input, da.grad_input, 1e-5, 1e-5, "grad_input");
  expect_close(dc.grad_weight, da.grad_weight, 1e-4, 1e-5, "grad_weight");
  expect_close(dc.grad_bias, da.grad_bias, 1e-4, 1e-5, "grad_bias");
}

TEST(BatchNorm, HalfInputsComputeInFloat) {
  Generator gen(4);
  Tensor x = ops::randn({4, 6, 5, 5}, DType::F32, kCPU, &gen);
  Tensor w = ops::randn({6}, DType::F32, kCPU, &gen), b = ops::randn({6}, DType::F32, kCPU, &gen);
  for (DType dt : {DType::F16, DType::BF16}) {
    for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      Tensor xh = ops::contiguous(ops::to_dtype(x, dt), fmt);
      Tensor ref_in = ops::to_dtype(xh, DType::F64);  // the exact 16-bit values
      auto r = ops::batch_norm(xh, w, b, Tensor(), Tensor(), {true, 0.1, 1e-5});
      auto ref = ops::batch_norm(ref_in, ops::to_dtype(w, DType::F64), ops::to_dtype(b, DType::F64), Tensor(), Tensor(),
                                 {true, 0.1, 1e-5});
      EXPECT_EQ(r.out.dtype(), dt);
      EXPECT_EQ(r.save_mean.dtype(), DType::F32);
      expect_close(r.save_mean, ref.save_mean, 1e-6, 1e-6, "16-bit mean");
      // One rounding to the 16-bit type: unit roundoff 2^-11 (F16) / 2^-8 (BF16), times |y| <= ~10.
      const double u = dt == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      expect_close(r.out, ref.out, 4 * u, 2 * u, "16-bit y");
    }
  }
}

// batch_norm, and batch_norm_act with ReLU and SiLU fused (None is batch_norm itself).
TEST(BatchNorm, GradientsMatchFiniteDifferences) {
  Generator gen(5);
  const int64_t C = 3;
  for (NormAct act : {NormAct::None, NormAct::ReLU, NormAct::SiLU})
    for (bool training : {true, false})
      for (bool channels_last : {false, true}) {
        Tensor x = leaf({2, C, 3, 2}, gen), w = leaf({C}, gen), b = leaf({C}, gen);
        Tensor rm = ops::randn({C}, DType::F64, kCPU, &gen);
        Tensor rv = ops::add_scalar(ops::mul(rm, rm), 0.5);
        expect_gradients_match(
            [&](const std::vector<Tensor>& in) {
              Tensor xi = channels_last ? in[0].contiguous(MemoryFormat::ChannelsLast) : in[0];
              // Training without running stats, so repeated evaluations see the same function.
              return batch_norm_act(xi, in[1], in[2], training ? Tensor() : rm, training ? Tensor() : rv, training, 0.1,
                                    1e-5, act);
            },
            {x, w, b}, 1e-6,
            fmt::format("batch_norm act {} {}", static_cast<int>(act), training ? "train" : "eval"));
      }
  // 2-D input (N, C), no affine parameters.
  Tensor x2 = leaf({5, 4}, gen);
  expect_gradients_match([](const std::vector<Tensor>& in) { return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
                         {x2}, 1e-6, "batch_norm 2-D");
  // Bias only: its gradient keeps the bias dtype.
  Tensor x3 = leaf({3, 2, 4}, gen), b3 = leaf({2}, gen);
  expect_gradients_match([](const std::vector<Tensor>& in) { return batch_norm(in[0], Tensor(), in[1], Tensor(), Tensor(), true); },
                         {x3, b3}, 1e-6, "batch_norm 3-D bias only");
}

// With and without a fused activation (SiLU: its backward also stores and re-reads dz, in grad_input for F32 and
// in an F32 buffer for BF16), F32 and BF16.
TEST(BatchNorm, SameBitsForAnyThreadCount) {
  Generator gen(6);
  for (NormAct act : {NormAct::None, NormAct::SiLU}) {
    for (DType dt : {DType::F32, DType::BF16})
    for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      Tensor x = ops::contiguous(ops::to_dtype(ops::randn({32, 16, 14, 14}, DType::F32, kCPU, &gen), dt), fmt);
      Tensor g = ops::contiguous(ops::to_dtype(ops::randn({32, 16, 14, 14}, DType::F32, kCPU, &gen), dt), fmt);
      Tensor w = ops::randn({16}, DType::F32, kCPU, &gen), b = ops::randn({16}, DType::F32, kCPU, &gen);
      auto run = [&] {
        Tensor rm = ops::zeros({16}), rv = ops::ones({16});
        const BatchNormAttrs at{true, 0.1, 1e-5, act};
        auto r = ops::batch_norm(x, w, b, rm, rv, at);
        auto d = ops::batch_norm_backward(g, x, w, r.save_mean, r.save_invstd, at, {true, true, true}, b);
        return std::vector<Tensor>{r.out, r.save_mean, r.save_invstd, rv, d.grad_input, d.grad_weight, d.grad_bias};
      };
      auto one = with_threads(1, run);
      auto two = with_threads(2, run);
      for (size_t i = 0; i < one.size(); ++i) expect_bitwise_equal(one[i], two[i], "output " + std::to_string(i));
    }
  }
}

TEST(BatchNorm, BadInputsAreClearErrors) {
  Tensor x = ops::zeros({4, 3, 2, 2});
  std::string m = error_message([&] { ops::batch_norm(x, ops::ones({4}), Tensor(), Tensor(), Tensor(), {}); });
  EXPECT_NE(m.find("batch_norm"), std::string::npos) << m;
  EXPECT_NE(m.find("weight"), std::string::npos) << m;
  EXPECT_NE(m.find("[3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4]"), std::string::npos) << m;
  m = error_message([&] { ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), {false, 0.1, 1e-5}); });
  EXPECT_NE(m.find("running_mean"), std::string::npos) << m;
  m = error_message([&] { ops::batch_norm(x, Tensor(), Tensor(), ops::zeros({3}), ops::ones({2}), {}); });
  EXPECT_NE(m.find("running_var"), std::string::npos) << m;
  m = error_message([&] { ops::batch_norm(ops::zeros({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), {}); });
  EXPECT_NE(m.find("more than 1 value per channel"), std::string::npos) << m;
  m = error_message([&] { ops::batch_norm(ops::zeros({5}), Tensor(), Tensor(), Tensor(), Tensor(), {}); });
  EXPECT_NE(m.find("(N, C)"), std::string::npos) << m;
}

// ---- batch norm + activation (batch_norm_act) ----------------------------------------------------------

// The fused op against batch_norm followed by relu/silu as separate ops: forward values, running statistics and
// every gradient, for both layouts, training and eval, F32 and BF16 inputs, and a plane size that is not a
// multiple of the kernels' chunk.
TEST(BatchNormAct, MatchesBatchNormThenActivation) {
  Generator gen(11);
  for (NormAct act : {NormAct::ReLU, NormAct::SiLU})
    for (DType dt : {DType::F32, DType::BF16})
      for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast})
        for (bool training : {true, false}) {
          const Shape s{3, 5, 17, 19};
          Tensor x0 = ops::contiguous(ops::to_dtype(ops::randn(s, DType::F32, kCPU, &gen), dt), fmt);
          Tensor w0 = ops::randn({5}, DType::F32, kCPU, &gen), b0 = ops::randn({5}, DType::F32, kCPU, &gen);
          Tensor g = ops::contiguous(ops::to_dtype(ops::randn(s, DType::F32, kCPU, &gen), dt), fmt);
          struct Run {
            Tensor y, rm, rv, gx, gw, gb;
          };
          auto run = [&](bool fused) {
            Run r;
            Tensor x = ops::clone(x0).requires_grad_(true);
            Tensor w = ops::clone(w0).requires_grad_(true), b = ops::clone(b0).requires_grad_(true);
            r.rm = ops::full({5}, 0.25);
            r.rv = ops::full({5}, 2.0);
            if (fused) {
              r.y = batch_norm_act(x, w, b, r.rm, r.rv, training, 0.1, 1e-5, act);
            } else {
              Tensor z = batch_norm(x, w, b, r.rm, r.rv, training, 0.1, 1e-5);
              r.y = act == NormAct::ReLU ? relu(z) : silu(z);
            }
            r.y.backward(g);
            r.gx = x.grad();
            r.gw = w.grad();
            r.gb = b.grad();
            return r;
          };
          const Run f = run(true), u = run(false);
          const std::string what = std::string(act == NormAct::ReLU ? "relu " : "silu ") + std::string(dtype_name(dt)) +
                                   (fmt == MemoryFormat::ChannelsLast ? " channels-last" : " nchw") +
                                   (training ? " train" : " eval");
          EXPECT_EQ(f.y.dtype(), u.y.dtype()) << what;
          EXPECT_EQ(f.y.is_contiguous(MemoryFormat::ChannelsLast), u.y.is_contiguous(MemoryFormat::ChannelsLast)) << what;
          // The separate ops round bn(x) to the input dtype before the activation; the fused kernel does not.
          const double tol = dt == DType::F32 ? 2e-6 : 1e-2;
          expect_close(f.y, u.y, tol, tol, "y " + what);
          expect_bitwise_equal(f.rm, u.rm, "running_mean " + what);
          expect_bitwise_equal(f.rv, u.rv, "running_var " + what);
          expect_close(f.gx, u.gx, 20 * tol, 20 * tol, "grad_input " + what);
          expect_close(f.gw, u.gw, 20 * tol, 20 * tol, "grad_weight " + what);
          expect_close(f.gb, u.gb, 20 * tol, 20 * tol, "grad_bias " + what);
        }
}

// ---- batch norm + residual + activation (batch_norm_add_act) ----------------------------------------------

// The fused op against batch_norm, add and relu as separate ops: values, running statistics and the gradients
// of x, the residual, weight and bias; both layouts (the residual in x's layout or the other one), training and
// eval, F32 and BF16, no activation and ReLU.
TEST(BatchNormAddAct, MatchesBatchNormAddThenActivation) {
  Generator gen(13);
  for (NormAct act : {NormAct::None, NormAct::ReLU})
    for (DType dt : {DType::F32, DType::BF16})
      for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast})
        for (bool res_same_layout : {true, false})
          for (bool training : {true, false}) {
            const Shape s{3, 5, 17, 19};
            const MemoryFormat rfmt = res_same_layout ? fmt
                                      : fmt == MemoryFormat::Contiguous ? MemoryFormat::ChannelsLast
                                                                        : MemoryFormat::Contiguous;
            Tensor x0 = ops::contiguous(ops::to_dtype(ops::randn(s, DType::F32, kCPU, &gen), dt), fmt);
            Tensor r0 = ops::contiguous(ops::to_dtype(ops::randn(s, DType::F32, kCPU, &gen), dt), rfmt);
            Tensor w0 = ops::randn({5}, DType::F32, kCPU, &gen), b0 = ops::randn({5}, DType::F32, kCPU, &gen);
            Tensor g = ops::contiguous(ops::to_dtype(ops::randn(s, DType::F32, kCPU, &gen), dt), fmt);
            struct Run {
              Tensor y, rm, rv, gx, gr, gw, gb;
            };
            auto run = [&](bool fused) {
              Run r;
              Tensor x = ops::clone(x0).requires_grad_(true), res = ops::clone(r0).requires_grad_(true);
              Tensor w = ops::clone(w0).requires_grad_(true), b = ops::clone(b0).requires_grad_(true);
              r.rm = ops::full({5}, 0.25);
              r.rv = ops::full({5}, 2.0);
              if (fused) {
                r.y = batch_norm_add_act(x, res, w, b, r.rm, r.rv, training, 0.1, 1e-5, act);
              } else {
                Tensor z = add(batch_norm(x, w, b, r.rm, r.rv, training, 0.1, 1e-5), res);
                r.y = act == NormAct::ReLU ? relu(z) : z;
              }
              r.y.backward(g);
              r.gx = x.grad();
              r.gr = res.grad();
              r.gw = w.grad();
              r.gb = b.grad();
              return r;
            };
            const Run f = run(true), u = run(false);
            const std::string what = fmt::format("{} {} {} residual {} {}", act == NormAct::ReLU ? "relu" : "none",
                                                 dtype_name(dt), fmt == MemoryFormat::ChannelsLast ? "channels-last" : "nchw",
                                                 res_same_layout ? "same layout" : "other layout",
                                                 training ? "train" : "eval");
            EXPECT_EQ(f.y.dtype(), u.y.dtype()) << what;
            // The output takes x's layout (add's rule for mixed layouts may differ; ResNet's operands share one).
            EXPECT_EQ(f.y.is_contiguous(MemoryFormat::ChannelsLast), fmt == MemoryFormat::ChannelsLast) << what;
            // F32: the same float operations in the same order, equal values (relu may differ in the sign of a
            // zero). 16-bit: the separate ops round bn(x) and the sum.
            if (dt == DType::F32) {
              expect_close(f.y, u.y, 0, 0, "y " + what);
              expect_close(f.gr, u.gr, 0, 0, "grad_residual " + what);
            }
            const double tol = dt == DType::F32 ? 2e-6 : 2e-2;
            expect_close(f.y, u.y, tol, tol, "y " + what);
            expect_bitwise_equal(f.rm, u.rm, "running_mean " + what);
            expect_bitwise_equal(f.rv, u.rv, "running_var " + what);
            if (dt == DType::F32) {
              expect_close(f.gx, u.gx, 20 * tol, 20 * tol, "grad_input " + what);
              expect_close(f.gw, u.gw, 20 * tol, 20 * tol, "grad_weight " + what);
              expect_close(f.gb, u.gb, 20 * tol, 20 * tol, "grad_bias " + what);
            } else {
              // 16-bit: a sum within rounding of zero has another sign in the separate ops (which round bn(x), then
              // the sum), so their ReLU masks differ at ~1% of the elements and the gradients with them. Pinned
              // instead: the residual's gradient is g where the fused output is > 0 (the F32 cases pin the rest).
              const std::vector<double> yv = f.y.tolist<double>(), gv = g.tolist<double>(), gr = f.gr.tolist<double>();
              for (size_t i = 0; i < yv.size(); ++i)
                ASSERT_EQ(gr[i], act == NormAct::None || yv[i] > 0 ? gv[i] : 0.0) << what << " element " << i;
            }
          }
}

TEST(BatchNormAddAct, GradientsMatchFiniteDifferences) {
  Generator gen(17);
  const int64_t C = 3;
  for (NormAct act : {NormAct::None, NormAct::ReLU})
    for (bool training : {true, false})
      for (bool channels_last : {false, true}) {
        Tensor x = leaf({2, C, 3, 2}, gen), res = leaf({2, C, 3, 2}, gen), w = leaf({C}, gen), b = leaf({C}, gen);
        Tensor rm = ops::randn({C}, DType::F64, kCPU, &gen);
        Tensor rv = ops::add_scalar(ops::mul(rm, rm), 0.5);
        expect_gradients_match(
            [&](const std::vector<Tensor>& in) {
              Tensor xi = channels_last ? in[0].contiguous(MemoryFormat::ChannelsLast) : in[0];
              return batch_norm_add_act(xi, in[1], in[2], in[3], training ? Tensor() : rm, training ? Tensor() : rv,
                                        training, 0.1, 1e-5, act);
            },
            {x, res, w, b}, 1e-6,
            fmt::format("batch_norm_add_act act {} {}", static_cast<int>(act), training ? "train" : "eval"));
      }
  // Only the residual wants a gradient: no pass over x runs, and grad_residual is still the masked gradient.
  Tensor x = ops::randn({2, C, 4, 4}, DType::F64, kCPU, &gen), res = leaf({2, C, 4, 4}, gen);
  Tensor y = batch_norm_add_act(x, res, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, NormAct::ReLU);
  Tensor g = ops::randn({2, C, 4, 4}, DType::F64, kCPU, &gen);
  y.backward(g);
  const std::vector<double> yv = y.tolist<double>(), gv = g.tolist<double>(), gr = res.grad().tolist<double>();
  for (size_t i = 0; i < yv.size(); ++i) ASSERT_EQ(gr[i], yv[i] > 0 ? gv[i] : 0.0) << "element " << i;
}

TEST(BatchNormAddAct, SameBitsForAnyThreadCount) {
  Generator gen(19);
  for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    Tensor x = ops::contiguous(ops::randn({32, 16, 14, 14}, DType::F32, kCPU, &gen), fmt);
    Tensor res = ops::contiguous(ops::randn({32, 16, 14, 14}, DType::F32, kCPU, &gen), fmt);
    Tensor g = ops::contiguous(ops::randn({32, 16, 14, 14}, DType::F32, kCPU, &gen), fmt);
    Tensor w = ops::randn({16}, DType::F32, kCPU, &gen), b = ops::randn({16}, DType::F32, kCPU, &gen);
    auto run = [&] {
      Tensor rm = ops::zeros({16}), rv = ops::ones({16});
      const BatchNormAttrs at{true, 0.1, 1e-5, NormAct::ReLU};
      auto r = ops::batch_norm(x, w, b, rm, rv, at, res);
      auto d = ops::batch_norm_backward(g, x, w, r.save_mean, r.save_invstd, at, {true, true, true}, Tensor(), r.out);
      return std::vector<Tensor>{r.out, r.save_mean, r.save_invstd, rv, d.grad_input, d.grad_weight, d.grad_bias,
                                 d.grad_residual};
    };
    auto one = with_threads(1, run);
    auto two = with_threads(2, run);
    for (size_t i = 0; i < one.size(); ++i) expect_bitwise_equal(one[i], two[i], "output " + std::to_string(i));
  }
}

// Rows-layout batch norm (channels-last, or (N, C)) in F32 and BF16 runs fused passes (norm_paths.h); with them off,
// the general loader path runs. Every output must have the same bits: channel counts that exercise the 64-, 16- and
// 8-channel groups and the scalar tail, activation None and ReLU, with and without the residual, and a 2-D input.
// (F16 runs the general path either way; with it fused, this test found one value in 726 rounded differently.)
TEST(BatchNorm, ChannelsLastFusedPassesKeepTheGeneralPathsBits) {
  Generator gen(23);
  const std::vector<Shape> shapes = {{4, 64, 9, 9}, {2, 200, 5, 7}, {3, 24, 6, 6}, {2, 3, 11, 11}, {2, 2048, 3, 3},
                                     {37, 72}};
  for (DType dt : {DType::F32, DType::BF16}) {
    for (const Shape& shape : shapes) {
      const int64_t C = shape[1];
      const MemoryFormat fmt = shape.size() == 4 ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
      Tensor x = ops::contiguous(ops::randn(shape, DType::F32, kCPU, &gen).to(dt), fmt);
      Tensor res = ops::contiguous(ops::randn(shape, DType::F32, kCPU, &gen).to(dt), fmt);
      Tensor g = ops::contiguous(ops::randn(shape, DType::F32, kCPU, &gen).to(dt), fmt);
      Tensor w = ops::randn({C}, DType::F32, kCPU, &gen), b = ops::randn({C}, DType::F32, kCPU, &gen);
      for (NormAct act : {NormAct::None, NormAct::ReLU}) {
        for (bool residual : {false, true}) {
          auto run = [&] {
            Tensor rm = ops::zeros({C}), rv = ops::ones({C});
            const BatchNormAttrs at{true, 0.1, 1e-5, act};
            auto r = ops::batch_norm(x, w, b, rm, rv, at, residual ? res : Tensor());
            auto d = residual ? ops::batch_norm_backward(g, x, w, r.save_mean, r.save_invstd, at, {true, true, true},
                                                         Tensor(), r.out)
                              : ops::batch_norm_backward(g, x, w, r.save_mean, r.save_invstd, at, {true, true, true}, b);
            std::vector<Tensor> out{r.out,          r.save_mean,   r.save_invstd, rm, rv,
                                    d.grad_input,   d.grad_weight, d.grad_bias};
            if (residual) out.push_back(d.grad_residual);
            return out;
          };
          const std::vector<Tensor> fused = run();
          cpu::set_batch_norm_fused(false);
          const std::vector<Tensor> general = run();
          cpu::set_batch_norm_fused(true);
          for (size_t i = 0; i < fused.size(); ++i)
            expect_bitwise_equal(fused[i], general[i],
                                 fmt::format("{} {} act {} residual {}: output {}", dtype_name(dt), shape.str(),
                                             static_cast<int>(act), residual, i));
        }
      }
    }
  }
}

TEST(BatchNormAddAct, BadResidualsAreClearErrors) {
  Tensor x = ops::zeros({4, 3, 2, 2});
  std::string m = error_message([&] {
    ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), {true, 0.1, 1e-5, NormAct::ReLU}, ops::zeros({4, 3, 2, 1}));
  });
  EXPECT_NE(m.find("residual"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 3, 2, 1]"), std::string::npos) << m;
  m = error_message([&] {
    ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), {true, 0.1, 1e-5, NormAct::SiLU}, ops::zeros({4, 3, 2, 2}));
  });
  EXPECT_NE(m.find("no activation or ReLU"), std::string::npos) << m;
  m = error_message([&] { batch_norm_add_act(x, x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, NormAct::SiLU); });
  EXPECT_NE(m.find("None or ReLU"), std::string::npos) << m;
}

// SiLU's backward needs its input: the separate ops keep bn(x) alive for backward, the fused op recomputes it
// from x (which batch_norm keeps anyway). Measured on the meta device standing for the CPU.
TEST(BatchNormAct, SiluKeepsNoPreActivation) {
  auto live_after_forward = [](bool fused) {
    meta::MetaSession session(meta::MetaOptions::stand_for(DeviceType::CPU));
    Tensor x = ops::randn({8, 32, 16, 16}, DType::F32, kMeta).requires_grad_(true);
    Tensor w = ops::ones({32}, DType::F32, kMeta).requires_grad_(true);
    Tensor b = ops::zeros({32}, DType::F32, kMeta).requires_grad_(true);
    const int64_t before = session.allocator().stats().requested.current;
    Tensor y = fused ? batch_norm_act(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5, NormAct::SiLU)
                     : silu(batch_norm(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5));
    return session.allocator().stats().requested.current - before;
  };
  const int64_t fused = live_after_forward(true), pair = live_after_forward(false);
  EXPECT_EQ(pair - fused, int64_t{8} * 32 * 16 * 16 * 4) << "fused " << fused << " bytes, pair " << pair << " bytes";
}

TEST(BatchNormAct, OtherDevicesAreRefusedAtTheOpLevel) {
  Tensor x = ops::zeros({4, 3, 2, 2});
  EXPECT_TRUE(ops::batch_norm_fuses_activation(kCPU));
  // CUDA kernels do not take an activation: ops/ refuses, autograd batch_norm_act composes (not testable
  // without a GPU; the message is what a caller sees).
  EXPECT_FALSE(ops::batch_norm_fuses_activation(Device(DeviceType::CUDA, 0)));
}

// ---- SyncBatchNorm (autograd sync_batch_norm) -------------------------------------------------------------
// One process: a reduction over one replica (identity), or over two replicas holding the same batch (x2: the
// sums double, so do the counts), must give batch_norm's values, running statistics and gradients. The
// multi-process case is DistTrain.SyncBatchNormEqualsOneProcessWithTheGlobalBatch (train/).
TEST(SyncBatchNorm, OneOrIdenticalReplicasMatchBatchNorm) {
  Generator gen(21);
  for (int replicas : {1, 2})
    for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      const Shape s{4, 6, 5, 3};
      Tensor x0 = ops::contiguous(ops::add_scalar(ops::randn(s, DType::F32, kCPU, &gen), 3.0), fmt);
      Tensor w0 = ops::randn({6}, DType::F32, kCPU, &gen), b0 = ops::randn({6}, DType::F32, kCPU, &gen);
      Tensor g = ops::contiguous(ops::randn(s, DType::F32, kCPU, &gen), fmt);
      auto run = [&](bool sync, Tensor& rm, Tensor& rv, std::vector<Tensor>& grads) {
        Tensor x = ops::clone(x0).requires_grad_(true);
        Tensor w = ops::clone(w0).requires_grad_(true), b = ops::clone(b0).requires_grad_(true);
        rm = ops::full({6}, 0.5);
        rv = ops::full({6}, 2.0);
        int calls = 0;
        Tensor y = sync ? sync_batch_norm(x, w, b, rm, rv, 0.1, 1e-5,
                                          [&](const Tensor& t) {
                                            ++calls;
                                            if (replicas == 2) ops::copy_(t, ops::mul_scalar(t, 2.0));
                                          })
                        : batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5);
        y.backward(g);
        if (sync) {
          EXPECT_EQ(calls, 3) << "two reductions forward, one backward";
        }
        grads = {y.detach(), x.grad(), w.grad(), b.grad()};
      };
      Tensor rm1, rv1, rm2, rv2;
      std::vector<Tensor> a, c;
      run(true, rm1, rv1, a);
      run(false, rm2, rv2, c);
      const std::string what = std::to_string(replicas) + (fmt == MemoryFormat::ChannelsLast ? " channels-last" : " nchw");
      expect_close(a[0], c[0], 1e-5, 1e-5, "y " + what);
      expect_close(a[1], c[1], 1e-4, 1e-5, "grad_input " + what);
      // weight/bias gradients are the replica's own: with two identical replicas, the same as one.
      expect_close(a[2], c[2], 1e-4, 1e-5, "grad_weight " + what);
      expect_close(a[3], c[3], 1e-4, 1e-5, "grad_bias " + what);
      expect_close(rm1, rm2, 1e-6, 1e-6, "running_mean " + what);
      // Unbiased with the global count: 2 replicas divide by 2M - 1, one process by M - 1.
      const double M = 4.0 * 5 * 3, n = replicas * M;
      Tensor rv_expected = replicas == 1 ? rv2
                                         : ops::add_scalar(ops::mul_scalar(ops::add_scalar(rv2, -0.9 * 2.0),
                                                                          (M - 1) / M * n / (n - 1)),
                                                           0.9 * 2.0);
      expect_close(rv1, rv_expected, 1e-5, 1e-6, "running_var " + what);
    }
}

TEST(SyncBatchNorm, GradientsMatchFiniteDifferences) {
  Generator gen(22);
  Tensor x = leaf({3, 2, 2, 2}, gen), w = leaf({2}, gen), b = leaf({2}, gen);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        return sync_batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), 0.1, 1e-5, [](const Tensor&) {});
      },
      {x, w, b}, 1e-6, "sync_batch_norm");
}

// ---- layer norm -------------------------------------------------------------------------------------

TEST(LayerNorm, MatchesNaiveReference) {
  Generator gen(7);
  const int64_t M = 6, A = 3, B = 4;
  Tensor x = ops::add_scalar(ops::randn({2, 3, A, B}, DType::F64, kCPU, &gen), 10.0);
  Tensor w = ops::randn({A, B}, DType::F64, kCPU, &gen), b = ops::randn({A, B}, DType::F64, kCPU, &gen);
  auto r = ops::layer_norm(x, {A, B}, w, b, 1e-5);
  EXPECT_EQ(r.mean.shape(), (Shape{2, 3, 1, 1}));
  const auto xv = x.tolist<double>(), wv = w.tolist<double>(), bv = b.tolist<double>();
  std::vector<double> y(xv.size()), mean, rstd;
  for (int64_t m = 0; m < M; ++m) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < A * B; ++j) mu += xv[m * A * B + j];
    mu /= A * B;
    for (int64_t j = 0; j < A * B; ++j) var += std::pow(xv[m * A * B + j] - mu, 2);
    var /= A * B;
    mean.push_back(mu);
    rstd.push_back(1 / std::sqrt(var + 1e-5));
    for (int64_t j = 0; j < A * B; ++j) y[m * A * B + j] = (xv[m * A * B + j] - mu) * rstd.back() * wv[j] + bv[j];
  }
  expect_close(r.out, Tensor::from_vector(y, x.shape()), 1e-12, 1e-12, "y");
  expect_close(ops::reshape(r.mean, {M}), Tensor::from_vector(mean), 1e-12, 1e-12, "mean");
  expect_close(ops::reshape(r.rstd, {M}), Tensor::from_vector(rstd), 1e-10, 1e-10, "rstd");
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  Generator gen(8);
  Tensor x = leaf({3, 2, 5}, gen), w = leaf({2, 5}, gen), b = leaf({2, 5}, gen);
  expect_gradients_match([](const std::vector<Tensor>& in) { return layer_norm(in[0], {2, 5}, in[1], in[2], 1e-5); },
                         {x, w, b}, 1e-6, "layer_norm 2 dims");
  Tensor x2 = leaf({4, 7}, gen);
  expect_gradients_match([](const std::vector<Tensor>& in) { return layer_norm(in[0], {7}); }, {x2}, 1e-6,
                         "layer_norm no affine");
  // A non-contiguous input (transposed view).
  Tensor x3 = leaf({6, 3}, gen), w3 = leaf({6}, gen);
  expect_gradients_match([](const std::vector<Tensor>& in) { return layer_norm(in[0].t(), {6}, in[1]); }, {x3, w3},
                         1e-6, "layer_norm transposed input");
}

TEST(LayerNorm, HalfAndThreads) {
  Generator gen(9);
  Tensor x = ops::randn({64, 300}, DType::F32, kCPU, &gen);
  Tensor w = ops::randn({300}, DType::F32, kCPU, &gen), b = ops::randn({300}, DType::F32, kCPU, &gen);
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor xh = ops::to_dtype(x, dt);
    auto r = ops::layer_norm(xh, {300}, w, b, 1e-5);
    auto ref = ops::layer_norm(ops::to_dtype(xh, DType::F64), {300}, ops::to_dtype(w, DType::F64),
                               ops::to_dtype(b, DType::F64), 1e-5);
    EXPECT_EQ(r.out.dtype(), dt);
    EXPECT_EQ(r.rstd.dtype(), DType::F32);
    const double u = dt == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    expect_close(r.out, ref.out, 4 * u, 2 * u, "16-bit layer_norm");
  }
  Tensor g = ops::randn({64, 300}, DType::F32, kCPU, &gen);
  auto run = [&] {
    auto r = ops::layer_norm(x, {300}, w, b, 1e-5);
    auto d = ops::layer_norm_backward(g, x, r.mean, r.rstd, w, 1, {true, true, true});
    return std::vector<Tensor>{r.out, d.grad_input, d.grad_weight, d.grad_bias};
  };
  auto one = with_threads(1, run);
  auto two = with_threads(2, run);
  for (size_t i = 0; i < one.size(); ++i) expect_bitwise_equal(one[i], two[i], "layer_norm output " + std::to_string(i));
}

TEST(LayerNorm, BadInputsAreClearErrors) {
  Tensor x = ops::zeros({2, 3, 4});
  std::string m = error_message([&] { ops::layer_norm(x, {3}, Tensor(), Tensor(), 1e-5); });
  EXPECT_NE(m.find("layer_norm"), std::string::npos) << m;
  EXPECT_NE(m.find("[3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3, 4]"), std::string::npos) << m;
  m = error_message([&] { ops::layer_norm(x, {3, 4}, ops::ones({4}), Tensor(), 1e-5); });
  EXPECT_NE(m.find("weight"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
}
