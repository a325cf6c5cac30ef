// CUDA fused optimizer steps and the mixed-precision kernels. Contracts are the CPU kernels'
// (backends/cpu/optim.cpp, backends/cpu/amp.cpp):
//   adamw_step / sgd_step  outputs {param (F32), state... [, model copy (F16/BF16)]},
//                          inputs {grad [, found_inf [, hyper]]}.
//                          One launch over a flat buffer. found_inf (one F32 on the device) is read by the
//                          kernel itself: non-zero makes every thread return, leaving all buffers untouched,
//                          so GradScaler's skip decision never reaches the host. hyper (F64 {completed
//                          steps, lr}, core/attrs.h) is read by every thread (bias corrections computed on the
//                          device) and advanced by a one-thread kernel after the update when the step ran:
//                          a second launch, so that no thread of the first can read a half-advanced count.
//   amp_unscale            inputs {inv_scale (F32, 1)}, outputs {grads (in place), found_inf (F32, 1)}; found_inf
//                          is set to 1 when a gradient is Inf/NaN and never cleared here.
//   amp_update_scale       inputs {found_inf}, outputs {scale (F32, 1), growth_tracker (I32, 1)}: one thread.
// Arithmetic mirrors the CPU kernels' order of operations (in float).
#include <cmath>

#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

enum class CopyMode : int { None, F16, BF16, BF16Stochastic };

struct ModelCopy {
  CopyMode mode = CopyMode::None;
  void* data = nullptr;
  uint64_t seed = 0, offset = 0;
  uint64_t blocks_per_step = 0;  // with device hyperparameters: offset = completed steps x this
};

// The 16-bit model copy of master element i. Stochastic BF16 rounding adds the low 16 bits of word i % 4
// of Philox(seed, offset + i / 4) below the kept bits (core/half.h, float_to_bf16_bits_stochastic).
AF_DEV void store_model_copy(const ModelCopy& mc, int64_t i, float v) {
  switch (mc.mode) {
    case CopyMode::None: return;
    case CopyMode::F16: static_cast<half_t*>(mc.data)[i] = __float2half_rn(v); return;
    case CopyMode::BF16: static_cast<bf16_t*>(mc.data)[i] = __float2bfloat16_rn(v); return;
    case CopyMode::BF16Stochastic: {
      uint32_t u = __float_as_uint(v);
      uint16_t bits;
      if ((u & 0x7fffffffu) > 0x7f800000u) {
        bits = static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
      } else {
        const Philox4 r = philox4x32(mc.seed, mc.offset + static_cast<uint64_t>(i) / 4);
        u += philox_word(r, static_cast<int>(i % 4)) & 0xffffu;
        bits = static_cast<uint16_t>(u >> 16);
      }
      static_cast<uint16_t*>(mc.data)[i] = bits;
      return;
    }
  }
}

ModelCopy model_copy(const KernelArgs& a, size_t idx, const ModelCopyRounding& rounding) {
  ModelCopy mc;
  if (a.outputs.size() <= idx || !a.out(idx).defined()) return mc;
  const Tensor& mp = a.out(idx);
  mc.data = mp.data_ptr();
  mc.seed = rounding.seed;
  mc.offset = rounding.offset;
  mc.blocks_per_step = rounding.blocks_per_step;
  if (mp.dtype() == DType::F16)
    mc.mode = CopyMode::F16;
  else if (mp.dtype() == DType::BF16)
    mc.mode = rounding.stochastic ? CopyMode::BF16Stochastic : CopyMode::BF16;
  else
    AF_THROW(InvalidArgument, "optimizer: the model copy must be F16 or BF16, got {}", dtype_name(mp.dtype()));
  return mc;
}

const float* found_inf_ptr(const KernelArgs& a, size_t idx) {
  if (a.inputs.size() <= idx || !a.in(idx).defined()) return nullptr;
  AF_ASSERT(a.in(idx).dtype() == DType::F32, "found_inf must be F32");
  return static_cast<const float*>(a.in(idx).data_ptr());
}

double* hyper_ptr(const KernelArgs& a, size_t idx) {
  if (a.inputs.size() <= idx || !a.in(idx).defined()) return nullptr;
  return static_cast<double*>(a.in(idx).data_ptr());
}

// hyper[0] += 1 unless the step was skipped (found_inf non-zero).
__global__ void advance_hyper_kernel(double* hyper, const float* found_inf) {
  if (found_inf == nullptr || *found_inf == 0.0f) hyper[0] += 1.0;
}

void advance_hyper(const DeviceState& s, double* hyper, const float* found) {
  if (hyper == nullptr) return;
  advance_hyper_kernel<<<1, 1, 0, s.compute>>>(hyper, found);
  AF_CUDA_CHECK_LAUNCH();
}

// ---- AdamW ---------------------------------------------------------------------------------------------------

struct AdamWParams {
  float b1, b2, decay, step_size, sqrt_bc2, eps;
};

// The per-step constants, computed in double and rounded as the CPU kernel does; on the host from the
// attrs, or on the device from the hyperparameter tensor.
__host__ __device__ inline AdamWParams adamw_params(double beta1, double beta2, double eps, double weight_decay, double lr,
                                     double step) {
  const double bc1 = 1.0 - pow(beta1, step);
  const double bc2 = 1.0 - pow(beta2, step);
  return {static_cast<float>(beta1),          static_cast<float>(beta2), static_cast<float>(1.0 - lr * weight_decay),
          static_cast<float>(lr / bc1),       static_cast<float>(sqrt(bc2)), static_cast<float>(eps)};
}

struct AdamWConsts {
  double beta1, beta2, eps, weight_decay;
};

template <class G>
__global__ void __launch_bounds__(kThreads) adamw_kernel(int64_t n, float* __restrict__ p, float* __restrict__ m1,
                                                         float* __restrict__ m2, const G* __restrict__ g,
                                                         const float* found_inf, AdamWParams h, ModelCopy mc,
                                                         const double* hyper, AdamWConsts c) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  if (hyper != nullptr) {
    const double completed = hyper[0];
    h = adamw_params(c.beta1, c.beta2, c.eps, c.weight_decay, hyper[1], completed + 1.0);
    mc.offset = static_cast<uint64_t>(completed) * mc.blocks_per_step;
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float gi = to_float(g[i]);
    float pp = p[i] * h.decay;  // decoupled weight decay, before the Adam update (PyTorch's order)
    const float mm = h.b1 * m1[i] + (1.0f - h.b1) * gi;
    const float vv = h.b2 * m2[i] + (1.0f - h.b2) * gi * gi;
    pp -= h.step_size * mm / (sqrtf(vv) / h.sqrt_bc2 + h.eps);
    p[i] = pp;
    m1[i] = mm;
    m2[i] = vv;
    store_model_copy(mc, i, pp);
  }
}

void adamw_cuda(const KernelArgs& a) {
  const auto& at = a.attr<AdamWAttrs>();
  const Tensor& param = a.out(0);
  const Tensor& grad = a.in(0);
  if (param.numel() == 0) return;
  const AdamWParams h =
      adamw_params(at.beta1, at.beta2, at.eps, at.weight_decay, at.lr, static_cast<double>(at.step));
  const AdamWConsts consts{at.beta1, at.beta2, at.eps, at.weight_decay};
  const ModelCopy mc = model_copy(a, 3, at.rounding);
  const float* found = found_inf_ptr(a, 1);
  double* hyper = hyper_ptr(a, 2);
  DeviceGuard guard(param.device());
  const DeviceState& s = device_state(param.device());
  visit_float(grad.dtype(), "adamw_step (gradient)", [&](auto tag) {
    using G = decltype(tag);
    adamw_kernel<G><<<blocks_for(param.numel(), kThreads, s), kThreads, 0, s.compute>>>(
        param.numel(), static_cast<float*>(param.data_ptr()), static_cast<float*>(a.out(1).data_ptr()),
        static_cast<float*>(a.out(2).data_ptr()), static_cast<const G*>(grad.data_ptr()), found, h, mc, hyper,
        consts);
  });
  AF_CUDA_CHECK_LAUNCH();
  advance_hyper(s, hyper, found);
}

// ---- SGD -------------------------------------------------------------------------------------------------------

struct SgdParams {
  float lr, momentum, dampening, weight_decay;
  bool nesterov, first_step;
};

template <class G>
__global__ void __launch_bounds__(kThreads) sgd_kernel(int64_t n, float* __restrict__ p, float* __restrict__ buf,
                                                       const G* __restrict__ g, const float* found_inf, SgdParams h,
                                                       ModelCopy mc, const double* hyper) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  if (hyper != nullptr) {
    const double completed = hyper[0];
    h.lr = static_cast<float>(hyper[1]);
    h.first_step = completed == 0.0;
    mc.offset = static_cast<uint64_t>(completed) * mc.blocks_per_step;
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    float pp = p[i];
    float d = to_float(g[i]) + h.weight_decay * pp;
    if (buf != nullptr) {
      const float bb = h.first_step ? d : h.momentum * buf[i] + (1.0f - h.dampening) * d;
      buf[i] = bb;
      d = h.nesterov ? d + h.momentum * bb : bb;
    }
    pp -= h.lr * d;
    p[i] = pp;
    store_model_copy(mc, i, pp);
  }
}

void sgd_cuda(const KernelArgs& a) {
  const auto& at = a.attr<SgdAttrs>();
  const Tensor& param = a.out(0);
  const Tensor& grad = a.in(0);
  if (param.numel() == 0) return;
  SgdParams h{static_cast<float>(at.lr), static_cast<float>(at.momentum), static_cast<float>(at.dampening),
              static_cast<float>(at.weight_decay), at.nesterov, at.first_step};
  float* buf = a.outputs.size() > 1 && a.out(1).defined() ? static_cast<float*>(a.out(1).data_ptr()) : nullptr;
  const ModelCopy mc = model_copy(a, 2, at.rounding);
  const float* found = found_inf_ptr(a, 1);
  double* hyper = hyper_ptr(a, 2);
  DeviceGuard guard(param.device());
  const DeviceState& s = device_state(param.device());
  visit_float(grad.dtype(), "sgd_step (gradient)", [&](auto tag) {
    using G = decltype(tag);
    sgd_kernel<G><<<blocks_for(param.numel(), kThreads, s), kThreads, 0, s.compute>>>(
        param.numel(), static_cast<float*>(param.data_ptr()), buf, static_cast<const G*>(grad.data_ptr()), found, h,
        mc, hyper);
  });
  AF_CUDA_CHECK_LAUNCH();
  advance_hyper(s, hyper, found);
}

// ---- AMP ------------------------------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kThreads) unscale_kernel(int64_t n, T* g, const float* inv_scale, float* found_inf) {
  const float inv = *inv_scale;
  bool bad = false;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float v = to_float(g[i]);
    bad = bad || !isfinite(v);
    g[i] = from_float<T>(v * inv);
  }
  // One store per warp that saw a non-finite value; every writer stores the same 1.0.
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *found_inf = 1.0f;
}

void unscale_cuda(const KernelArgs& a) {
  const Tensor& g = a.out(0);
  AF_ASSERT(g.is_contiguous(), "amp_unscale: gradients must be contiguous");
  if (g.numel() == 0) return;
  DeviceGuard guard(g.device());
  const DeviceState& s = device_state(g.device());
  visit_float(g.dtype(), "amp_unscale", [&](auto tag) {
    using T = decltype(tag);
    unscale_kernel<T><<<blocks_for(g.numel(), kThreads, s), kThreads, 0, s.compute>>>(
        g.numel(), static_cast<T*>(g.data_ptr()), static_cast<const float*>(a.in(0).data_ptr()),
        static_cast<float*>(a.out(1).data_ptr()));
  });
  AF_CUDA_CHECK_LAUNCH();
}

__global__ void update_scale_kernel(const float* found_inf, float* scale, int32_t* tracker, float growth,
                                    float backoff, int64_t interval) {
  if (*found_inf != 0.0f) {
    *scale *= backoff;
    *tracker = 0;
    return;
  }
  const int64_t successful = static_cast<int64_t>(*tracker) + 1;
  if (successful == interval) {
    const float grown = *scale * growth;
    if (isfinite(grown)) *scale = grown;
    *tracker = 0;
  } else {
    *tracker = static_cast<int32_t>(successful);
  }
}

void update_scale_cuda(const KernelArgs& a) {
  const auto& at = a.attr<AmpUpdateAttrs>();
  const Tensor& scale = a.out(0);
  DeviceGuard guard(scale.device());
  const DeviceState& s = device_state(scale.device());
  update_scale_kernel<<<1, 1, 0, s.compute>>>(
      static_cast<const float*>(a.in(0).data_ptr()), static_cast<float*>(scale.data_ptr()),
      static_cast<int32_t*>(a.out(1).data_ptr()), static_cast<float>(at.growth_factor),
      static_cast<float>(at.backoff_factor), at.growth_interval);
  AF_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_optim_cuda() {
  register_kernel(OpId::adamw_step, DeviceType::CUDA, adamw_cuda);
  register_kernel(OpId::sgd_step, DeviceType::CUDA, sgd_cuda);
  register_kernel(OpId::amp_unscale, DeviceType::CUDA, unscale_cuda);
  register_kernel(OpId::amp_update_scale, DeviceType::CUDA, update_scale_cuda);
}

}  // namespace ampforge::cuda
