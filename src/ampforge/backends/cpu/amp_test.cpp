// The CPU unscale kernel (amp.cpp): every gradient is multiplied by inv_scale (exactly: a power of two), and one
// non-finite value anywhere (any vector lane of any chunk, the scalar tail, any thread's range) sets found_inf,
// which nothing here clears. F32 and F16/BF16 storage.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ampforge/ops/ops.h"

using namespace ampforge;

namespace {

// 3 x 65536 + 16 x 17 + 5 values: several parallel ranges, whole 16-lane groups and a scalar tail.
constexpr int64_t kN = 3 * 65536 + 16 * 17 + 5;

Tensor ramp(DType dt) {
  std::vector<float> v(kN);
  for (int64_t i = 0; i < kN; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i % 97) - 48) * 0.5f;
  return ops::to_dtype(Tensor::from_vector(v, Shape{kN}), dt);
}

TEST(CpuAmpUnscale, ScalesEveryValueAndFindsOneNonFiniteAnywhere) {
  const Tensor inv = Tensor::from_vector(std::vector<float>{0.25f}, Shape{1});
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    {
      Tensor g = ramp(dt);
      const Tensor found = ops::zeros({1});
      ops::amp_unscale_(g, inv, found);
      EXPECT_EQ(found.item(), 0.0);
      const std::vector<double> got = g.tolist<double>(), want = ramp(dt).tolist<double>();
      for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)] * 0.25) << i;
    }
    // Positions: the first value, lanes 1 and 15 of a group, the last group of the first chunk, another thread's
    // range, the scalar tail and the very last value.
    for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{255}, int64_t{65536 + 7}, kN - 3, kN - 1}) {
      for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> v(kN, 1.0f);
        v[static_cast<size_t>(pos)] = bad;
        Tensor g = ops::to_dtype(Tensor::from_vector(v, Shape{kN}), dt);
        const Tensor found = ops::zeros({1});
        ops::amp_unscale_(g, inv, found);
        EXPECT_EQ(found.item(), 1.0) << "a " << bad << " at " << pos << " was not seen";
      }
    }
  }
}

}  // namespace
