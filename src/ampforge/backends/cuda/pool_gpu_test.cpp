// CUDA max/avg/adaptive-avg pooling and nearest upsampling (forward and backward) against the CPU kernels:
// F32/F16/BF16, contiguous and channels-last operands, mixed layouts in the backward, strided views,
// odd shapes (channel counts that are not multiples of 32), padding, stride larger than the kernel,
// overlapping windows, dilation, ceil_mode, count_include_pad, NaN in max pooling, an empty batch, and
// bit-identical backward results from run to run. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ampforge/backends/cuda/gpu_testutil.h"
#include "ampforge/core/attrs.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

Tensor in_layout(const Tensor& t, bool cl) {
  return ops::contiguous(t, cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
}

std::string tag(DType dt, bool cl, const std::string& what) {
  return what + " " + std::string(dtype_name(dt)) + (cl ? " channels-last" : " contiguous");
}

Pool2dAttrs pool(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh = 1,
                 int64_t dw = 1, bool ceil_mode = false, bool include_pad = true) {
  Pool2dAttrs a;
  a.kernel[0] = kh, a.kernel[1] = kw;
  a.stride[0] = sh, a.stride[1] = sw;
  a.padding[0] = ph, a.padding[1] = pw;
  a.dilation[0] = dh, a.dilation[1] = dw;
  a.ceil_mode = ceil_mode;
  a.count_include_pad = include_pad;
  return a;
}

std::string attrs_str(const Pool2dAttrs& a) {
  // appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "literal" + std::string&&
  std::string s;
  auto put = [&s](const char* label, int64_t v) {
    s += label;
    s += std::to_string(v);
  };
  put("k", a.kernel[0]), put("x", a.kernel[1]), put(" s", a.stride[0]), put("x", a.stride[1]);
  put(" p", a.padding[0]), put("x", a.padding[1]), put(" d", a.dilation[0]), put("x", a.dilation[1]);
  if (a.ceil_mode) s += " ceil";
  if (!a.count_include_pad) s += " exclude_pad";
  return s;
}

// Max-pool configurations: overlapping windows, stride > kernel, padding, dilation, ceil_mode, asymmetric.
std::vector<Pool2dAttrs> max_configs() {
  return {pool(3, 3, 2, 2, 1, 1),       pool(2, 2, 2, 2, 0, 0),       pool(3, 3, 1, 1, 1, 1),
          pool(2, 2, 3, 3, 0, 0),       pool(3, 3, 2, 2, 1, 1, 2, 2, true), pool(3, 2, 1, 2, 1, 0),
          pool(2, 3, 2, 1, 1, 1, 1, 2, true)};
}

// Average-pool configurations (no dilation): padding with and without count_include_pad, ceil_mode.
std::vector<Pool2dAttrs> avg_configs() {
  return {pool(3, 3, 2, 2, 1, 1),       pool(3, 3, 2, 2, 1, 1, 1, 1, false, false), pool(2, 2, 2, 2, 0, 0),
          pool(2, 2, 3, 3, 0, 0),       pool(3, 3, 2, 2, 1, 1, 1, 1, true, false),  pool(3, 2, 1, 2, 1, 1),
          pool(3, 3, 2, 2, 0, 0, 1, 1, true, true)};
}

const std::vector<Shape> kShapes = {Shape{2, 3, 7, 9}, Shape{1, 37, 6, 5}};

}  // namespace

TEST(CudaPool, MaxPoolForwardAndBackward) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (bool cl : {false, true})
      for (const Shape& s : kShapes)
        for (const Pool2dAttrs& a : max_configs()) {
          const std::string what = tag(dt, cl, "max_pool2d " + s.str() + " " + attrs_str(a));
          Tensor x = in_layout(random_cpu(s, dt, 300), cl);
          auto [y, ind] = ops::max_pool2d(x, a);
          auto [gy_cuda, gind] = ops::max_pool2d(to_cuda(x), a);
          expect_matches_cpu(gy_cuda, y, what);
          expect_identical(gind, ind, what + " indices");  // ties resolve identically: same scan, strict >
          EXPECT_EQ(gy_cuda.is_contiguous(MemoryFormat::ChannelsLast), y.is_contiguous(MemoryFormat::ChannelsLast));
          Tensor go = in_layout(random_cpu(y.shape(), dt, 301), cl);
          Tensor gx = ops::max_pool2d_backward(go, ind, s, a);
          expect_matches_cpu(ops::max_pool2d_backward(to_cuda(go), to_cuda(ind), s, a), gx, what + " backward");
        }
}

TEST(CudaPool, MaxPoolNanAndMixedLayouts) {
  AF_SKIP_WITHOUT_CUDA();
  Tensor x = random_cpu(Shape{2, 3, 6, 7}, DType::F32, 302);
  std::vector<float> v = x.tolist<float>();
  v[5] = NAN;   // (0, 0, 0, 5)
  v[50] = NAN;  // (0, 1, 1, 1)
  v[51] = NAN;  // two NaNs in one window: the later one wins, as on the CPU
  x = Tensor::from_vector<float>(v, x.shape());
  const Pool2dAttrs a = pool(3, 3, 2, 2, 1, 1);
  for (bool cl : {false, true}) {
    Tensor xl = in_layout(x, cl);
    auto [y, ind] = ops::max_pool2d(xl, a);
    auto [gy, gind] = ops::max_pool2d(to_cuda(xl), a);
    expect_matches_cpu(gy, y, tag(DType::F32, cl, "max_pool2d with NaN"));
    expect_identical(gind, ind, tag(DType::F32, cl, "max_pool2d indices with NaN"));
    // backward with grad_output and indices in one layout and grad_input requested in the other
    Tensor go = in_layout(random_cpu(y.shape(), DType::F32, 303), !cl);
    const MemoryFormat f = cl ? MemoryFormat::Contiguous : MemoryFormat::ChannelsLast;
    expect_matches_cpu(ops::max_pool2d_backward(to_cuda(go), to_cuda(ind), x.shape(), a, f),
                       ops::max_pool2d_backward(go, ind, x.shape(), a, f), tag(DType::F32, cl, "mixed-layout backward"));
  }
}

TEST(CudaPool, AvgPoolForwardAndBackward) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (bool cl : {false, true})
      for (const Shape& s : kShapes)
        for (const Pool2dAttrs& a : avg_configs()) {
          const std::string what = tag(dt, cl, "avg_pool2d " + s.str() + " " + attrs_str(a));
          Tensor x = in_layout(random_cpu(s, dt, 310), cl);
          Tensor y = ops::avg_pool2d(x, a);
          expect_matches_cpu(ops::avg_pool2d(to_cuda(x), a), y, what);
          Tensor go = in_layout(random_cpu(y.shape(), dt, 311), cl);
          expect_matches_cpu(ops::avg_pool2d_backward(to_cuda(go), s, a), ops::avg_pool2d_backward(go, s, a),
                             what + " backward");
        }
}

TEST(CudaPool, AdaptiveAvgPoolForwardAndBackward) {
  AF_SKIP_WITHOUT_CUDA();
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{3, 2}, {1, 1}, {4, 7}, {7, 9}, {10, 13}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (bool cl : {false, true})
      for (auto [oh, ow] : sizes) {
        const Shape s{2, 35, 7, 9};
        const std::string what =
            tag(dt, cl, "adaptive_avg_pool2d " + std::to_string(oh) + "x" + std::to_string(ow));
        Tensor x = in_layout(random_cpu(s, dt, 320), cl);
        Tensor y = ops::adaptive_avg_pool2d(x, oh, ow);
        expect_matches_cpu(ops::adaptive_avg_pool2d(to_cuda(x), oh, ow), y, what);
        Tensor go = in_layout(random_cpu(y.shape(), dt, 321), cl);
        expect_matches_cpu(ops::adaptive_avg_pool2d_backward(to_cuda(go), s),
                           ops::adaptive_avg_pool2d_backward(go, s), what + " backward");
      }
}

TEST(CudaPool, UpsampleNearestForwardAndBackward) {
  AF_SKIP_WITHOUT_CUDA();
  const std::vector<std::pair<int64_t, int64_t>> scales = {{2, 2}, {2, 3}, {1, 1}, {3, 1}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (bool cl : {false, true})
      for (auto [sh, sw] : scales) {
        const Shape s{2, 33, 5, 4};
        const std::string what = tag(dt, cl, "upsample_nearest2d " + std::to_string(sh) + "x" + std::to_string(sw));
        Tensor x = in_layout(random_cpu(s, dt, 330), cl);
        Tensor y = ops::upsample_nearest2d(x, sh, sw);
        expect_identical(ops::upsample_nearest2d(to_cuda(x), sh, sw), y, what);  // a copy: exact
        Tensor go = in_layout(random_cpu(y.shape(), dt, 331), cl);
        expect_matches_cpu(ops::upsample_nearest2d_backward(to_cuda(go), s, sh, sw),
                           ops::upsample_nearest2d_backward(go, s, sh, sw), what + " backward");
      }
}

TEST(CudaPool, StridedViewsAndEmptyBatch) {
  AF_SKIP_WITHOUT_CUDA();
  // A view that is neither contiguous nor channels-last: every 2nd column of a wider image.
  Tensor full = random_cpu(Shape{2, 5, 8, 14}, DType::F32, 340);
  Tensor view = ops::slice(full, 3, 0, 14, 2);
  Tensor view_cuda = ops::slice(to_cuda(full), 3, 0, 14, 2);
  const Pool2dAttrs a = pool(3, 3, 2, 2, 1, 1);
  auto [y, ind] = ops::max_pool2d(view, a);
  auto [gy, gind] = ops::max_pool2d(view_cuda, a);
  expect_matches_cpu(gy, y, "max_pool2d of a strided view");
  expect_identical(gind, ind, "max_pool2d indices of a strided view");
  expect_matches_cpu(ops::avg_pool2d(view_cuda, a), ops::avg_pool2d(view, a), "avg_pool2d of a strided view");
  expect_matches_cpu(ops::adaptive_avg_pool2d(view_cuda, 3, 2), ops::adaptive_avg_pool2d(view, 3, 2),
                     "adaptive_avg_pool2d of a strided view");
  expect_identical(ops::upsample_nearest2d(view_cuda, 2, 2), ops::upsample_nearest2d(view, 2, 2),
                   "upsample_nearest2d of a strided view");

  // N == 0: empty outputs of the right shapes, no launch.
  for (bool cl : {false, true}) {
    Tensor x = in_layout(random_cpu(Shape{0, 3, 6, 6}, DType::F32, 341), cl);
    auto [ey, eind] = ops::max_pool2d(x, a);
    auto [egy, egind] = ops::max_pool2d(to_cuda(x), a);
    EXPECT_EQ(egy.shape(), ey.shape());
    EXPECT_EQ(egind.shape(), eind.shape());
    EXPECT_EQ(ops::max_pool2d_backward(to_cuda(ey), egind, x.shape(), a).shape(), x.shape());
    EXPECT_EQ(ops::avg_pool2d(to_cuda(x), a).shape(), ops::avg_pool2d(x, a).shape());
    EXPECT_EQ(ops::avg_pool2d_backward(to_cuda(ey), x.shape(), a).shape(), x.shape());
    EXPECT_EQ(ops::adaptive_avg_pool2d(to_cuda(x), 2, 2).shape(), (Shape{0, 3, 2, 2}));
    EXPECT_EQ(ops::upsample_nearest2d(to_cuda(x), 2, 2).shape(), (Shape{0, 3, 12, 12}));
    EXPECT_EQ(ops::upsample_nearest2d_backward(to_cuda(ops::upsample_nearest2d(x, 2, 2)), x.shape(), 2, 2).shape(),
              x.shape());
  }
}

TEST(CudaPool, BackwardIsBitIdenticalRunToRun) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::BF16})
    for (bool cl : {false, true}) {
      const Shape s{4, 40, 17, 19};
      const Pool2dAttrs a = pool(3, 3, 1, 1, 1, 1);  // every input in 9 windows
      Tensor x = to_cuda(in_layout(random_cpu(s, dt, 350), cl));
      auto [y, ind] = ops::max_pool2d(x, a);
      Tensor go = to_cuda(in_layout(random_cpu(y.shape(), dt, 351), cl));
      expect_identical(ops::max_pool2d_backward(go, ind, s, a), to_cpu(ops::max_pool2d_backward(go, ind, s, a)),
                       tag(dt, cl, "max_pool2d_backward twice"));
      expect_identical(ops::avg_pool2d_backward(go, s, a), to_cpu(ops::avg_pool2d_backward(go, s, a)),
                       tag(dt, cl, "avg_pool2d_backward twice"));
      Tensor ga = to_cuda(in_layout(random_cpu(Shape{4, 40, 5, 6}, dt, 352), cl));
      expect_identical(ops::adaptive_avg_pool2d_backward(ga, s), to_cpu(ops::adaptive_avg_pool2d_backward(ga, s)),
                       tag(dt, cl, "adaptive_avg_pool2d_backward twice"));
      Tensor gu = to_cuda(in_layout(random_cpu(Shape{4, 40, 34, 38}, dt, 353), cl));
      expect_identical(ops::upsample_nearest2d_backward(gu, s, 2, 2),
                       to_cpu(ops::upsample_nearest2d_backward(gu, s, 2, 2)),
                       tag(dt, cl, "upsample_nearest2d_backward twice"));
    }
}
