// Device-side building blocks shared by the backend's .cu files: storage <-> compute type conversions,
// dtype visitors, launch sizing, the elementwise launch helper, warp/block reductions, Philox.
//
// Numerics: F16 and BF16 are storage types; arithmetic runs in float (acc_t), and each result is rounded
// once to the output dtype with round-to-nearest-even (__float2half_rn / __float2bfloat16_rn), as the
// CPU backend does. Integer dtypes compute in their own type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ampforge/backends/cuda/plan.h"
#include "ampforge/backends/cuda/runtime.h"
#include "ampforge/core/tensor.h"

namespace ampforge::cuda {

#define AF_DEV __device__ __forceinline__

// ---- types ----------------------------------------------------------------------------------------

using half_t = __half;
using bf16_t = __nv_bfloat16;

template <class T>
struct AccType {
  using type = T;
};
template <>
struct AccType<half_t> {
  using type = float;
};
template <>
struct AccType<bf16_t> {
  using type = float;
};
template <class T>
using acc_t = typename AccType<T>::type;

template <class T>
AF_DEV acc_t<T> to_acc(T v) {
  if constexpr (std::is_same_v<T, half_t>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, bf16_t>)
    return __bfloat162float(v);
  else
    return v;
}

template <class T>
AF_DEV T from_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, half_t>)
    return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, bf16_t>)
    return __float2bfloat16_rn(v);
  else
    return v;
}

template <class T>
AF_DEV T from_float(float v) {
  if constexpr (std::is_same_v<T, half_t>)
    return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, bf16_t>)
    return __float2bfloat16_rn(v);
  else
    return static_cast<T>(v);
}

template <class T>
AF_DEV float to_float(T v) {
  if constexpr (std::is_same_v<T, half_t>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, bf16_t>)
    return __bfloat162float(v);
  else
    return static_cast<float>(v);
}

// Calls f(U{}) with the unsigned integer type of an element width: copies, fills and gathers that need no
// conversion move bits (any dtype of that width).
template <class F>
void visit_width(int64_t bytes, F&& f) {
  switch (bytes) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: AF_THROW(Internal, "no {}-byte element type", bytes);
  }
}

// Calls f(T{}) with the device storage type of a floating dtype the backend computes on.
template <class F>
void visit_float(DType d, const char* what, F&& f) {
  switch (d) {
    case DType::F32: f(float{}); return;
    case DType::F16: f(half_t{}); return;
    case DType::BF16: f(bf16_t{}); return;
    default:
      AF_THROW(NotImplemented, "{}: dtype {} is not supported on CUDA (F32, F16 and BF16 are)", what, dtype_name(d));
  }
}

// Floating dtypes plus the integer types used for indices and counts.
template <class F>
void visit_arith(DType d, const char* what, F&& f) {
  switch (d) {
    case DType::I32: f(int32_t{}); return;
    case DType::I64: f(int64_t{}); return;
    case DType::F32:
    case DType::F16:
    case DType::BF16: visit_float(d, what, f); return;
    default:
      AF_THROW(NotImplemented, "{}: dtype {} is not supported on CUDA (F32, F16, BF16, I32 and I64 are)", what,
               dtype_name(d));
  }
}

// ---- launch sizing ----------------------------------------------------------------------------------

inline constexpr int kThreads = 256;

// Blocks for `items` work items at `threads` per block: enough to fill the device a few times over,
// never more than needed; kernels loop grid-stride over the rest.
inline unsigned blocks_for(int64_t items, int threads, const DeviceState& s) {
  const int64_t need = (items + threads - 1) / threads;
  const int64_t per_sm = s.max_threads_per_sm / threads > 0 ? s.max_threads_per_sm / threads : 1;
  const int64_t cap = static_cast<int64_t>(s.sm_count) * per_sm * 4;
  const int64_t b = need < cap ? need : cap;
  return static_cast<unsigned>(b > 0 ? b : 1);
}

// ---- elementwise ------------------------------------------------------------------------------------

template <int N>
struct Ptrs {
  char* p[N];
};

template <class T, int V>
struct alignas(sizeof(T) * V) VecT {
  T v[V];
};

inline constexpr int kVec = 4;  // elements per vector access (16 bytes for F32, 8 for F16/BF16)

template <int NIn, class F, class A>
AF_DEV auto apply_n(const F& f, const A (&a)[NIn > 0 ? NIn : 1]) {
  if constexpr (NIn == 0)
    return f();
  else if constexpr (NIn == 1)
    return f(a[0]);
  else if constexpr (NIn == 2)
    return f(a[0], a[1]);
  else
    return f(a[0], a[1], a[2]);
}

// out = f(in_0, ..., in_{NIn-1}) over a plan. All inputs have storage type TIn, the output TOut; f takes
// and returns compute types (acc_t). Grid-stride loops: any element count works with any grid.
template <int NIn, class TOut, class TIn, class F, bool kVector>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(int64_t n, OffsetCalc<NIn + 1> calc, Ptrs<NIn + 1> ptrs, F f) {
  using AIn = acc_t<TIn>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (kVector) {
    const int64_t nv = n / kVec;
    for (int64_t v = first; v < nv; v += step) {
      VecT<TIn, kVec> in[NIn > 0 ? NIn : 1];
      AF_UNROLL
      for (int k = 0; k < NIn; ++k) in[k] = reinterpret_cast<const VecT<TIn, kVec>*>(ptrs.p[k + 1])[v];
      VecT<TOut, kVec> o;
      AF_UNROLL
      for (int j = 0; j < kVec; ++j) {
        AIn a[NIn > 0 ? NIn : 1];
        AF_UNROLL
        for (int k = 0; k < NIn; ++k) a[k] = to_acc(in[k].v[j]);
        o.v[j] = from_acc<TOut>(apply_n<NIn>(f, a));
      }
      reinterpret_cast<VecT<TOut, kVec>*>(ptrs.p[0])[v] = o;
    }
    for (int64_t e = nv * kVec + first; e < n; e += step) {
      AIn a[NIn > 0 ? NIn : 1];
      AF_UNROLL
      for (int k = 0; k < NIn; ++k) a[k] = to_acc(reinterpret_cast<const TIn*>(ptrs.p[k + 1])[e]);
      reinterpret_cast<TOut*>(ptrs.p[0])[e] = from_acc<TOut>(apply_n<NIn>(f, a));
    }
  } else {
    for (int64_t e = first; e < n; e += step) {
      int64_t off[NIn + 1];
      calc.get(e, off);
      AIn a[NIn > 0 ? NIn : 1];
      AF_UNROLL
      for (int k = 0; k < NIn; ++k) a[k] = to_acc(reinterpret_cast<const TIn*>(ptrs.p[k + 1])[off[k + 1]]);
      reinterpret_cast<TOut*>(ptrs.p[0])[off[0]] = from_acc<TOut>(apply_n<NIn>(f, a));
    }
  }
}

inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Launches elementwise_kernel on the compute stream of the output's device. Handles n == 0 (no launch).
// kTryVector: also instantiate the vector-load variant (used when the plan is contiguous and every pointer
// is aligned to a whole vector); off for rarely hot dtypes to keep compile time down.
template <int NIn, class TOut, class TIn, bool kTryVector = true, class F>
void launch_elementwise(const Tensor& out, std::initializer_list<const Tensor*> inputs, F f) {
  static_assert(NIn + 1 <= kMaxOperands);
  AF_ASSERT(static_cast<int>(inputs.size()) == NIn, "elementwise launch: {} inputs, expected {}", inputs.size(), NIn);
  const Tensor* ops[kMaxOperands] = {&out};
  int k = 1;
  for (const Tensor* t : inputs) ops[k++] = t;
  const ElementwisePlan plan = make_elementwise_plan(ops, NIn + 1);
  if (plan.numel == 0) return;
  DeviceGuard guard(out.device());
  const DeviceState& s = device_state(out.device());
  Ptrs<NIn + 1> ptrs;
  for (int i = 0; i <= NIn; ++i) ptrs.p[i] = plan.data[i];
  if constexpr (kTryVector) {
    bool vec = plan.contiguous && plan.numel >= kVec;
    vec = vec && aligned_to(ptrs.p[0], sizeof(TOut) * kVec);
    for (int i = 1; i <= NIn; ++i) vec = vec && aligned_to(ptrs.p[i], sizeof(TIn) * kVec);
    if (vec) {
      const unsigned blocks = blocks_for((plan.numel + kVec - 1) / kVec, kThreads, s);
      elementwise_kernel<NIn, TOut, TIn, F, true>
          <<<blocks, kThreads, 0, s.compute>>>(plan.numel, OffsetCalc<NIn + 1>{}, ptrs, f);
      AF_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  const unsigned blocks = blocks_for(plan.numel, kThreads, s);
  elementwise_kernel<NIn, TOut, TIn, F, false>
      <<<blocks, kThreads, 0, s.compute>>>(plan.numel, plan.dims.calc<NIn + 1>(), ptrs, f);
  AF_CUDA_CHECK_LAUNCH();
}

// ---- reductions inside a warp / block ---------------------------------------------------------------

template <class T>  // float, or double where a long sum must match the CPU's double one (softmax.cu)
AF_DEV T warp_sum(T v) {
  AF_UNROLL
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Max that propagates NaN (a NaN anywhere makes the result NaN), as the CPU's row_max.
AF_DEV float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

AF_DEV float warp_max(float v) {
  AF_UNROLL
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions for blocks of up to 1024 threads (a multiple of 32). Every thread gets the
// result. `scratch` holds 32 values of T in shared memory; the call synchronises the block twice.
template <class T>
AF_DEV T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : T(0);
  return warp_sum(v);
}

AF_DEV float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// ---- Philox-4x32-10 (the same function as core/generator.h's philox4x32, on the device) ---------------

struct Philox4 {
  uint32_t x, y, z, w;
};

AF_DEV Philox4 philox4x32(uint64_t seed, uint64_t ctr) {
  uint32_t c0 = static_cast<uint32_t>(ctr), c1 = static_cast<uint32_t>(ctr >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  AF_UNROLL
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    c0 = n0;
    c2 = n2;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

AF_DEV uint32_t philox_word(const Philox4& r, int i) { return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w; }

// Uniform float in [0, 1) from the top 24 bits (exact: 24 bits fit a float's significand).
AF_DEV float unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

}  // namespace ampforge::cuda
