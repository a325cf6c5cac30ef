#include "ampforge/backends/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "ampforge/backends/cpu/blas_kernels.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/util/thread_pool.h"

namespace ampforge::cpu {
namespace {

// Resolves a strided matrix to a BLAS (transpose flag, leading dimension), packing it when neither
// stride is 1. `rows`, `cols` are the logical sizes.
template <class T>
struct BlasMat {
  const T* ptr;
  CBLAS_TRANSPOSE trans;
  int64_t ld;
  std::vector<T> packed;
};

template <class T>
BlasMat<T> as_blas(const MatRef& m, int64_t rows, int64_t cols) {
  BlasMat<T> b;
  const T* p = static_cast<const T*>(m.data);
  if (m.cs == 1 && m.rs >= std::max<int64_t>(cols, 1)) {
    b.ptr = p;
    b.trans = CblasNoTrans;
    b.ld = m.rs;
  } else if (m.rs == 1 && m.cs >= std::max<int64_t>(rows, 1)) {
    b.ptr = p;
    b.trans = CblasTrans;
    b.ld = m.cs;
  } else {  // neither stride is unit (or a vector with an odd stride): pack row-major
    b.packed.resize(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) b.packed[i * cols + j] = p[i * m.rs + j * m.cs];
    b.ptr = b.packed.data();
    b.trans = CblasNoTrans;
    b.ld = std::max<int64_t>(cols, 1);
  }
  return b;
}

inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}
inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, double alpha,
                      const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

template <class T>
void gemm_impl(int64_t M, int64_t N, int64_t K, T alpha, MatRef Ar, MatRef Br, T beta, T* C, int64_t ldc,
               bool parallel) {
  if (M == 0 || N == 0) return;
  select_blas_kernels();  // once per process, before our first OpenBLAS call (blas_kernels.h)
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  BlasMat<T> A = as_blas<T>(Ar, M, K);
  BlasMat<T> B = as_blas<T>(Br, K, N);
  auto elem = [](const BlasMat<T>& m, int64_t r, int64_t c) {
    return m.trans == CblasNoTrans ? m.ptr + r * m.ld + c : m.ptr + c * m.ld + r;
  };
  const int threads = parallel ? get_num_threads() : 1;
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  if constexpr (std::is_same_v<T, float>) {
    // oneDNN's SGEMM where it is this build's F32 engine (matmul_onednn.h); small products on one thread, as below.
    if (onednn_sgemm(A.trans == CblasTrans, B.trans == CblasTrans, M, N, K, alpha, A.ptr, A.ld, B.ptr, B.ld, beta, C, ldc,
                     threads > 1 && flops >= 2e6))
      return;
  }
  if (threads <= 1 || flops < 2e6) {
    blas_gemm(A.trans, B.trans, M, N, K, alpha, A.ptr, A.ld, B.ptr, B.ld, beta, C, ldc);
    return;
  }
  if (M >= N) {
    // Row blocks, multiples of 16 so each part keeps whole micro-tiles.
    const int64_t nb = (M + 15) / 16;
    parallel_for(nb, 1, [&](int64_t b, int64_t e) {
      const int64_t r0 = b * 16, r1 = std::min(M, e * 16);
      blas_gemm(A.trans, B.trans, r1 - r0, N, K, alpha, elem(A, r0, 0), A.ld, B.ptr, B.ld, beta, C + r0 * ldc, ldc);
    });
  } else {
    const int64_t nb = (N + 15) / 16;
    parallel_for(nb, 1, [&](int64_t b, int64_t e) {
      const int64_t c0 = b * 16, c1 = std::min(N, e * 16);
      blas_gemm(A.trans, B.trans, M, c1 - c0, K, alpha, A.ptr, A.ld, elem(B, 0, c0), B.ld, beta, C + c0, ldc);
    });
  }
}

}  // namespace

void gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, MatRef A, MatRef B, float beta, float* C, int64_t ldc,
              bool parallel) {
  gemm_impl<float>(M, N, K, alpha, A, B, beta, C, ldc, parallel);
}

void gemm_f64(int64_t M, int64_t N, int64_t K, double alpha, MatRef A, MatRef B, double beta, double* C, int64_t ldc,
              bool parallel) {
  gemm_impl<double>(M, N, K, alpha, A, B, beta, C, ldc, parallel);
}

}  // namespace ampforge::cpu
