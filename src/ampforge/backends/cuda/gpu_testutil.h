// Helpers for the CUDA backend's tests (*_gpu_test.cpp): skip without a device, move tensors, compare a
// CUDA result with the CPU kernel's within the tolerance table (core/tolerance.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/ops/ops.h"

namespace ampforge::testutil {

#define AF_SKIP_WITHOUT_CUDA()                                                                    \
  do {                                                                                            \
    if (!::ampforge::cuda::is_available())                                                        \
      GTEST_SKIP() << "no CUDA device: " << ::ampforge::cuda::unavailable_reason();               \
  } while (0)

inline const Device kCuda0{DeviceType::CUDA, 0};

// Deterministic cuDNN algorithms while alive (then the previous setting): tests that compare two runs bit for bit,
// or step by step, need kernels that repeat bit for bit, and cuDNN's heuristics may choose an atomics-based
// backward convolution (a run-to-run difference that F16 rounding and Adam's sign-like first steps amplify).
struct DeterministicCudnn {
  bool before = cuda::cudnn_deterministic();
  DeterministicCudnn() { cuda::set_cudnn_deterministic(true); }
  ~DeterministicCudnn() { cuda::set_cudnn_deterministic(before); }
  DeterministicCudnn(const DeterministicCudnn&) = delete;
  DeterministicCudnn& operator=(const DeterministicCudnn&) = delete;
};

inline Tensor to_cuda(const Tensor& t) { return ops::to_device(t, kCuda0); }
inline Tensor to_cpu(const Tensor& t) { return ops::to_device(t, kCPU); }
inline Tensor absolute(const Tensor& t) { return ops::unary(OpId::abs, t); }

// Random CPU tensor: N(0, 1) * scale + shift, generated in F32 and rounded to `dtype` (so CPU and CUDA
// receive identical values).
inline Tensor random_cpu(const Shape& s, DType dtype, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator gen(seed);
  Tensor t = ops::randn(s, DType::F32, kCPU, &gen);
  if (scale != 1.0) t = ops::mul_scalar(t, scale);
  if (shift != 0.0) t = ops::add_scalar(t, shift);
  return ops::to_dtype(t, dtype);
}

// Expects `cuda_result` (any device) to match `cpu_result` within tolerance(dtype) (exact for integer and
// Bool dtypes): same shape and dtype, then the table's comparison rule.
inline void expect_matches_cpu(const Tensor& cuda_result, const Tensor& cpu_result, const std::string& what,
                               double tolerance_factor_scale = 1.0) {
  ASSERT_TRUE(cuda_result.defined() && cpu_result.defined()) << what;
  ASSERT_EQ(cuda_result.shape(), cpu_result.shape()) << what << ": shape";
  ASSERT_EQ(cuda_result.dtype(), cpu_result.dtype()) << what << ": dtype";
  const std::vector<double> a = ops::to_dtype(to_cpu(cuda_result), DType::F64).tolist<double>();
  const std::vector<double> e = ops::to_dtype(cpu_result, DType::F64).tolist<double>();
  const ToleranceEntry tol = tolerance(cpu_result.dtype());
  const double rtol = tol.rtol * tolerance_factor_scale, atol = tol.atol * tolerance_factor_scale;
  const CloseResult r = tolerance_close(
      static_cast<int64_t>(a.size()), [&](int64_t i) { return a[i]; }, [&](int64_t i) { return e[i]; }, rtol, atol);
  EXPECT_TRUE(r.ok) << what << " (" << dtype_name(cpu_result.dtype()) << "): " << r.mismatches << " of " << a.size()
                    << " elements differ from the CPU beyond rtol " << rtol << ", atol " << atol << " x scale "
                    << r.scale << "; worst element " << r.worst << ": cuda " << r.actual_at_worst << ", cpu "
                    << r.expected_at_worst << " (" << r.max_ratio << "x the tolerance)";
}

// Bit-for-bit equality (random streams, masks, copies).
inline void expect_identical(const Tensor& cuda_result, const Tensor& cpu_result, const std::string& what) {
  ASSERT_EQ(cuda_result.shape(), cpu_result.shape()) << what << ": shape";
  ASSERT_EQ(cuda_result.dtype(), cpu_result.dtype()) << what << ": dtype";
  const Tensor a = ops::contiguous(to_cpu(cuda_result)), e = ops::contiguous(cpu_result);
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pe = static_cast<const unsigned char*>(e.data_ptr());
  const int64_t es = a.element_size();
  int64_t diffs = 0, first = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    bool same = true;
    for (int64_t b = 0; b < es; ++b) same = same && pa[i * es + b] == pe[i * es + b];
    if (!same) {
      ++diffs;
      if (first < 0) first = i;
    }
  }
  EXPECT_EQ(diffs, 0) << what << ": " << diffs << " of " << a.numel() << " elements differ bitwise from the CPU; "
                      << "first at " << first;
}

}  // namespace ampforge::testutil
