// CPU matmul (batched, broadcasting batch strides) and linear (x @ W^T + b, bias fused as beta = 1).
// F32/F64 run on the tensors in place. BF16 runs on oneDNN's BF16 kernels where the CPU multiplies BF16 natively
// (matmul_onednn.h); elsewhere, and for F16, operands are converted to float matrices first (the conversion is
// O(n^2) against the GEMM's O(n^3)) and the result is rounded once on store.
#include <algorithm>
#include <vector>

#include "ampforge/backends/cpu/gemm.h"
#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/backends/cpu/thread_scratch.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/util/thread_pool.h"

namespace ampforge::cpu {
namespace {

// The float copies of the conversion path: per-thread buffers reused across calls (thread_scratch.h; a fresh vector
// per call had glibc mmap and page in BERT-base's 94 MB vocabulary weight every call). Slots: A, B, C of a product.
constexpr ScratchSlot kSlotA = kScratch0, kSlotB = kScratch1, kSlotC = kScratch2;
float* float_buffer(ScratchSlot slot, int64_t n) {
  return static_cast<float*>(thread_scratch(slot, static_cast<size_t>(n) * sizeof(float)));
}

// A float copy of a strided (rows, cols) slice in `dst`, laid out the way the source runs: row-major when its
// column stride is 1 (or neither stride is), column-major when its row stride is 1, so that every run converts
// contiguous values with the vector loads of load_n (a transposed view, as backward passes hand matmul, was
// gathered element by element across rows; BERT's F16 vocabulary-gradient product took 94 ms that way, 21 now). Returns the
// copy as gemm_f32 takes it. Runs are converted in parallel when the copy is large and the caller allows it.
template <class S>
MatRef to_float(const S* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, float* dst, bool parallel) {
  const bool col_major = cs != 1 && rs == 1;
  const int64_t runs = col_major ? cols : rows, len = col_major ? rows : cols, step = col_major ? cs : rs;
  auto convert = [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (col_major || cs == 1) {
        load_n<S, float>(p + r * step, dst + r * len, len);
      } else {
        for (int64_t j = 0; j < len; ++j) dst[r * len + j] = static_cast<float>(p[r * rs + j * cs]);
      }
    }
  };
  if (parallel && rows * cols >= (int64_t{1} << 16))
    parallel_for(runs, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(len, 1)), convert);
  else
    convert(0, runs);
  return col_major ? MatRef{dst, 1, rows} : MatRef{dst, cols, 1};
}

// Rounds the float product (M x N, row-major) into out, in parallel when large and allowed.
template <class S>
void store_rounded(const float* c, S* out, int64_t n, bool parallel) {
  if (parallel && n >= (int64_t{1} << 16))
    parallel_for(n, int64_t{1} << 14, [=](int64_t i0, int64_t i1) { store_n<S, float>(c + i0, out + i0, i1 - i0); });
  else
    store_n<S, float>(c, out, n);
}

// out[b] = A[b] @ B[b]; A (Bt, M, K), B (Bt, K, N), out (Bt, M, N) contiguous.
void matmul_kernel(const KernelArgs& a) {
  const Tensor& A = a.in(0);
  const Tensor& B = a.in(1);
  const Tensor& out = a.out(0);
  const int64_t batch = out.size(0), M = out.size(1), N = out.size(2), K = A.size(2);
  const DType dt = out.dtype();
  if (dt == DType::F32 || dt == DType::F64) {
    visit_float(dt, "matmul", [&](auto tag) {
      using S = decltype(tag);
      if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
        const S* ap = static_cast<const S*>(A.data_ptr());
        const S* bp = static_cast<const S*>(B.data_ptr());
        S* cp = static_cast<S*>(out.data_ptr());
        auto one = [&](int64_t b, bool par) {
          MatRef ar{ap + b * A.stride(0), A.stride(1), A.stride(2)};
          MatRef br{bp + b * B.stride(0), B.stride(1), B.stride(2)};
          if constexpr (std::is_same_v<S, float>)
            gemm_f32(M, N, K, 1.0f, ar, br, 0.0f, cp + b * M * N, N, par);
          else
            gemm_f64(M, N, K, 1.0, ar, br, 0.0, cp + b * M * N, N, par);
        };
        // Many small matrices: parallel over the batch; few large ones: parallel inside each GEMM.
        if (batch >= get_num_threads() && M * N * K < (1 << 21)) {
          parallel_for(batch, 1, [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) one(b, false);
          });
        } else {
          for (int64_t b = 0; b < batch; ++b) one(b, true);
        }
      }
    });
    return;
  }
  if (onednn_matmul(A, B, out)) return;
  visit_float(dt, "matmul", [&](auto tag) {
    using S = decltype(tag);
    if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
      const S* ap = static_cast<const S*>(A.data_ptr());
      const S* bp = static_cast<const S*>(B.data_ptr());
      S* cp = static_cast<S*>(out.data_ptr());
      auto one = [&](int64_t b, bool par) {
        const MatRef af = to_float(ap + b * A.stride(0), M, K, A.stride(1), A.stride(2), float_buffer(kSlotA, M * K), par);
        const MatRef bf = to_float(bp + b * B.stride(0), K, N, B.stride(1), B.stride(2), float_buffer(kSlotB, K * N), par);
        float* cf = float_buffer(kSlotC, M * N);
        gemm_f32(M, N, K, 1.0f, af, bf, 0.0f, cf, N, par);
        store_rounded<S>(cf, cp + b * M * N, M * N, par);
      };
      if (batch >= get_num_threads() && M * N * K < (1 << 21)) {
        parallel_for(batch, 1, [&](int64_t b0, int64_t b1) {
          for (int64_t b = b0; b < b1; ++b) one(b, false);
        });
      } else {
        for (int64_t b = 0; b < batch; ++b) one(b, true);
      }
    }
  });
}

// out (M, N) = x (M, K) @ W (N, K)^T + bias (N); inputs: x, W[, bias].
void linear_kernel(const KernelArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& W = a.in(1);
  const Tensor* bias = a.inputs.size() > 2 && a.in(2).defined() ? &a.in(2) : nullptr;
  const Tensor& out = a.out(0);
  const int64_t M = x.size(0), K = x.size(1), N = W.size(0);
  if (onednn_linear(x, W, bias, out)) return;
  visit_float(out.dtype(), "linear", [&](auto tag) {
    using S = decltype(tag);
    S* cp = static_cast<S*>(out.data_ptr());
    if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
      if (bias) {
        const S* bp = static_cast<const S*>(bias->data_ptr());
        const int64_t bs = bias->stride(0);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) cp[i * N + j] = bp[j * bs];
      }
      MatRef xr{x.data_ptr(), x.stride(0), x.stride(1)};
      MatRef wr{W.data_ptr(), W.stride(1), W.stride(0)};  // W^T: (K, N)
      const S beta = bias ? S(1) : S(0);
      if constexpr (std::is_same_v<S, float>)
        gemm_f32(M, N, K, 1.0f, xr, wr, beta, cp, N);
      else
        gemm_f64(M, N, K, 1.0, xr, wr, beta, cp, N);
    } else {
      const MatRef xf = to_float(static_cast<const S*>(x.data_ptr()), M, K, x.stride(0), x.stride(1),
                                 float_buffer(kSlotA, M * K), true);
      // W^T (K, N): the weight's strides swapped.
      const MatRef wf = to_float(static_cast<const S*>(W.data_ptr()), K, N, W.stride(1), W.stride(0),
                                 float_buffer(kSlotB, K * N), true);
      float* cf = float_buffer(kSlotC, M * N);
      if (bias) {
        const S* bp = static_cast<const S*>(bias->data_ptr());
        const int64_t bs = bias->stride(0);
        for (int64_t j = 0; j < N; ++j) cf[j] = static_cast<float>(bp[j * bs]);
        for (int64_t i = 1; i < M; ++i) std::copy(cf, cf + N, cf + i * N);
      }
      gemm_f32(M, N, K, 1.0f, xf, wf, bias ? 1.0f : 0.0f, cf, N);
      store_rounded<S>(cf, cp, M * N, true);
    }
  });
}

}  // namespace

void register_blas_cpu() {
  register_kernel(OpId::matmul, DeviceType::CPU, matmul_kernel);
  register_kernel(OpId::linear, DeviceType::CPU, linear_kernel);
}

}  // namespace ampforge::cpu
