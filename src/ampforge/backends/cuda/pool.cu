// CUDA pooling and nearest upsampling: max_pool2d (+ I64 indices), avg_pool2d, adaptive_avg_pool2d,
// upsample_nearest2d, and their backward kernels. Contracts and window conventions are the CPU kernels'
// (backends/cpu/pool.cpp, which documents them):
//   max_pool2d   rows h0 = oh*s - p .. min(h0 + (k-1)*d + 1, H) step d, h0 moved up by d while negative;
//                NaN wins (a later NaN replaces an earlier one); the index is h*W + w in the (n, c) plane,
//                starting at the window's first in-bounds position.
//   avg_pool2d   window h0 = oh*s - p .. min(h0 + k, H + p), divisor its padded size (count_include_pad)
//                or its clipped size; an empty clipped window gives 0.
//   adaptive     rows floor(oh*H/OH) .. ceil((oh+1)*H/OH); divisor = window size.
//   upsample     out[oh, ow] = in[oh / sh, ow / sw] (integer scales).
//
// Layouts: ops/pool.cpp hands over any strides (it never copies), so every operand is addressed through
// its own four strides: contiguous, channels-last and any other view work without a copy. Each kernel
// runs one thread per element of the tensor it writes; the thread's linear index is split in that
// tensor's memory order (c fastest when it is channels-last, w fastest otherwise), so neighbouring threads
// write neighbouring addresses and, in channels-last, also read neighbouring addresses.
//
// Backward kernels are gathers, never scatters: one thread per input-gradient element visits, in
// ascending (oh, ow) order, the outputs whose windows contain it and sums their contributions in float,
// then rounds once to the storage type. There are no atomics, so results are bit-identical run to run,
// and the order of the additions is the CPU's (ascending output position), so F32 gradients normally
// equal the CPU's bit for bit. max_pool2d_backward adds an output's gradient when its saved index names
// this position. (Interpretation: the CPU's strided path scatters a gradient to wherever its index
// points; an index can only point outside its own window for a window with no in-bounds position, whose
// output is -inf. The gather sends such gradients nowhere, as the CPU's channels-last path does.)
#include <algorithm>

#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

// ---- addressing -----------------------------------------------------------------------------------------

// A 4-D image operand: sizes and element strides (data pointers are passed separately, typed).
struct Img {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t sn = 0, sc = 0, sh = 0, sw = 0;
  AF_DEV int64_t at(int64_t n, int64_t c, int64_t h, int64_t w) const { return n * sn + c * sc + h * sh + w * sw; }
};

Img img_of(const Tensor& t) {
  return {t.size(0), t.size(1), t.size(2), t.size(3), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

struct Pos {
  int64_t n, c, h, w;
};

// How the written tensor's elements are enumerated: channels-last order (n, h, w, c) or (n, c, h, w);
// narrow: fewer than 2^31 elements, so the index splits with 32-bit divisions (a 64-bit division is a long
// software sequence on GPUs).
struct Order {
  bool cl = false, narrow = true;
};

Order order_of(const Tensor& written) {
  return {written.is_contiguous(MemoryFormat::ChannelsLast) && !written.is_contiguous(),
          written.numel() < (int64_t{1} << 31)};
}

// Splits e into four coordinates, sizes s0 (fastest) .. s2, the last one taking the rest.
template <class I>
AF_DEV void split4(I e, I s0, I s1, I s2, int64_t (&o)[4]) {
  I q = e / s0;
  o[0] = static_cast<int64_t>(e - q * s0);
  e = q;
  q = e / s1;
  o[1] = static_cast<int64_t>(e - q * s1);
  e = q;
  q = e / s2;
  o[2] = static_cast<int64_t>(e - q * s2);
  o[3] = static_cast<int64_t>(q);
}

// The (n, c, h, w) of element e of image g enumerated in order `ord`.
AF_DEV Pos position(int64_t e, const Img& g, Order ord) {
  int64_t o[4];
  const int64_t s0 = ord.cl ? g.C : g.W, s1 = ord.cl ? g.W : g.H, s2 = ord.cl ? g.H : g.C;
  if (ord.narrow)
    split4<uint32_t>(static_cast<uint32_t>(e), static_cast<uint32_t>(s0), static_cast<uint32_t>(s1),
                     static_cast<uint32_t>(s2), o);
  else
    split4<int64_t>(e, s0, s1, s2, o);
  if (ord.cl) return {o[3], o[0], o[2], o[1]};  // (n, h, w, c): c fastest
  return {o[3], o[2], o[1], o[0]};              // (n, c, h, w): w fastest
}

AF_DEV int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
AF_DEV int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Launches `kernel` with one thread per element of `written` (nothing for an empty tensor) on the compute
// stream of its device; the kernel's leading parameters are (total, order).
template <class... KArgs, class... Args>
void launch_per_element(const Tensor& written, void (*kernel)(int64_t, Order, KArgs...), Args&&... args) {
  const int64_t total = written.numel();
  if (total == 0) return;
  DeviceGuard guard(written.device());
  const DeviceState& s = device_state(written.device());
  kernel<<<blocks_for(total, kThreads, s), kThreads, 0, s.compute>>>(total, order_of(written),
                                                                     std::forward<Args>(args)...);
  AF_CUDA_CHECK_LAUNCH();
}

#define AF_GRID_STRIDE(e, total)                                                                        \
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < (total);             \
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- max pooling ----------------------------------------------------------------------------------------

// One spatial dim of a max-pool window (kernel, stride, padding, dilation, input size).
struct Win {
  int64_t k, s, p, d, in;
  // First in-bounds position b and exclusive end e of output o's window; positions b, b + d, ... < e.
  AF_DEV void range(int64_t o, int64_t& b, int64_t& e) const {
    b = o * s - p;
    e = min64(b + (k - 1) * d + 1, in);
    if (b < 0) b += ((-b + d - 1) / d) * d;  // the CPU's "b += d while b < 0"
  }
};

Win win_of(const Pool2dAttrs& a, int dim, int64_t in) {
  return {a.kernel[dim], a.stride[dim], a.padding[dim], a.dilation[dim], in};
}

template <class T>
__global__ void __launch_bounds__(kThreads) max_pool_kernel(int64_t total, Order ord, Img x, Img y, Img ind, Win wh,
                                                            Win ww, const T* xp, T* yp, int64_t* ip) {
  AF_GRID_STRIDE(e, total) {
    const Pos q = position(e, y, ord);
    int64_t h0, h1, w0, w1;
    wh.range(q.h, h0, h1);
    ww.range(q.w, w0, w1);
    const T* xb = xp + q.n * x.sn + q.c * x.sc;
    float best = -INFINITY;
    int64_t arg = h0 * x.W + w0;
    for (int64_t ih = h0; ih < h1; ih += wh.d)
      for (int64_t iw = w0; iw < w1; iw += ww.d) {
        const float v = to_float(xb[ih * x.sh + iw * x.sw]);
        if (v > best || v != v) {  // NaN wins, as on the CPU
          best = v;
          arg = ih * x.W + iw;
        }
      }
    yp[y.at(q.n, q.c, q.h, q.w)] = from_float<T>(best);
    ip[ind.at(q.n, q.c, q.h, q.w)] = arg;
  }
}

// Gather: input position (ih, iw) lies in output oh's window exactly when ih = oh*s - p + kh*d for some
// kh in [0, k) (every such position is in bounds, and the window ends after it). Walking kh downwards
// visits the candidate oh in ascending order; likewise for columns.
template <class T>
__global__ void __launch_bounds__(kThreads) max_pool_backward_kernel(int64_t total, Order ord, Img gx, Img gy, Img ind,
                                                                     Win wh, Win ww, const T* gyp, const int64_t* ip,
                                                                     T* gxp) {
  AF_GRID_STRIDE(e, total) {
    const Pos q = position(e, gx, ord);
    const int64_t here = q.h * gx.W + q.w;
    const int64_t gyb = q.n * gy.sn + q.c * gy.sc, ib = q.n * ind.sn + q.c * ind.sc;
    float acc = 0.0f;
    for (int64_t kh = wh.k - 1; kh >= 0; --kh) {
      const int64_t th = q.h + wh.p - kh * wh.d;
      if (th < 0 || th % wh.s != 0) continue;
      const int64_t oh = th / wh.s;
      if (oh >= gy.H) break;  // later kh only give larger oh
      for (int64_t kw = ww.k - 1; kw >= 0; --kw) {
        const int64_t tw = q.w + ww.p - kw * ww.d;
        if (tw < 0 || tw % ww.s != 0) continue;
        const int64_t ow = tw / ww.s;
        if (ow >= gy.W) break;
        if (ip[ib + oh * ind.sh + ow * ind.sw] == here) acc += to_float(gyp[gyb + oh * gy.sh + ow * gy.sw]);
      }
    }
    gxp[gx.at(q.n, q.c, q.h, q.w)] = from_float<T>(acc);
  }
}

// inputs: x; outputs: y, indices (I64).
void max_pool2d_cuda(const KernelArgs& k) {
  const Tensor &x = k.in(0), &y = k.out(0), &ind = k.out(1);
  const Pool2dAttrs& a = k.attr<Pool2dAttrs>();
  AF_ASSERT(ind.dtype() == DType::I64, "max_pool2d: indices must be I64");
  visit_float(y.dtype(), "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    launch_per_element(y, max_pool_kernel<T>, img_of(x), img_of(y), img_of(ind), win_of(a, 0, x.size(2)),
                       win_of(a, 1, x.size(3)), static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()),
                       static_cast<int64_t*>(ind.data_ptr()));
  });
}

// inputs: grad_out, indices; outputs: grad_in.
void max_pool2d_backward_cuda(const KernelArgs& k) {
  const Tensor &gy = k.in(0), &ind = k.in(1), &gx = k.out(0);
  const Pool2dAttrs& a = k.attr<Pool2dAttrs>();
  AF_ASSERT(ind.dtype() == DType::I64, "max_pool2d_backward: indices must be I64");
  visit_float(gx.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_per_element(gx, max_pool_backward_kernel<T>, img_of(gx), img_of(gy), img_of(ind),
                       win_of(a, 0, gx.size(2)), win_of(a, 1, gx.size(3)), static_cast<const T*>(gy.data_ptr()),
                       static_cast<const int64_t*>(ind.data_ptr()), static_cast<T*>(gx.data_ptr()));
  });
}

// ---- window means (avg_pool2d, adaptive_avg_pool2d) ---------------------------------------------------

// A clipped averaging window: rows [h0, h1), cols [w0, w1), divided by div (empty: the output is 0).
struct Box {
  int64_t h0, h1, w0, w1, div;
  AF_DEV bool empty() const { return h0 >= h1 || w0 >= w1; }
  AF_DEV bool contains(int64_t h, int64_t w) const { return h >= h0 && h < h1 && w >= w0 && w < w1; }
};

// avg_pool2d's window of output (oh, ow) over an H x W input (the CPU's AvgBox).
struct AvgBox {
  int64_t kh, kw, sh, sw, ph, pw, H, W, OH, OW;
  bool include_pad;
  AF_DEV Box operator()(int64_t oh, int64_t ow) const {
    int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
    int64_t h1 = min64(h0 + kh, H + ph), w1 = min64(w0 + kw, W + pw);
    const int64_t padded = (h1 - h0) * (w1 - w0);
    h0 = max64(h0, 0), w0 = max64(w0, 0);
    h1 = min64(h1, H), w1 = min64(w1, W);
    return Box{h0, h1, w0, w1, include_pad ? padded : (h1 - h0) * (w1 - w0)};
  }
  // Outputs whose window may contain input (ih, iw): those with o*s - p <= i < o*s - p + k, widened by one
  // on each side (callers test containment, so the range only has to be a superset).
  AF_DEV void candidates(int64_t ih, int64_t iw, int64_t& oh0, int64_t& oh1, int64_t& ow0, int64_t& ow1) const {
    oh0 = max64((ih + ph - kh + 1) / sh - 1, 0), oh1 = min64((ih + ph) / sh + 1, OH - 1);
    ow0 = max64((iw + pw - kw + 1) / sw - 1, 0), ow1 = min64((iw + pw) / sw + 1, OW - 1);
  }
};

AvgBox avg_box(const Pool2dAttrs& a, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  return {a.kernel[0], a.kernel[1], a.stride[0], a.stride[1], a.padding[0], a.padding[1], H, W, OH, OW,
          a.count_include_pad};
}

// adaptive_avg_pool2d's window: [floor(o*In/Out), ceil((o+1)*In/Out)) in each dim.
struct AdaptiveBox {
  int64_t H, W, OH, OW;
  AF_DEV Box operator()(int64_t oh, int64_t ow) const {
    const int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
    const int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
    return Box{h0, h1, w0, w1, (h1 - h0) * (w1 - w0)};
  }
  // Window o contains i iff floor(i*Out/In) <= o <= ceil((i+1)*Out/In) - 1; widened by one each side.
  AF_DEV void candidates(int64_t ih, int64_t iw, int64_t& oh0, int64_t& oh1, int64_t& ow0, int64_t& ow1) const {
    oh0 = max64(ih * OH / H - 1, 0), oh1 = min64(((ih + 1) * OH + H - 1) / H, OH - 1);
    ow0 = max64(iw * OW / W - 1, 0), ow1 = min64(((iw + 1) * OW + W - 1) / W, OW - 1);
  }
};

// y = mean of x over box(oh, ow), summed row by row in float (the CPU's order), divided once.
template <class T, class BoxFn>
__global__ void __launch_bounds__(kThreads)
    window_mean_kernel(int64_t total, Order ord, Img x, Img y, BoxFn box, const T* xp, T* yp) {
  AF_GRID_STRIDE(e, total) {
    const Pos q = position(e, y, ord);
    const Box b = box(q.h, q.w);
    const T* xb = xp + q.n * x.sn + q.c * x.sc;
    float acc = 0.0f;
    if (!b.empty()) {
      for (int64_t ih = b.h0; ih < b.h1; ++ih)
        for (int64_t iw = b.w0; iw < b.w1; ++iw) acc += to_float(xb[ih * x.sh + iw * x.sw]);
      acc /= static_cast<float>(b.div);
    }
    yp[y.at(q.n, q.c, q.h, q.w)] = from_float<T>(acc);
  }
}

// gx[ih, iw] = sum over the outputs whose box contains (ih, iw), in ascending (oh, ow), of gy / div.
template <class T, class BoxFn>
__global__ void __launch_bounds__(kThreads)
    window_mean_backward_kernel(int64_t total, Order ord, Img gx, Img gy, BoxFn box, const T* gyp, T* gxp) {
  AF_GRID_STRIDE(e, total) {
    const Pos q = position(e, gx, ord);
    const T* gb = gyp + q.n * gy.sn + q.c * gy.sc;
    int64_t oh0, oh1, ow0, ow1;
    box.candidates(q.h, q.w, oh0, oh1, ow0, ow1);
    float acc = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const Box b = box(oh, ow);
        if (b.contains(q.h, q.w)) acc += to_float(gb[oh * gy.sh + ow * gy.sw]) / static_cast<float>(b.div);
      }
    gxp[gx.at(q.n, q.c, q.h, q.w)] = from_float<T>(acc);
  }
}

template <class BoxFn>
void window_mean_forward(const Tensor& x, const Tensor& y, const BoxFn& box, const char* what) {
  visit_float(y.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    launch_per_element(y, window_mean_kernel<T, BoxFn>, img_of(x), img_of(y), box,
                       static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()));
  });
}

template <class BoxFn>
void window_mean_backward(const Tensor& gy, const Tensor& gx, const BoxFn& box, const char* what) {
  visit_float(gx.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    launch_per_element(gx, window_mean_backward_kernel<T, BoxFn>, img_of(gx), img_of(gy), box,
                       static_cast<const T*>(gy.data_ptr()), static_cast<T*>(gx.data_ptr()));
  });
}

// inputs: x; outputs: y.
void avg_pool2d_cuda(const KernelArgs& k) {
  const Tensor &x = k.in(0), &y = k.out(0);
  window_mean_forward(x, y, avg_box(k.attr<Pool2dAttrs>(), x.size(2), x.size(3), y.size(2), y.size(3)),
                      "avg_pool2d");
}

// inputs: grad_out; outputs: grad_in.
void avg_pool2d_backward_cuda(const KernelArgs& k) {
  const Tensor &gy = k.in(0), &gx = k.out(0);
  window_mean_backward(gy, gx, avg_box(k.attr<Pool2dAttrs>(), gx.size(2), gx.size(3), gy.size(2), gy.size(3)),
                       "avg_pool2d_backward");
}

// inputs: x; outputs: y (its H, W are the output size).
void adaptive_avg_pool2d_cuda(const KernelArgs& k) {
  const Tensor &x = k.in(0), &y = k.out(0);
  window_mean_forward(x, y, AdaptiveBox{x.size(2), x.size(3), y.size(2), y.size(3)}, "adaptive_avg_pool2d");
}

// inputs: grad_out; outputs: grad_in.
void adaptive_avg_pool2d_backward_cuda(const KernelArgs& k) {
  const Tensor &gy = k.in(0), &gx = k.out(0);
  window_mean_backward(gy, gx, AdaptiveBox{gx.size(2), gx.size(3), gy.size(2), gy.size(3)},
                       "adaptive_avg_pool2d_backward");
}

// ---- nearest upsampling -----------------------------------------------------------------------------------

// A copy: the value moves without conversion, as the CPU's memcpy.
template <class T>
__global__ void __launch_bounds__(kThreads) upsample_kernel(int64_t total, Order ord, Img x, Img y, int64_t sh,
                                                            int64_t sw, const T* xp, T* yp) {
  AF_GRID_STRIDE(e, total) {
    const Pos q = position(e, y, ord);
    yp[y.at(q.n, q.c, q.h, q.w)] = xp[x.at(q.n, q.c, q.h / sh, q.w / sw)];
  }
}

// gx[ih, iw] = sum of the sh x sw block of gy it was copied to, row by row (the CPU's order).
template <class T>
__global__ void __launch_bounds__(kThreads) upsample_backward_kernel(int64_t total, Order ord, Img gx, Img gy,
                                                                     int64_t sh, int64_t sw, const T* gyp, T* gxp) {
  AF_GRID_STRIDE(e, total) {
    const Pos q = position(e, gx, ord);
    const T* gb = gyp + q.n * gy.sn + q.c * gy.sc;
    float acc = 0.0f;
    for (int64_t i = 0; i < sh; ++i)
      for (int64_t j = 0; j < sw; ++j) acc += to_float(gb[(q.h * sh + i) * gy.sh + (q.w * sw + j) * gy.sw]);
    gxp[gx.at(q.n, q.c, q.h, q.w)] = from_float<T>(acc);
  }
}

// inputs: x; outputs: y.
void upsample_nearest2d_cuda(const KernelArgs& k) {
  const Tensor &x = k.in(0), &y = k.out(0);
  const UpsampleAttrs& a = k.attr<UpsampleAttrs>();
  visit_float(y.dtype(), "upsample_nearest2d", [&](auto tag) {
    using T = decltype(tag);
    launch_per_element(y, upsample_kernel<T>, img_of(x), img_of(y), a.scale_h, a.scale_w,
                       static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()));
  });
}

// inputs: grad_out; outputs: grad_in.
void upsample_nearest2d_backward_cuda(const KernelArgs& k) {
  const Tensor &gy = k.in(0), &gx = k.out(0);
  const UpsampleAttrs& a = k.attr<UpsampleAttrs>();
  visit_float(gx.dtype(), "upsample_nearest2d_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_per_element(gx, upsample_backward_kernel<T>, img_of(gx), img_of(gy), a.scale_h, a.scale_w,
                       static_cast<const T*>(gy.data_ptr()), static_cast<T*>(gx.data_ptr()));
  });
}

#undef AF_GRID_STRIDE

}  // namespace

void register_pool_cuda() {
  register_kernel(OpId::max_pool2d, DeviceType::CUDA, max_pool2d_cuda);
  register_kernel(OpId::max_pool2d_backward, DeviceType::CUDA, max_pool2d_backward_cuda);
  register_kernel(OpId::avg_pool2d, DeviceType::CUDA, avg_pool2d_cuda);
  register_kernel(OpId::avg_pool2d_backward, DeviceType::CUDA, avg_pool2d_backward_cuda);
  register_kernel(OpId::adaptive_avg_pool2d, DeviceType::CUDA, adaptive_avg_pool2d_cuda);
  register_kernel(OpId::adaptive_avg_pool2d_backward, DeviceType::CUDA, adaptive_avg_pool2d_backward_cuda);
  register_kernel(OpId::upsample_nearest2d, DeviceType::CUDA, upsample_nearest2d_cuda);
  register_kernel(OpId::upsample_nearest2d_backward, DeviceType::CUDA, upsample_nearest2d_backward_cuda);
}

}  // namespace ampforge::cuda
