// 16-bit floating-point storage types. Arithmetic happens in float: these types only store.
//   Half      IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits.
//   BFloat16  the top 16 bits of a binary32: 1 sign, 8 exponent, 7 mantissa bits.
// float -> 16-bit rounds to nearest, ties to even; NaN stays NaN (quiet, sign kept); overflow goes
// to Inf; values below the smallest subnormal round to (signed) zero. 16-bit -> float is exact.
#pragma once

#include <cstdint>
#include <cstring>

namespace ampforge {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// binary16 -> binary32, exact (handles subnormals, Inf, NaN).
inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // Inf / NaN (payload kept)
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: value = mant * 2^-24. Exact in float.
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// binary32 -> binary16 with round-to-nearest-even.
inline uint16_t float_to_half_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {                                 // Inf or NaN
    if (abs == 0x7f800000u) return sign | 0x7c00u;
    return sign | 0x7e00u | static_cast<uint16_t>((abs >> 13) & 0x3ffu);  // quiet NaN
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to Inf
  if (abs < 0x38800000u) {                          // below the smallest normal half (2^-14): subnormal or 0
    // Add 0.5 (as a float) so the FPU's own round-to-nearest-even places the subnormal bits.
    float r = bits_float(abs) + 0.5f;
    return sign | static_cast<uint16_t>(float_bits(r) - 0x3f000000u);
  }
  // Normal: rebias exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t mant_odd = (abs >> 13) & 1u;
  uint32_t r = abs + 0xc8000fffu + mant_odd;  // rebias (-112 << 23) plus rounding bias
  return sign | static_cast<uint16_t>(r >> 13);
}

inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even; overflow carries into Inf correctly
  return static_cast<uint16_t>(u >> 16);
}

// Stochastic rounding to BF16: `noise` is a uniform random 32-bit word, of which the low 16 bits are
// added to the 16 bits that truncation drops. The carry into the kept bits happens with probability
// (dropped bits) / 2^16, so the result is the upper neighbour with exactly that probability and
// E[result] = f (for finite f away from the overflow threshold). Sign-magnitude makes this symmetric for
// negative values. NaN stays a quiet NaN; Inf stays Inf (its dropped bits are zero, so no carry).
inline uint16_t float_to_bf16_bits_stochastic(float f, uint32_t noise) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += noise & 0xffffu;
  return static_cast<uint16_t>(u >> 16);
}

struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f) : bits(float_to_half_bits(f)) {}
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
  operator float() const { return half_bits_to_float(bits); }
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(float_to_bf16_bits(f)) {}
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
  operator float() const { return bf16_bits_to_float(bits); }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

}  // namespace ampforge
