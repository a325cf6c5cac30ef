// CUDA random numbers: rand_uniform, rand_normal, dropout. The same counter scheme as the CPU kernels
// (backends/cpu/elementwise.cpp, backends/cpu/index.cpp), so a seed gives the same numbers on both:
//   uniform  element i = word i % 4 of Philox(seed, offset + i / 4), mapped to [a, b)
//   normal   elements 2c, 2c + 1 = the Box-Muller pair of words 0, 1 of Philox(seed, offset + c), in double
//   dropout  element i kept when unit(word i % 4 of Philox(seed, offset + i / 4)) < 1 - p
// One thread per Philox block, so each block is computed once. Outputs are contiguous (ops/ checks).
#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

template <class T>
__global__ void __launch_bounds__(kThreads)
    uniform_kernel(int64_t n, T* out, uint64_t seed, uint64_t offset, float lo, float span) {
  const int64_t blocks = (n + 3) / 4;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < blocks; c += step) {
    const Philox4 w = philox4x32(seed, offset + static_cast<uint64_t>(c));
    AF_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int64_t i = c * 4 + j;
      // lo + span * u as one fused multiply-add: what the CPU kernel compiles to with the default
      // -march=native on x86-64 (GCC contracts it to vfmadd). For [0, 1) (lo = 0, span = 1) every
      // evaluation order gives the same bits.
      if (i < n) out[i] = from_float<T>(__fmaf_rn(span, unit_float(philox_word(w, j)), lo));
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    normal_kernel(int64_t n, T* out, uint64_t seed, uint64_t offset, double mean, double stdv) {
  const int64_t pairs = (n + 1) / 2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < pairs; c += step) {
    const Philox4 w = philox4x32(seed, offset + static_cast<uint64_t>(c));
    // u1 in (0, 1] so log(u1) is finite.
    const double u1 = (static_cast<double>(w.x >> 8) + 1.0) * (1.0 / 16777216.0);
    const double u2 = static_cast<double>(w.y >> 8) * (1.0 / 16777216.0);
    const double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
    double sn, cs;
    sincos(th, &sn, &cs);
    const int64_t i = c * 2;
    out[i] = from_float<T>(static_cast<float>(mean + stdv * r * cs));
    if (i + 1 < n) out[i + 1] = from_float<T>(static_cast<float>(mean + stdv * r * sn));
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) dropout_kernel(int64_t n, const T* x, T* y, bool* mask, uint64_t seed,
                                                           uint64_t offset, float keep, float scale) {
  const int64_t blocks = (n + 3) / 4;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < blocks; c += step) {
    const Philox4 w = philox4x32(seed, offset + static_cast<uint64_t>(c));
    AF_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int64_t i = c * 4 + j;
      if (i >= n) break;
      const bool kept = unit_float(philox_word(w, j)) < keep;
      mask[i] = kept;
      y[i] = kept ? from_float<T>(to_float(x[i]) * scale) : from_float<T>(0.0f);
    }
  }
}

// The Philox offset is a launch argument taken from the host generator: a CUDA graph would replay the
// same numbers at every replay. Refuse inside a capture rather than train with a frozen dropout mask.
void refuse_in_capture(const char* op) {
  AF_CHECK(!is_capturing(), "{} inside a CUDA graph capture: random numbers would repeat at every replay (the "
                            "Philox offset is fixed at capture time); run models with dropout without --cuda-graphs",
           op);
}

void rand_uniform_cuda(const KernelArgs& a) {
  refuse_in_capture("rand_uniform");
  const auto& at = a.attr<RandAttrs>();
  const Tensor& out = a.out(0);
  AF_ASSERT(out.is_contiguous(), "rand_uniform: output must be contiguous");
  if (out.numel() == 0) return;
  const float lo = static_cast<float>(at.a), span = static_cast<float>(at.b - at.a);
  DeviceGuard guard(out.device());
  const DeviceState& s = device_state(out.device());
  visit_float(out.dtype(), "rand", [&](auto tag) {
    using T = decltype(tag);
    uniform_kernel<T><<<blocks_for((out.numel() + 3) / 4, kThreads, s), kThreads, 0, s.compute>>>(
        out.numel(), static_cast<T*>(out.data_ptr()), at.philox.seed, at.philox.offset, lo, span);
  });
  AF_CUDA_CHECK_LAUNCH();
}

void rand_normal_cuda(const KernelArgs& a) {
  refuse_in_capture("rand_normal");
  const auto& at = a.attr<RandAttrs>();
  const Tensor& out = a.out(0);
  AF_ASSERT(out.is_contiguous(), "rand_normal: output must be contiguous");
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device());
  const DeviceState& s = device_state(out.device());
  visit_float(out.dtype(), "randn", [&](auto tag) {
    using T = decltype(tag);
    normal_kernel<T><<<blocks_for((out.numel() + 1) / 2, kThreads, s), kThreads, 0, s.compute>>>(
        out.numel(), static_cast<T*>(out.data_ptr()), at.philox.seed, at.philox.offset, at.a, at.b);
  });
  AF_CUDA_CHECK_LAUNCH();
}

void dropout_cuda(const KernelArgs& a) {
  refuse_in_capture("dropout");
  const Tensor &x = a.in(0), &y = a.out(0), &mask = a.out(1);
  const auto& at = a.attr<DropoutAttrs>();
  AF_ASSERT(x.is_contiguous() && y.is_contiguous() && mask.is_contiguous(), "dropout: operands must be contiguous");
  if (x.numel() == 0) return;
  const float keep = static_cast<float>(1.0 - at.p);
  const float scale = static_cast<float>(at.p < 1.0 ? 1.0 / (1.0 - at.p) : 0.0);
  DeviceGuard guard(x.device());
  const DeviceState& s = device_state(x.device());
  visit_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<blocks_for((x.numel() + 3) / 4, kThreads, s), kThreads, 0, s.compute>>>(
        x.numel(), static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()),
        static_cast<bool*>(mask.data_ptr()), at.philox.seed, at.philox.offset, keep, scale);
  });
  AF_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_random_cuda() {
  register_kernel(OpId::rand_uniform, DeviceType::CUDA, rand_uniform_cuda);
  register_kernel(OpId::rand_normal, DeviceType::CUDA, rand_normal_cuda);
  register_kernel(OpId::dropout, DeviceType::CUDA, dropout_cuda);
}

}  // namespace ampforge::cuda
