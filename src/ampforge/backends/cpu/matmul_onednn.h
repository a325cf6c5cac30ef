// BF16 matrix products on oneDNN's matmul primitive (libdnnl), tried by blas.cpp's matmul and linear kernels before
// their convert-to-F32 + OpenBLAS path.
//
// Why: without native BF16 arithmetic, blas.cpp converts BF16 operands to F32 matrices, runs SGEMM and rounds the
// result: the conversions are pure cost, so BF16 autocast was slower than F32 (BERT-base b4 seq 64: 1334 against
// 962 ms per step). On a CPU with AVX512_BF16 (or AMX), oneDNN's kernels multiply BF16 pairs on the dot-product
// instructions and accumulate in F32, reading the operands as they lie: BERT's GEMMs run in about half the F32
// time (256 x 768 x 3072: 1.5 against 3.0 ms on 2 threads; docs/PERFORMANCE.md). PyTorch's CPU BF16 matmul runs on
// the same library.
//
// Numerics: products of BF16 values accumulated in F32 and rounded to BF16 once on store, as the fallback path;
// the order of the additions differs, so results agree with it within BF16 rounding, not bit for bit. The dot-product
// instructions treat BF16 subnormal inputs as zero.
//
// Which path runs: AMPFORGE_CPU_MATMUL, read at every call so that a test or an A/B measurement can switch it:
// unset, empty or "auto" = oneDNN for BF16 where the CPU has native BF16 (AVX512_BF16 / AMX) and this build has
// oneDNN; "blas" = always the conversion path; "onednn" = as auto, but an error in a build without oneDNN. Any other
// value raises InvalidArgument naming the variable. F32, F64 and F16 (no F16 matmul on the CPU in oneDNN 2.6) always
// run on OpenBLAS, as does a BF16 problem oneDNN offers only its reference kernel for.
#pragma once

#include <cstdint>
#include <string>

#include "ampforge/core/tensor.h"

namespace ampforge::cpu {

enum class CpuMatmulPath { Blas, OneDnn };
CpuMatmulPath cpu_matmul_path();

// Whether BF16 products go to oneDNN on this CPU with this build and AMPFORGE_CPU_MATMUL as it is now.
bool onednn_bf16_matmul_active();

// Products oneDNN has run so far (matmul and linear), and the implementation of the last one it accepted or
// declined ("" when none), e.g. "brg:avx512_core_bf16": for the tests that check which path ran.
int64_t onednn_matmul_executions();
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

}  // namespace ampforge::cpu
