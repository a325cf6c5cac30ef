// CPU GEMM on strided matrices, the building block of matmul, linear and im2col convolution.
// C[M, N] = alpha * A[M, K] @ B[K, N] + beta * C, with A, B, C given by pointer and (row, col) strides
// in elements. A matrix with unit column stride is row-major, with unit row stride column-major;
// anything else is packed first. F32 runs on oneDNN's SGEMM where the build has oneDNN (matmul_onednn.h says why
// and how to switch it off). Otherwise the call splits the larger of M and N across the thread pool and runs
// single-threaded OpenBLAS on each part (ampforge owns the threads; OpenBLAS is set to 1 thread). `parallel` false:
// the calling thread alone.
#pragma once

#include <cstdint>

namespace ampforge::cpu {

struct MatRef {
  const void* data;
  int64_t rs, cs;  // row and column strides, in elements
};

void gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, MatRef A, MatRef B, float beta, float* C, int64_t ldc,
              bool parallel = true);
void gemm_f64(int64_t M, int64_t N, int64_t K, double alpha, MatRef A, MatRef B, double beta, double* C, int64_t ldc,
              bool parallel = true);

}  // namespace ampforge::cpu
