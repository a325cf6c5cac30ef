// CUDA softmax, log_softmax, cross_entropy, bce_with_logits and their backward kernels. Contracts are the CPU kernels'
// (backends/cpu/softmax.cpp): ops/ made every operand contiguous; a tensor is viewed as (outer, D, inner)
// around the softmax dim (dim 1 for cross_entropy: D = C classes).
//
//   inner == 1, D <= 1024  one warp per row (several rows per block)
//   inner == 1, D > 1024   one block per row
//   inner > 1              one thread per (outer, inner) column, walking D with stride inner: neighbouring
//                          threads read neighbouring addresses
// Row sums (of exp, of g or g * y) accumulate in double, as on the CPU: with float sums, log_softmax_backward's
// sum(g) over a 5000-element row, times an exp(y) of a few tenths, came out up to 1.7x the F32 tolerance away from
// the CPU's (a host emulation of this kernel's summation order). cross_entropy's row sums stay in float: they
// only move a row's lse by a few float roundings.
//
// cross_entropy: per-row log-sum-exp (saved as F32 for the backward) and loss; the reductions Mean and Sum
// finish in one block that adds the row losses in a fixed order (in double) and counts the non-ignored
// targets on the device, so nothing waits for the host. A target outside [0, C) that is not ignore_index
// cannot raise at the call as on the CPU: its row's loss and gradient become NaN and the device's error
// word is set, which the next synchronising call (a copy to the CPU, cuda::synchronize) turns into an
// InvalidArgument error.
#include <algorithm>

#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

constexpr int kMaxWarpRow = 1024;  // rows up to this length go to one warp
constexpr int kRowBlock = 512;     // threads per block for long rows

struct RowShape {
  int64_t outer = 1, D = 1, inner = 1;
  int64_t rows() const { return outer * inner; }
};

RowShape row_shape(const Shape& s, int dim) {
  RowShape r;
  for (int d = 0; d < dim; ++d) r.outer *= s[d];
  r.D = s.size() == 0 ? 1 : s[dim];
  for (int d = dim + 1; d < s.size(); ++d) r.inner *= s[d];
  return r;
}

// ---- softmax family ------------------------------------------------------------------------------------

// Row-parallel kernel. Forward: a = x. Backward: a = grad, b = y (the forward output).
template <class T, bool kLog, bool kBackward, bool kBlock>
__global__ void __launch_bounds__(kRowBlock) softmax_rows_kernel(int64_t rows, int64_t D, const T* a, const T* b, T* out) {
  __shared__ float scratch[32];
  __shared__ double dscratch[32];
  const int lane = kBlock ? threadIdx.x : (threadIdx.x & 31);
  const int width = kBlock ? blockDim.x : 32;
  const int64_t rows_per_block = kBlock ? 1 : blockDim.x / 32;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * rows_per_block;
  // The loop bound is uniform per warp (warp rows) or per block (block rows): shuffles and barriers are safe.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + (kBlock ? 0 : threadIdx.x / 32); row < rows;
       row += row_step) {
    const T* ar = a + row * D;
    T* orow = out + row * D;
    auto sum_all = [&](double v) {
      if constexpr (kBlock)
        return block_sum(v, dscratch);
      else
        return warp_sum(v);
    };
    if constexpr (!kBackward) {
      float m = -INFINITY;
      for (int64_t j = lane; j < D; j += width) m = nan_max(m, to_float(ar[j]));
      if constexpr (kBlock)
        m = block_max(m, scratch);
      else
        m = warp_max(m);
      double s = 0.0;
      for (int64_t j = lane; j < D; j += width) s += static_cast<double>(expf(to_float(ar[j]) - m));
      s = sum_all(s);
      if constexpr (kLog) {
        const float ls = logf(static_cast<float>(s));  // the log of the sum rounded to float, as the CPU
        for (int64_t j = lane; j < D; j += width) orow[j] = from_float<T>((to_float(ar[j]) - m) - ls);
      } else {
        const float inv = static_cast<float>(1.0 / s);
        for (int64_t j = lane; j < D; j += width) orow[j] = from_float<T>(expf(to_float(ar[j]) - m) * inv);
      }
    } else {
      const T* br = b + row * D;
      double sd = 0.0;  // a product of two floats is exact in double
      for (int64_t j = lane; j < D; j += width)
        sd += kLog ? static_cast<double>(to_float(ar[j]))
                   : static_cast<double>(to_float(ar[j])) * static_cast<double>(to_float(br[j]));
      const float s = static_cast<float>(sum_all(sd));
      for (int64_t j = lane; j < D; j += width) {
        const float g = to_float(ar[j]), y = to_float(br[j]);
        orow[j] = from_float<T>(kLog ? g - expf(y) * s : y * (g - s));
      }
    }
  }
}

// Column kernel for inner > 1: thread per (outer, inner) position.
template <class T, bool kLog, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    softmax_cols_kernel(int64_t outer, int64_t D, int64_t inner, const T* a, const T* b, T* out) {
  const int64_t n = outer * inner;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < n; c += step) {
    const int64_t base = (c / inner) * D * inner + c % inner;
    const T* ac = a + base;
    T* oc = out + base;
    if constexpr (!kBackward) {
      float m = -INFINITY;
      for (int64_t j = 0; j < D; ++j) m = nan_max(m, to_float(ac[j * inner]));
      double s = 0.0;
      for (int64_t j = 0; j < D; ++j) s += static_cast<double>(expf(to_float(ac[j * inner]) - m));
      if constexpr (kLog) {
        const float ls = logf(static_cast<float>(s));
        for (int64_t j = 0; j < D; ++j) oc[j * inner] = from_float<T>((to_float(ac[j * inner]) - m) - ls);
      } else {
        const float inv = static_cast<float>(1.0 / s);
        for (int64_t j = 0; j < D; ++j) oc[j * inner] = from_float<T>(expf(to_float(ac[j * inner]) - m) * inv);
      }
    } else {
      const T* bc = b + base;
      double sd = 0.0;
      for (int64_t j = 0; j < D; ++j)
        sd += kLog ? static_cast<double>(to_float(ac[j * inner]))
                   : static_cast<double>(to_float(ac[j * inner])) * static_cast<double>(to_float(bc[j * inner]));
      const float s = static_cast<float>(sd);
      for (int64_t j = 0; j < D; ++j) {
        const float g = to_float(ac[j * inner]), y = to_float(bc[j * inner]);
        oc[j * inner] = from_float<T>(kLog ? g - expf(y) * s : y * (g - s));
      }
    }
  }
}

template <bool kLog, bool kBackward>
void softmax_cuda(const KernelArgs& a) {
  const Tensor& in0 = a.in(0);
  const Tensor* in1 = kBackward ? &a.in(1) : nullptr;
  const Tensor& out = a.out(0);
  const RowShape rs = row_shape(out.shape(), a.attr<SoftmaxAttrs>().dim);
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device());
  const DeviceState& s = device_state(out.device());
  visit_float(out.dtype(), kLog ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(in0.data_ptr());
    const T* pb = in1 ? static_cast<const T*>(in1->data_ptr()) : nullptr;
    T* po = static_cast<T*>(out.data_ptr());
    if (rs.inner > 1) {
      softmax_cols_kernel<T, kLog, kBackward><<<blocks_for(rs.rows(), kThreads, s), kThreads, 0, s.compute>>>(
          rs.outer, rs.D, rs.inner, pa, pb, po);
    } else if (rs.D <= kMaxWarpRow) {
      constexpr int kWarpsPerBlock = 8;
      const int64_t blocks = std::min<int64_t>((rs.rows() + kWarpsPerBlock - 1) / kWarpsPerBlock,
                                               static_cast<int64_t>(s.sm_count) * 32);
      softmax_rows_kernel<T, kLog, kBackward, false>
          <<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, s.compute>>>(rs.rows(), rs.D, pa, pb, po);
    } else {
      const int64_t blocks = std::min<int64_t>(rs.rows(), static_cast<int64_t>(s.sm_count) * 16);
      softmax_rows_kernel<T, kLog, kBackward, true>
          <<<static_cast<unsigned>(blocks), kRowBlock, 0, s.compute>>>(rs.rows(), rs.D, pa, pb, po);
    }
    AF_CUDA_CHECK_LAUNCH();
  });
}

// ---- cross entropy ------------------------------------------------------------------------------------------

struct CeParams {
  int64_t outer = 1, C = 1, inner = 1;
  int64_t ignore_index = -100;
  float eps = 0;  // label smoothing
  const int64_t* target = nullptr;
  float* lse = nullptr;       // per row (F32)
  float* row_loss = nullptr;  // per row, when the loss is reduced
  int* error_word = nullptr;
};

// Sets the invalid-target bit of the device's error word, keeping its other bits (the word holds bit flags: a
// plain store of this bit would erase an embedding index error not yet reported). Every writer of the bit writes
// the same value, so racing read-modify-writes of it lose nothing.
AF_DEV void flag_bad_target(int* error_word) {
  volatile int* w = error_word;
  *w = *w | kErrTargetOutOfRange;
}

// One row: returns the loss (0 for an ignored target, NaN for an invalid one) and stores the row's lse.
// Lanes [0, width) of the caller share the row (width 1: one thread; 32: a warp).
template <class T, int kWidth>
AF_DEV float ce_row(const CeParams& p, const T* x, int64_t row, int lane) {
  const int64_t st = p.inner;
  const int64_t base = (row / p.inner) * p.C * p.inner + row % p.inner;
  const T* xr = x + base;
  float m = -INFINITY;
  for (int64_t j = lane; j < p.C; j += kWidth) m = nan_max(m, to_float(xr[j * st]));
  if constexpr (kWidth == 32) m = warp_max(m);
  float s = 0.0f, sx = 0.0f;
  for (int64_t j = lane; j < p.C; j += kWidth) {
    const float v = to_float(xr[j * st]);
    s += expf(v - m);
    sx += v;
  }
  if constexpr (kWidth == 32) {
    s = warp_sum(s);
    sx = warp_sum(sx);
  }
  const float lse = m + logf(s);
  if (lane == 0) p.lse[row] = lse;
  const int64_t t = p.target[row];
  if (t == p.ignore_index) return 0.0f;
  if (t < 0 || t >= p.C) {
    if (lane == 0) flag_bad_target(p.error_word);
    return NAN;
  }
  const float nll = lse - to_float(xr[t * st]);
  if (p.eps > 0.0f)  // -mean_c log p_c = lse - mean_c x_c
    return (1.0f - p.eps) * nll + p.eps * (lse - sx / static_cast<float>(p.C));
  return nll;
}

// Rows of a (N, C) tensor: a warp per row. loss_out: T per row (reduction None) or nullptr.
template <class T>
__global__ void __launch_bounds__(kThreads) ce_rows_warp_kernel(CeParams p, const T* x, T* loss_out) {
  const int64_t rows = p.outer * p.inner;
  const int64_t step = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows;
       row += step) {
    const float l = ce_row<T, 32>(p, x, row, threadIdx.x & 31);
    if ((threadIdx.x & 31) == 0) {
      if (loss_out != nullptr)
        loss_out[row] = from_float<T>(l);
      else
        p.row_loss[row] = l;
    }
  }
}

// Rows of an (N, C, d...) tensor: a thread per row (neighbouring rows are neighbouring addresses).
template <class T>
__global__ void __launch_bounds__(kThreads) ce_rows_thread_kernel(CeParams p, const T* x, T* loss_out) {
  const int64_t rows = p.outer * p.inner;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < rows; row += step) {
    const float l = ce_row<T, 1>(p, x, row, 0);
    if (loss_out != nullptr)
      loss_out[row] = from_float<T>(l);
    else
      p.row_loss[row] = l;
  }
}

// One block: the reduced loss. Sums row losses in a fixed order (per-thread strided partials in double,
// then a fixed tree) and counts the targets that are not ignore_index.
template <class T>
__global__ void __launch_bounds__(1024) ce_finish_kernel(int64_t rows, const float* row_loss, const int64_t* target,
                                                          int64_t ignore_index, bool mean, T* loss) {
  __shared__ double ssum[1024];
  __shared__ int64_t scount[1024];
  double s = 0;
  int64_t c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    s += static_cast<double>(row_loss[r]);
    c += target[r] != ignore_index ? 1 : 0;
  }
  ssum[threadIdx.x] = s;
  scount[threadIdx.x] = c;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) {
      ssum[threadIdx.x] += ssum[threadIdx.x + k];
      scount[threadIdx.x] += scount[threadIdx.x + k];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    // mean over non-ignored targets (0/0 = NaN when every target is ignored, as PyTorch and the CPU)
    const double total = mean ? ssum[0] / static_cast<double>(scount[0]) : ssum[0];
    *loss = from_float<T>(static_cast<float>(total));
  }
}

// One block: the backward's gradient scale for a reduced loss, g / count (Mean) or g (Sum), read and
// computed on the device.
template <class T>
__global__ void __launch_bounds__(1024) ce_scale_kernel(int64_t rows, const int64_t* target, int64_t ignore_index,
                                                         bool mean, const T* grad, float* scale) {
  __shared__ int64_t scount[1024];
  int64_t c = 0;
  if (mean)
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) c += target[r] != ignore_index ? 1 : 0;
  scount[threadIdx.x] = c;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) scount[threadIdx.x] += scount[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double g = static_cast<double>(to_float(grad[0]));
    if (mean) g /= static_cast<double>(scount[0]);
    *scale = static_cast<float>(g);
  }
}

// grad_x over every logit element: scale * (softmax - eps / C) - scale * (1 - eps) at the target class.
template <class T>
__global__ void __launch_bounds__(kThreads)
    ce_backward_kernel(CeParams p, const T* x, const T* grad, const float* reduced_scale, T* gx) {
  const int64_t n = p.outer * p.C * p.inner;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const float smooth = p.eps / static_cast<float>(p.C);
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    const int64_t o = e / (p.C * p.inner), rem = e - o * p.C * p.inner;
    const int64_t c = rem / p.inner, i = rem - c * p.inner;
    const int64_t row = o * p.inner + i;
    const int64_t t = p.target[row];
    float v;
    if (t == p.ignore_index) {
      v = 0.0f;
    } else if (t < 0 || t >= p.C) {
      flag_bad_target(p.error_word);
      v = NAN;
    } else {
      const float scale = reduced_scale != nullptr ? *reduced_scale : to_float(grad[row]);
      v = scale * (expf(to_float(x[e]) - p.lse[row]) - smooth);
      if (c == t) v -= scale * (1.0f - p.eps);
    }
    gx[e] = from_float<T>(v);
  }
}

CeParams ce_params(const Tensor& logits, const Tensor& target, const CrossEntropyAttrs& at) {
  const RowShape rs = row_shape(logits.shape(), 1);
  CeParams p;
  p.outer = rs.outer;
  p.C = rs.D;
  p.inner = rs.inner;
  p.ignore_index = at.ignore_index;
  p.eps = static_cast<float>(at.label_smoothing);
  p.target = static_cast<const int64_t*>(target.data_ptr());
  p.error_word = device_state(logits.device()).error_word_dev;
  return p;
}

void cross_entropy_cuda(const KernelArgs& a) {
  const Tensor &x = a.in(0), &target = a.in(1);
  const Tensor &loss = a.out(0), &lse = a.out(1);
  const auto& at = a.attr<CrossEntropyAttrs>();
  visit_float(x.dtype(), "cross_entropy", [](auto) {});  // F64 logits: NotImplemented, not an lse dtype error
  AF_CHECK(lse.dtype() == DType::F32, "cross_entropy: CUDA keeps the log-sum-exp in F32, got {}",
           dtype_name(lse.dtype()));
  DeviceGuard guard(x.device());
  const DeviceState& s = device_state(x.device());
  CeParams p = ce_params(x, target, at);
  p.lse = static_cast<float*>(lse.data_ptr());
  const int64_t rows = p.outer * p.inner;
  const bool reduced = at.reduction != Reduction::None;
  Scratch row_loss(x.device().index, reduced ? static_cast<size_t>(std::max<int64_t>(rows, 1)) * sizeof(float) : 0);
  p.row_loss = row_loss.as<float>();
  visit_float(x.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* lp = reduced ? nullptr : static_cast<T*>(loss.data_ptr());
    if (rows > 0) {
      if (p.inner == 1) {
        ce_rows_warp_kernel<T><<<blocks_for(rows * 32, kThreads, s), kThreads, 0, s.compute>>>(p, xp, lp);
      } else {
        ce_rows_thread_kernel<T><<<blocks_for(rows, kThreads, s), kThreads, 0, s.compute>>>(p, xp, lp);
      }
      AF_CUDA_CHECK_LAUNCH();
    }
    if (reduced) {
      ce_finish_kernel<T><<<1, 1024, 0, s.compute>>>(rows, p.row_loss, p.target, p.ignore_index,
                                                     at.reduction == Reduction::Mean,
                                                     static_cast<T*>(loss.data_ptr()));
      AF_CUDA_CHECK_LAUNCH();
    }
  });
}

void cross_entropy_backward_cuda(const KernelArgs& a) {
  const Tensor &g = a.in(0), &x = a.in(1), &target = a.in(2), &lse = a.in(3);
  const Tensor& gx = a.out(0);
  const auto& at = a.attr<CrossEntropyAttrs>();
  visit_float(x.dtype(), "cross_entropy_backward", [](auto) {});  // F64 logits: NotImplemented (as above)
  AF_CHECK(lse.dtype() == DType::F32, "cross_entropy_backward: expected an F32 log-sum-exp, got {}",
           dtype_name(lse.dtype()));
  if (gx.numel() == 0) return;
  DeviceGuard guard(x.device());
  const DeviceState& s = device_state(x.device());
  CeParams p = ce_params(x, target, at);
  p.lse = static_cast<float*>(lse.data_ptr());
  const int64_t rows = p.outer * p.inner;
  const bool reduced = at.reduction != Reduction::None;
  Scratch scale(x.device().index, reduced ? sizeof(float) : 0);
  visit_float(x.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* gp = static_cast<const T*>(g.data_ptr());
    if (reduced) {
      ce_scale_kernel<T><<<1, 1024, 0, s.compute>>>(rows, p.target, p.ignore_index, at.reduction == Reduction::Mean,
                                                    gp, scale.as<float>());
      AF_CUDA_CHECK_LAUNCH();
    }
    ce_backward_kernel<T><<<blocks_for(gx.numel(), kThreads, s), kThreads, 0, s.compute>>>(
        p, static_cast<const T*>(x.data_ptr()), gp, reduced ? scale.as<float>() : nullptr,
        static_cast<T*>(gx.data_ptr()));
    AF_CUDA_CHECK_LAUNCH();
  });
}

// ---- binary cross entropy with logits ----------------------------------------------------------------------

// max(x, 0) - x t + log(1 + exp(-|x|)): never exponentiates a positive number (the CPU's formula).
AF_DEV float bce_term(float x, float t) { return (x < 0.0f ? 0.0f : x) - x * t + log1pf(expf(-fabsf(x))); }

// Per-element losses: into `out` (reduction None) or into the F32 scratch `terms` (reduced).
template <class T>
__global__ void __launch_bounds__(kThreads) bce_kernel(int64_t n, const T* x, const T* t, T* out, float* terms) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float l = bce_term(to_float(x[i]), to_float(t[i]));
    if (out != nullptr)
      out[i] = from_float<T>(l);
    else
      terms[i] = l;
  }
}

// One block: sum of n floats in a fixed order (strided partials in double, then a fixed tree), divided by
// `divisor`, rounded once to T.
template <class T>
__global__ void __launch_bounds__(1024) sum_finish_kernel(int64_t n, const float* terms, double divisor, T* out) {
  __shared__ double ssum[1024];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(terms[i]);
  ssum[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) ssum[threadIdx.x] += ssum[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = from_float<T>(static_cast<float>(ssum[0] / divisor));
}

// grad_x = (sigmoid(x) - t) * g_i (reduction None) or * g / divisor (reduced; g read on the device).
template <class T>
__global__ void __launch_bounds__(kThreads)
    bce_backward_kernel(int64_t n, const T* g, const T* x, const T* t, T* gx, bool per_element, double divisor) {
  const float gs = per_element ? 0.0f : static_cast<float>(static_cast<double>(to_float(g[0])) / divisor);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float xv = to_float(x[i]);
    const float sig = 1.0f / (1.0f + expf(-xv));
    gx[i] = from_float<T>((sig - to_float(t[i])) * (per_element ? to_float(g[i]) : gs));
  }
}

void bce_cuda(const KernelArgs& a) {
  const Tensor &x = a.in(0), &t = a.in(1), &loss = a.out(0);
  const Reduction red = a.attr<BceAttrs>().reduction;
  const int64_t n = x.numel();
  DeviceGuard guard(x.device());
  const DeviceState& s = device_state(x.device());
  const bool reduced = red != Reduction::None;
  Scratch terms(x.device().index, reduced ? static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float) : 0);
  visit_float(x.dtype(), "binary_cross_entropy_with_logits", [&](auto tag) {
    using T = decltype(tag);
    if (n > 0) {
      bce_kernel<T><<<blocks_for(n, kThreads, s), kThreads, 0, s.compute>>>(
          n, static_cast<const T*>(x.data_ptr()), static_cast<const T*>(t.data_ptr()),
          reduced ? nullptr : static_cast<T*>(loss.data_ptr()), terms.as<float>());
      AF_CUDA_CHECK_LAUNCH();
    }
    if (reduced) {
      // mean of nothing: 0/0 = NaN, as on the CPU
      sum_finish_kernel<T><<<1, 1024, 0, s.compute>>>(n, terms.as<float>(),
                                                      red == Reduction::Mean ? static_cast<double>(n) : 1.0,
                                                      static_cast<T*>(loss.data_ptr()));
      AF_CUDA_CHECK_LAUNCH();
    }
  });
}

void bce_backward_cuda(const KernelArgs& a) {
  const Tensor &g = a.in(0), &x = a.in(1), &t = a.in(2), &gx = a.out(0);
  const Reduction red = a.attr<BceAttrs>().reduction;
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard guard(x.device());
  const DeviceState& s = device_state(x.device());
  visit_float(x.dtype(), "binary_cross_entropy_with_logits_backward", [&](auto tag) {
    using T = decltype(tag);
    bce_backward_kernel<T><<<blocks_for(n, kThreads, s), kThreads, 0, s.compute>>>(
        n, static_cast<const T*>(g.data_ptr()), static_cast<const T*>(x.data_ptr()), static_cast<const T*>(t.data_ptr()),
        static_cast<T*>(gx.data_ptr()), red == Reduction::None, red == Reduction::Mean ? static_cast<double>(n) : 1.0);
    AF_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void register_softmax_cuda() {
  register_kernel(OpId::softmax, DeviceType::CUDA, softmax_cuda<false, false>);
  register_kernel(OpId::log_softmax, DeviceType::CUDA, softmax_cuda<true, false>);
  register_kernel(OpId::softmax_backward, DeviceType::CUDA, softmax_cuda<false, true>);
  register_kernel(OpId::log_softmax_backward, DeviceType::CUDA, softmax_cuda<true, true>);
  register_kernel(OpId::cross_entropy, DeviceType::CUDA, cross_entropy_cuda);
  register_kernel(OpId::cross_entropy_backward, DeviceType::CUDA, cross_entropy_backward_cuda);
  register_kernel(OpId::bce_with_logits, DeviceType::CUDA, bce_cuda);
  register_kernel(OpId::bce_with_logits_backward, DeviceType::CUDA, bce_backward_cuda);
}

}  // namespace ampforge::cuda
