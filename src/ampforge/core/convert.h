// Bulk conversions between storage dtypes and their compute type (float for F16/BF16/F32).
// Vectorised with AVX-512F (16 values per step), else F16C / AVX2 (8), when the compiler targets them (-march=native on
// a machine that has them), with a portable scalar fallback that gives bit-identical results (Convert.BulkMatchesScalar).
// The AVX-512 loops doubled the conversion rate where autocast's casts are a quarter of a BF16 step (BERT-base: every
// F32 weight to BF16 per forward, every BF16 weight gradient back). No AVX512_BF16 instruction (VCVTNEPS2BF16) is used:
// it flushes subnormal inputs to zero, which would differ from the scalar rounding.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ampforge/core/half.h"

#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ampforge {

#if defined(__AVX512F__)
// The AVX-512 loops below use the zero-masking forms with every lane selected: the plain forms start from an
// "undefined" register, which GCC 12 reports as maybe-uninitialized at every caller.
inline constexpr __mmask16 kAll16 = 0xFFFF;
#endif

inline void half_to_float_n(const Half* in, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
#endif
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < n; ++i) out[i] = half_bits_to_float(in[i].bits);
}

inline void float_to_half_n(const float* in, Half* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_maskz_cvtps_ph(kAll16, _mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
#if defined(__F16C__)
  // _MM_FROUND_TO_NEAREST_INT: round to nearest even, same as float_to_half_bits (NaN payloads may differ
  // in the low bits, still NaN).
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) out[i].bits = float_to_half_bits(in[i]);
}

inline void bf16_to_float_n(const BFloat16* in, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_maskz_cvtepu16_epi32(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll16, v, 16)));
  }
#endif
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
  }
#endif
  for (; i < n; ++i) out[i] = bf16_bits_to_float(in[i].bits);
}

inline void float_to_bf16_n(const float* in, BFloat16* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  {
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i qnan_bit = _mm512_set1_epi32(0x00400000);
    for (; i + 16 <= n; i += 16) {
      const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(in + i));
      const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll16, u, 16), one);
      const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
      const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
      const __m512i r = _mm512_maskz_srli_epi32(kAll16, _mm512_mask_or_epi32(rounded, is_nan, u, qnan_bit), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_maskz_cvtepi32_epi16(kAll16, r));  // each < 65536
    }
  }
#endif
#if defined(__AVX2__)
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i qnan_bit = _mm256_set1_epi32(0x00400000);
  for (; i + 8 <= n; i += 8) {
    __m256i u = _mm256_castps_si256(_mm256_loadu_ps(in + i));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(bias, lsb));
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    __m256i nan_val = _mm256_or_si256(u, qnan_bit);
    __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, nan_val, is_nan), 16);
    // pack 8 x u32 (each < 65536) to 8 x u16
    __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi32(lo, hi));
  }
#endif
  for (; i < n; ++i) out[i].bits = float_to_bf16_bits(in[i]);
}

// Generic load/store of n contiguous elements of storage type T into compute type A.
template <class T, class A>
inline void load_n(const T* in, A* out, int64_t n) {
  if constexpr (std::is_same_v<T, Half> && std::is_same_v<A, float>) {
    half_to_float_n(in, out, n);
  } else if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<A, float>) {
    bf16_to_float_n(in, out, n);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<A>(in[i]);
  }
}

template <class T, class A>
inline void store_n(const A* in, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, Half> && std::is_same_v<A, float>) {
    float_to_half_n(in, out, n);
  } else if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<A, float>) {
    float_to_bf16_n(in, out, n);
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    for (int64_t i = 0; i < n; ++i) out[i] = T(static_cast<float>(in[i]));
  } else if constexpr (std::is_same_v<T, bool>) {
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] != A(0);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(in[i]);
  }
}

// The compute type of a storage type: float for F16/BF16/F32, double for F64, the type itself for ints.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<Half> {
  using type = float;
};
template <>
struct compute_type<BFloat16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

}  // namespace ampforge
