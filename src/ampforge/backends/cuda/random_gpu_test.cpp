// CUDA random numbers against the CPU kernels: the same generator state gives the same stream (the
// counter scheme of core/generator.h). Uniform [0, 1) and dropout masks are bit-identical; scaled
// uniforms and normals agree to the F32 tolerance (a fused multiply-add or libm's last bit may differ).
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include "ampforge/backends/cuda/gpu_testutil.h"

using namespace ampforge;
using namespace ampforge::testutil;

TEST(CudaRandom, UniformIsTheCpuStream) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {1, 3, 4, 1001, 1 << 20}) {
      Generator a(1234), b(1234);
      a.reserve(17);  // a non-zero starting offset
      b.reserve(17);
      Tensor c = ops::rand(Shape{n}, dt, kCPU, &a);
      Tensor g = ops::rand(Shape{n}, dt, kCuda0, &b);
      expect_identical(g, c, "rand n=" + std::to_string(n));
      EXPECT_EQ(a.state().offset, b.state().offset);
    }
  Generator a(7), b(7);
  Tensor c = ops::rand(Shape{999}, DType::F32, kCPU, &a, -3.0, 5.0);
  Tensor g = ops::rand(Shape{999}, DType::F32, kCuda0, &b, -3.0, 5.0);
  expect_matches_cpu(g, c, "rand [-3, 5)");
}

TEST(CudaRandom, NormalIsTheCpuStream) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {1, 2, 5, 4097}) {
      Generator a(99), b(99);
      Tensor c = ops::randn(Shape{n}, dt, kCPU, &a, 0.5, 2.0);
      Tensor g = ops::randn(Shape{n}, dt, kCuda0, &b, 0.5, 2.0);
      expect_matches_cpu(g, c, "randn n=" + std::to_string(n));
    }
}

TEST(CudaRandom, DropoutMaskAndValuesAreTheCpus) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (double p : {0.0, 0.1, 0.5, 1.0}) {
      Tensor x = random_cpu(Shape{33, 65}, dt, 300);
      Generator a(5), b(5);
      auto c = ops::dropout(x, p, &a);
      auto g = ops::dropout(to_cuda(x), p, &b);
      const std::string what = std::string(dtype_name(dt)) + " p=" + std::to_string(p);
      expect_identical(g.mask, c.mask, "dropout mask " + what);
      expect_identical(g.out, c.out, "dropout values " + what);
    }
}
