// Matrix products on oneDNN (libdnnl): the F32 GEMMs of gemm.cpp (and so of matmul, linear and im2col convolution)
// on its SGEMM, and BF16 matmul / linear on its matmul primitive, each tried before the OpenBLAS path.
//
// Why F32: OpenBLAS picks its kernels from a table of CPU models that lags behind new CPUs, and environments pin older
// kernels on purpose (OPENBLAS_CORETYPE=Haswell on this project's AVX-512 AMD EPYC VMs, where older OpenBLAS builds
// miscompute on the newer kernels); oneDNN generates its SGEMM for the running CPU at run time. Measured on 2 threads
// on that EPYC, BERT-base's products (256 x 768 x 3072 and its transposes): 2.8-4.8 ms against 5.9-6.2 ms for
// OpenBLAS's Haswell kernels (ad-hoc program, OpenBLAS's own threads; bench/gemm_shapes through ampforge: 1.7-2.7x),
// and on a par with or ahead of OpenBLAS's own AVX-512 (SkylakeX) kernels (2.8-3.4 against 3.2-3.4 ms; the
// 40 x 30522 x 768 vocabulary product 6.7 against 12.8 ms); docs/PERFORMANCE.md.
//
// Why BF16: without native BF16 arithmetic, blas.cpp converts BF16 operands to F32 matrices, runs SGEMM and rounds the
// result: the conversions are pure cost, so BF16 autocast was slower than F32 (BERT-base b4 seq 64: 1334 against
// 962 ms per step). On a CPU with AVX512_BF16 (or AMX), oneDNN's kernels multiply BF16 pairs on the dot-product
// instructions and accumulate in F32, reading the operands as they lie: BERT's GEMMs run in about half the F32
// time (256 x 768 x 3072: 1.5 against 3.0 ms on 2 threads). PyTorch's CPU BF16 matmul runs on the same library.
//
// Numerics: F32 sums in another order than OpenBLAS's (results within the F32 tolerance table of each other). BF16:
// products of BF16 values accumulated in F32 and rounded to BF16 once on store, as the fallback path; the order of
// the additions differs, so results agree with it within BF16 rounding, not bit for bit. The dot-product
// instructions treat BF16 subnormal inputs as zero.
//
// Which path runs: AMPFORGE_CPU_MATMUL, read at every call so that a test or an A/B measurement can switch it:
// unset, empty or "auto" = oneDNN for F32 whenever this build has oneDNN, and for BF16 where the CPU also has
// native BF16 (AVX512_BF16 / AMX) and bf16_compute.h chooses the native way (AMPFORGE_CPU_BF16; on CPUs where the
// BF16 matmul is slower than F32 copies + SGEMM, BF16 products take the conversion path, whose SGEMM is oneDNN's); "blas" = always OpenBLAS (BF16 through F32 copies); "onednn" = as auto, but an
// error in a build without oneDNN. Any other value raises InvalidArgument naming the variable. F64 and F16 (no F16
// matmul on the CPU in oneDNN 2.6) always run on OpenBLAS, as does a BF16 problem oneDNN offers only its reference
// kernel for.
#pragma once

#include <cstdint>
#include <string>

#include "ampforge/core/tensor.h"

namespace ampforge::cpu {

enum class CpuMatmulPath { Blas, OneDnn };
CpuMatmulPath cpu_matmul_path();

// Whether F32 GEMMs / BF16 products go to oneDNN with this build, on this CPU, with AMPFORGE_CPU_MATMUL as it is now.
bool onednn_f32_gemm_active();
bool onednn_bf16_matmul_active();

// One line for `ampforge info` and the bench header: which library runs the CPU's F32 and BF16 products now, e.g.
// "F32 on oneDNN 2.6.3 (avx512_core_bf16) SGEMM; BF16: F32 copies (measured: native 3.54 ms, F32 2.04 ms)" (the BF16
// part is bf16_compute.h's summary), or "OpenBLAS (BF16 via F32 copies)".
std::string cpu_gemm_summary();

// BF16 products oneDNN has run so far (matmul and linear), and the implementation of the last one it accepted or
// declined ("" when none), e.g. "brg:avx512_core_bf16"; F32 GEMMs it has run: for the tests that check which path ran.
int64_t onednn_matmul_executions();
int64_t onednn_sgemm_executions();
std::string onednn_matmul_last_impl();

// Each runs the product on oneDNN and returns true, or returns false without touching the output when it does not
// take the problem (not BF16, path "blas", no native BF16, an empty dimension, a stride layout oneDNN cannot
// describe, or only a reference kernel); the caller then runs its own path.
// out[b] = A[b] @ B[b]: A (Bt, M, K) and B (Bt, K, N) of any strides (batch stride 0 = one matrix for all), out
// (Bt, M, N) contiguous; all three BF16.
bool onednn_matmul(const Tensor& A, const Tensor& B, const Tensor& out);
// out (M, N) = x (M, K) @ w (N, K)^T + bias (N): x and w of any strides, bias (may be null) of any stride, out
// contiguous; all BF16.
bool onednn_linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out);

// C (M, N) = alpha * op(A) @ op(B) + beta * C, row-major with leading dimensions (cblas_sgemm's contract, op = the
// transpose when trans_*), on oneDNN's SGEMM: on the calling thread's OpenMP team of get_num_threads() threads when
// `parallel`, else on the calling thread alone. Returns false without touching C when F32 GEMMs are not oneDNN's
// (path "blas", or no oneDNN in the build) or oneDNN rejects the call.
bool onednn_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc, bool parallel);

}  // namespace ampforge::cpu
