// vec_math.h's functions against the F64 reference, whichever instruction set the file is compiled for: SLEEF's
// AVX-512 functions in a native build on an AVX-512 CPU, its AVX2 ones in an AVX2 build (this file is also built
// for x86-64-v3 alone: ampforge_isa_v3_tests, tests/CMakeLists.txt), the std:: loops without SLEEF.
// Bounds: SLEEF's _u10 functions are within 1.0 ULP; erf8 is our own polynomial (Abramowitz &
// Stegun 7.1.26, vec_math.h) held to its stated absolute error (1.5e-7); sigmoid and GELU compose them (a few ULP). Also pinned:
// the result of an element does not depend on the array's length or where it sits in it (the padding of the last
// group), which makes the kernels built on these thread-count invariant.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ampforge/backends/cpu/vec_math.h"

namespace vm = ampforge::cpu::vmath;

namespace {

// ULP distance of float a from the exact value e (in double), in units of float's spacing at e.
double ulps(float a, double e) {
  if (std::isnan(e)) return std::isnan(a) ? 0 : INFINITY;
  if (std::isinf(e)) return a == e ? 0 : INFINITY;
  const double spacing = std::ldexp(1.0, std::ilogb(std::max(std::abs(e), double(std::numeric_limits<float>::min()))) - 23);
  return std::abs(double(a) - e) / spacing;
}

std::vector<float> grid(float lo, float hi, int n) {
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = lo + (hi - lo) * float(i) / float(n - 1);
  return x;
}

using VecFn = std::function<void(const float*, float*, int64_t)>;

void expect_ulps(const std::string& what, const VecFn& f, double (*ref)(double), const std::vector<float>& x,
                 double max_ulps, double abs_floor = 0) {
  std::vector<float> y(x.size());
  f(x.data(), y.data(), static_cast<int64_t>(x.size()));
  int bad = 0;
  for (size_t i = 0; i < x.size() && bad < 5; ++i) {
    const double e = ref(double(x[i]));
    if (!(ulps(y[i], e) <= max_ulps || std::abs(double(y[i]) - e) <= abs_floor)) {
      ADD_FAILURE() << what << "(" << x[i] << ") = " << y[i] << ", exact " << e << ": " << ulps(y[i], e) << " ulp";
      ++bad;
    }
  }
}

double sigmoid_ref(double v) { return 1 / (1 + std::exp(-v)); }
double gelu_ref(double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }
double exp_ref(double v) { return std::exp(v); }
double log_ref(double v) { return std::log(v); }
double log1p_ref(double v) { return std::log1p(v); }
double tanh_ref(double v) { return std::tanh(v); }
double erf_ref(double v) { return std::erf(v); }

}  // namespace

TEST(VecMath, WithinTheirErrorBoundsOnThisBuildsInstructionSet) {
  const auto xs = grid(-87.f, 88.f, 20001);
  expect_ulps("exp", [](const float* x, float* y, int64_t n) { vm::exp(x, y, n); }, exp_ref, xs, 1.0);
  expect_ulps("log", [](const float* x, float* y, int64_t n) { vm::log(x, y, n); }, log_ref, grid(1e-30f, 1e4f, 20001),
              1.0);
  expect_ulps("log1p", [](const float* x, float* y, int64_t n) { vm::log1p(x, y, n); }, log1p_ref,
              grid(-0.999f, 100.f, 20001), 1.0);
  expect_ulps("tanh", [](const float* x, float* y, int64_t n) { vm::tanh(x, y, n); }, tanh_ref, grid(-20.f, 20.f, 20001),
              1.0);
  // sigmoid = 1 / (1 + exp(-x)): exp's ulp, the addition's and the division's half ulps each.
  expect_ulps("sigmoid", [](const float* x, float* y, int64_t n) { vm::sigmoid(x, y, n); }, sigmoid_ref,
              grid(-80.f, 80.f, 20001), 3.0, 1e-37);
  // erf and GELU: the polynomial's absolute error (<= 1.5e-7 over the whole range, vec_math.h) dominates near 0,
  // where erf's ulps are tiny; an absolute floor of 4e-7 holds the SLEEF-free std:: path to the same test.
  expect_ulps("erf", [](const float* x, float* y, int64_t n) { vm::erf(x, y, n); }, erf_ref, grid(-6.f, 6.f, 20001), 2.0,
              4e-7);
  // GELU = 0.5 x (1 + erf(x / sqrt 2)) carries erf's absolute error times 0.5 |x|: 7.5e-7 at |x| = 10, doubled.
  expect_ulps("gelu_erf", [](const float* x, float* y, int64_t n) { vm::gelu_erf(x, y, n); }, gelu_ref,
              grid(-10.f, 10.f, 20001), 4.0, 1.5e-6);
}

TEST(VecMath, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x{0.f, -0.f, inf, -inf, nan, 89.f, -104.f};
  std::vector<float> y(x.size());
  vm::exp(x.data(), y.data(), int64_t(x.size()));
  EXPECT_EQ(y[0], 1.f);
  EXPECT_EQ(y[2], inf);
  EXPECT_EQ(y[3], 0.f);
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_EQ(y[5], inf) << "exp(89) overflows float";
  EXPECT_EQ(y[6], 0.f);
  vm::tanh(x.data(), y.data(), int64_t(x.size()));
  EXPECT_EQ(y[2], 1.f);
  EXPECT_EQ(y[3], -1.f);
  EXPECT_TRUE(std::isnan(y[4]));
  vm::erf(x.data(), y.data(), int64_t(x.size()));
  EXPECT_EQ(y[2], 1.f);
  EXPECT_EQ(y[3], -1.f);
  EXPECT_TRUE(std::isnan(y[4]));
  vm::sigmoid(x.data(), y.data(), int64_t(x.size()));
  EXPECT_EQ(y[2], 1.f);
  EXPECT_EQ(y[3], 0.f);
}

TEST(VecMath, AnElementsResultDoesNotDependOnWhereItSits) {
  // The same values at every offset and in arrays of every length up to three groups: bit-identical results.
  const auto base = grid(-5.f, 5.f, 53);
  std::vector<float> ref(base.size());
  vm::gelu_erf(base.data(), ref.data(), int64_t(base.size()));
  for (int64_t off = 0; off < 17; ++off)
    for (int64_t len = 1; off + len <= int64_t(base.size()) && len <= 48; len += 5) {
      std::vector<float> y(len);
      vm::gelu_erf(base.data() + off, y.data(), len);
      ASSERT_EQ(0, std::memcmp(y.data(), ref.data() + off, len * sizeof(float))) << "offset " << off << " length " << len;
    }
}

TEST(VecMath, InPlace) {
  auto x = grid(-3.f, 3.f, 37);
  std::vector<float> want(x.size());
  vm::exp(x.data(), want.data(), int64_t(x.size()));
  vm::exp(x.data(), x.data(), int64_t(x.size()));
  EXPECT_EQ(0, std::memcmp(x.data(), want.data(), x.size() * sizeof(float)));
}

#if defined(AMPFORGE_VEC_MATH_512)
TEST(VecMath, SixteenWideErfAndGeluGiveTheEightWideBits) {
  // An AVX-512 build evaluates erf and GELU 16 lanes at a time: operation for operation the 8-wide code, so every
  // element must get the 8-wide bits (NaN, infinities, signed zeros and the flush below e^-87 included).
  auto x = grid(-12.f, 12.f, 40001);
  for (float v : {0.f, -0.f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 1e-30f, -1e-30f, 1e30f})
    x.push_back(v);
  const int64_t n = int64_t(x.size());
  std::vector<float> wide(x.size()), narrow(x.size());
  vm::erf(x.data(), wide.data(), n);
  vm::apply8(x.data(), narrow.data(), n, vm::erf8);
  ASSERT_EQ(0, std::memcmp(wide.data(), narrow.data(), x.size() * sizeof(float))) << "erf";
  vm::gelu_erf(x.data(), wide.data(), n);
  vm::apply8(x.data(), narrow.data(), n, [](__m256 v) {
    const __m256 e = vm::erf8(_mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  });
  ASSERT_EQ(0, std::memcmp(wide.data(), narrow.data(), x.size() * sizeof(float))) << "gelu_erf";
}
#endif
