// Exhaustive tests of the 16-bit conversions (all 65,536 bit patterns) and of float -> 16-bit rounding at
// every boundary class: ties to even, the largest finite values, overflow to Inf, subnormals, underflow
// to zero, NaN. The vectorised bulk paths (F16C / AVX2) must agree bit for bit with the scalar ones.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ampforge/core/convert.h"
#include "ampforge/core/half.h"

using namespace ampforge;

namespace {
// Reference: the exact value of a binary16 pattern, computed independently with ldexp.
double half_value(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(1024 + mant, exp - 25);
}
bool is_half_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
bool is_bf16_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }
}  // namespace

TEST(Half, AllPatternsRoundTripAndValue) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = half_bits_to_float(h);
    if (is_half_nan(h)) {
      EXPECT_TRUE(std::isnan(f)) << i;
      EXPECT_TRUE(is_half_nan(float_to_half_bits(f))) << i;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), half_value(h)) << "pattern " << i;
    EXPECT_EQ(float_to_half_bits(f), h) << "16->32->16 identity fails for pattern " << i;
  }
}

TEST(BFloat16, AllPatternsRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = bf16_bits_to_float(b);
    if (is_bf16_nan(b)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(is_bf16_nan(float_to_bf16_bits(f)));
      continue;
    }
    EXPECT_EQ(float_to_bf16_bits(f), b) << "pattern " << i;
  }
}

// For every pair of adjacent finite half values (a, b): values strictly between round to the nearer; the
// exact midpoint rounds to the one with an even mantissa. Covers subnormals, the normal range and the
// transition between them.
TEST(Half, RoundingAtEveryTieAndBoundary) {
  for (uint32_t i = 0; i < 0x7bff; ++i) {  // positive finite, each with its successor
    const uint16_t a = static_cast<uint16_t>(i), b = static_cast<uint16_t>(i + 1);
    const double va = half_value(a), vb = half_value(b);
    const double mid = 0.5 * (va + vb);
    const float fmid = static_cast<float>(mid);  // exact: a half midpoint needs 12 significant bits
    ASSERT_EQ(static_cast<double>(fmid), mid);
    const uint16_t even = (a & 1) ? b : a;
    EXPECT_EQ(float_to_half_bits(fmid), even) << "tie between " << a << " and " << b;
    EXPECT_EQ(float_to_half_bits(-fmid), static_cast<uint16_t>(even | 0x8000));
    EXPECT_EQ(float_to_half_bits(std::nextafter(fmid, 0.0f)), a);
    EXPECT_EQ(float_to_half_bits(std::nextafter(fmid, INFINITY)), b);
  }
  // Largest finite half is 65504; the midpoint to the next (65520) ties to even -> Inf.
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half_bits(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_half_bits(1e30f), 0x7c00);
  EXPECT_EQ(float_to_half_bits(-INFINITY), 0xfc00);
  // Underflow: half the smallest subnormal (2^-25) ties to even -> 0; just above rounds up.
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(float_to_half_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_half_bits(-1e-30f), 0x8000);
  EXPECT_TRUE(is_half_nan(float_to_half_bits(std::numeric_limits<float>::quiet_NaN())));
}

TEST(BFloat16, RoundingAtTies) {
  for (uint32_t i = 0; i < 0x7f7f; i += 7) {
    const uint16_t a = static_cast<uint16_t>(i), b = static_cast<uint16_t>(i + 1);
    const uint32_t mid_bits = (static_cast<uint32_t>(a) << 16) | 0x8000u;  // exactly halfway
    const uint16_t even = (a & 1) ? b : a;
    EXPECT_EQ(float_to_bf16_bits(bits_float(mid_bits)), even);
    EXPECT_EQ(float_to_bf16_bits(bits_float(mid_bits - 1)), a);
    EXPECT_EQ(float_to_bf16_bits(bits_float(mid_bits + 1)), b);
  }
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to Inf
  EXPECT_TRUE(is_bf16_nan(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN())));
}

// The bulk (vectorised) conversions agree with the scalar ones on every pattern and on random floats.
TEST(Convert, BulkMatchesScalar) {
  std::vector<Half> h(65536);
  std::vector<BFloat16> b(65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    h[i].bits = static_cast<uint16_t>(i);
    b[i].bits = static_cast<uint16_t>(i);
  }
  std::vector<float> fh(65536), fb(65536);
  half_to_float_n(h.data(), fh.data(), 65536);
  bf16_to_float_n(b.data(), fb.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const float sh = half_bits_to_float(static_cast<uint16_t>(i)), sb = bf16_bits_to_float(static_cast<uint16_t>(i));
    if (std::isnan(sh)) EXPECT_TRUE(std::isnan(fh[i])); else EXPECT_EQ(float_bits(fh[i]), float_bits(sh)) << i;
    if (std::isnan(sb)) EXPECT_TRUE(std::isnan(fb[i])); else EXPECT_EQ(float_bits(fb[i]), float_bits(sb)) << i;
  }
  // float -> 16 on a sweep of float bit patterns (every 4099th, covering all exponents).
  std::vector<float> f;
  for (uint64_t u = 0; u < 0x100000000ull; u += 4099) f.push_back(bits_float(static_cast<uint32_t>(u)));
  std::vector<Half> oh(f.size());
  std::vector<BFloat16> ob(f.size());
  float_to_half_n(f.data(), oh.data(), static_cast<int64_t>(f.size()));
  float_to_bf16_n(f.data(), ob.data(), static_cast<int64_t>(f.size()));
  for (size_t i = 0; i < f.size(); ++i) {
    if (std::isnan(f[i])) {
      EXPECT_TRUE(is_half_nan(oh[i].bits));
      EXPECT_TRUE(is_bf16_nan(ob[i].bits));
      continue;
    }
    ASSERT_EQ(oh[i].bits, float_to_half_bits(f[i])) << "float bits " << float_bits(f[i]);
    ASSERT_EQ(ob[i].bits, float_to_bf16_bits(f[i])) << "float bits " << float_bits(f[i]);
  }
}
