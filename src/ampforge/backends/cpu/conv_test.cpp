// Tests of the CPU convolution, pooling and upsampling kernels, their ops/ validation and their autograd
// functions:
//   - every kernel against direct loops written here in F64, over many configurations (stride, padding,
//     dilation, groups, depthwise, 1x1, ceil_mode, count_include_pad), both memory formats and all four
//     floating dtypes; tolerances from the per-dtype table below;
//   - NCHW and channels-last give identical values where they share a code path;
//   - batches larger than the scratch limit (Conv2dAttrs::max_scratch_bytes);
//   - central finite differences (F64) of every differentiable function;
//   - error messages for bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ampforge/autograd/autocast.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/backends/cpu/conv_test_util.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/env_test_util.h"
#include "ampforge/util/thread_pool.h"

using namespace ampforge;
using ampforge::testutil::conv_attrs;
using ampforge::testutil::ConvCase;

namespace {

constexpr MemoryFormat kNCHW = MemoryFormat::Contiguous;
constexpr MemoryFormat kNHWC = MemoryFormat::ChannelsLast;
const DType kDtypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16};

// Tolerance table. `round`: unit roundoff of the storage dtype (the output is rounded once);
// `acc`: unit roundoff of the compute type (F64 for F64, float otherwise), charged once per accumulated term;
// `sub`: spacing of the storage dtype's subnormals (an absolute floor on rounding error).
struct Tol {
  double round, acc, sub;
};
Tol tol_of(DType d) {
  switch (d) {
    case DType::F64:
      return {std::ldexp(1.0, -53), std::ldexp(1.0, -53), std::ldexp(1.0, -1074)};
    case DType::F32:
      return {std::ldexp(1.0, -24), std::ldexp(1.0, -24), std::ldexp(1.0, -149)};
    case DType::F16:
      return {std::ldexp(1.0, -11), std::ldexp(1.0, -24), std::ldexp(1.0, -24)};
    case DType::BF16:
      return {std::ldexp(1.0, -8), std::ldexp(1.0, -24), std::ldexp(1.0, -133)};
    default:
      return {0, 0, 0};
  }
}

// |got - ref| <= (round + terms * acc) * mag + sub, with mag the sum of |terms| (the error bound of a sum
// of `terms` products), times 2 for slack.
void expect_close(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<double>& mag,
                  DType d, int64_t terms, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const Tol t = tol_of(d);
  const double f = 2.0 * (t.round + static_cast<double>(terms) * t.acc);
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double tol = f * mag[i] + 2.0 * t.sub;
    if (!(std::abs(got[i] - ref[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " expected " << ref[i] << " (tol " << tol
                    << ")";
      ++bad;
    }
  }
}

Generator& gen() {
  static Generator g(20240611);
  return g;
}

// A copy of t with exactly the strides of layout `mf` (also when size-1 dims make both layouts match,
// where contiguous(ChannelsLast) would return t itself).
Tensor in_layout(const Tensor& t, MemoryFormat mf) {
  Tensor o = Tensor::empty(t.shape(), t.dtype(), kCPU, mf);
  ops::copy_(o, t);
  return o;
}

// Random normal values in `dtype` and layout `mf`.
Tensor rnd(const Shape& s, DType dtype = DType::F64, MemoryFormat mf = kNCHW) {
  return in_layout(ops::to_dtype(ops::randn(s, DType::F64, kCPU, &gen()), dtype), mf);
}

std::vector<double> vals(const Tensor& t) { return t.tolist<double>(); }

int64_t idx4(const Shape& s, int64_t n, int64_t c, int64_t h, int64_t w) {
  return ((n * s[1] + c) * s[2] + h) * s[3] + w;
}

// ---- convolution reference ----------------------------------------------------------------------

struct ConvRef {
  Shape ys;
  std::vector<double> y, ymag;    // forward and sum of |terms|
  std::vector<double> gx, gxmag;  // input gradient for upstream gradient gy
  std::vector<double> gw, gwmag;  // weight gradient
};

// Direct loops over logical (NCHW) values. gy may be empty (forward only).
ConvRef conv_ref(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w, const Shape& ws,
                 const std::vector<double>* b, const std::vector<double>& gy, const Conv2dAttrs& a) {
  ConvRef r;
  r.ys = ops::conv2d_output_shape(xs, ws, a);
  const int64_t N = xs[0], Co = ws[0], Cg = ws[1], KH = ws[2], KW = ws[3], OH = r.ys[2], OW = r.ys[3];
  const int64_t Cog = Co / a.groups;
  r.y.assign(shape_numel(r.ys), 0);
  r.ymag.assign(r.y.size(), 0);
  r.gx.assign(x.size(), 0);
  r.gxmag.assign(x.size(), 0);
  r.gw.assign(w.size(), 0);
  r.gwmag.assign(w.size(), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Co; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t yi = idx4(r.ys, n, o, oh, ow);
          double acc = b ? (*b)[o] : 0.0, mag = b ? std::abs((*b)[o]) : 0.0;
          const double g = gy.empty() ? 0.0 : gy[yi];
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t ih = oh * a.stride[0] - a.padding[0] + kh * a.dilation[0];
                const int64_t iw = ow * a.stride[1] - a.padding[1] + kw * a.dilation[1];
                if (ih < 0 || ih >= xs[2] || iw < 0 || iw >= xs[3]) continue;
                const int64_t xi = idx4(xs, n, (o / Cog) * Cg + c, ih, iw), wi = idx4(ws, o, c, kh, kw);
                acc += x[xi] * w[wi];
                mag += std::abs(x[xi] * w[wi]);
                r.gx[xi] += g * w[wi];
                r.gxmag[xi] += std::abs(g * w[wi]);
                r.gw[wi] += g * x[xi];
                r.gwmag[wi] += std::abs(g * x[xi]);
              }
          r.y[yi] = acc;
          r.ymag[yi] = mag;
        }
  return r;
}

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {"plain3x3", 2, 3, 7, 6, 4, 3, 3, conv_attrs(1, 1, 0, 0, 1, 1, 1), true},
      {"stride2_pad1", 2, 3, 9, 8, 5, 3, 3, conv_attrs(2, 2, 1, 1, 1, 1, 1), true},
      {"dilation2", 1, 2, 10, 9, 3, 3, 3, conv_attrs(1, 1, 2, 2, 2, 2, 1), false},
      {"groups2", 2, 4, 6, 6, 6, 3, 3, conv_attrs(1, 1, 1, 1, 1, 1, 2), true},
      {"depthwise", 2, 4, 7, 7, 4, 3, 3, conv_attrs(1, 1, 1, 1, 1, 1, 4), true},
      {"depthwise_x2", 1, 3, 5, 5, 6, 3, 3, conv_attrs(2, 2, 1, 1, 1, 1, 3), false},
      {"pointwise", 3, 5, 4, 4, 7, 1, 1, conv_attrs(1, 1, 0, 0, 1, 1, 1), true},
      {"pointwise_groups2", 2, 4, 3, 5, 6, 1, 1, conv_attrs(1, 1, 0, 0, 1, 1, 2), false},
      {"pointwise_stride2", 2, 3, 5, 6, 4, 1, 1, conv_attrs(2, 2, 0, 0, 1, 1, 1), true},
      {"asymmetric", 2, 3, 8, 9, 4, 2, 3, conv_attrs(2, 1, 1, 0, 1, 2, 1), true},
      {"one_channel_in", 4, 1, 8, 8, 8, 3, 3, conv_attrs(1, 1, 1, 1, 1, 1, 1), true},
      {"kernel_is_input", 2, 3, 5, 5, 2, 5, 5, conv_attrs(1, 1, 0, 0, 1, 1, 1), true},
      {"pad_wider_than_kernel", 1, 2, 4, 4, 2, 2, 2, conv_attrs(1, 1, 2, 3, 1, 1, 1), true},
      {"stride3_groups_dil", 3, 6, 11, 10, 9, 3, 2, conv_attrs(3, 2, 1, 2, 2, 3, 3), true},
  };
  return cases;
}

bool is_pointwise(const ConvCase& c) {
  return c.KH == 1 && c.KW == 1 && c.a.stride[0] == 1 && c.a.stride[1] == 1 && c.a.padding[0] == 0 &&
         c.a.padding[1] == 0;
}

struct ConvRun {
  Tensor y, gx, gw;
};

ConvRun run_conv(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy, const Conv2dAttrs& a) {
  ConvRun r;
  r.y = ops::conv2d(x, w, b, a);
  r.gx = ops::conv2d_backward_input(gy, w, x.shape(), a, ops::conv2d_memory_format(x, w));
  r.gw = ops::conv2d_backward_weight(gy, x, w.shape(), a);
  return r;
}

// ---- finite differences -------------------------------------------------------------------------

// Memory offset (elements, from data_ptr) of logical element i.
int64_t offset_of(const Tensor& t, int64_t i) {
  int64_t off = 0;
  for (int d = t.dim() - 1; d >= 0; --d) {
    off += (i % t.size(d)) * t.stride(d);
    i /= t.size(d);
  }
  return off;
}

// Checks the gradients autograd gives for <f(inputs), r> against central differences (eps 1e-6) for every
// element of every input (F64 leaves that require grad).
void gradcheck(const std::string& what, const std::function<Tensor(const std::vector<Tensor>&)>& f,
               const std::vector<Tensor>& inputs) {
  Tensor out = f(inputs);
  Tensor r = rnd(out.shape());
  std::vector<Tensor> grads = autograd::grad({out}, inputs, {r});
  autograd::NoGradGuard ng;
  auto eval = [&] { return ops::sum(ops::mul(f(inputs), r)).item(); };
  const double eps = 1e-6;
  for (size_t k = 0; k < inputs.size(); ++k) {
    ASSERT_TRUE(grads[k].defined()) << what << ": no gradient for input " << k;
    ASSERT_EQ(grads[k].shape(), inputs[k].shape()) << what;
    const std::vector<double> g = vals(grads[k]);
    double* p = inputs[k].data<double>();
    int bad = 0;
    for (int64_t i = 0; i < inputs[k].numel() && bad < 5; ++i) {
      double& v = p[offset_of(inputs[k], i)];
      const double v0 = v;
      v = v0 + eps;
      const double fp = eval();
      v = v0 - eps;
      const double fm = eval();
      v = v0;
      const double num = (fp - fm) / (2 * eps);
      // Central differences: truncation O(eps^2) and cancellation O(|f| * 1e-16 / eps).
      if (!(std::abs(num - g[i]) <= 1e-6 * (1 + std::abs(num)))) {
        ADD_FAILURE() << what << ": input " << k << " element " << i << " analytic " << g[i] << " numeric " << num;
        ++bad;
      }
    }
  }
}

Tensor leaf(const Shape& s, MemoryFormat mf = kNCHW) { return rnd(s, DType::F64, mf).requires_grad_(); }

// Expects `fn` to throw an InvalidArgument error whose message contains every string in `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << parts[0];
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

}  // namespace

// ---- convolution ----------------------------------------------------------------------------------

TEST(Conv2d, MatchesDirectLoops) {
  for (const ConvCase& c : conv_cases())
    for (MemoryFormat mf : {kNCHW, kNHWC})
      for (DType dt : kDtypes)
        for (int64_t scratch : {int64_t{0}, int64_t{1}}) {  // default batching; one image at a time
          const std::string what =
              fmt::format("{} {} {} scratch={}", c.name, mf == kNHWC ? "NHWC" : "NCHW", dtype_name(dt), scratch);
          Conv2dAttrs a = c.a;
          a.max_scratch_bytes = scratch;
          const Shape xs{c.N, c.C, c.H, c.W}, ws{c.Co, c.C / a.groups, c.KH, c.KW};
          Tensor x = rnd(xs, dt, mf);
          // A channels-last weight exercises the kernel's strided weight packing.
          Tensor w = rnd(ws, dt, scratch ? kNHWC : kNCHW);
          Tensor b = c.bias ? rnd({c.Co}, dt) : Tensor();
          const Shape ys = ops::conv2d_output_shape(xs, ws, a);
          Tensor gy = rnd(ys, dt, mf);
          const std::vector<double> bv = c.bias ? vals(b) : std::vector<double>();
          const ConvRef ref = conv_ref(vals(x), xs, vals(w), ws, c.bias ? &bv : nullptr, vals(gy), a);
          const ConvRun got = run_conv(x, w, b, gy, a);
          ASSERT_EQ(got.y.shape(), ref.ys) << what;
          EXPECT_EQ(got.y.dtype(), dt) << what;
          // Channels-last when x or the weight is; the input gradient follows.
          const MemoryFormat want = mf == kNHWC || scratch ? kNHWC : kNCHW;
          EXPECT_EQ(ops::conv2d_memory_format(x, w), want) << what;
          EXPECT_TRUE(got.y.is_contiguous(want)) << what;
          EXPECT_TRUE(got.gx.is_contiguous(want)) << what;
          const int64_t K = ws[1] * c.KH * c.KW + 1;
          expect_close(vals(got.y), ref.y, ref.ymag, dt, K, what + " forward");
          expect_close(vals(got.gx), ref.gx, ref.gxmag, dt, c.Co * c.KH * c.KW, what + " grad_input");
          expect_close(vals(got.gw), ref.gw, ref.gwmag, dt, c.N * ys[2] * ys[3], what + " grad_weight");
        }
}

TEST(Conv2d, LayoutsGiveIdenticalValues) {
  // Both layouts go through the same staging, im2col and GEMM calls, so results agree bit for bit; the F32
  // NCHW 1x1 path is a differently shaped GEMM and agrees to rounding. A property of the im2col path:
  // oneDNN runs the two layouts on different kernels (conv_onednn_test.cpp compares it with im2col).
  const testutil::ScopedEnv im2col("AMPFORGE_CPU_CONV", "im2col");
  for (const ConvCase& c : conv_cases()) {
    const Shape xs{c.N, c.C, c.H, c.W}, ws{c.Co, c.C / c.a.groups, c.KH, c.KW};
    Tensor x = rnd(xs, DType::F32), w = rnd(ws, DType::F32), b = rnd({c.Co}, DType::F32);
    Tensor gy = rnd(ops::conv2d_output_shape(xs, ws, c.a), DType::F32);
    const ConvRun p = run_conv(x, w, b, gy, c.a);
    const ConvRun q = run_conv(in_layout(x, kNHWC), w, b, in_layout(gy, kNHWC), c.a);
    if (!is_pointwise(c)) {
      EXPECT_EQ(vals(p.y), vals(q.y)) << c.name;
      EXPECT_EQ(vals(p.gx), vals(q.gx)) << c.name;
      EXPECT_EQ(vals(p.gw), vals(q.gw)) << c.name;
    } else {
      const auto py = vals(p.y), qy = vals(q.y);
      for (size_t i = 0; i < py.size(); ++i) EXPECT_NEAR(py[i], qy[i], 1e-5 * (1 + std::abs(py[i]))) << c.name;
    }
  }
}

TEST(Conv2d, ThreadCountDoesNotChangeResults) {
  // Enough images for image tiles on every thread count tried (tile = 6 images of 12x12x144 F32 columns):
  // forward, input gradient and the block-summed weight gradient are identical for 1, 2 and 3 threads,
  // and match the direct loops. A property of the im2col path: oneDNN's weight gradients sum per-thread
  // partials, so their rounding depends on the thread count.
  const testutil::ScopedEnv im2col("AMPFORGE_CPU_CONV", "im2col");
  const int saved = get_num_threads();
  const Conv2dAttrs a = conv_attrs(1, 1, 1, 1, 1, 1, 1);
  const Shape xs{32, 16, 12, 12}, ws{8, 16, 3, 3};
  for (DType dt : {DType::F32, DType::BF16})
    for (MemoryFormat mf : {kNCHW, kNHWC}) {
      const std::string what = fmt::format("{} {}", dtype_name(dt), mf == kNHWC ? "NHWC" : "NCHW");
      Tensor x = rnd(xs, dt, mf), w = rnd(ws, dt), b = rnd({8}, dt);
      Tensor gy = rnd(ops::conv2d_output_shape(xs, ws, a), dt, mf);
      std::vector<ConvRun> runs;
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        runs.push_back(run_conv(x, w, b, gy, a));
      }
      set_num_threads(saved);
      for (size_t i = 1; i < runs.size(); ++i) {
        EXPECT_EQ(vals(runs[i].y), vals(runs[0].y)) << what;
        EXPECT_EQ(vals(runs[i].gx), vals(runs[0].gx)) << what;
        EXPECT_EQ(vals(runs[i].gw), vals(runs[0].gw)) << what;
      }
      const std::vector<double> bv = vals(b);
      const ConvRef ref = conv_ref(vals(x), xs, vals(w), ws, &bv, vals(gy), a);
      expect_close(vals(runs[0].y), ref.y, ref.ymag, dt, 16 * 9 + 1, what + " forward");
      expect_close(vals(runs[0].gx), ref.gx, ref.gxmag, dt, 8 * 9, what + " grad_input");
      expect_close(vals(runs[0].gw), ref.gw, ref.gwmag, dt, 32 * 144, what + " grad_weight");
    }
}

TEST(Conv2d, BatchesLargerThanTheScratchLimit) {
  // 5 images, scratch for 2: batches of 2, 2, 1, with NCHW staging buffers in the budget too.
  for (MemoryFormat mf : {kNCHW, kNHWC}) {
    Conv2dAttrs a = conv_attrs(1, 1, 1, 1, 1, 1, 1);
    const Shape xs{5, 3, 6, 7}, ws{4, 3, 3, 3};
    const int64_t per_image = (6 * 7 * 27 + (mf == kNCHW ? 6 * 7 * (3 + 4) : 0)) * 8;
    a.max_scratch_bytes = 2 * per_image + per_image / 2;
    Tensor x = rnd(xs, DType::F64, mf), w = rnd(ws), b = rnd({4});
    Tensor gy = rnd({5, 4, 6, 7}, DType::F64, mf);
    const std::vector<double> bv = vals(b);
    const ConvRef ref = conv_ref(vals(x), xs, vals(w), ws, &bv, vals(gy), a);
    const ConvRun got = run_conv(x, w, b, gy, a);
    expect_close(vals(got.y), ref.y, ref.ymag, DType::F64, 28, "limited forward");
    expect_close(vals(got.gx), ref.gx, ref.gxmag, DType::F64, 36, "limited grad_input");
    expect_close(vals(got.gw), ref.gw, ref.gwmag, DType::F64, 5 * 42, "limited grad_weight");
  }
}

TEST(Conv2d, ChannelSlicesAndConcatsOfChannelsLastImagesStayChannelsLast) {
  // YOLOv8's C2f: a channels-last conv output is split along channels (views that are neither contiguous
  // nor channels-last-contiguous), convolved, and concatenated along channels. Every step keeps
  // channels-last, as in PyTorch (is_channels_last_strides_2d; cat follows its first input), so the
  // convolutions run on channels-last kernels instead of an NCHW copy. (im2col: both layouts then give the
  // same values bit for bit.)
  const testutil::ScopedEnv im2col("AMPFORGE_CPU_CONV", "im2col");
  Tensor x = rnd({2, 8, 5, 6}, DType::F32, kNHWC);
  const Tensor half = ops::narrow(x, 1, 4, 4);
  ASSERT_FALSE(half.is_contiguous(kNHWC));
  ASSERT_FALSE(half.is_contiguous());
  EXPECT_EQ(ops::image_memory_format(half), kNHWC);
  Tensor w = rnd({4, 4, 3, 3}, DType::F32);
  const Conv2dAttrs a = conv_attrs(1, 1, 1, 1, 1, 1, 1);
  const Tensor y = ops::conv2d(half, w, Tensor(), a);
  EXPECT_TRUE(y.is_contiguous(kNHWC));
  EXPECT_EQ(vals(y), vals(ops::conv2d(ops::contiguous(half), w, Tensor(), a)));
  const Tensor c = cat({ops::narrow(x, 1, 0, 4), half, y}, 1);
  EXPECT_TRUE(c.is_contiguous(kNHWC));
  EXPECT_EQ(vals(ops::narrow(c, 1, 4, 4)), vals(half));
  // An NCHW image's slices stay NCHW.
  Tensor xn = rnd({2, 8, 5, 6}, DType::F32);
  EXPECT_EQ(ops::image_memory_format(ops::narrow(xn, 1, 4, 4)), kNCHW);
  EXPECT_TRUE(cat({ops::narrow(xn, 1, 0, 4), ops::narrow(xn, 1, 4, 4)}, 1).is_contiguous());
}

TEST(Conv2d, OutputKeepsTheInputLayout) {
  // A single-channel image with channels-last strides stays channels-last (the first layer of a
  // channels-last CNN); with NCHW strides it is NCHW unless the weight is channels-last (PyTorch's rule).
  Tensor x = rnd({2, 1, 5, 5}, DType::F32, kNHWC);
  Tensor w = rnd({4, 1, 3, 3}, DType::F32);
  EXPECT_EQ(ops::image_memory_format(x), kNHWC);
  EXPECT_TRUE(ops::conv2d(x, w, Tensor(), {}).is_contiguous(kNHWC));
  Tensor xn = rnd({2, 1, 5, 5}, DType::F32);
  EXPECT_EQ(ops::image_memory_format(xn), kNCHW);
  Tensor yn = ops::conv2d(xn, w, Tensor(), {});
  EXPECT_TRUE(yn.is_contiguous() && !yn.is_contiguous(kNHWC));
  EXPECT_TRUE(ops::conv2d(xn, in_layout(w, kNHWC), Tensor(), {}).is_contiguous(kNHWC));
  // The two layouts may run on different kernels (oneDNN's for the channels-last output, im2col's for the NCHW one,
  // depending on what oneDNN offers this CPU), whose 9-term sums round in different orders: both are held to the
  // F32 bound of a 9-term sum against the F64 reference, not to each other's bits.
  const ConvRef r1 = conv_ref(vals(xn), xn.shape(), vals(w), w.shape(), nullptr, {}, {});
  expect_close(vals(yn), r1.y, r1.ymag, DType::F32, 9, "NCHW input and weight");
  expect_close(vals(ops::conv2d(xn, in_layout(w, kNHWC), Tensor(), {})), r1.y, r1.ymag, DType::F32, 9,
               "NCHW input, channels-last weight");
  // Neither layout (a permuted view): computed from a copy, output contiguous.
  Tensor xp = ops::permute(rnd({2, 5, 5, 3}, DType::F64), {0, 3, 2, 1});
  Tensor w3 = rnd({2, 3, 3, 3});
  Tensor y = ops::conv2d(xp, w3, Tensor(), {});
  EXPECT_TRUE(y.is_contiguous());
  const ConvRef ref = conv_ref(vals(xp), xp.shape(), vals(w3), w3.shape(), nullptr, {}, {});
  expect_close(vals(y), ref.y, ref.ymag, DType::F64, 28, "permuted input");
}

TEST(Conv2d, AutogradMatchesFiniteDifferences) {
  const Conv2dAttrs a = conv_attrs(2, 1, 1, 2, 1, 2, 2);
  for (MemoryFormat mf : {kNCHW, kNHWC}) {
    gradcheck("conv2d grouped strided dilated",
              [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], a); },
              {leaf({2, 4, 6, 5}, mf), leaf({6, 2, 3, 3}), leaf({6})});
    gradcheck("conv2d 1x1", [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], {}); },
              {leaf({2, 3, 3, 4}, mf), leaf({5, 3, 1, 1}), leaf({5})});
    gradcheck("conv2d no bias", [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], Tensor(), {}); },
              {leaf({1, 2, 4, 4}, mf), leaf({3, 2, 2, 2})});
  }
}

TEST(Conv2d, AutocastRunsInLowerPrecisionWithF32Gradients) {
  // Both layouts, with an expanded gradient (from sum) and a dense one: every bias-gradient path.
  for (MemoryFormat mf : {kNCHW, kNHWC})
    for (bool dense : {false, true}) {
      const autograd::AutocastState saved = autograd::autocast_state(DeviceType::CPU);
      autograd::set_autocast_state(DeviceType::CPU, {true, DType::BF16});
      Tensor x = rnd({2, 3, 5, 5}, DType::F32, mf);
      Tensor w = rnd({4, 3, 3, 3}, DType::F32).requires_grad_();
      Tensor b = rnd({4}, DType::F32).requires_grad_();
      Tensor y = conv2d(x, w, b, conv_attrs(1, 1, 1, 1, 1, 1, 1));
      autograd::set_autocast_state(DeviceType::CPU, saved);
      EXPECT_EQ(y.dtype(), DType::BF16);
      EXPECT_TRUE(y.is_contiguous(mf));
      if (dense)
        y.backward(ops::ones_like(y));
      else
        y.sum().backward();
      ASSERT_TRUE(w.grad().defined());
      EXPECT_EQ(w.grad().dtype(), DType::F32);
      EXPECT_EQ(b.grad().dtype(), DType::F32);
      // d sum(y) / d b = N * OH * OW per channel (exact in BF16).
      EXPECT_EQ(vals(b.grad()), std::vector<double>(4, 50.0));
    }
}

TEST(Conv2d, BadArgumentsAreClearErrors) {
  Tensor x = rnd({2, 3, 8, 8}, DType::F32), w = rnd({4, 3, 3, 3}, DType::F32);
  expect_error([&] { ops::conv2d(rnd({3, 8, 8}, DType::F32), w, Tensor(), {}); }, {"conv2d", "4-D input", "[3, 8, 8]"});
  expect_error([&] { ops::conv2d(x, rnd({4, 3, 3}, DType::F32), Tensor(), {}); }, {"conv2d", "4-D weight"});
  expect_error(
      [&] {
        ops::conv2d(x, rnd({4, 2, 3, 3}, DType::F32), Tensor(), {});
      },
      {"conv2d", "input has 3 channels", "2 * 1 = 2"});
  expect_error(
      [&] {
        ops::conv2d(x, rnd({4, 1, 3, 3}, DType::F32), Tensor(), conv_attrs(1, 1, 0, 0, 1, 1, 2));
      },
      {"conv2d", "groups (2) must divide the input channels (3)"});
  expect_error(
      [&] {
        ops::conv2d(rnd({2, 4, 8, 8}, DType::F32), rnd({3, 2, 3, 3}, DType::F32), Tensor(),
                    conv_attrs(1, 1, 0, 0, 1, 1, 2));
      },
      {"conv2d", "groups (2) must divide the output channels (3"});
  expect_error(
      [&] {
        ops::conv2d(x, rnd({4, 3, 9, 3}, DType::F32), Tensor(), {});
      },
      {"conv2d", "larger than the padded input height", "8 + 2 * 0 = 8"});
  expect_error([&] { ops::conv2d(x, w, Tensor(), conv_attrs(1, 1, 0, 0, 4, 1, 1)); },
               {"conv2d", "effective 9", "larger than the padded input"});
  expect_error([&] { ops::conv2d(x, w, Tensor(), conv_attrs(0, 1, 0, 0, 1, 1, 1)); },
               {"conv2d", "stride must be positive"});
  expect_error([&] { ops::conv2d(x, w, Tensor(), conv_attrs(1, 1, 0, 0, 1, 0, 1)); },
               {"conv2d", "dilation must be positive"});
  expect_error([&] { ops::conv2d(x, w, Tensor(), conv_attrs(1, 1, -1, 0, 1, 1, 1)); },
               {"conv2d", "padding must be non-negative"});
  expect_error([&] { ops::conv2d(x, w, Tensor(), conv_attrs(1, 1, 0, 0, 1, 1, 0)); },
               {"conv2d", "groups must be positive"});
  expect_error(
      [&] {
        ops::conv2d(x, rnd({4, 3, 3, 3}, DType::F64), Tensor(), {});
      },
      {"conv2d", "same dtype", "f32", "f64"});
  expect_error([&] { ops::conv2d(x, w, rnd({5}, DType::F32), {}); }, {"conv2d", "bias must have shape [4]", "[5]"});
  expect_error(
      [&] {
        ops::conv2d(ops::zeros({2, 3, 8, 8}, DType::I64), w, Tensor(), {});
      },
      {"conv2d", "floating-point"});
  expect_error(
      [&] {
        ops::conv2d_backward_input(rnd({2, 4, 5, 5}, DType::F32), w, x.shape(), {});
      },
      {"conv2d_backward_input", "[2, 4, 6, 6]", "[2, 4, 5, 5]"});
  expect_error(
      [&] {
        ops::conv2d_backward_weight(rnd({2, 4, 6, 6}, DType::F32), rnd({2, 3, 8, 8}, DType::F64), w.shape(), {});
      },
      {"conv2d_backward_weight", "same dtype"});
}

// ---- pooling references -------------------------------------------------------------------------------

namespace {

Pool2dAttrs pool_attrs(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh = 1,
                       int64_t dw = 1, bool ceil_mode = false, bool count_include_pad = true) {
  Pool2dAttrs a;
  a.kernel[0] = kh, a.kernel[1] = kw, a.stride[0] = sh, a.stride[1] = sw, a.padding[0] = ph, a.padding[1] = pw;
  a.dilation[0] = dh, a.dilation[1] = dw, a.ceil_mode = ceil_mode, a.count_include_pad = count_include_pad;
  return a;
}

struct PoolRef {
  Shape ys;
  std::vector<double> y, ymag;
  std::vector<int64_t> idx;
  std::vector<double> gx, gxmag;
};

// Max pooling by direct loops over the window's positions ih = oh*s - p + kh*d inside the input: a NaN
// wins (a later NaN replaces an earlier one, as PyTorch); ties keep the first position.
PoolRef max_pool_ref(const std::vector<double>& x, const Shape& xs, const std::vector<double>& gy,
                     const Pool2dAttrs& a) {
  PoolRef r;
  const int64_t OH = ops::pool2d_output_size(xs[2], a.kernel[0], a.stride[0], a.padding[0], a.dilation[0], a.ceil_mode);
  const int64_t OW = ops::pool2d_output_size(xs[3], a.kernel[1], a.stride[1], a.padding[1], a.dilation[1], a.ceil_mode);
  r.ys = Shape{xs[0], xs[1], OH, OW};
  r.y.assign(shape_numel(r.ys), 0);
  r.idx.assign(r.y.size(), -1);
  r.gx.assign(x.size(), 0);
  for (int64_t n = 0; n < xs[0]; ++n)
    for (int64_t c = 0; c < xs[1]; ++c)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double best = -std::numeric_limits<double>::infinity();
          int64_t arg = -1;
          for (int64_t kh = 0; kh < a.kernel[0]; ++kh)
            for (int64_t kw = 0; kw < a.kernel[1]; ++kw) {
              const int64_t ih = oh * a.stride[0] - a.padding[0] + kh * a.dilation[0];
              const int64_t iw = ow * a.stride[1] - a.padding[1] + kw * a.dilation[1];
              if (ih < 0 || ih >= xs[2] || iw < 0 || iw >= xs[3]) continue;
              const double v = x[idx4(xs, n, c, ih, iw)];
              if (arg < 0 || v > best || std::isnan(v)) {
                best = v;
                arg = ih * xs[3] + iw;
              }
            }
          const int64_t yi = idx4(r.ys, n, c, oh, ow);
          r.y[yi] = best;
          r.idx[yi] = arg;
          if (!gy.empty() && arg >= 0) r.gx[idx4(xs, n, c, 0, 0) + arg] += gy[yi];
        }
  r.ymag.assign(r.y.size(), 0);
  for (size_t i = 0; i < r.y.size(); ++i) r.ymag[i] = std::abs(r.y[i]);
  r.gxmag.assign(r.gx.size(), 0);
  return r;
}

// Window sums over boxes given by `box(oh, ow, h0, h1, w0, w1, div)`; backward spreads gy / div.
template <class Box>
PoolRef mean_ref(const std::vector<double>& x, const Shape& xs, const Shape& ys, const std::vector<double>& gy,
                 Box box) {
  PoolRef r;
  r.ys = ys;
  r.y.assign(shape_numel(ys), 0);
  r.ymag.assign(r.y.size(), 0);
  r.gx.assign(x.size(), 0);
  r.gxmag.assign(x.size(), 0);
  for (int64_t n = 0; n < xs[0]; ++n)
    for (int64_t c = 0; c < xs[1]; ++c)
      for (int64_t oh = 0; oh < ys[2]; ++oh)
        for (int64_t ow = 0; ow < ys[3]; ++ow) {
          int64_t h0, h1, w0, w1, div;
          box(oh, ow, h0, h1, w0, w1, div);
          const int64_t yi = idx4(ys, n, c, oh, ow);
          double s = 0, m = 0;
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) {
              const int64_t xi = idx4(xs, n, c, ih, iw);
              s += x[xi];
              m += std::abs(x[xi]);
              if (!gy.empty()) {
                r.gx[xi] += gy[yi] / static_cast<double>(div);
                r.gxmag[xi] += std::abs(gy[yi] / static_cast<double>(div));
              }
            }
          if (h0 < h1 && w0 < w1) {
            r.y[yi] = s / static_cast<double>(div);
            r.ymag[yi] = m / static_cast<double>(div);
          }
        }
  return r;
}

// avg_pool2d as PyTorch documents it: the window clipped to the padded input; divisor with or without padding.
PoolRef avg_pool_ref(const std::vector<double>& x, const Shape& xs, const std::vector<double>& gy,
                     const Pool2dAttrs& a) {
  const int64_t OH = ops::pool2d_output_size(xs[2], a.kernel[0], a.stride[0], a.padding[0], 1, a.ceil_mode);
  const int64_t OW = ops::pool2d_output_size(xs[3], a.kernel[1], a.stride[1], a.padding[1], 1, a.ceil_mode);
  return mean_ref(x, xs, Shape{xs[0], xs[1], OH, OW}, gy,
                  [&](int64_t oh, int64_t ow, int64_t& h0, int64_t& h1, int64_t& w0, int64_t& w1, int64_t& div) {
                    h0 = oh * a.stride[0] - a.padding[0];
                    w0 = ow * a.stride[1] - a.padding[1];
                    h1 = std::min(h0 + a.kernel[0], xs[2] + a.padding[0]);
                    w1 = std::min(w0 + a.kernel[1], xs[3] + a.padding[1]);
                    const int64_t padded = (h1 - h0) * (w1 - w0);
                    h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
                    h1 = std::min(h1, xs[2]), w1 = std::min(w1, xs[3]);
                    div = a.count_include_pad ? padded : (h1 - h0) * (w1 - w0);
                  });
}

PoolRef adaptive_ref(const std::vector<double>& x, const Shape& xs, const std::vector<double>& gy, int64_t OH,
                     int64_t OW) {
  return mean_ref(x, xs, Shape{xs[0], xs[1], OH, OW}, gy,
                  [&](int64_t oh, int64_t ow, int64_t& h0, int64_t& h1, int64_t& w0, int64_t& w1, int64_t& div) {
                    h0 = static_cast<int64_t>(std::floor(static_cast<double>(oh * xs[2]) / OH));
                    h1 = static_cast<int64_t>(std::ceil(static_cast<double>((oh + 1) * xs[2]) / OH));
                    w0 = static_cast<int64_t>(std::floor(static_cast<double>(ow * xs[3]) / OW));
                    w1 = static_cast<int64_t>(std::ceil(static_cast<double>((ow + 1) * xs[3]) / OW));
                    div = (h1 - h0) * (w1 - w0);
                  });
}

PoolRef upsample_ref(const std::vector<double>& x, const Shape& xs, const std::vector<double>& gy, int64_t sh,
                     int64_t sw) {
  PoolRef r;
  r.ys = Shape{xs[0], xs[1], xs[2] * sh, xs[3] * sw};
  r.y.assign(shape_numel(r.ys), 0);
  r.gx.assign(x.size(), 0);
  r.gxmag.assign(x.size(), 0);
  for (int64_t n = 0; n < xs[0]; ++n)
    for (int64_t c = 0; c < xs[1]; ++c)
      for (int64_t oh = 0; oh < r.ys[2]; ++oh)
        for (int64_t ow = 0; ow < r.ys[3]; ++ow) {
          const int64_t yi = idx4(r.ys, n, c, oh, ow), xi = idx4(xs, n, c, oh / sh, ow / sw);
          r.y[yi] = x[xi];
          if (!gy.empty()) {
            r.gx[xi] += gy[yi];
            r.gxmag[xi] += std::abs(gy[yi]);
          }
        }
  r.ymag.assign(r.y.size(), 0);
  for (size_t i = 0; i < r.y.size(); ++i) r.ymag[i] = std::abs(r.y[i]);
  return r;
}

}  // namespace

TEST(Pool2d, OutputSizesFollowPyTorch) {
  EXPECT_EQ(ops::pool2d_output_size(7, 3, 2, 1, 1, false), 4);
  EXPECT_EQ(ops::pool2d_output_size(6, 3, 2, 0, 1, false), 2);
  EXPECT_EQ(ops::pool2d_output_size(6, 3, 2, 0, 1, true), 3);  // ceil adds a partial window
  EXPECT_EQ(ops::pool2d_output_size(5, 2, 2, 1, 1, false), 3);
  EXPECT_EQ(ops::pool2d_output_size(5, 2, 2, 1, 1, true), 3);    // ceil's extra window would start in the right padding
  EXPECT_EQ(ops::pool2d_output_size(10, 3, 3, 1, 2, false), 3);  // dilated: effective kernel 5
  EXPECT_EQ(ops::pool2d_output_size(10, 3, 3, 1, 2, true), 4);
  EXPECT_EQ(ops::pool2d_output_size(28, 2, 2, 0, 1, false), 14);
}

TEST(Pool2d, MaxPoolMatchesDirectLoops) {
  const std::vector<std::pair<const char*, Pool2dAttrs>> cases = {
      {"2x2s2", pool_attrs(2, 2, 2, 2, 0, 0)},
      {"3x3s2p1", pool_attrs(3, 3, 2, 2, 1, 1)},
      {"3x3s2p1_ceil", pool_attrs(3, 3, 2, 2, 1, 1, 1, 1, true)},
      {"3x2s1_dil2", pool_attrs(3, 2, 1, 2, 1, 1, 2, 2)},
      {"2x3s3_ceil", pool_attrs(2, 3, 3, 3, 1, 0, 1, 1, true)},
      {"overlap_s1", pool_attrs(3, 3, 1, 1, 1, 1)},
      // Disjoint windows leaving gaps (stride 3 > kernel 2) and holes (dilation 2 inside a window of extent 3).
      {"2x2s3_gaps", pool_attrs(2, 2, 3, 3, 0, 0)},
      {"2x2s3_dil2", pool_attrs(2, 2, 3, 3, 0, 0, 2, 2)},
  };
  const Shape xs{2, 5, 7, 8};
  for (const auto& [name, a] : cases)
    for (MemoryFormat mf : {kNCHW, kNHWC})
      for (DType dt : kDtypes) {
        const std::string what =
            fmt::format("max_pool2d {} {} {}", name, mf == kNHWC ? "NHWC" : "NCHW", dtype_name(dt));
        Tensor x = rnd(xs, dt, mf);
        auto [y, idx] = ops::max_pool2d(x, a);
        Tensor gy = rnd(y.shape(), dt, mf);
        const PoolRef ref = max_pool_ref(vals(x), xs, vals(gy), a);
        ASSERT_EQ(y.shape(), ref.ys) << what;
        EXPECT_EQ(idx.dtype(), DType::I64);
        if (mf == kNHWC) {
          EXPECT_TRUE(y.is_contiguous(kNHWC) && idx.is_contiguous(kNHWC)) << what;
        }
        EXPECT_EQ(vals(y), ref.y) << what;  // a selection: exact in every dtype
        EXPECT_EQ(idx.tolist<int64_t>(), ref.idx) << what;
        Tensor gx = ops::max_pool2d_backward(gy, idx, xs, a, mf);
        EXPECT_TRUE(gx.is_contiguous(mf)) << what;
        // Overlapping windows add several 16-bit values in float, then round once: bound by sum of |terms|.
        const std::vector<double> gyv = vals(gy);
        std::vector<double> absum(ref.gx.size(), 0);
        const auto iv = idx.tolist<int64_t>();
        for (size_t i = 0; i < gyv.size(); ++i) {
          const int64_t plane = static_cast<int64_t>(i) / (ref.ys[2] * ref.ys[3]);
          absum[plane * xs[2] * xs[3] + iv[i]] += std::abs(gyv[i]);
        }
        expect_close(vals(gx), ref.gx, absum, dt, 9, what + " backward");
        if (mf == kNHWC) {
          // The gradient of a flatten arrives NCHW while the indices and gx are channels-last.
          Tensor gx2 = ops::max_pool2d_backward(gy.contiguous(kNCHW), idx, xs, a, mf);
          EXPECT_TRUE(gx2.is_contiguous(mf)) << what;
          expect_close(vals(gx2), ref.gx, absum, dt, 9, what + " backward, NCHW gradient");
        }
      }
}

TEST(Pool2d, MaxPoolNanWinsAndTiesKeepTheFirst) {
  Tensor x = Tensor::from_vector<float>({1, 3, 3, 2, NAN, 0, 5, 5, 5}, Shape{1, 1, 3, 3});
  for (MemoryFormat mf : {kNCHW, kNHWC}) {
    auto [y, idx] = ops::max_pool2d(mf == kNHWC ? in_layout(x, kNHWC) : x, pool_attrs(2, 2, 1, 1, 0, 0));
    const auto v = vals(y);
    EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1]) && std::isnan(v[2]) && std::isnan(v[3]));
    EXPECT_EQ(idx.tolist<int64_t>(), (std::vector<int64_t>{4, 4, 4, 4}));
    auto [y2, idx2] = ops::max_pool2d(ops::narrow(x, 2, 2, 1), pool_attrs(1, 2, 1, 1, 0, 0));
    EXPECT_EQ(idx2.tolist<int64_t>(), (std::vector<int64_t>{0, 1}));  // ties: first position in the row
  }
}

TEST(Pool2d, AvgPoolMatchesDirectLoops) {
  const std::vector<std::pair<const char*, Pool2dAttrs>> cases = {
      {"2x2s2", pool_attrs(2, 2, 2, 2, 0, 0)},
      {"3x3s2p1_incl", pool_attrs(3, 3, 2, 2, 1, 1)},
      {"3x3s2p1_excl", pool_attrs(3, 3, 2, 2, 1, 1, 1, 1, false, false)},
      {"3x3s2p1_ceil_incl", pool_attrs(3, 3, 2, 2, 1, 1, 1, 1, true, true)},
      {"3x3s2p1_ceil_excl", pool_attrs(3, 3, 2, 2, 1, 1, 1, 1, true, false)},
      {"2x3s3p1_ceil", pool_attrs(2, 3, 3, 3, 1, 1, 1, 1, true, true)},
      {"3x1s1", pool_attrs(3, 1, 1, 1, 1, 0)},
  };
  const Shape xs{2, 4, 8, 7};
  for (const auto& [name, a] : cases)
    for (MemoryFormat mf : {kNCHW, kNHWC})
      for (DType dt : kDtypes) {
        const std::string what =
            fmt::format("avg_pool2d {} {} {}", name, mf == kNHWC ? "NHWC" : "NCHW", dtype_name(dt));
        Tensor x = rnd(xs, dt, mf);
        Tensor y = ops::avg_pool2d(x, a);
        Tensor gy = rnd(y.shape(), dt, mf);
        const PoolRef ref = avg_pool_ref(vals(x), xs, vals(gy), a);
        ASSERT_EQ(y.shape(), ref.ys) << what;
        if (mf == kNHWC) {
          EXPECT_TRUE(y.is_contiguous(kNHWC)) << what;
        }
        expect_close(vals(y), ref.y, ref.ymag, dt, 10, what);
        Tensor gx = ops::avg_pool2d_backward(gy, xs, a);
        expect_close(vals(gx), ref.gx, ref.gxmag, dt, 10, what + " backward");
      }
}

TEST(Pool2d, AdaptiveAvgPoolMatchesDirectLoops) {
  const std::vector<std::pair<Shape, std::pair<int64_t, int64_t>>> cases = {
      {{2, 3, 7, 5}, {3, 2}},  // windows of uneven size
      {{2, 3, 4, 4}, {1, 1}},  // global average
      {{1, 2, 3, 3}, {5, 4}},  // more outputs than inputs: overlapping windows
      {{2, 4, 8, 8}, {4, 4}},  // divisible
  };
  for (const auto& [xs, os] : cases)
    for (MemoryFormat mf : {kNCHW, kNHWC})
      for (DType dt : kDtypes) {
        const std::string what = fmt::format("adaptive_avg_pool2d {} -> {}x{} {} {}", xs.str(), os.first, os.second,
                                             mf == kNHWC ? "NHWC" : "NCHW", dtype_name(dt));
        Tensor x = rnd(xs, dt, mf);
        Tensor y = ops::adaptive_avg_pool2d(x, os.first, os.second);
        Tensor gy = rnd(y.shape(), dt, mf);
        const PoolRef ref = adaptive_ref(vals(x), xs, vals(gy), os.first, os.second);
        ASSERT_EQ(y.shape(), ref.ys) << what;
        expect_close(vals(y), ref.y, ref.ymag, dt, 64, what);
        expect_close(vals(ops::adaptive_avg_pool2d_backward(gy, xs)), ref.gx, ref.gxmag, dt, 8, what + " backward");
      }
}

TEST(Upsample, NearestMatchesDirectLoops) {
  for (auto [sh, sw] : {std::pair<int64_t, int64_t>{2, 2}, {3, 2}, {1, 4}})
    for (MemoryFormat mf : {kNCHW, kNHWC})
      for (DType dt : kDtypes) {
        const std::string what =
            fmt::format("upsample_nearest2d {}x{} {} {}", sh, sw, mf == kNHWC ? "NHWC" : "NCHW", dtype_name(dt));
        const Shape xs{2, 3, 4, 5};
        Tensor x = rnd(xs, dt, mf);
        Tensor y = ops::upsample_nearest2d(x, sh, sw);
        Tensor gy = rnd(y.shape(), dt, mf);
        const PoolRef ref = upsample_ref(vals(x), xs, vals(gy), sh, sw);
        ASSERT_EQ(y.shape(), ref.ys) << what;
        EXPECT_EQ(vals(y), ref.y) << what;
        expect_close(vals(ops::upsample_nearest2d_backward(gy, xs, sh, sw)), ref.gx, ref.gxmag, dt, sh * sw, what);
      }
}

TEST(Pool2d, LayoutsGiveIdenticalValues) {
  // Both loop orders visit every window in the same order, so results agree bit for bit.
  Tensor x = rnd({2, 6, 9, 8}, DType::F32);
  Tensor xl = in_layout(x, kNHWC);
  const Pool2dAttrs a = pool_attrs(3, 3, 2, 2, 1, 1, 1, 1, true, false);
  auto [y1, i1] = ops::max_pool2d(x, a);
  auto [y2, i2] = ops::max_pool2d(xl, a);
  EXPECT_EQ(vals(y1), vals(y2));
  Tensor gy = rnd(y1.shape(), DType::F32);
  EXPECT_EQ(vals(ops::max_pool2d_backward(gy, i1, x.shape(), a)),
            vals(ops::max_pool2d_backward(in_layout(gy, kNHWC), i2, x.shape(), a)));
  EXPECT_EQ(vals(ops::avg_pool2d(x, a)), vals(ops::avg_pool2d(xl, a)));
  EXPECT_EQ(vals(ops::avg_pool2d_backward(gy, x.shape(), a)),
            vals(ops::avg_pool2d_backward(in_layout(gy, kNHWC), x.shape(), a)));
  EXPECT_EQ(vals(ops::adaptive_avg_pool2d(x, 3, 5)), vals(ops::adaptive_avg_pool2d(xl, 3, 5)));
  EXPECT_EQ(vals(ops::upsample_nearest2d(x, 2, 3)), vals(ops::upsample_nearest2d(xl, 2, 3)));
  Tensor gu = rnd({2, 6, 18, 24}, DType::F32);
  EXPECT_EQ(vals(ops::upsample_nearest2d_backward(gu, x.shape(), 2, 3)),
            vals(ops::upsample_nearest2d_backward(in_layout(gu, kNHWC), x.shape(), 2, 3)));
  // A gradient that is a channel slice of a channels-last tensor (a concatenation's backward), into a channels-
  // last gradient: the same values as from the contiguous gradient.
  Tensor wide = in_layout(rnd({2, 10, 18, 24}, DType::F32), kNHWC);
  Tensor slice = ops::slice(wide, 1, 3, 9, 1);
  ASSERT_FALSE(slice.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(vals(ops::upsample_nearest2d_backward(slice, x.shape(), 2, 3, MemoryFormat::ChannelsLast)),
            vals(ops::upsample_nearest2d_backward(ops::contiguous(slice), x.shape(), 2, 3)));
}

TEST(Pool2d, AutogradMatchesFiniteDifferences) {
  for (MemoryFormat mf : {kNCHW, kNHWC}) {
    // Random inputs: windows have no ties closer than eps, so max pooling is differentiable at them.
    gradcheck("max_pool2d ceil",
              [](const std::vector<Tensor>& in) { return max_pool2d(in[0], pool_attrs(3, 3, 2, 2, 1, 1, 1, 1, true)); },
              {leaf({2, 3, 7, 6}, mf)});
    gradcheck("max_pool2d dilated",
              [](const std::vector<Tensor>& in) { return max_pool2d(in[0], pool_attrs(2, 3, 1, 2, 1, 1, 2, 2)); },
              {leaf({1, 2, 6, 7}, mf)});
    gradcheck("avg_pool2d excl",
              [](const std::vector<Tensor>& in) {
                return avg_pool2d(in[0], pool_attrs(3, 3, 2, 2, 1, 1, 1, 1, true, false));
              },
              {leaf({2, 3, 7, 6}, mf)});
    gradcheck("avg_pool2d incl",
              [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], pool_attrs(2, 3, 2, 1, 1, 1)); },
              {leaf({1, 2, 5, 6}, mf)});
    gradcheck("adaptive_avg_pool2d", [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 3, 2); },
              {leaf({2, 3, 7, 5}, mf)});
    gradcheck("upsample_nearest2d", [](const std::vector<Tensor>& in) { return upsample_nearest2d(in[0], 2, 3); },
              {leaf({2, 3, 3, 4}, mf)});
  }
}

TEST(Pool2d, BadArgumentsAreClearErrors) {
  Tensor x = rnd({2, 3, 8, 8}, DType::F32);
  expect_error(
      [&] {
        ops::max_pool2d(rnd({3, 8, 8}, DType::F32), pool_attrs(2, 2, 2, 2, 0, 0));
      },
      {"max_pool2d", "4-D input", "[3, 8, 8]"});
  expect_error([&] { ops::max_pool2d(x, pool_attrs(3, 3, 1, 1, 2, 0)); },
               {"max_pool2d", "padding must be at most half the kernel size", "padding 2 for kernel 3"});
  expect_error([&] { ops::max_pool2d(x, pool_attrs(2, 2, 0, 2, 0, 0)); }, {"max_pool2d", "stride must be positive"});
  expect_error([&] { ops::max_pool2d(x, pool_attrs(0, 2, 1, 1, 0, 0)); },
               {"max_pool2d", "kernel size must be positive"});
  expect_error([&] { ops::max_pool2d(x, pool_attrs(2, 2, 1, 1, -1, 0)); },
               {"max_pool2d", "padding must be non-negative"});
  expect_error([&] { ops::max_pool2d(x, pool_attrs(2, 2, 1, 1, 0, 0, 0, 1)); },
               {"max_pool2d", "dilation must be positive"});
  expect_error([&] { ops::max_pool2d(x, pool_attrs(9, 2, 1, 1, 0, 0)); }, {"max_pool2d", "too small", "8x8"});
  expect_error([&] { ops::avg_pool2d(x, pool_attrs(2, 2, 1, 1, 0, 0, 2, 1)); },
               {"avg_pool2d", "dilation is not supported"});
  expect_error(
      [&] {
        ops::avg_pool2d(ops::zeros({2, 3, 8, 8}, DType::I32), pool_attrs(2, 2, 2, 2, 0, 0));
      },
      {"avg_pool2d", "floating-point"});
  expect_error([&] { ops::adaptive_avg_pool2d(x, 0, 2); }, {"adaptive_avg_pool2d", "output size must be positive"});
  expect_error([&] { ops::upsample_nearest2d(x, 0, 2); }, {"upsample_nearest2d", "scale factors"});
  expect_error(
      [&] {
        ops::avg_pool2d_backward(rnd({2, 3, 3, 3}, DType::F32), x.shape(), pool_attrs(2, 2, 2, 2, 0, 0));
      },
      {"avg_pool2d_backward", "[2, 3, 4, 4]", "[2, 3, 3, 3]"});
  // (not a structured binding: clang 14, the fuzz and sanitizer builds' compiler, cannot capture one in a lambda)
  const Tensor y = ops::max_pool2d(x, pool_attrs(2, 2, 2, 2, 0, 0)).first;
  expect_error(
      [&] { ops::max_pool2d_backward(y, ops::zeros(y.shape(), DType::I32), x.shape(), pool_attrs(2, 2, 2, 2, 0, 0)); },
      {"max_pool2d_backward", "indices must be I64"});
  expect_error(
      [&] {
        ops::upsample_nearest2d_backward(rnd({2, 3, 16, 15}, DType::F32), x.shape(), 2, 2);
      },
      {"upsample_nearest2d_backward", "[2, 3, 16, 16]"});
}
