// Vectorised float math for the CPU kernels: exp, log, log1p, tanh, sigmoid and erf over contiguous float arrays.
//
// With AVX2 at compile time and SLEEF present (Debian's libsleef-dev; the vectorised libm that PyTorch's
// CPU kernels use too), each call evaluates 8 floats with SLEEF's 1.0-ULP AVX2 functions (16 with its AVX-512
// ones when the build targets AVX-512); glibc's scalar
// erff/tanhf are 5-10x slower per element. Arrays go in groups of 8 (16) and the last partial group is padded,
// so an element's result never depends on where a chunk or thread boundary falls: kernels built on these
// stay bit-identical for any thread count. Without AVX2 or SLEEF the same functions loop over std::
// scalars (also thread-count invariant). x and y may be the same array.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(AMPFORGE_HAVE_SLEEF) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <sleef.h>
#define AMPFORGE_VEC_MATH_SLEEF 1
#endif

namespace ampforge::cpu::vmath {

#if defined(AMPFORGE_VEC_MATH_SLEEF)
template <class Op>
inline void apply8(const float* x, float* y, int64_t n, Op op) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, op(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::copy(x + i, x + n, buf);
    _mm256_store_ps(buf, op(_mm256_load_ps(buf)));
    std::copy(buf, buf + (n - i), y + i);
  }
}
#if defined(__AVX512F__)
// AVX-512 at compile time: SLEEF's 16-wide functions, the last partial group masked (lanes past n read as 0,
// as the 8-wide padding does). Half the calls of the 8-wide ones; on cores with full 512-bit units (Intel
// Xeon, AMD Zen 5) about twice the throughput, on Zen 4 (two 256-bit halves) the same.
#define AMPFORGE_VEC_MATH_512 1
template <class Op>
inline void apply16(const float* x, float* y, int64_t n, Op op) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, op(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, m, op(_mm512_maskz_loadu_ps(m, x + i)));
  }
}
inline void exp(const float* x, float* y, int64_t n) { apply16(x, y, n, [](__m512 v) { return Sleef_expf16_u10avx512f(v); }); }
inline void log(const float* x, float* y, int64_t n) { apply16(x, y, n, [](__m512 v) { return Sleef_logf16_u10avx512f(v); }); }
inline void tanh(const float* x, float* y, int64_t n) {
  apply16(x, y, n, [](__m512 v) { return Sleef_tanhf16_u10avx512f(v); });
}
inline void log1p(const float* x, float* y, int64_t n) {
  apply16(x, y, n, [](__m512 v) { return Sleef_log1pf16_u10avx512f(v); });
}
// 1 / (1 + exp(-x)) in registers (SiLU and sigmoid, forward and backward; norm.cpp's fused activations).
inline void sigmoid(const float* x, float* y, int64_t n) {
  apply16(x, y, n, [](__m512 v) {
    const __m512 e = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_setzero_ps(), v));
    return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  });
}
#else
inline void exp(const float* x, float* y, int64_t n) { apply8(x, y, n, [](__m256 v) { return Sleef_expf8_u10avx2(v); }); }
inline void log(const float* x, float* y, int64_t n) { apply8(x, y, n, [](__m256 v) { return Sleef_logf8_u10avx2(v); }); }
inline void tanh(const float* x, float* y, int64_t n) {
  apply8(x, y, n, [](__m256 v) { return Sleef_tanhf8_u10avx2(v); });
}
inline void log1p(const float* x, float* y, int64_t n) {
  apply8(x, y, n, [](__m256 v) { return Sleef_log1pf8_u10avx2(v); });
}
inline void sigmoid(const float* x, float* y, int64_t n) {
  apply8(x, y, n, [](__m256 v) {
    const __m256 e = Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_setzero_ps(), v));
    return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  });
}
#endif
// erf by Abramowitz & Stegun 7.1.26: erf(|x|) = 1 - t (a1 + t (a2 + ... a5 t)) exp(-x^2), t = 1 / (1 + p|x|),
// absolute error <= 1.5e-7 (about one F32 ulp of values near 1; PyTorch's vectorised CPU erf uses the same
// formula). 3x faster than SLEEF's 1-ULP erff8 here, which matters because GELU is built on it; callers
// that need relative accuracy for tiny |erf| values must not use it (GELU needs 1 + erf: absolute is right).
// exp(x) for x <= 0 (erf's exp(-x^2)), inline: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, and the
// degree-7 Taylor polynomial of e^r (truncation below 6e-9 relative), scaled by 2^n through the exponent
// bits. Inputs below -87 give 0 (flushed; e^-87 is below every value erf can resolve). Being inline (no call,
// no spilled registers) is what makes it cheaper than SLEEF's general expf8 here.
inline __m256 exp_nonpositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 split: exact high part
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

inline __m256 erf8(__m256 x) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 sign = _mm256_and_ps(x, sign_mask), ax = _mm256_andnot_ps(sign_mask, x);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), ax, one));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  p = _mm256_mul_ps(p, t);
  const __m256 e = exp_nonpositive8(_mm256_xor_ps(_mm256_mul_ps(ax, ax), sign_mask));  // exp(-x^2)
  const __m256 r = _mm256_fnmadd_ps(p, e, one);                                         // 1 - p e
  return _mm256_or_ps(r, sign);  // NaN in, NaN out: t, p and r all become NaN
}
#if defined(AMPFORGE_VEC_MATH_512)
// The same two functions 16 lanes wide, operation for operation (the same roundings, so the same bits per element as
// the 8-wide ones): on cores with full 512-bit units, half the instructions per element (BERT's GELU,
// docs/PERFORMANCE.md).
inline __m512 exp_nonpositive16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i scale = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(scale));
}

inline __m512 erf16(__m512 x) {
  const __m512i sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i xi = _mm512_castps_si512(x);
  const __m512i sign = _mm512_and_si512(xi, sign_mask);
  const __m512 ax = _mm512_castsi512_ps(_mm512_andnot_si512(sign_mask, xi));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), ax, one));
  __m512 p = _mm512_set1_ps(1.061405429f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
  p = _mm512_mul_ps(p, t);
  const __m512 ax2 = _mm512_mul_ps(ax, ax);
  const __m512 e = exp_nonpositive16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(ax2), sign_mask)));
  const __m512 r = _mm512_fnmadd_ps(p, e, one);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign));
}
inline void erf(const float* x, float* y, int64_t n) { apply16(x, y, n, erf16); }
// GELU (erf form) in one pass: x * 0.5 * (1 + erf(x / sqrt 2)), all in registers (the chunked form went over
// its L1 buffer three times; this one is what makes GELU as fast as PyTorch's fused vectorised loop).
inline void gelu_erf(const float* x, float* y, int64_t n) {
  apply16(x, y, n, [](__m512 v) {
    const __m512 half = _mm512_set1_ps(0.5f);
    const __m512 e = erf16(_mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f)));
    return _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  });
}
#else
inline void erf(const float* x, float* y, int64_t n) { apply8(x, y, n, erf8); }
// GELU (erf form) in one pass: x * 0.5 * (1 + erf(x / sqrt 2)), all in registers (the chunked form went over
// its L1 buffer three times; this one is what makes GELU as fast as PyTorch's fused vectorised loop).
inline void gelu_erf(const float* x, float* y, int64_t n) {
  apply8(x, y, n, [](__m256 v) {
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 e = erf8(_mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f)));
    return _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  });
}
#endif
#endif

// Scalar std:: loops: every double array (F64 kernels, the reference path), and float arrays when the SLEEF
// overloads above are not built (a non-template overload wins over these templates).
template <class T>
void exp(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}
template <class T>
void log(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::log(x[i]);
}
template <class T>
void tanh(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}
template <class T>
void log1p(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::log1p(x[i]);
}
template <class T>
void sigmoid(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = T(1) / (T(1) + std::exp(-x[i]));
}
template <class T>
void gelu_erf(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * T(0.70710678118654752440)));
}
template <class T>
void erf(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::erf(x[i]);
}

}  // namespace ampforge::cpu::vmath
