// CPU convolution: conv2d forward and its input and weight gradients, as im2col + GEMM (gemm.h).
//
// The kernels at the end first offer the problem to oneDNN (conv_onednn.h) when the build has it and
// AMPFORGE_CPU_CONV does not say im2col (F16, and BF16 where bf16_compute.h says so, as the F32 problem on F32
// copies); what oneDNN cannot run well (F64, problems with only a reference kernel there) comes back here.
// Everything below this comment is the im2col path.
//
// One layout inside: channels-last (NHWC). im2col rows are output pixels (n, oh, ow) and columns are
// (kh, kw, c), so
//   forward          out[rows, C_out]   = col[rows, K] @ Wm^T           (the GEMM result IS the NHWC output)
//   backward input   gcol[rows, K]      = gout[rows, C_out] @ Wm         then col2im (a gather, no races)
//   backward weight  gWm[C_out, K]     += gout^T @ col                   (summed over batches of images)
// with Wm the weight packed as (C_out, kH, kW, C_in/groups) and K = kH*kW*C_in/groups (per group).
// im2col and col2im move runs contiguous over C_in.
//
// F32/F64 channels-last tensors are used in place. NCHW tensors and 16-bit tensors are staged, one batch
// of images at a time, into a compute-type NHWC buffer (a tiled transpose and/or a conversion: O(tensor),
// against the GEMM's O(tensor * K)), so the same im2col/col2im serves every dtype and format. The one
// exception: F32/F64 NCHW 1x1 stride-1 unpadded convs run as one GEMM per image on the tensors as they are.
// 1x1 stride-1 unpadded convs never build columns: the NHWC input already is the column matrix.
//
// Scheduling (the Plan below): by default the batch is cut into tiles of whole images whose scratch
// (staging, columns) is about kTileBytes, and the pool runs tiles in parallel, each tile's staging, im2col,
// GEMM and col2im on one thread. A tile's columns stay in L2 between the im2col that writes them and the
// GEMM that reads them (and between the GEMM and col2im), instead of a batch-sized column matrix making a
// round trip through DRAM. When there are fewer tiles than threads (a few large images), the old way
// applies: as many images as fit Conv2dAttrs::max_scratch_bytes (default 64 MiB) go through one GEMM that
// splits itself over the pool. Nested parallel_for calls run serially, so the same code serves both.
// Weight gradients of tiled runs are summed per block of tiles into at most kMaxWeightPartials partial
// buffers, then added in block order: the block layout depends on the shapes only, so the result is the
// same for every thread count.
// Contract (ops/conv.cpp guarantees it): x, out, grad_out, grad_in are 4-D and each independently
// contiguous or channels-last contiguous; weight (C_out, C_in/groups, kH, kW) and bias (C_out) have any
// strides; one floating dtype throughout. Outputs are overwritten.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "ampforge/backends/cpu/bf16_compute.h"
#include "ampforge/backends/cpu/conv_onednn.h"
#include "ampforge/backends/cpu/gemm.h"
#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cpu {
namespace {

constexpr int64_t kDefaultScratchBytes = int64_t{64} << 20;
constexpr int64_t kTileBytes = int64_t{512} << 10;  // per-task scratch target: about half a Zen 3 L2
constexpr int64_t kMaxWeightPartials = 16;
constexpr int64_t kTile = 32;  // transpose tile edge

struct Geom {
  int64_t N, C, H, W;      // input (N, C, H, W)
  int64_t Co, KH, KW;      // weight (Co, C/G, KH, KW)
  int64_t OH, OW, P;       // output spatial size, P = OH*OW
  int64_t G, Cg, Cog, Kg;  // groups, channels per group (in, out), GEMM depth per group KH*KW*Cg
  int64_t sh, sw, ph, pw, dh, dw;
  bool pointwise;  // 1x1, stride 1, no padding: output pixels are input pixels
};

Geom make_geom(const Shape& x, const Shape& w, const Shape& y, const Conv2dAttrs& a) {
  Geom g{};
  g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3];
  g.Co = w[0], g.KH = w[2], g.KW = w[3];
  g.OH = y[2], g.OW = y[3], g.P = g.OH * g.OW;
  g.G = a.groups, g.Cg = g.C / g.G, g.Cog = g.Co / g.G, g.Kg = g.KH * g.KW * g.Cg;
  g.sh = a.stride[0], g.sw = a.stride[1], g.ph = a.padding[0], g.pw = a.padding[1];
  g.dh = a.dilation[0], g.dw = a.dilation[1];
  g.pointwise = g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
  AF_ASSERT(w[1] == g.Cg && y[1] == g.Co && y[0] == g.N, "conv2d kernel: inconsistent shapes x {} w {} y {}", x.str(),
            w.str(), y.str());
  return g;
}

// A tensor the kernel reads or writes as NHWC memory: true for channels-last (and for layouts where the
// two coincide because of size-1 dims), false for NCHW-contiguous.
bool is_nhwc(const Tensor& t) {
  if (t.is_contiguous(MemoryFormat::ChannelsLast)) return true;
  AF_ASSERT(t.is_contiguous(), "conv2d kernel: tensor of shape {} strides {} is neither contiguous nor channels-last",
            t.shape().str(), t.strides().str());
  return false;
}

template <class T>
std::unique_ptr<T[]> scratch(int64_t n) {  // uninitialised: every use overwrites it
  return n > 0 ? std::make_unique_for_overwrite<T[]>(static_cast<size_t>(n)) : nullptr;
}

template <class D, class S>
inline D convert(S v) {
  if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>)
    return D(static_cast<float>(v));
  else
    return static_cast<D>(v);
}

inline void gemm(int64_t M, int64_t N, int64_t K, MatRef A, MatRef B, float beta, float* C, int64_t ldc) {
  gemm_f32(M, N, K, 1.0f, A, B, beta, C, ldc);
}
inline void gemm(int64_t M, int64_t N, int64_t K, MatRef A, MatRef B, double beta, double* C, int64_t ldc) {
  gemm_f64(M, N, K, 1.0, A, B, beta, C, ldc);
}

// ---- staging between tensors and compute-type NHWC buffers ------------------------------------------

// dst[c * ld_dst + r] = src[r * ld_src + c] for a rows x cols tile (both <= kTile), converting S -> D.
template <class S, class D, class A>
void transpose_tile(const S* src, int64_t ld_src, D* dst, int64_t ld_dst, int64_t rows, int64_t cols) {
  alignas(64) A in[kTile][kTile];
  alignas(64) A col[kTile];
  for (int64_t r = 0; r < rows; ++r) load_n<S, A>(src + r * ld_src, in[r], cols);
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) col[r] = in[r][c];
    store_n<D, A>(col, dst + c * ld_dst, rows);
  }
}

// For each of nb images: dst (cols, rows) <- src (rows, cols), both row-major, image strides rows*cols.
// Parallel over (image, band of kTile source rows); each band writes its own columns of dst.
template <class S, class D, class A>
void transpose_images(const S* src, D* dst, int64_t nb, int64_t rows, int64_t cols) {
  const int64_t bands = (rows + kTile - 1) / kTile;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, kTile * cols));
  parallel_for(nb * bands, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t t = b0; t < b1; ++t) {
      const int64_t n = t / bands, r0 = (t % bands) * kTile, rh = std::min(kTile, rows - r0);
      const S* s = src + n * rows * cols + r0 * cols;
      D* d = dst + n * rows * cols + r0;
      for (int64_t c0 = 0; c0 < cols; c0 += kTile)
        transpose_tile<S, D, A>(s + c0, cols, d + c0 * rows, rows, rh, std::min(kTile, cols - c0));
    }
  });
}

// Contiguous conversion of n elements, in parallel.
template <class S, class D, class A>
void convert_range(const S* src, D* dst, int64_t n) {
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<S, D>) {
      std::memcpy(dst + b, src + b, static_cast<size_t>(e - b) * sizeof(S));
    } else {
      alignas(64) A buf[kChunk];
      for (int64_t i = b; i < e; i += kChunk) {
        const int64_t m = std::min(kChunk, e - i);
        load_n<S, A>(src + i, buf, m);
        store_n<D, A>(buf, dst + i, m);
      }
    }
  });
}

// buf (nb, H, W, C) in A <- images [n0, n0 + nb) of t (N, C, H, W), NCHW or NHWC, storage S.
template <class S, class A>
void stage_from(const Tensor& t, int64_t n0, int64_t nb, A* buf) {
  const int64_t C = t.size(1), HW = t.size(2) * t.size(3);
  const S* src = static_cast<const S*>(t.data_ptr()) + n0 * C * HW;
  if (is_nhwc(t))
    convert_range<S, A, A>(src, buf, nb * C * HW);
  else
    transpose_images<S, A, A>(src, buf, nb, C, HW);  // per image (C, HW) -> (HW, C)
}

// images [n0, n0 + nb) of t <- buf (nb, H, W, C).
template <class S, class A>
void stage_to(const A* buf, const Tensor& t, int64_t n0, int64_t nb) {
  const int64_t C = t.size(1), HW = t.size(2) * t.size(3);
  S* dst = static_cast<S*>(t.data_ptr()) + n0 * C * HW;
  if (is_nhwc(t))
    convert_range<A, S, A>(buf, dst, nb * C * HW);
  else
    transpose_images<A, S, A>(buf, dst, nb, HW, C);  // per image (HW, C) -> (C, HW)
}

// Images [n0, n0 + nb) of t as NHWC compute-type memory: the tensor's own memory when `direct`, else
// staged into buf. per_image: elements per image.
template <class S, class A>
const A* images_in(const Tensor& t, bool direct, int64_t n0, int64_t nb, int64_t per_image, A* buf) {
  if (direct) return static_cast<const A*>(t.data_ptr()) + n0 * per_image;
  stage_from<S, A>(t, n0, nb, buf);
  return buf;
}

// Wm (Co, KH, KW, Cg) in A <- weight (Co, Cg, KH, KW), any strides. Runs on every conv call (forward and both
// backwards), so the strides are read once (Tensor::stride checks its argument: per element, that cost 12% of a
// ResNet-50 step) and output channels go in parallel.
template <class S, class A>
std::unique_ptr<A[]> pack_weight(const Tensor& w) {
  const int64_t Co = w.size(0), Cg = w.size(1), KH = w.size(2), KW = w.size(3);
  const int64_t s0 = w.stride(0), s1 = w.stride(1), s2 = w.stride(2), s3 = w.stride(3);
  const S* p = static_cast<const S*>(w.data_ptr());
  std::unique_ptr<A[]> m = scratch<A>(Co * KH * KW * Cg);  // every element written below
  A* out = m.get();
  parallel_for(Co, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, KH * KW * Cg)), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) {
          const S* src = p + o * s0 + kh * s2 + kw * s3;
          A* dst = out + ((o * KH + kh) * KW + kw) * Cg;
          for (int64_t c = 0; c < Cg; ++c) dst[c] = convert<A>(src[c * s1]);
        }
  });
  return m;
}

// grad weight (Co, Cg, KH, KW), any strides <- Wm (Co, KH, KW, Cg).
template <class S, class A>
void unpack_weight(const A* m, const Tensor& w) {
  const int64_t Co = w.size(0), Cg = w.size(1), KH = w.size(2), KW = w.size(3);
  const int64_t s0 = w.stride(0), s1 = w.stride(1), s2 = w.stride(2), s3 = w.stride(3);
  S* p = static_cast<S*>(w.data_ptr());
  parallel_for(Co, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, KH * KW * Cg)), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) {
          const A* src = m + ((o * KH + kh) * KW + kw) * Cg;
          S* dst = p + o * s0 + kh * s2 + kw * s3;
          for (int64_t c = 0; c < Cg; ++c) dst[c * s1] = convert<S>(src[c]);
        }
  });
}

// ---- im2col / col2im (NHWC) ---------------------------------------------------------------------

// Output rows per parallel task: about 32K column elements.
inline int64_t row_grain(int64_t elems_per_row) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, elems_per_row));
}

// col (nb*OH*OW, Kg), columns (kh, kw, c) <- x (nb, H, W, C), channels [c0, c0 + Cg); zeros where the
// window covers padding.
// Copies and zero fills of the short runs im2col moves (KW*C values: 3 for a one-channel 3x3 conv). Kept
// as plain loops: as library calls (what GCC turns such loops into) a 12-byte memmove costs more than the
// copy itself, and the first conv of an image model makes one per window row and output pixel.
template <class A>
__attribute__((optimize("no-tree-loop-distribute-patterns"))) inline void copy_run(const A* __restrict s,
                                                                                   A* __restrict d, int64_t n) {
  if (n > 32) {
    std::copy_n(s, n, d);
    return;
  }
  for (int64_t i = 0; i < n; ++i) d[i] = s[i];
}
template <class A>
__attribute__((optimize("no-tree-loop-distribute-patterns"))) inline void zero_run(A* d, int64_t n) {
  if (n > 32) {
    std::fill_n(d, n, A(0));
    return;
  }
  for (int64_t i = 0; i < n; ++i) d[i] = A(0);
}

template <class A>
void im2col(const A* x, int64_t nb, const Geom& g, int64_t c0, A* col) {
  const bool runs = g.dw == 1 && g.Cg == g.C;  // a window row is one contiguous run of KW*C values
  parallel_for(nb * g.OH, row_grain(g.OW * g.Kg), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / g.OH, oh = r % g.OH;
      A* dst = col + r * g.OW * g.Kg;
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const int64_t iw0 = ow * g.sw - g.pw;
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          A* d = dst + ow * g.Kg + kh * g.KW * g.Cg;
          const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
          if (ih < 0 || ih >= g.H) {
            zero_run(d, g.KW * g.Cg);
            continue;
          }
          const A* srow = x + (n * g.H + ih) * g.W * g.C + c0;
          if (runs) {
            const int64_t lo = std::clamp<int64_t>(-iw0, 0, g.KW), hi = std::clamp<int64_t>(g.W - iw0, lo, g.KW);
            zero_run(d, lo * g.C);
            copy_run(srow + (iw0 + lo) * g.C, d + lo * g.C, (hi - lo) * g.C);
            zero_run(d + hi * g.C, (g.KW - hi) * g.C);
          } else {
            for (int64_t kw = 0; kw < g.KW; ++kw) {
              const int64_t iw = iw0 + kw * g.dw;
              if (iw < 0 || iw >= g.W)
                zero_run(d + kw * g.Cg, g.Cg);
              else
                copy_run(srow + iw * g.C, d + kw * g.Cg, g.Cg);
            }
          }
        }
      }
    }
  });
}

// d[i] += s[i]; the buffers never overlap (restrict lets the loop vectorise).
template <class A>
inline void add_into(A* __restrict d, const A* __restrict s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

// gx (nb, H, W, C), channels [c0, c0 + Cg) <- for every input pixel, the sum of the gcol entries im2col
// copied it to. Written as a gather over input rows, so tasks never write the same element.
template <class A>
void col2im(const A* gcol, int64_t nb, const Geom& g, int64_t c0, A* gx) {
  parallel_for(nb * g.H, row_grain(g.W * g.C * g.KH * g.KW / std::max<int64_t>(1, g.sh * g.sw)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r) {
                   const int64_t n = r / g.H, ih = r % g.H;
                   for (int64_t iw = 0; iw < g.W; ++iw) {
                     A* d = gx + (r * g.W + iw) * g.C + c0;
                     std::fill_n(d, g.Cg, A(0));
                     for (int64_t kh = 0; kh < g.KH; ++kh) {
                       const int64_t t = ih + g.ph - kh * g.dh;  // = oh * sh when this kh reaches ih
                       if (t < 0) break;                         // t only decreases with kh
                       if (g.sh != 1 && t % g.sh != 0) continue;
                       const int64_t oh = g.sh == 1 ? t : t / g.sh;
                       if (oh >= g.OH) continue;
                       const A* grow = gcol + (n * g.OH + oh) * g.OW * g.Kg + kh * g.KW * g.Cg;
                       for (int64_t kw = 0; kw < g.KW; ++kw) {
                         const int64_t u = iw + g.pw - kw * g.dw;
                         if (u < 0) break;
                         if (g.sw != 1 && u % g.sw != 0) continue;
                         const int64_t ow = g.sw == 1 ? u : u / g.sw;
                         if (ow >= g.OW) continue;
                         add_into(d, grow + ow * g.Kg + kw * g.Cg, g.Cg);
                       }
                     }
                   }
                 }
               });
}

// Images per batch so that per-image scratch (elements of A) fits the limit; at least 1.
int64_t images_per_batch(int64_t per_image_elems, int64_t elem_size, const Conv2dAttrs& a, int64_t N) {
  const int64_t limit = a.max_scratch_bytes > 0 ? a.max_scratch_bytes : kDefaultScratchBytes;
  const int64_t per = per_image_elems * elem_size;
  if (per == 0) return std::max<int64_t>(N, 1);
  return std::clamp<int64_t>(limit / per, 1, std::max<int64_t>(N, 1));
}

// How a call spreads its images over the pool (see the header comment).
struct Plan {
  int64_t images;  // per tile (tiled) or per batch
  bool tiled;
  int64_t tiles(int64_t N) const { return (N + images - 1) / images; }
};

// per_image_elems: all scratch per image (bounds batches by max_scratch_bytes). The tile size counts the
// columns only (pixels x (C + Co) for 1x1 convs), so that NCHW (staged) and NHWC (direct) tensors get the
// same tiles and therefore bit-identical results.
Plan plan_images(const Geom& g, int64_t per_image_elems, int64_t elem_size, const Conv2dAttrs& a) {
  const int64_t N = g.N;
  const int64_t batch = images_per_batch(per_image_elems, elem_size, a, N);
  if (per_image_elems == 0) return {batch, false};  // nothing to keep in cache: one GEMM over the tensors
  const int64_t cols = g.pointwise ? g.P * (g.C + g.Co) : g.P * g.Kg;
  const int64_t tile = std::clamp<int64_t>(kTileBytes / std::max<int64_t>(1, cols * elem_size), 1, batch);
  const Plan p{tile, true};
  return p.tiles(N) >= get_num_threads() ? p : Plan{batch, false};
}

// Calls fn(n_begin, n_end) on disjoint image ranges covering [0, N): one call per task over whole tiles
// when tiled (in parallel; fn's own parallel_for calls then run serially), else one call for everything.
// fn allocates its scratch for plan.images images and walks its range plan.images at a time.
template <class F>
void for_each_task(const Plan& p, int64_t N, F&& fn) {
  if (!p.tiled) {
    fn(int64_t{0}, N);
    return;
  }
  parallel_for(p.tiles(N), 1,
               [&](int64_t t0, int64_t t1) { fn(t0 * p.images, std::min(t1 * p.images, N)); });
}

// Whether the F32/F64 NCHW pointwise path applies: every image tensor NCHW and used in place.
template <class S>
bool nchw_pointwise(const Geom& g, std::initializer_list<const Tensor*> ts) {
  if (!g.pointwise || !(std::is_same_v<S, float> || std::is_same_v<S, double>)) return false;
  for (const Tensor* t : ts)
    if (is_nhwc(*t)) return false;
  return true;
}

// ---- forward ------------------------------------------------------------------------------------

template <class S>
void conv_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y, const Conv2dAttrs& a) {
  using A = compute_t<S>;
  const Geom g = make_geom(x.shape(), w.shape(), y.shape(), a);
  if (g.N == 0) return;
  const std::unique_ptr<A[]> wm = pack_weight<S, A>(w);  // (Co, KH, KW, Cg)
  std::vector<A> bv;
  if (bias) {
    bv.resize(static_cast<size_t>(g.Co));
    const S* bp = static_cast<const S*>(bias->data_ptr());
    for (int64_t o = 0; o < g.Co; ++o) bv[o] = convert<A>(bp[o * bias->stride(0)]);
  }
  const A beta = bias ? A(1) : A(0);

  if (nchw_pointwise<S>(g, {&x, &y})) {
    // y[n] (Co, HW) = Wm (Co, C) @ x[n] (C, HW), per group; bias pre-filled, added by beta = 1.
    const A* xp = static_cast<const A*>(x.data_ptr());
    A* yp = static_cast<A*>(y.data_ptr());
    for (int64_t n = 0; n < g.N; ++n) {
      A* yn = yp + n * g.Co * g.P;
      if (bias)
        parallel_for(g.Co, row_grain(g.P), [&](int64_t o0, int64_t o1) {
          for (int64_t o = o0; o < o1; ++o) std::fill_n(yn + o * g.P, g.P, bv[o]);
        });
      for (int64_t gi = 0; gi < g.G; ++gi)
        gemm(g.Cog, g.P, g.Cg, MatRef{wm.get() + gi * g.Cog * g.Kg, g.Kg, 1},
             MatRef{xp + (n * g.C + gi * g.Cg) * g.P, g.P, 1}, beta, yn + gi * g.Cog * g.P, g.P);
    }
    return;
  }

  const bool x_direct = std::is_same_v<S, A> && is_nhwc(x);
  const bool y_direct = std::is_same_v<S, A> && is_nhwc(y);
  const int64_t per_image =
      (x_direct ? 0 : g.H * g.W * g.C) + (g.pointwise ? 0 : g.P * g.Kg) + (y_direct ? 0 : g.P * g.Co);
  const Plan plan = plan_images(g, per_image, sizeof(A), a);
  for_each_task(plan, g.N, [&](int64_t n_begin, int64_t n_end) {
    auto xbuf = scratch<A>(x_direct ? 0 : plan.images * g.H * g.W * g.C);
    auto col = scratch<A>(g.pointwise ? 0 : plan.images * g.P * g.Kg);
    auto ybuf = scratch<A>(y_direct ? 0 : plan.images * g.P * g.Co);
    for (int64_t n0 = n_begin; n0 < n_end; n0 += plan.images) {
      const int64_t nb = std::min(plan.images, n_end - n0), M = nb * g.P;
      const A* xin = images_in<S, A>(x, x_direct, n0, nb, g.H * g.W * g.C, xbuf.get());  // (nb, H, W, C)
      A* yout = y_direct ? static_cast<A*>(y.data_ptr()) + n0 * g.P * g.Co : ybuf.get();  // (nb*P, Co)
      if (bias)
        parallel_for(M, row_grain(g.Co), [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) std::copy_n(bv.data(), g.Co, yout + r * g.Co);
        });
      for (int64_t gi = 0; gi < g.G; ++gi) {
        MatRef am{nullptr, 0, 0};
        if (g.pointwise) {
          am = MatRef{xin + gi * g.Cg, g.C, 1};
        } else {
          im2col(xin, nb, g, gi * g.Cg, col.get());
          am = MatRef{col.get(), g.Kg, 1};
        }
        // B (Kg, Cog) = Wm_g^T: element (k, o) at o*Kg + k.
        gemm(M, g.Cog, g.Kg, am, MatRef{wm.get() + gi * g.Cog * g.Kg, 1, g.Kg}, beta, yout + gi * g.Cog, g.Co);
      }
      if (!y_direct) stage_to<S, A>(yout, y, n0, nb);
    }
  });
}

// ---- backward input -----------------------------------------------------------------------------

template <class S>
void conv_backward_input(const Tensor& gy, const Tensor& w, const Tensor& gx, const Conv2dAttrs& a) {
  using A = compute_t<S>;
  const Geom g = make_geom(gx.shape(), w.shape(), gy.shape(), a);
  if (g.N == 0) return;
  const std::unique_ptr<A[]> wm = pack_weight<S, A>(w);  // (Co, KH, KW, Cg)

  if (nchw_pointwise<S>(g, {&gy, &gx})) {
    // gx[n] (C, HW) = Wm^T (C, Co) @ gy[n] (Co, HW), per group.
    const A* gyp = static_cast<const A*>(gy.data_ptr());
    A* gxp = static_cast<A*>(gx.data_ptr());
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t gi = 0; gi < g.G; ++gi)
        gemm(g.Cg, g.P, g.Cog, MatRef{wm.get() + gi * g.Cog * g.Kg, 1, g.Kg},
             MatRef{gyp + (n * g.Co + gi * g.Cog) * g.P, g.P, 1}, A(0), gxp + (n * g.C + gi * g.Cg) * g.P, g.P);
    return;
  }

  const bool gy_direct = std::is_same_v<S, A> && is_nhwc(gy);
  const bool gx_direct = std::is_same_v<S, A> && is_nhwc(gx);
  const int64_t per_image =
      (gy_direct ? 0 : g.P * g.Co) + (g.pointwise ? 0 : g.P * g.Kg) + (gx_direct ? 0 : g.H * g.W * g.C);
  const Plan plan = plan_images(g, per_image, sizeof(A), a);
  for_each_task(plan, g.N, [&](int64_t n_begin, int64_t n_end) {
    auto gybuf = scratch<A>(gy_direct ? 0 : plan.images * g.P * g.Co);
    auto gcol = scratch<A>(g.pointwise ? 0 : plan.images * g.P * g.Kg);
    auto gxbuf = scratch<A>(gx_direct ? 0 : plan.images * g.H * g.W * g.C);
    for (int64_t n0 = n_begin; n0 < n_end; n0 += plan.images) {
      const int64_t nb = std::min(plan.images, n_end - n0), M = nb * g.P;
      const A* gyin = images_in<S, A>(gy, gy_direct, n0, nb, g.P * g.Co, gybuf.get());  // (nb*P, Co)
      A* gxout = gx_direct ? static_cast<A*>(gx.data_ptr()) + n0 * g.H * g.W * g.C : gxbuf.get();  // (nb, H, W, C)
      for (int64_t gi = 0; gi < g.G; ++gi) {
        const MatRef am{gyin + gi * g.Cog, g.Co, 1};              // (M, Cog)
        const MatRef bm{wm.get() + gi * g.Cog * g.Kg, g.Kg, 1};  // (Cog, Kg)
        if (g.pointwise) {
          gemm(M, g.Cg, g.Cog, am, bm, A(0), gxout + gi * g.Cg, g.C);  // input pixels = output pixels
        } else {
          gemm(M, g.Kg, g.Cog, am, bm, A(0), gcol.get(), g.Kg);
          col2im(gcol.get(), nb, g, gi * g.Cg, gxout);
        }
      }
      if (!gx_direct) stage_to<S, A>(gxout, gx, n0, nb);
    }
  });
}

// ---- backward weight ----------------------------------------------------------------------------

template <class S>
void conv_backward_weight(const Tensor& gy, const Tensor& x, const Tensor& gw, const Conv2dAttrs& a) {
  using A = compute_t<S>;
  const Geom g = make_geom(x.shape(), gw.shape(), gy.shape(), a);
  std::vector<A> gwm(static_cast<size_t>(g.Co * g.Kg), A(0));  // (Co, KH, KW, Cg), summed over images

  if (g.N > 0 && nchw_pointwise<S>(g, {&gy, &x})) {
    // gWm_g (Cog, Cg) += gy[n]_g (Cog, HW) @ x[n]_g^T (HW, Cg).
    const A* gyp = static_cast<const A*>(gy.data_ptr());
    const A* xp = static_cast<const A*>(x.data_ptr());
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t gi = 0; gi < g.G; ++gi)
        gemm(g.Cog, g.Cg, g.P, MatRef{gyp + (n * g.Co + gi * g.Cog) * g.P, g.P, 1},
             MatRef{xp + (n * g.C + gi * g.Cg) * g.P, 1, g.P}, A(1), gwm.data() + gi * g.Cog * g.Kg, g.Kg);
    unpack_weight<S, A>(gwm.data(), gw);
    return;
  }

  const bool gy_direct = std::is_same_v<S, A> && is_nhwc(gy);
  const bool x_direct = std::is_same_v<S, A> && is_nhwc(x);
  const int64_t per_image =
      (gy_direct ? 0 : g.P * g.Co) + (g.pointwise ? 0 : g.P * g.Kg) + (x_direct ? 0 : g.H * g.W * g.C);
  const Plan plan = plan_images(g, per_image, sizeof(A), a);
  // Adds images [n_begin, n_end)'s contribution into acc (Co, KH, KW, Cg).
  auto accumulate = [&](int64_t n_begin, int64_t n_end, A* acc) {
    auto gybuf = scratch<A>(gy_direct ? 0 : plan.images * g.P * g.Co);
    auto col = scratch<A>(g.pointwise ? 0 : plan.images * g.P * g.Kg);
    auto xbuf = scratch<A>(x_direct ? 0 : plan.images * g.H * g.W * g.C);
    for (int64_t n0 = n_begin; n0 < n_end; n0 += plan.images) {
      const int64_t nb = std::min(plan.images, n_end - n0), M = nb * g.P;
      const A* gyin = images_in<S, A>(gy, gy_direct, n0, nb, g.P * g.Co, gybuf.get());  // (nb*P, Co)
      const A* xin = images_in<S, A>(x, x_direct, n0, nb, g.H * g.W * g.C, xbuf.get());  // (nb, H, W, C)
      for (int64_t gi = 0; gi < g.G; ++gi) {
        MatRef bm{nullptr, 0, 0};  // (M, Kg)
        if (g.pointwise) {
          bm = MatRef{xin + gi * g.Cg, g.C, 1};
        } else {
          im2col(xin, nb, g, gi * g.Cg, col.get());
          bm = MatRef{col.get(), g.Kg, 1};
        }
        // acc_g (Cog, Kg) += gy_g^T (Cog, M) @ col (M, Kg); gy_g^T element (o, r) at r*Co + o.
        gemm(g.Cog, g.Kg, M, MatRef{gyin + gi * g.Cog, 1, g.Co}, bm, A(1), acc + gi * g.Cog * g.Kg, g.Kg);
      }
    }
  };
  if (g.N > 0 && !plan.tiled) {
    accumulate(0, g.N, gwm.data());
  } else if (g.N > 0) {
    // Blocks of consecutive tiles, each summed into its own buffer, then the buffers in block order.
    const int64_t wsize = g.Co * g.Kg, tiles = plan.tiles(g.N);
    const int64_t limit = a.max_scratch_bytes > 0 ? a.max_scratch_bytes : kDefaultScratchBytes;
    const int64_t blocks =
        std::clamp<int64_t>(limit / std::max<int64_t>(1, wsize * static_cast<int64_t>(sizeof(A))), 1,
                            std::min(kMaxWeightPartials, tiles));
    std::vector<A> partial(static_cast<size_t>(blocks * wsize), A(0));
    parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t t0 = b * tiles / blocks, t1 = (b + 1) * tiles / blocks;
        accumulate(t0 * plan.images, std::min(t1 * plan.images, g.N), partial.data() + b * wsize);
      }
    });
    parallel_for(wsize, 4096, [&](int64_t e0, int64_t e1) {
      for (int64_t b = 0; b < blocks; ++b) add_into(gwm.data() + e0, partial.data() + b * wsize + e0, e1 - e0);
    });
  }
  unpack_weight<S, A>(gwm.data(), gw);
}

// ---- kernels ------------------------------------------------------------------------------------

// oneDNN first (see the header comment), im2col when it declines or AMPFORGE_CPU_CONV=im2col.
// cpu_conv_path() reads (and checks) AMPFORGE_CPU_CONV in every build: "onednn" without oneDNN is an error.
bool use_onednn() { return cpu_conv_path() == CpuConvPath::OneDnn; }

// 16-bit convolutions in F32 on oneDNN: the kernels below convert the operands to F32 tensors, run the F32 problem
// (its Winograd and 1x1 GEMM choices included), and round the result to the 16-bit type once. F16 always: oneDNN 2.6
// has no F16 convolution, and the im2col path it would fall to (which also computes in F32) is slower (ResNet-50 b8
// 128 fp16 step: 639 -> 393-454 ms, bench). BF16 where bf16_compute.h chooses the F32 way (oneDNN's BF16 kernels slower than
// its F32 ones with the conversions counted). The copies are tensors (the caching allocator's, counted in peak
// memory), not per-thread scratch: they are activation-sized, and a grow-only scratch would keep the largest for the
// process.
bool sixteen_bit_in_f32(DType dtype) {
  return dtype == DType::F16 || (dtype == DType::BF16 && cpu_bf16_compute(Bf16Kind::Conv) == Bf16Compute::F32);
}

Tensor f32_copy(const Tensor& t) {
  Tensor r = empty_like(t, DType::F32);
  const bool converted = convert_float16_pair(r, t);
  AF_ASSERT(converted, "conv: expected an F16 or BF16 operand");
  return r;
}

// Each direction on oneDNN when `onednn` (and it takes the problem), else on im2col.
void forward(bool onednn, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y, const Conv2dAttrs& a) {
  if (onednn && onednn_conv2d_forward(x, w, bias, y, a)) return;
  visit_float(y.dtype(), "conv2d", [&](auto tag) { conv_forward<decltype(tag)>(x, w, bias, y, a); });
}

void backward_input(bool onednn, const Tensor& gy, const Tensor& w, const Tensor& gx, const Conv2dAttrs& a) {
  if (onednn && onednn_conv2d_backward_input(gy, w, gx, a)) return;
  visit_float(gx.dtype(), "conv2d_backward_input",
              [&](auto tag) { conv_backward_input<decltype(tag)>(gy, w, gx, a); });
}

void backward_weight(bool onednn, const Tensor& gy, const Tensor& x, const Tensor& gw, const Conv2dAttrs& a) {
  if (onednn && onednn_conv2d_backward_weight(gy, x, gw, a)) return;
  visit_float(gw.dtype(), "conv2d_backward_weight",
              [&](auto tag) { conv_backward_weight<decltype(tag)>(gy, x, gw, a); });
}

// Runs `run(in0, in1, bias, out)` on the kernel's operands as they are, or, for a 16-bit problem the F32 way, on F32
// copies of them (in0, in1, then the bias, then the result: the order backends/meta/cpu_scratch.cpp takes the same
// allocations in), rounding the result into the kernel's output.
template <class Run>
void run_kernel(const KernelArgs& k, const Tensor* bias, Run&& run) {
  const bool onednn = use_onednn();
  if (!onednn || !sixteen_bit_in_f32(k.out(0).dtype())) {
    run(onednn, k.in(0), k.in(1), bias, k.out(0));
    return;
  }
  const Tensor in0 = f32_copy(k.in(0));
  const Tensor in1 = f32_copy(k.in(1));
  const Tensor b = bias != nullptr ? f32_copy(*bias) : Tensor();
  const Tensor out = empty_like(k.out(0), DType::F32);
  run(true, in0, in1, bias != nullptr ? &b : nullptr, out);
  convert_float16_pair(k.out(0), out);
}

// inputs: x, weight[, bias]; outputs: y.
void conv2d_kernel(const KernelArgs& k) {
  const Tensor* bias = k.inputs.size() > 2 && k.in(2).defined() ? &k.in(2) : nullptr;
  const auto& a = k.attr<Conv2dAttrs>();
  run_kernel(k, bias, [&](bool onednn, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y) {
    forward(onednn, x, w, b, y, a);
  });
}

// inputs: grad_out, weight; outputs: grad_in.
void conv2d_backward_input_kernel(const KernelArgs& k) {
  const auto& a = k.attr<Conv2dAttrs>();
  run_kernel(k, nullptr, [&](bool onednn, const Tensor& gy, const Tensor& w, const Tensor*, const Tensor& gx) {
    backward_input(onednn, gy, w, gx, a);
  });
}

// inputs: grad_out, x; outputs: grad_weight.
void conv2d_backward_weight_kernel(const KernelArgs& k) {
  const auto& a = k.attr<Conv2dAttrs>();
  run_kernel(k, nullptr, [&](bool onednn, const Tensor& gy, const Tensor& x, const Tensor*, const Tensor& gw) {
    backward_weight(onednn, gy, x, gw, a);
  });
}

}  // namespace

bool cpu_conv_in_f32_copies(DType dtype) { return use_onednn() && sixteen_bit_in_f32(dtype); }

void register_conv_cpu() {
  register_kernel(OpId::conv2d, DeviceType::CPU, conv2d_kernel);
  register_kernel(OpId::conv2d_backward_input, DeviceType::CPU, conv2d_backward_input_kernel);
  register_kernel(OpId::conv2d_backward_weight, DeviceType::CPU, conv2d_backward_weight_kernel);
}

}  // namespace ampforge::cpu
