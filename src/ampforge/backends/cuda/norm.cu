// CUDA normalisation kernels: batch_norm, batch_norm_backward, layer_norm, layer_norm_backward. Contracts
// are the CPU kernels' (backends/cpu/norm.cpp, which lists operands and outputs):
//   batch_norm   training: batch statistics (biased variance) normalise; running stats, when given, are
//                updated in place with momentum and the UNBIASED variance. Eval: the running statistics
//                normalise and are also written to save_mean / save_invstd (so the backward reads one pair).
//   layer_norm   rows of N = prod(normalized_shape) elements; mean and rstd per row.
// Statistics outputs are F32 (the CUDA backend has no F64 tensors to normalise); weight, bias and running
// statistics may be F32, F16, BF16 or F64, read and written through double as on the CPU.
//
// batch_norm layouts (ops/norm.cpp hands over x, y, grad and grad_input all contiguous (N, C, *) or all
// channels-last (N, H, W, C); nothing else reaches the kernels): x is viewed as (outer, C, inner) with
// inner = prod(*) for contiguous x and inner = 1 (outer = N*H*W rows of C channels) for channels-last x or
// one spatial element.
//   per-channel sums   inner > 1: a block per (channel, fixed split of its M = outer*inner elements);
//                      inner == 1: blocks of 32 channels x 8 row lanes over a fixed split of the rows, so
//                      a warp reads 32 consecutive channels of a row.
//                      Each split writes its sums (double) to scratch; one thread per channel then adds the
//                      splits in split order. Within a split: per-thread sums in a fixed stride, then a fixed
//                      tree (warp shuffles, shared memory). As on the CPU the sums are shifted by the
//                      channel's first element and accumulated in double.
//   elementwise        y = x * alpha[c] + gamma[c] (and the backward's three-term form) in float, with the
//                      per-channel coefficients computed once in double by the finishing kernel.
// layer_norm: a warp per row up to 1024 elements, a block of 512 threads per longer row; two passes (mean,
// then the centred second moment) in float with shuffle trees. Weight/bias gradients are column sums:
// blocks of 32 columns x 8 row lanes over fixed splits of 256 rows (float), the splits added in order in
// double by a finishing kernel.
// Every partition depends only on the shape, and nothing is accumulated with atomics, so every output is
// bit-identical run to run (and independent of the device's SM count).
#include <algorithm>
#include <cmath>

#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

AF_DEV int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

#define AF_GRID_STRIDE(e, total)                                                                        \
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < (total);             \
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- 1-D parameter / statistics vectors (any float dtype, any stride) ------------------------------------

enum VecKind : int { kVecF32, kVecF16, kVecBF16, kVecF64 };

int vec_kind(DType d, const char* what) {
  switch (d) {
    case DType::F32: return kVecF32;
    case DType::F16: return kVecF16;
    case DType::BF16: return kVecBF16;
    case DType::F64: return kVecF64;
    default: AF_THROW(NotImplemented, "{}: parameter dtype {} is not supported on CUDA", what, dtype_name(d));
  }
}

// Read side: element i as double; `fill` when the tensor is undefined (p == nullptr).
struct VecIn {
  const void* p = nullptr;
  int64_t stride = 0;
  int kind = kVecF32;
  double fill = 0.0;
  AF_DEV double get(int64_t i) const {
    if (p == nullptr) return fill;
    const int64_t k = i * stride;
    switch (kind) {
      case kVecF32: return static_cast<double>(static_cast<const float*>(p)[k]);
      case kVecF16: return static_cast<double>(__half2float(static_cast<const half_t*>(p)[k]));
      case kVecBF16: return static_cast<double>(__bfloat162float(static_cast<const bf16_t*>(p)[k]));
      default: return static_cast<const double*>(p)[k];
    }
  }
};

// Write side: stores double v converted as the CPU's from_d (16-bit types through float).
struct VecOut {
  void* p = nullptr;
  int64_t stride = 0;
  int kind = kVecF32;
  AF_DEV void put(int64_t i, double v) const {
    if (p == nullptr) return;
    const int64_t k = i * stride;
    switch (kind) {
      case kVecF32: static_cast<float*>(p)[k] = static_cast<float>(v); return;
      case kVecF16: static_cast<half_t*>(p)[k] = __float2half_rn(static_cast<float>(v)); return;
      case kVecBF16: static_cast<bf16_t*>(p)[k] = __float2bfloat16_rn(static_cast<float>(v)); return;
      default: static_cast<double*>(p)[k] = v; return;
    }
  }
};

// The CPU's load_vec/store_vec address element i at i * (stride of the last dim); `flat` forces stride 1
// (layer_norm's parameters have the normalised shape and are contiguous, ops/norm.cpp made them so).
VecIn vec_in(const Tensor& t, double fill, const char* what, bool flat = false) {
  VecIn v;
  v.fill = fill;
  if (!t.defined()) return v;
  v.p = t.data_ptr();
  v.stride = flat ? 1 : (t.dim() == 0 ? 0 : t.stride(t.dim() - 1));
  v.kind = vec_kind(t.dtype(), what);
  return v;
}

VecOut vec_out(const Tensor& t, const char* what, bool flat = false) {
  VecOut v;
  if (!t.defined()) return v;
  v.p = t.data_ptr();
  v.stride = flat ? 1 : (t.dim() == 0 ? 0 : t.stride(t.dim() - 1));
  v.kind = vec_kind(t.dtype(), what);
  return v;
}

template <class T>
AF_DEV double to_double(T v) {
  return static_cast<double>(to_float(v));
}

// ---- fixed-order block reductions -------------------------------------------------------------------

AF_DEV double warp_sum_d(double v) {
  AF_UNROLL
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Two block-wide double sums at once (blockDim.x a multiple of 32, 1-D block); every thread gets both.
AF_DEV void block_sum2_d(double& a, double& b, double (*scratch)[32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  a = warp_sum_d(a);
  b = warp_sum_d(b);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) {
    scratch[0][warp] = a;
    scratch[1][warp] = b;
  }
  __syncthreads();
  a = lane < nwarps ? scratch[0][lane] : 0.0;
  b = lane < nwarps ? scratch[1][lane] : 0.0;
  a = warp_sum_d(a);
  b = warp_sum_d(b);
}

// Tiles for column sums over rows: 32 columns (one warp, consecutive addresses) x 8 row lanes.
constexpr int kTileC = 32, kTileR = 8;

// ---- batch norm ---------------------------------------------------------------------------------------

constexpr int kBnThreads = 256;
constexpr int64_t kBnSplitElems = 16384;  // elements of one channel per split (inner > 1)
constexpr int64_t kBnSplitRows = 1024;    // rows per split (inner == 1)

struct BnGeo {
  int64_t outer = 0, C = 0, inner = 1;
  AF_HD int64_t count() const { return outer * inner; }  // elements per channel
};

BnGeo bn_geo(const Tensor& x) {
  BnGeo g;
  g.C = x.size(1);
  int64_t spatial = 1;
  for (int d = 2; d < x.dim(); ++d) spatial *= x.size(d);
  if (x.is_contiguous()) {
    g.outer = x.size(0);
    g.inner = spatial;
  } else {
    AF_ASSERT(x.is_contiguous(MemoryFormat::ChannelsLast), "batch_norm: x {} must be contiguous or channels-last",
              x.shape().str());
    g.outer = x.size(0) * spatial;
    g.inner = 1;
  }
  return g;
}

void check_same_layout(const Tensor& t, const Tensor& x, const char* what) {
  const bool ok = x.is_contiguous() ? t.is_contiguous() : t.is_contiguous(MemoryFormat::ChannelsLast);
  AF_ASSERT(ok && t.shape() == x.shape(), "{}: operand {} is not laid out like x {}", what, t.shape().str(),
            x.shape().str());
}

// Splits of each channel's data (a function of the shape only).
int64_t bn_splits(const BnGeo& g) {
  if (g.inner == 1) return (g.outer + kBnSplitRows - 1) / kBnSplitRows;
  return (g.count() + kBnSplitElems - 1) / kBnSplitElems;
}

// Per (channel c, split) sums of u = a - ka and u * v, v = b - kb, into partial[(c * nsplit + split) * 2 + {0, 1}].
// Forward (kForward): a = b = x and ka = kb = the channel's first element (the CPU's shift). Backward:
// a = grad, b = x, ka = 0, kb = save_mean[c].
template <class T, bool kForward>
__global__ void __launch_bounds__(kBnThreads) bn_plane_sums_kernel(BnGeo g, int64_t nsplit, bool narrow, const T* a,
                                                                   const T* b, VecIn mean, double* partial) {
  __shared__ double scratch[2][32];
  const int64_t M = g.count(), I = g.inner;
  for (int64_t t = blockIdx.x; t < g.C * nsplit; t += gridDim.x) {  // uniform per block: barriers are safe
    const int64_t c = t / nsplit, sp = t - c * nsplit;
    const double ka = kForward ? to_double(a[c * I]) : 0.0;
    const double kb = kForward ? ka : mean.get(c);
    const int64_t j1 = min64(M, (sp + 1) * kBnSplitElems);
    double su = 0.0, suv = 0.0;
    for (int64_t j = sp * kBnSplitElems + threadIdx.x; j < j1; j += blockDim.x) {
      int64_t o, i;
      if (narrow) {
        const uint32_t q = static_cast<uint32_t>(j) / static_cast<uint32_t>(I);
        o = q;
        i = j - static_cast<int64_t>(q) * I;
      } else {
        o = j / I;
        i = j - o * I;
      }
      const int64_t off = (o * g.C + c) * I + i;
      const double u = to_double(a[off]) - ka;
      const double v = kForward ? u : to_double(b[off]) - kb;
      su += u;
      suv += u * v;
    }
    block_sum2_d(su, suv, scratch);
    if (threadIdx.x == 0) {
      partial[t * 2] = su;
      partial[t * 2 + 1] = suv;
    }
  }
}

// The same sums for rows of C contiguous channels (inner == 1): R = outer rows; blocks (32, 8).
template <class T, bool kForward>
__global__ void __launch_bounds__(kTileC* kTileR) bn_row_sums_kernel(int64_t R, int64_t C, int64_t nsplit, const T* a,
                                                                     const T* b, VecIn mean, double* partial) {
  __shared__ double red[2][kTileR][kTileC];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t ntiles = (C + kTileC - 1) / kTileC;
  for (int64_t t = blockIdx.x; t < ntiles * nsplit; t += gridDim.x) {  // uniform per block
    const int64_t tile = t / nsplit, sp = t - tile * nsplit;
    const int64_t c = tile * kTileC + tx;
    double su = 0.0, suv = 0.0;
    if (c < C) {
      const double ka = kForward ? to_double(a[c]) : 0.0;
      const double kb = kForward ? ka : mean.get(c);
      const int64_t r1 = min64(R, (sp + 1) * kBnSplitRows);
      for (int64_t r = sp * kBnSplitRows + ty; r < r1; r += kTileR) {
        const double u = to_double(a[r * C + c]) - ka;
        const double v = kForward ? u : to_double(b[r * C + c]) - kb;
        su += u;
        suv += u * v;
      }
    }
    red[0][ty][tx] = su;
    red[1][ty][tx] = suv;
    __syncthreads();
    if (ty == 0 && c < C) {
      double s0 = 0.0, s1 = 0.0;
      for (int k = 0; k < kTileR; ++k) {
        s0 += red[0][k][tx];
        s1 += red[1][k][tx];
      }
      partial[(c * nsplit + sp) * 2] = s0;
      partial[(c * nsplit + sp) * 2 + 1] = s1;
    }
    __syncthreads();  // red is reused by the next task
  }
}

template <class T, bool kForward>
void launch_bn_sums(const DeviceState& s, const BnGeo& g, int64_t nsplit, bool narrow, const T* a, const T* b,
                    const VecIn& mean, double* partial) {
  if (nsplit == 0 || g.C == 0) return;
  if (g.inner == 1) {
    const int64_t tasks = (g.C + kTileC - 1) / kTileC * nsplit;
    bn_row_sums_kernel<T, kForward><<<blocks_for(tasks * kTileC * kTileR, kTileC * kTileR, s), dim3(kTileC, kTileR),
                                      0, s.compute>>>(g.outer, g.C, nsplit, a, b, mean, partial);
  } else {
    bn_plane_sums_kernel<T, kForward><<<blocks_for(g.C * nsplit * kBnThreads, kBnThreads, s), kBnThreads, 0,
                                        s.compute>>>(g, nsplit, narrow, a, b, mean, partial);
  }
  AF_CUDA_CHECK_LAUNCH();
}

struct BnForwardParams {
  int64_t C = 0, inner = 1, M = 0, nsplit = 0;
  bool training = true;
  double eps = 0, momentum = 0;
  VecIn w, b, rm, rv;
  VecOut rm_out, rv_out, save_mean, save_invstd;  // rm_out.p == nullptr: no running-stat update
  const double* partial = nullptr;
  float* alpha = nullptr;  // y = x * alpha[c] + gamma[c]
  float* gamma = nullptr;
};

// One thread per channel: statistics (the CPU's formulas, in double), running-stat update, saved
// statistics and the folded coefficients.
template <class T>
__global__ void __launch_bounds__(kThreads) bn_forward_finish_kernel(BnForwardParams p, const T* x) {
  AF_GRID_STRIDE(c, p.C) {
    double mean, invstd;
    if (p.training) {
      double s1 = 0.0, s2 = 0.0;
      for (int64_t sp = 0; sp < p.nsplit; ++sp) {
        s1 += p.partial[(c * p.nsplit + sp) * 2];
        s2 += p.partial[(c * p.nsplit + sp) * 2 + 1];
      }
      const double M = static_cast<double>(p.M);
      const double m1 = s1 / M;
      mean = to_double(x[c * p.inner]) + m1;
      double var = s2 / M - m1 * m1;
      var = 0.0 < var ? var : 0.0;  // std::max(0.0, var), NaN included
      invstd = 1.0 / sqrt(var + p.eps);
      if (p.rm_out.p != nullptr) {
        const double unbias = p.M > 1 ? M / static_cast<double>(p.M - 1) : 1.0;
        p.rm_out.put(c, (1.0 - p.momentum) * p.rm.get(c) + p.momentum * mean);
        p.rv_out.put(c, (1.0 - p.momentum) * p.rv.get(c) + p.momentum * var * unbias);
      }
    } else {
      mean = p.rm.get(c);
      invstd = 1.0 / sqrt(p.rv.get(c) + p.eps);
    }
    p.save_mean.put(c, mean);
    p.save_invstd.put(c, invstd);
    const double scale = invstd * p.w.get(c);
    p.alpha[c] = static_cast<float>(scale);
    p.gamma[c] = static_cast<float>(p.b.get(c) - mean * scale);
  }
}

// out = a * alpha[c] + gamma[c] (kTwo false) or a * alpha[c] + (b - mu[c]) * beta[c] + gamma[c], in float.
// Every operand is dense in the same layout, so element e is at offset e in each and its channel is
// (e / inner) % C.
template <class T, bool kTwo>
__global__ void __launch_bounds__(kThreads)
    bn_apply_kernel(int64_t n, int64_t C, int64_t inner, bool narrow, const T* a, const T* b, T* out,
                    const float* alpha, const float* beta, const float* mu, const float* gamma) {
  AF_GRID_STRIDE(e, n) {
    int64_t c;
    if (narrow)
      c = (static_cast<uint32_t>(e) / static_cast<uint32_t>(inner)) % static_cast<uint32_t>(C);
    else
      c = (e / inner) % C;
    float o;
    if constexpr (kTwo)
      o = to_float(a[e]) * alpha[c] + (to_float(b[e]) - mu[c]) * beta[c] + gamma[c];
    else
      o = to_float(a[e]) * alpha[c] + gamma[c];
    out[e] = from_float<T>(o);
  }
}

void batch_norm_cuda(const KernelArgs& args) {
  const Tensor& x = args.in(0);
  const Tensor &w = args.in(1), &b = args.in(2), &rm = args.in(3), &rv = args.in(4);
  const Tensor &y = args.out(0), &save_mean = args.out(1), &save_invstd = args.out(2);
  const auto& at = args.attr<BatchNormAttrs>();
  const BnGeo g = bn_geo(x);
  check_same_layout(y, x, "batch_norm");
  const int64_t C = g.C, M = g.count();
  if (C == 0) return;
  AF_ASSERT(!at.training || M > 0, "batch_norm: training with an empty channel");
  AF_ASSERT(at.training || (rm.defined() && rv.defined()), "batch_norm: eval needs the running statistics");
  const int dev = x.device().index;
  DeviceGuard guard(x.device());
  const DeviceState& s = device_state(x.device());
  const int64_t nsplit = at.training ? bn_splits(g) : 0;
  Scratch partial(dev, static_cast<size_t>(nsplit * C * 2) * sizeof(double));
  Scratch coef(dev, static_cast<size_t>(2 * C) * sizeof(float));
  BnForwardParams p;
  p.C = C, p.inner = g.inner, p.M = M, p.nsplit = nsplit;
  p.training = at.training, p.eps = at.eps, p.momentum = at.momentum;
  p.w = vec_in(w, 1.0, "batch_norm");
  p.b = vec_in(b, 0.0, "batch_norm");
  p.rm = vec_in(rm, 0.0, "batch_norm");
  p.rv = vec_in(rv, 1.0, "batch_norm");
  if (at.training && rm.defined()) {
    p.rm_out = vec_out(rm, "batch_norm");
    p.rv_out = vec_out(rv, "batch_norm");
  }
  p.save_mean = vec_out(save_mean, "batch_norm");
  p.save_invstd = vec_out(save_invstd, "batch_norm");
  p.partial = partial.as<double>();
  p.alpha = coef.as<float>();
  p.gamma = p.alpha + C;
  const bool narrow = x.numel() < (int64_t{1} << 31);
  visit_float(x.dtype(), "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    launch_bn_sums<T, true>(s, g, nsplit, narrow, xp, xp, VecIn{}, partial.as<double>());
    bn_forward_finish_kernel<T><<<blocks_for(C, kThreads, s), kThreads, 0, s.compute>>>(p, xp);
    AF_CUDA_CHECK_LAUNCH();
    if (x.numel() > 0) {
      bn_apply_kernel<T, false><<<blocks_for(x.numel(), kThreads, s), kThreads, 0, s.compute>>>(
          x.numel(), C, g.inner, narrow, xp, nullptr, static_cast<T*>(y.data_ptr()), p.alpha, nullptr, nullptr,
          p.gamma);
      AF_CUDA_CHECK_LAUNCH();
    }
  });
}

struct BnBackwardParams {
  int64_t C = 0, M = 0, nsplit = 0;
  bool training = true;
  VecIn mean, invstd, w;
  VecOut gw, gb;
  const double* partial = nullptr;  // nsplit == 0: the sums are not needed (zero)
  float *alpha = nullptr, *beta = nullptr, *mu = nullptr, *gamma = nullptr;
};

// One thread per channel: sum(g), sum(g * (x - mean)), the parameter gradients, and the input gradient's
// coefficients (the CPU's formulas, in double).
__global__ void __launch_bounds__(kThreads) bn_backward_finish_kernel(BnBackwardParams p) {
  AF_GRID_STRIDE(c, p.C) {
    double sg = 0.0, sgx = 0.0;
    for (int64_t sp = 0; sp < p.nsplit; ++sp) {
      sg += p.partial[(c * p.nsplit + sp) * 2];
      sgx += p.partial[(c * p.nsplit + sp) * 2 + 1];
    }
    const double mean = p.mean.get(c), invstd = p.invstd.get(c), wv = p.w.get(c);
    p.gb.put(c, sg);
    p.gw.put(c, sgx * invstd);
    if (!p.training) {  // running statistics are constants: dx = g * invstd * w
      p.alpha[c] = static_cast<float>(invstd * wv);
      p.beta[c] = 0.0f;
      p.mu[c] = 0.0f;
      p.gamma[c] = 0.0f;
      continue;
    }
    // dx = k * (g - mean(g) - (x - mean) * invstd^2 * mean(g * (x - mean))), k = invstd * w
    const double M = static_cast<double>(p.M);
    const double k = invstd * wv;
    const double proj = sgx * invstd * invstd / M;
    p.alpha[c] = static_cast<float>(k);
    p.beta[c] = static_cast<float>(-k * proj);
    p.gamma[c] = static_cast<float>(-k * sg / M);
    p.mu[c] = static_cast<float>(mean);
  }
}

void batch_norm_backward_cuda(const KernelArgs& args) {
  const Tensor &g = args.in(0), &x = args.in(1), &w = args.in(2), &smean = args.in(3), &sinv = args.in(4);
  const Tensor &gx = args.out(0), &gw = args.out(1), &gb = args.out(2);
  const auto& at = args.attr<BatchNormAttrs>();
  const BnGeo geo = bn_geo(x);
  check_same_layout(g, x, "batch_norm_backward");
  if (gx.defined()) check_same_layout(gx, x, "batch_norm_backward");
  const int64_t C = geo.C;
  if (C == 0) return;
  const bool need_sums = (at.training && gx.defined()) || gw.defined() || gb.defined();
  const int dev = x.device().index;
  DeviceGuard guard(x.device());
  const DeviceState& s = device_state(x.device());
  const int64_t nsplit = need_sums ? bn_splits(geo) : 0;
  Scratch partial(dev, static_cast<size_t>(nsplit * C * 2) * sizeof(double));
  Scratch coef(dev, static_cast<size_t>(4 * C) * sizeof(float));
  BnBackwardParams p;
  p.C = C, p.M = geo.count(), p.nsplit = nsplit, p.training = at.training;
  p.mean = vec_in(smean, 0.0, "batch_norm_backward");
  p.invstd = vec_in(sinv, 1.0, "batch_norm_backward");
  p.w = vec_in(w, 1.0, "batch_norm_backward");
  p.gw = vec_out(gw, "batch_norm_backward");
  p.gb = vec_out(gb, "batch_norm_backward");
  p.partial = partial.as<double>();
  p.alpha = coef.as<float>();
  p.beta = p.alpha + C;
  p.mu = p.alpha + 2 * C;
  p.gamma = p.alpha + 3 * C;
  const bool narrow = x.numel() < (int64_t{1} << 31);
  visit_float(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* gp = static_cast<const T*>(g.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    launch_bn_sums<T, false>(s, geo, nsplit, narrow, gp, xp, p.mean, partial.as<double>());
    bn_backward_finish_kernel<<<blocks_for(C, kThreads, s), kThreads, 0, s.compute>>>(p);
    AF_CUDA_CHECK_LAUNCH();
    if (!gx.defined() || gx.numel() == 0) return;
    T* out = static_cast<T*>(gx.data_ptr());
    const unsigned blocks = blocks_for(gx.numel(), kThreads, s);
    if (at.training)
      bn_apply_kernel<T, true><<<blocks, kThreads, 0, s.compute>>>(gx.numel(), C, geo.inner, narrow, gp, xp, out,
                                                                   p.alpha, p.beta, p.mu, p.gamma);
    else
      bn_apply_kernel<T, false><<<blocks, kThreads, 0, s.compute>>>(gx.numel(), C, geo.inner, narrow, gp, nullptr,
                                                                    out, p.alpha, nullptr, nullptr, p.gamma);
    AF_CUDA_CHECK_LAUNCH();
  });
}

// ---- layer norm ---------------------------------------------------------------------------------------

constexpr int kLnMaxWarpRow = 1024;  // rows up to this length go to one warp
constexpr int kLnRowBlock = 512;     // threads per block for longer rows
constexpr int kLnWarpsPerBlock = 8;
constexpr int64_t kLnSplitRows = 256;  // rows per split of the weight/bias gradient column sums

int64_t ln_inner(const Tensor& x, int normalized_dims) {
  int64_t n = 1;
  for (int d = x.dim() - normalized_dims; d < x.dim(); ++d) n *= x.size(d);
  return n;
}

// n values of a parameter vector (or `fill` when undefined) as float, into out.
__global__ void __launch_bounds__(kThreads) vec_to_float_kernel(int64_t n, VecIn v, float* out) {
  AF_GRID_STRIDE(i, n) out[i] = static_cast<float>(v.get(i));
}

void launch_vec_to_float(const DeviceState& s, int64_t n, const VecIn& v, float* out) {
  if (n == 0) return;
  vec_to_float_kernel<<<blocks_for(n, kThreads, s), kThreads, 0, s.compute>>>(n, v, out);
  AF_CUDA_CHECK_LAUNCH();
}

// Row-parallel helpers shared by the forward and the input-gradient kernels: lanes [0, width) of a warp
// (kBlock false) or of the block (kBlock true) share a row.
template <bool kBlock>
AF_DEV float row_sum(float v, float* scratch) {
  if constexpr (kBlock)
    return block_sum(v, scratch);
  else
    return warp_sum(v);
}

struct LnForwardParams {
  int64_t M = 0, N = 0;
  double eps = 0;
  const float* w = nullptr;  // N values (ones when the op has no weight)
  const float* b = nullptr;  // N values (zeros when the op has no bias)
  float* mean = nullptr;
  float* rstd = nullptr;
};

template <class T, bool kBlock>
__global__ void __launch_bounds__(kLnRowBlock) ln_forward_kernel(LnForwardParams p, const T* x, T* y) {
  __shared__ float scratch[32];
  const int lane = kBlock ? threadIdx.x : (threadIdx.x & 31);
  const int width = kBlock ? blockDim.x : 32;
  const int64_t rows_per_block = kBlock ? 1 : blockDim.x / 32;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * rows_per_block;
  const float n = static_cast<float>(p.N);
  // The loop bound is uniform per warp (warp rows) or per block (block rows): shuffles and barriers are safe.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + (kBlock ? 0 : threadIdx.x / 32); row < p.M;
       row += row_step) {
    const T* xr = x + row * p.N;
    T* yr = y + row * p.N;
    // Two passes over a row that stays in cache: the mean first, then the centred second moment.
    float s = 0.0f;
    for (int64_t j = lane; j < p.N; j += width) s += to_float(xr[j]);
    const float mean = row_sum<kBlock>(s, scratch) / n;
    float q = 0.0f;
    for (int64_t j = lane; j < p.N; j += width) {
      const float d = to_float(xr[j]) - mean;
      q += d * d;
    }
    const float var = row_sum<kBlock>(q, scratch) / n;
    const float rstd = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + p.eps));  // eps added in double
    if (lane == 0) {
      p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
    for (int64_t j = lane; j < p.N; j += width) yr[j] = from_float<T>((to_float(xr[j]) - mean) * rstd * p.w[j] + p.b[j]);
  }
}

struct LnBackwardParams {
  int64_t M = 0, N = 0;
  const float* w = nullptr;  // N values (ones when the op has no weight)
  const float* mean = nullptr;
  const float* rstd = nullptr;
};

// dx = rstd * (wg - mean(wg) - xhat * mean(wg * xhat)), wg = g * w, xhat = (x - mean) * rstd.
template <class T, bool kBlock>
__global__ void __launch_bounds__(kLnRowBlock) ln_backward_kernel(LnBackwardParams p, const T* g, const T* x, T* gx) {
  __shared__ float scratch[32];
  const int lane = kBlock ? threadIdx.x : (threadIdx.x & 31);
  const int width = kBlock ? blockDim.x : 32;
  const int64_t rows_per_block = kBlock ? 1 : blockDim.x / 32;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * rows_per_block;
  const float n = static_cast<float>(p.N);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + (kBlock ? 0 : threadIdx.x / 32); row < p.M;
       row += row_step) {
    const T* gr = g + row * p.N;
    const T* xr = x + row * p.N;
    T* orow = gx + row * p.N;
    const float mean = p.mean[row], rstd = p.rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t j = lane; j < p.N; j += width) {
      const float wg = to_float(gr[j]) * p.w[j];
      s1 += wg;
      s2 += wg * ((to_float(xr[j]) - mean) * rstd);
    }
    const float m1 = row_sum<kBlock>(s1, scratch) / n;
    const float m2 = row_sum<kBlock>(s2, scratch) / n;
    for (int64_t j = lane; j < p.N; j += width) {
      const float xhat = (to_float(xr[j]) - mean) * rstd;
      const float wg = to_float(gr[j]) * p.w[j];
      orow[j] = from_float<T>(rstd * (wg - m1 - xhat * m2));
    }
  }
}

// Weight/bias gradient partials: for split sp (rows [sp*kLnSplitRows, ...)) and column j,
// pw[sp*N + j] = sum g * xhat, pb[sp*N + j] = sum g. Blocks (32, 8) over (column tile, split) tasks.
template <class T>
__global__ void __launch_bounds__(kTileC* kTileR)
    ln_param_partials_kernel(int64_t M, int64_t N, int64_t nsplit, const T* g, const T* x, const float* mean,
                             const float* rstd, float* pw, float* pb) {
  __shared__ float red[2][kTileR][kTileC];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t ntiles = (N + kTileC - 1) / kTileC;
  for (int64_t t = blockIdx.x; t < ntiles * nsplit; t += gridDim.x) {  // uniform per block
    const int64_t tile = t / nsplit, sp = t - tile * nsplit;
    const int64_t j = tile * kTileC + tx;
    float aw = 0.0f, ab = 0.0f;
    if (j < N) {
      const int64_t r1 = min64(M, (sp + 1) * kLnSplitRows);
      for (int64_t r = sp * kLnSplitRows + ty; r < r1; r += kTileR) {
        const float gv = to_float(g[r * N + j]);
        aw += gv * ((to_float(x[r * N + j]) - mean[r]) * rstd[r]);
        ab += gv;
      }
    }
    red[0][ty][tx] = aw;
    red[1][ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && j < N) {
      float s0 = 0.0f, s1 = 0.0f;
      for (int k = 0; k < kTileR; ++k) {
        s0 += red[0][k][tx];
        s1 += red[1][k][tx];
      }
      pw[sp * N + j] = s0;
      pb[sp * N + j] = s1;
    }
    __syncthreads();  // red is reused by the next task
  }
}

// One thread per column: the splits' partials added in split order (double), stored in the gradients' dtypes.
__global__ void __launch_bounds__(kThreads)
    ln_param_finish_kernel(int64_t N, int64_t nsplit, const float* pw, const float* pb, VecOut gw, VecOut gb) {
  AF_GRID_STRIDE(j, N) {
    double sw = 0.0, sb = 0.0;
    for (int64_t sp = 0; sp < nsplit; ++sp) {
      sw += static_cast<double>(pw[sp * N + j]);
      sb += static_cast<double>(pb[sp * N + j]);
    }
    gw.put(j, sw);
    gb.put(j, sb);
  }
}

// Launches a row kernel (warp rows up to kLnMaxWarpRow elements, block rows above) for M rows of N.
template <class Warp, class Block>
void launch_rows(const DeviceState& s, int64_t M, int64_t N, Warp warp_kernel, Block block_kernel) {
  if (M == 0) return;
  if (N <= kLnMaxWarpRow) {
    const int64_t blocks =
        std::min<int64_t>((M + kLnWarpsPerBlock - 1) / kLnWarpsPerBlock, static_cast<int64_t>(s.sm_count) * 32);
    warp_kernel(static_cast<unsigned>(blocks), 32 * kLnWarpsPerBlock);
  } else {
    const int64_t blocks = std::min<int64_t>(M, static_cast<int64_t>(s.sm_count) * 16);
    block_kernel(static_cast<unsigned>(blocks), kLnRowBlock);
  }
  AF_CUDA_CHECK_LAUNCH();
}

// ops/ allocates mean and rstd contiguous, in F32 for F32/F16/BF16 inputs (F64 inputs, whose statistics
// are F64, have no CUDA kernel).
void check_stat(const Tensor& t, const char* what) {
  if (t.dtype() != DType::F32)
    AF_THROW(NotImplemented, "{}: CUDA supports F32, F16 and BF16 inputs (F32 mean and rstd), got {} statistics",
             what, dtype_name(t.dtype()));
  AF_CHECK(t.is_contiguous(), "{}: mean and rstd must be contiguous", what);
}

void layer_norm_cuda(const KernelArgs& args) {
  const Tensor &x = args.in(0), &w = args.in(1), &b = args.in(2);
  const Tensor &y = args.out(0), &mean_t = args.out(1), &rstd_t = args.out(2);
  const auto& at = args.attr<LayerNormAttrs>();
  AF_ASSERT(x.is_contiguous() && y.is_contiguous(), "layer_norm: operands must be contiguous");
  check_stat(mean_t, "layer_norm");
  check_stat(rstd_t, "layer_norm");
  const int64_t N = ln_inner(x, at.normalized_dims);
  const int64_t M = N == 0 ? 0 : x.numel() / N;
  if (M == 0) return;
  DeviceGuard guard(x.device());
  const DeviceState& s = device_state(x.device());
  Scratch params(x.device().index, static_cast<size_t>(2 * N) * sizeof(float));
  LnForwardParams p;
  p.M = M, p.N = N, p.eps = at.eps;
  float* wf = params.as<float>();
  launch_vec_to_float(s, N, vec_in(w, 1.0, "layer_norm", true), wf);
  launch_vec_to_float(s, N, vec_in(b, 0.0, "layer_norm", true), wf + N);
  p.w = wf;
  p.b = wf + N;
  p.mean = static_cast<float*>(mean_t.data_ptr());
  p.rstd = static_cast<float*>(rstd_t.data_ptr());
  visit_float(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    launch_rows(
        s, M, N,
        [&](unsigned blocks, int threads) {
          ln_forward_kernel<T, false><<<blocks, threads, 0, s.compute>>>(p, xp, yp);
        },
        [&](unsigned blocks, int threads) {
          ln_forward_kernel<T, true><<<blocks, threads, 0, s.compute>>>(p, xp, yp);
        });
  });
}

void layer_norm_backward_cuda(const KernelArgs& args) {
  const Tensor &g = args.in(0), &x = args.in(1), &mean_t = args.in(2), &rstd_t = args.in(3), &w = args.in(4);
  const Tensor &gx = args.out(0), &gw = args.out(1), &gb = args.out(2);
  const auto& at = args.attr<LayerNormAttrs>();
  AF_ASSERT(x.is_contiguous() && g.is_contiguous(), "layer_norm_backward: operands must be contiguous");
  AF_ASSERT(!gx.defined() || gx.is_contiguous(), "layer_norm_backward: grad_input must be contiguous");
  const int64_t N = ln_inner(x, at.normalized_dims);
  const int64_t M = N == 0 ? 0 : x.numel() / N;
  const bool want_params = gw.defined() || gb.defined();
  if (N == 0 || (!want_params && (M == 0 || !gx.defined()))) return;
  if (M > 0) {
    check_stat(mean_t, "layer_norm_backward");
    check_stat(rstd_t, "layer_norm_backward");
  }
  DeviceGuard guard(x.device());
  const DeviceState& s = device_state(x.device());
  const int dev = x.device().index;
  const float* mp = M > 0 ? static_cast<const float*>(mean_t.data_ptr()) : nullptr;
  const float* rp = M > 0 ? static_cast<const float*>(rstd_t.data_ptr()) : nullptr;
  const int64_t nsplit = want_params ? (M + kLnSplitRows - 1) / kLnSplitRows : 0;
  Scratch wbuf(dev, gx.defined() && M > 0 ? static_cast<size_t>(N) * sizeof(float) : 0);
  Scratch partial(dev, static_cast<size_t>(2 * nsplit * N) * sizeof(float));
  visit_float(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* gp = static_cast<const T*>(g.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    if (gx.defined() && M > 0) {
      LnBackwardParams p;
      p.M = M, p.N = N, p.mean = mp, p.rstd = rp;
      launch_vec_to_float(s, N, vec_in(w, 1.0, "layer_norm_backward", true), wbuf.as<float>());
      p.w = wbuf.as<float>();
      T* gxp = static_cast<T*>(gx.data_ptr());
      launch_rows(
          s, M, N,
          [&](unsigned blocks, int threads) {
            ln_backward_kernel<T, false><<<blocks, threads, 0, s.compute>>>(p, gp, xp, gxp);
          },
          [&](unsigned blocks, int threads) {
            ln_backward_kernel<T, true><<<blocks, threads, 0, s.compute>>>(p, gp, xp, gxp);
          });
    }
    if (!want_params) return;
    float* pw = partial.as<float>();
    float* pb = pw == nullptr ? nullptr : pw + nsplit * N;
    if (nsplit > 0) {
      const int64_t tasks = (N + kTileC - 1) / kTileC * nsplit;
      ln_param_partials_kernel<T><<<blocks_for(tasks * kTileC * kTileR, kTileC * kTileR, s), dim3(kTileC, kTileR), 0,
                                    s.compute>>>(M, N, nsplit, gp, xp, mp, rp, pw, pb);
      AF_CUDA_CHECK_LAUNCH();
    }
    // M == 0: no splits, and the gradients are zeros (as on the CPU).
    ln_param_finish_kernel<<<blocks_for(N, kThreads, s), kThreads, 0, s.compute>>>(
        N, nsplit, pw, pb, vec_out(gw, "layer_norm_backward", true), vec_out(gb, "layer_norm_backward", true));
    AF_CUDA_CHECK_LAUNCH();
  });
}

#undef AF_GRID_STRIDE

}  // namespace

void register_norm_cuda() {
  register_kernel(OpId::batch_norm, DeviceType::CUDA, batch_norm_cuda);
  register_kernel(OpId::batch_norm_backward, DeviceType::CUDA, batch_norm_backward_cuda);
  register_kernel(OpId::layer_norm, DeviceType::CUDA, layer_norm_cuda);
  register_kernel(OpId::layer_norm_backward, DeviceType::CUDA, layer_norm_backward_cuda);
}

}  // namespace ampforge::cuda
