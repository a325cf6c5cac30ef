// CPU matmul (batched, broadcasting batch strides) and linear (x @ W^T + b, bias fused as beta = 1).
// F32/F64 run on the tensors in place. BF16 runs on oneDNN's BF16 kernels where the CPU multiplies BF16 natively
// (matmul_onednn.h); elsewhere, and for F16, operands are converted to float matrices first (the conversion is
// O(n^2) against the GEMM's O(n^3)) and the result is rounded once on store.
#include <vector>

#include "ampforge/backends/cpu/gemm.h"
#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cpu {
namespace {

// A float copy of a strided 2-D slice, row-major.
template <class S>
std::vector<float> to_float_matrix(const S* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    if (cs == 1) {
      load_n<S, float>(p + i * rs, m.data() + i * cols, cols);
    } else {
      for (int64_t j = 0; j < cols; ++j) m[i * cols + j] = static_cast<float>(p[i * rs + j * cs]);
    }
  }
  return m;
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
        auto af = to_float_matrix(ap + b * A.stride(0), M, K, A.stride(1), A.stride(2));
        auto bf = to_float_matrix(bp + b * B.stride(0), K, N, B.stride(1), B.stride(2));
        std::vector<float> cf(static_cast<size_t>(M * N));
        gemm_f32(M, N, K, 1.0f, MatRef{af.data(), K, 1}, MatRef{bf.data(), N, 1}, 0.0f, cf.data(), N, par);
        store_n<S, float>(cf.data(), cp + b * M * N, M * N);
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
      auto xf = to_float_matrix(static_cast<const S*>(x.data_ptr()), M, K, x.stride(0), x.stride(1));
      auto wf = to_float_matrix(static_cast<const S*>(W.data_ptr()), N, K, W.stride(0), W.stride(1));
      std::vector<float> cf(static_cast<size_t>(M * N), 0.0f);
      if (bias) {
        auto bf = to_float_matrix(static_cast<const S*>(bias->data_ptr()), 1, N, 0, bias->stride(0));
        for (int64_t i = 0; i < M; ++i) std::copy(bf.begin(), bf.end(), cf.begin() + i * N);
      }
      gemm_f32(M, N, K, 1.0f, MatRef{xf.data(), K, 1}, MatRef{wf.data(), 1, K}, bias ? 1.0f : 0.0f, cf.data(), N);
      store_n<S, float>(cf.data(), cp, M * N);
    }
  });
}

}  // namespace

void register_blas_cpu() {
  register_kernel(OpId::matmul, DeviceType::CPU, matmul_kernel);
  register_kernel(OpId::linear, DeviceType::CPU, linear_kernel);
}

}  // namespace ampforge::cpu
