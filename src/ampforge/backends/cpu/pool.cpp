// CPU pooling and upsampling: max_pool2d (+ indices), avg_pool2d, adaptive_avg_pool2d, upsample_nearest2d,
// and their backward kernels.
//
// Two loop orders. When every 4-D operand is channels-last, work is split over rows (n, oh) or images
// and the innermost loop runs over C, contiguous in memory (one bulk 16-bit conversion per pixel).
// Otherwise work is split over (n, c) planes and every access goes through the tensors' strides, so any
// mix of layouts is correct (ops/ hands over NCHW or channels-last tensors).
//
// Conventions, as PyTorch:
//   max_pool2d   window rows h0 = oh*s - p .. min(h0 + (k-1)*d + 1, H) step d, h0 moved up by d while
//                negative; NaN wins; indices (I64, same layout as the output) are h*W + w in the plane,
//                starting at the window's first in-bounds position.
//   avg_pool2d   window h0 = oh*s - p .. min(h0 + k, H + p); divisor = its size with padding
//                (count_include_pad) or the clipped size; an empty clipped window gives 0.
//   adaptive     rows floor(oh*H/OH) .. ceil((oh+1)*H/OH); divisor = window size.
//   upsample     out[oh, ow] = in[oh / sh, ow / sw] (integer scales).
// Backward kernels overwrite grad_in. Scatter-style gradients (max, avg) accumulate into a compute-type
// buffer per plane or image, so 16-bit gradients are rounded once; summation order is fixed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cpu {
namespace {

template <class D, class S>
inline D convert(S v) {
  if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>)
    return D(static_cast<float>(v));
  else
    return static_cast<D>(v);
}

bool all_channels_last(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (!t->is_contiguous(MemoryFormat::ChannelsLast)) return false;
  return true;
}

// Units of work per parallel task: about 32K inner iterations.
inline int64_t grain_for(int64_t work_per_unit) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_unit));
}

struct Dims4 {
  int64_t N, C, H, W;
};
Dims4 dims_of(const Tensor& t) { return {t.size(0), t.size(1), t.size(2), t.size(3)}; }

// A 4-D tensor's strides, read once: Tensor::stride is an out-of-line call, and in the per-plane loops below
// it made max_pool2d_backward on NCHW tensors of the small CNN's first pool (128 x 32 x 28 x 28, F32) take
// 13.2 ms instead of 0.7-0.9 ms.
struct Strides4 {
  int64_t n, c, h, w;
};
Strides4 strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

// A clipped averaging window: rows [h0, h1), cols [w0, w1), divided by `div` (empty: output 0).
struct Box {
  int64_t h0, h1, w0, w1, div;
  bool empty() const { return h0 >= h1 || w0 >= w1; }
};

// ---- max pooling ----------------------------------------------------------------------------------

struct MaxWindow {
  int64_t k, s, p, d, in;
  // First in-bounds position and exclusive end; step d.
  void range(int64_t o, int64_t& b, int64_t& e) const {
    b = o * s - p;
    e = std::min(b + (k - 1) * d + 1, in);
    while (b < 0) b += d;
  }
};

template <class S>
void max_pool_forward(const Tensor& x, const Tensor& y, const Tensor& ind, const Pool2dAttrs& a) {
  using A = compute_t<S>;
  const Dims4 in = dims_of(x), out = dims_of(y);
  const MaxWindow wh{a.kernel[0], a.stride[0], a.padding[0], a.dilation[0], in.H};
  const MaxWindow ww{a.kernel[1], a.stride[1], a.padding[1], a.dilation[1], in.W};
  const S* xp = static_cast<const S*>(x.data_ptr());
  S* yp = static_cast<S*>(y.data_ptr());
  int64_t* ip = static_cast<int64_t*>(ind.data_ptr());
  const A ninf = -std::numeric_limits<A>::infinity();
  const int64_t C = in.C, win = a.kernel[0] * a.kernel[1];

  if (all_channels_last({&x, &y, &ind})) {
    // Vectorised over C: the running argmax is kept as int32 (same lane count as float under AVX2) and
    // widened to the int64 index output once per output pixel; the select is branch-free.
    AF_CHECK(in.H * in.W < (int64_t{1} << 31), "max_pool2d: planes larger than 2^31 elements are not supported");
    parallel_for(in.N * out.H, grain_for(out.W * win * C), [&](int64_t r0, int64_t r1) {
      std::vector<A> row(C), best(C);
      std::vector<int32_t> arg(C);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / out.H, oh = r % out.H;
        int64_t h0, h1;
        wh.range(oh, h0, h1);
        for (int64_t ow = 0; ow < out.W; ++ow) {
          int64_t w0, w1;
          ww.range(ow, w0, w1);
          A* bp = best.data();
          int32_t* ap = arg.data();
          for (int64_t c = 0; c < C; ++c) {
            bp[c] = ninf;
            ap[c] = static_cast<int32_t>(h0 * in.W + w0);
          }
          for (int64_t ih = h0; ih < h1; ih += wh.d)
            for (int64_t iw = w0; iw < w1; iw += ww.d) {
              const S* src = xp + ((n * in.H + ih) * in.W + iw) * C;
              const A* v;
              if constexpr (std::is_same_v<S, A>) {
                v = src;  // F32/F64: read the tensor directly
              } else {
                load_n<S, A>(src, row.data(), C);
                v = row.data();
              }
              const int32_t idx = static_cast<int32_t>(ih * in.W + iw);
              for (int64_t c = 0; c < C; ++c) {  // NaN wins, as in PyTorch (v != v)
                const bool take = (v[c] > bp[c]) | (v[c] != v[c]);
                bp[c] = take ? v[c] : bp[c];
                ap[c] = take ? idx : ap[c];
              }
            }
          const int64_t o = (r * out.W + ow) * C;
          store_n<S, A>(bp, yp + o, C);
          for (int64_t c = 0; c < C; ++c) ip[o + c] = ap[c];
        }
      }
    });
    return;
  }
  const Strides4 x_st = strides_of(x);
  const Strides4 y_st = strides_of(y);
  const Strides4 ind_st = strides_of(ind);
  parallel_for(in.N * C, grain_for(out.H * out.W * win), [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl) {
      const int64_t n = pl / C, c = pl % C;
      const S* xb = xp + n * x_st.n + c * x_st.c;
      const int64_t yb = n * y_st.n + c * y_st.c, ib = n * ind_st.n + c * ind_st.c;
      for (int64_t oh = 0; oh < out.H; ++oh) {
        int64_t h0, h1;
        wh.range(oh, h0, h1);
        for (int64_t ow = 0; ow < out.W; ++ow) {
          int64_t w0, w1;
          ww.range(ow, w0, w1);
          A best = ninf;
          int64_t arg = h0 * in.W + w0;
          for (int64_t ih = h0; ih < h1; ih += wh.d)
            for (int64_t iw = w0; iw < w1; iw += ww.d) {
              const A v = static_cast<A>(xb[ih * x_st.h + iw * x_st.w]);
              if (v > best || std::isnan(v)) {
                best = v;
                arg = ih * in.W + iw;
              }
            }
          yp[yb + oh * y_st.h + ow * y_st.w] = convert<S>(best);
          ip[ib + oh * ind_st.h + ow * ind_st.w] = arg;
        }
      }
    }
  });
}

// grad_in (N, C, H, W) = scatter-add of grad_out at the saved indices. An index outside the plane (only
// possible for a window with no in-bounds position, whose output is -inf) contributes nothing.
template <class S>
void max_pool_backward(const Tensor& gy, const Tensor& ind, const Tensor& gx, const Pool2dAttrs& a) {
  using A = compute_t<S>;
  const Dims4 in = dims_of(gx), out = dims_of(gy);
  const S* gyp = static_cast<const S*>(gy.data_ptr());
  const int64_t* ip = static_cast<const int64_t*>(ind.data_ptr());
  S* gxp = static_cast<S*>(gx.data_ptr());
  const int64_t C = in.C, HW = in.H * in.W, OHW = out.H * out.W;

  // The channels-last forms need the indices and gx channels-last; gy may come in any layout: a flatten's
  // backward hands the last pool of a CNN an NCHW gradient (at the first pool's shape, 12.5 ms per call through
  // the per-plane form below before its strides were hoisted, 0.55 ms here). load_gy reads the C gradients of
  // output pixel (n, q).
  const bool gy_cl = gy.is_contiguous(MemoryFormat::ChannelsLast);
  const Strides4 gs = strides_of(gy);
  auto load_gy = [&](int64_t n, int64_t q, A* g) {
    if (gy_cl) {
      load_n<S, A>(gyp + (n * OHW + q) * C, g, C);
      return;
    }
    const S* src = gyp + n * gs.n + (q / out.W) * gs.h + (q % out.W) * gs.w;
    for (int64_t c = 0; c < C; ++c) g[c] = static_cast<A>(src[c * gs.c]);
  };
  if (all_channels_last({&ind, &gx}) && a.kernel[0] * a.kernel[1] <= 64) {
    // Gather form, vectorised over C: every output pixel adds its gradient to each position of its window
    // whose index matches (a select, no scatter), so windows that overlap still accumulate correctly.
    const MaxWindow wh{a.kernel[0], a.stride[0], a.padding[0], a.dilation[0], in.H};
    const MaxWindow ww{a.kernel[1], a.stride[1], a.padding[1], a.dilation[1], in.W};
    parallel_for(in.N, grain_for(OHW * C), [&](int64_t n0, int64_t n1) {
      // F32/F64 accumulate in gx itself (no plane-sized buffer per call and no copy: ResNet-50's stem pool backward at
      // batch 8, 2.49-2.67 -> 2.08-2.30 ms, min of 20, three alternations); 16-bit in a compute-type plane, converted
      // at the end.
      std::vector<A> plane(std::is_same_v<S, A> ? 0 : HW * C), g(C);
      std::vector<int32_t> idx32(C);
      for (int64_t n = n0; n < n1; ++n) {
        A* const acc = std::is_same_v<S, A> ? reinterpret_cast<A*>(gxp + n * HW * C) : plane.data();
        std::fill(acc, acc + HW * C, A(0));
        for (int64_t oh = 0; oh < out.H; ++oh) {
          int64_t h0, h1;
          wh.range(oh, h0, h1);
          for (int64_t ow = 0; ow < out.W; ++ow) {
            int64_t w0, w1;
            ww.range(ow, w0, w1);
            const int64_t o = ((n * out.H + oh) * out.W + ow) * C;
            load_gy(n, oh * out.W + ow, g.data());
            for (int64_t c = 0; c < C; ++c) idx32[c] = static_cast<int32_t>(ip[o + c]);
            const A* gp = g.data();
            const int32_t* xp = idx32.data();
            for (int64_t ih = h0; ih < h1; ih += wh.d)
              for (int64_t iw = w0; iw < w1; iw += ww.d) {
                const int32_t here = static_cast<int32_t>(ih * in.W + iw);
                A* dst = acc + (ih * in.W + iw) * C;
                for (int64_t c = 0; c < C; ++c) dst[c] += xp[c] == here ? gp[c] : A(0);
              }
          }
        }
        if constexpr (!std::is_same_v<S, A>) store_n<S, A>(acc, gxp + n * HW * C, HW * C);
      }
    });
    return;
  }
  if (all_channels_last({&ind, &gx})) {
    parallel_for(in.N, grain_for(OHW * C), [&](int64_t n0, int64_t n1) {
      std::vector<A> acc(HW * C), g(C);
      for (int64_t n = n0; n < n1; ++n) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t q = 0; q < OHW; ++q) {
          const int64_t o = (n * OHW + q) * C;
          load_gy(n, q, g.data());
          for (int64_t c = 0; c < C; ++c) {
            const int64_t i = ip[o + c];
            if (i >= 0 && i < HW) acc[i * C + c] += g[c];
          }
        }
        store_n<S, A>(acc.data(), gxp + n * HW * C, HW * C);
      }
    });
    return;
  }
  // Any other layout: one (n, c) plane at a time.
  const Strides4 is = strides_of(ind), xs = strides_of(gx);
  parallel_for(in.N * C, grain_for(OHW + HW), [&](int64_t p0, int64_t p1) {
    std::vector<A> acc(HW);
    for (int64_t pl = p0; pl < p1; ++pl) {
      const int64_t n = pl / C, c = pl % C;
      std::fill(acc.begin(), acc.end(), A(0));
      const S* gb = gyp + n * gs.n + c * gs.c;
      const int64_t* ib = ip + n * is.n + c * is.c;
      for (int64_t oh = 0; oh < out.H; ++oh)
        for (int64_t ow = 0; ow < out.W; ++ow) {
          const int64_t i = ib[oh * is.h + ow * is.w];
          if (i >= 0 && i < HW) acc[i] += static_cast<A>(gb[oh * gs.h + ow * gs.w]);
        }
      S* xb = gxp + n * xs.n + c * xs.c;
      for (int64_t ih = 0; ih < in.H; ++ih)
        for (int64_t iw = 0; iw < in.W; ++iw) xb[ih * xs.h + iw * xs.w] = convert<S>(acc[ih * in.W + iw]);
    }
  });
}

// ---- window means (avg_pool2d, adaptive_avg_pool2d) ----------------------------------------------

// y[oh, ow] = sum of x over box(oh, ow) / div.
template <class S, class BoxFn>
void window_mean_forward(const Tensor& x, const Tensor& y, BoxFn box, int64_t win) {
  using A = compute_t<S>;
  const Dims4 in = dims_of(x), out = dims_of(y);
  const S* xp = static_cast<const S*>(x.data_ptr());
  S* yp = static_cast<S*>(y.data_ptr());
  const int64_t C = in.C;
  if (all_channels_last({&x, &y})) {
    parallel_for(in.N * out.H, grain_for(out.W * win * C), [&](int64_t r0, int64_t r1) {
      std::vector<A> row(C), acc(C);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / out.H, oh = r % out.H;
        for (int64_t ow = 0; ow < out.W; ++ow) {
          const Box b = box(oh, ow);
          std::fill(acc.begin(), acc.end(), A(0));
          if (!b.empty()) {
            for (int64_t ih = b.h0; ih < b.h1; ++ih)
              for (int64_t iw = b.w0; iw < b.w1; ++iw) {
                load_n<S, A>(xp + ((n * in.H + ih) * in.W + iw) * C, row.data(), C);
                for (int64_t c = 0; c < C; ++c) acc[c] += row[c];
              }
            const A div = static_cast<A>(b.div);
            for (int64_t c = 0; c < C; ++c) acc[c] /= div;
          }
          store_n<S, A>(acc.data(), yp + (r * out.W + ow) * C, C);
        }
      }
    });
    return;
  }
  const Strides4 x_st = strides_of(x);
  const Strides4 y_st = strides_of(y);
  parallel_for(in.N * C, grain_for(out.H * out.W * win), [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl) {
      const int64_t n = pl / C, c = pl % C;
      const S* xb = xp + n * x_st.n + c * x_st.c;
      S* yb = yp + n * y_st.n + c * y_st.c;
      for (int64_t oh = 0; oh < out.H; ++oh)
        for (int64_t ow = 0; ow < out.W; ++ow) {
          const Box b = box(oh, ow);
          A acc = 0;
          if (!b.empty()) {
            for (int64_t ih = b.h0; ih < b.h1; ++ih)
              for (int64_t iw = b.w0; iw < b.w1; ++iw) acc += static_cast<A>(xb[ih * x_st.h + iw * x_st.w]);
            acc /= static_cast<A>(b.div);
          }
          yb[oh * y_st.h + ow * y_st.w] = convert<S>(acc);
        }
    }
  });
}

// gx = for every output, gy / div added over its box.
template <class S, class BoxFn>
void window_mean_backward(const Tensor& gy, const Tensor& gx, BoxFn box, int64_t win) {
  using A = compute_t<S>;
  const Dims4 in = dims_of(gx), out = dims_of(gy);
  const S* gyp = static_cast<const S*>(gy.data_ptr());
  S* gxp = static_cast<S*>(gx.data_ptr());
  const int64_t C = in.C, HW = in.H * in.W;
  if (all_channels_last({&gy, &gx})) {
    parallel_for(in.N, grain_for(out.H * out.W * win * C), [&](int64_t n0, int64_t n1) {
      std::vector<A> acc(HW * C), g(C);
      for (int64_t n = n0; n < n1; ++n) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t oh = 0; oh < out.H; ++oh)
          for (int64_t ow = 0; ow < out.W; ++ow) {
            const Box b = box(oh, ow);
            if (b.empty()) continue;
            load_n<S, A>(gyp + ((n * out.H + oh) * out.W + ow) * C, g.data(), C);
            const A div = static_cast<A>(b.div);
            for (int64_t c = 0; c < C; ++c) g[c] /= div;
            for (int64_t ih = b.h0; ih < b.h1; ++ih)
              for (int64_t iw = b.w0; iw < b.w1; ++iw) {
                A* d = acc.data() + (ih * in.W + iw) * C;
                for (int64_t c = 0; c < C; ++c) d[c] += g[c];
              }
          }
        store_n<S, A>(acc.data(), gxp + n * HW * C, HW * C);
      }
    });
    return;
  }
  const Strides4 gy_st = strides_of(gy);
  const Strides4 gx_st = strides_of(gx);
  parallel_for(in.N * C, grain_for(out.H * out.W * win + HW), [&](int64_t p0, int64_t p1) {
    std::vector<A> acc(HW);
    for (int64_t pl = p0; pl < p1; ++pl) {
      const int64_t n = pl / C, c = pl % C;
      std::fill(acc.begin(), acc.end(), A(0));
      const S* gb = gyp + n * gy_st.n + c * gy_st.c;
      for (int64_t oh = 0; oh < out.H; ++oh)
        for (int64_t ow = 0; ow < out.W; ++ow) {
          const Box b = box(oh, ow);
          if (b.empty()) continue;
          const A g = static_cast<A>(gb[oh * gy_st.h + ow * gy_st.w]) / static_cast<A>(b.div);
          for (int64_t ih = b.h0; ih < b.h1; ++ih)
            for (int64_t iw = b.w0; iw < b.w1; ++iw) acc[ih * in.W + iw] += g;
        }
      S* xb = gxp + n * gx_st.n + c * gx_st.c;
      for (int64_t ih = 0; ih < in.H; ++ih)
        for (int64_t iw = 0; iw < in.W; ++iw)
          xb[ih * gx_st.h + iw * gx_st.w] = convert<S>(acc[ih * in.W + iw]);
    }
  });
}

// avg_pool2d's window for output (oh, ow) of an input with H x W pixels.
struct AvgBox {
  Pool2dAttrs a;
  int64_t H, W;
  Box operator()(int64_t oh, int64_t ow) const {
    int64_t h0 = oh * a.stride[0] - a.padding[0], w0 = ow * a.stride[1] - a.padding[1];
    int64_t h1 = std::min(h0 + a.kernel[0], H + a.padding[0]), w1 = std::min(w0 + a.kernel[1], W + a.padding[1]);
    const int64_t padded = (h1 - h0) * (w1 - w0);
    h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
    h1 = std::min(h1, H), w1 = std::min(w1, W);
    return Box{h0, h1, w0, w1, a.count_include_pad ? padded : (h1 - h0) * (w1 - w0)};
  }
};

// adaptive_avg_pool2d's window: [floor(o*In/Out), ceil((o+1)*In/Out)) in each dimension.
struct AdaptiveBox {
  int64_t H, W, OH, OW;
  Box operator()(int64_t oh, int64_t ow) const {
    const int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
    const int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
    return Box{h0, h1, w0, w1, (h1 - h0) * (w1 - w0)};
  }
};

// Largest window of an adaptive pool along one dim (for parallel grain sizing only).
int64_t adaptive_span(int64_t in, int64_t out) { return (in + out - 1) / out + 1; }

// ---- nearest upsampling ---------------------------------------------------------------------------

template <class S>
void upsample_forward(const Tensor& x, const Tensor& y, const UpsampleAttrs& a) {
  const Dims4 in = dims_of(x), out = dims_of(y);
  const S* xp = static_cast<const S*>(x.data_ptr());
  S* yp = static_cast<S*>(y.data_ptr());
  const int64_t C = in.C;
  if (all_channels_last({&x, &y})) {
    parallel_for(in.N * out.H, grain_for(out.W * C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / out.H, ih = (r % out.H) / a.scale_h;
        const S* src = xp + (n * in.H + ih) * in.W * C;
        S* dst = yp + r * out.W * C;
        for (int64_t ow = 0; ow < out.W; ++ow)
          std::memcpy(dst + ow * C, src + (ow / a.scale_w) * C, static_cast<size_t>(C) * sizeof(S));
      }
    });
    return;
  }
  const Strides4 x_st = strides_of(x);
  const Strides4 y_st = strides_of(y);
  parallel_for(in.N * C, grain_for(out.H * out.W), [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl) {
      const int64_t n = pl / C, c = pl % C;
      const S* xb = xp + n * x_st.n + c * x_st.c;
      S* yb = yp + n * y_st.n + c * y_st.c;
      for (int64_t oh = 0; oh < out.H; ++oh)
        for (int64_t ow = 0; ow < out.W; ++ow)
          yb[oh * y_st.h + ow * y_st.w] = xb[(oh / a.scale_h) * x_st.h + (ow / a.scale_w) * x_st.w];
    }
  });
}

// gx[ih, iw] = sum of gy over the scale_h x scale_w block it was copied to (a gather: no races).
template <class S>
void upsample_backward(const Tensor& gy, const Tensor& gx, const UpsampleAttrs& a) {
  using A = compute_t<S>;
  const Dims4 in = dims_of(gx), out = dims_of(gy);
  const S* gyp = static_cast<const S*>(gy.data_ptr());
  S* gxp = static_cast<S*>(gx.data_ptr());
  const int64_t C = in.C, sh = a.scale_h, sw = a.scale_w;
  // Channels-last gx, and gy with contiguous channels: channels-last itself, or a channel slice of a wider
  // channels-last tensor (YOLOv8's neck: the upsampled map is concatenated, so its gradient is a slice of the
  // concatenation's). The strided per-plane loop below would walk such a gy C elements apart.
  if (gx.is_contiguous(MemoryFormat::ChannelsLast) && (gy.stride(1) == 1 || C == 1)) {
    const int64_t s0 = gy.stride(0), s2 = gy.stride(2), s3 = gy.stride(3);
    parallel_for(in.N * in.H, grain_for(in.W * sh * sw * C), [&](int64_t r0, int64_t r1) {
      std::vector<A> row(C), acc(C);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / in.H, ih = r % in.H;
        for (int64_t iw = 0; iw < in.W; ++iw) {
          std::fill(acc.begin(), acc.end(), A(0));
          for (int64_t i = 0; i < sh; ++i)
            for (int64_t j = 0; j < sw; ++j) {
              load_n<S, A>(gyp + n * s0 + (ih * sh + i) * s2 + (iw * sw + j) * s3, row.data(), C);
              for (int64_t c = 0; c < C; ++c) acc[c] += row[c];
            }
          store_n<S, A>(acc.data(), gxp + (r * in.W + iw) * C, C);
        }
      }
    });
    return;
  }
  const Strides4 gy_st = strides_of(gy), gx_st = strides_of(gx);
  parallel_for(in.N * C, grain_for(out.H * out.W), [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl) {
      const int64_t n = pl / C, c = pl % C;
      const S* gb = gyp + n * gy_st.n + c * gy_st.c;
      S* xb = gxp + n * gx_st.n + c * gx_st.c;
      for (int64_t ih = 0; ih < in.H; ++ih)
        for (int64_t iw = 0; iw < in.W; ++iw) {
          A acc = 0;
          for (int64_t i = 0; i < sh; ++i)
            for (int64_t j = 0; j < sw; ++j)
              acc += static_cast<A>(gb[(ih * sh + i) * gy_st.h + (iw * sw + j) * gy_st.w]);
          xb[ih * gx_st.h + iw * gx_st.w] = convert<S>(acc);
        }
    }
  });
}

// ---- kernels ----------------------------------------------------------------------------------------

// inputs: x; outputs: y, indices (I64).
void max_pool2d_kernel(const KernelArgs& k) {
  visit_float(k.out(0).dtype(), "max_pool2d",
              [&](auto tag) { max_pool_forward<decltype(tag)>(k.in(0), k.out(0), k.out(1), k.attr<Pool2dAttrs>()); });
}

// inputs: grad_out, indices; outputs: grad_in.
void max_pool2d_backward_kernel(const KernelArgs& k) {
  visit_float(k.out(0).dtype(), "max_pool2d_backward",
              [&](auto tag) { max_pool_backward<decltype(tag)>(k.in(0), k.in(1), k.out(0), k.attr<Pool2dAttrs>()); });
}

// inputs: x; outputs: y.
void avg_pool2d_kernel(const KernelArgs& k) {
  const Pool2dAttrs& a = k.attr<Pool2dAttrs>();
  visit_float(k.out(0).dtype(), "avg_pool2d", [&](auto tag) {
    window_mean_forward<decltype(tag)>(k.in(0), k.out(0), AvgBox{a, k.in(0).size(2), k.in(0).size(3)},
                                       a.kernel[0] * a.kernel[1]);
  });
}

// inputs: grad_out; outputs: grad_in.
void avg_pool2d_backward_kernel(const KernelArgs& k) {
  const Pool2dAttrs& a = k.attr<Pool2dAttrs>();
  visit_float(k.out(0).dtype(), "avg_pool2d_backward", [&](auto tag) {
    window_mean_backward<decltype(tag)>(k.in(0), k.out(0), AvgBox{a, k.out(0).size(2), k.out(0).size(3)},
                                        a.kernel[0] * a.kernel[1]);
  });
}

// inputs: x; outputs: y (its H, W are the output size).
void adaptive_avg_pool2d_kernel(const KernelArgs& k) {
  const Tensor& x = k.in(0);
  const Tensor& y = k.out(0);
  const AdaptiveBox box{x.size(2), x.size(3), y.size(2), y.size(3)};
  visit_float(y.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
    window_mean_forward<decltype(tag)>(x, y, box, adaptive_span(box.H, box.OH) * adaptive_span(box.W, box.OW));
  });
}

// inputs: grad_out; outputs: grad_in.
void adaptive_avg_pool2d_backward_kernel(const KernelArgs& k) {
  const Tensor& gy = k.in(0);
  const Tensor& gx = k.out(0);
  const AdaptiveBox box{gx.size(2), gx.size(3), gy.size(2), gy.size(3)};
  visit_float(gx.dtype(), "adaptive_avg_pool2d_backward", [&](auto tag) {
    window_mean_backward<decltype(tag)>(gy, gx, box, adaptive_span(box.H, box.OH) * adaptive_span(box.W, box.OW));
  });
}

// inputs: x; outputs: y.
void upsample_nearest2d_kernel(const KernelArgs& k) {
  visit_float(k.out(0).dtype(), "upsample_nearest2d",
              [&](auto tag) { upsample_forward<decltype(tag)>(k.in(0), k.out(0), k.attr<UpsampleAttrs>()); });
}

// inputs: grad_out; outputs: grad_in.
void upsample_nearest2d_backward_kernel(const KernelArgs& k) {
  visit_float(k.out(0).dtype(), "upsample_nearest2d_backward",
              [&](auto tag) { upsample_backward<decltype(tag)>(k.in(0), k.out(0), k.attr<UpsampleAttrs>()); });
}

}  // namespace

void register_pool_cpu() {
  register_kernel(OpId::max_pool2d, DeviceType::CPU, max_pool2d_kernel);
  register_kernel(OpId::max_pool2d_backward, DeviceType::CPU, max_pool2d_backward_kernel);
  register_kernel(OpId::avg_pool2d, DeviceType::CPU, avg_pool2d_kernel);
  register_kernel(OpId::avg_pool2d_backward, DeviceType::CPU, avg_pool2d_backward_kernel);
  register_kernel(OpId::adaptive_avg_pool2d, DeviceType::CPU, adaptive_avg_pool2d_kernel);
  register_kernel(OpId::adaptive_avg_pool2d_backward, DeviceType::CPU, adaptive_avg_pool2d_backward_kernel);
  register_kernel(OpId::upsample_nearest2d, DeviceType::CPU, upsample_nearest2d_kernel);
  register_kernel(OpId::upsample_nearest2d_backward, DeviceType::CPU, upsample_nearest2d_backward_kernel);
}

}  // namespace ampforge::cpu
