// CUDA elementwise kernels: fill, device-local copy/cast, arange, binary arithmetic (broadcasting),
// comparisons and where. Contracts are the CPU kernels' (backends/cpu/elementwise.cpp): the output is
// preallocated by ops/, inputs broadcast to it, 16-bit floats compute in float.
#include <cstring>

#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

// ---- fill ---------------------------------------------------------------------------------------------

template <class U>
struct FillBits {
  U bits;
  AF_DEV U operator()() const { return bits; }
};

}  // namespace

void fill_on_device(const Tensor& t, double v) {
  // The value's bit pattern in t's dtype, converted on the host exactly as the CPU kernel converts it.
  uint64_t bits = 0;
  visit_dtype(t.dtype(), [&](auto tag) {
    using S = decltype(tag);
    S value;
    if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
      value = S(static_cast<float>(v));
    else
      value = static_cast<S>(v);
    std::memcpy(&bits, &value, sizeof(S));
  });
  if (t.numel() == 0) return;
  DeviceGuard guard(t.device());
  if (bits == 0 && t.is_contiguous()) {  // zeros: a memset
    AF_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, static_cast<size_t>(t.nbytes()), stream_for(t.device())));
    return;
  }
  visit_width(t.element_size(), [&](auto utag) {
    using U = decltype(utag);
    launch_elementwise<0, U, U>(t, {}, FillBits<U>{static_cast<U>(bits)});
  });
}

namespace {

void fill_kernel(const KernelArgs& a) { fill_on_device(a.out(0), a.attr<FillAttrs>().value); }

// ---- copy ---------------------------------------------------------------------------------------------

struct Identity {
  template <class A>
  AF_DEV A operator()(A x) const {
    return x;
  }
};

// Any dtype to any dtype through double, with the CPU's conversion rules (16-bit targets round via float,
// Bool stores x != 0). For the pairs without a dedicated instantiation (integers, Bool, F64).
AF_DEV double load_any(const char* p, DType dt) {
  switch (dt) {
    case DType::F32: return *reinterpret_cast<const float*>(p);
    case DType::F16: return __half2float(*reinterpret_cast<const half_t*>(p));
    case DType::BF16: return __bfloat162float(*reinterpret_cast<const bf16_t*>(p));
    case DType::F64: return *reinterpret_cast<const double*>(p);
    case DType::I32: return *reinterpret_cast<const int32_t*>(p);
    case DType::I64: return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case DType::U8: return *reinterpret_cast<const uint8_t*>(p);
    case DType::Bool: return *reinterpret_cast<const uint8_t*>(p) != 0 ? 1.0 : 0.0;
  }
  return 0;
}

AF_DEV void store_any(char* p, DType dt, double v) {
  switch (dt) {
    case DType::F32: *reinterpret_cast<float*>(p) = static_cast<float>(v); return;
    case DType::F16: *reinterpret_cast<half_t*>(p) = __float2half_rn(static_cast<float>(v)); return;
    case DType::BF16: *reinterpret_cast<bf16_t*>(p) = __float2bfloat16_rn(static_cast<float>(v)); return;
    case DType::F64: *reinterpret_cast<double*>(p) = v; return;
    case DType::I32: *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(v); return;
    case DType::I64: *reinterpret_cast<int64_t*>(p) = static_cast<int64_t>(v); return;
    case DType::U8: *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v); return;
    case DType::Bool: *reinterpret_cast<uint8_t*>(p) = v != 0.0 ? 1 : 0; return;
  }
}

__global__ void __launch_bounds__(kThreads)
    convert_any_kernel(int64_t n, OffsetCalc<2> calc, Ptrs<2> ptrs, DType in_dt, DType out_dt, int in_size,
                       int out_size) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    int64_t off[2];
    calc.get(e, off);
    store_any(ptrs.p[0] + off[0] * out_size, out_dt, load_any(ptrs.p[1] + off[1] * in_size, in_dt));
  }
}

bool is_float16_or_32(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

// Both tensors cover one dense range of memory with the same layout: one memcpy moves everything.
bool same_dense_layout(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  for (MemoryFormat f : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast})
    if (a.is_contiguous(f) && b.is_contiguous(f)) return true;
  return false;
}

}  // namespace

void copy_on_device(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  AF_ASSERT(dst.device().is_cuda() && src.device() == dst.device(), "copy_on_device: {} -> {}", src.device().str(),
            dst.device().str());
  DeviceGuard guard(dst.device());
  if (same_dense_layout(dst, src)) {
    AF_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(dst.nbytes()),
                                  cudaMemcpyDeviceToDevice, stream_for(dst.device())));
    return;
  }
  if (src.dtype() == dst.dtype()) {
    visit_width(dst.element_size(), [&](auto utag) {
      using U = decltype(utag);
      launch_elementwise<1, U, U>(dst, {&src}, Identity{});
    });
    return;
  }
  if (is_float16_or_32(src.dtype()) && is_float16_or_32(dst.dtype())) {
    visit_float(src.dtype(), "copy", [&](auto itag) {
      visit_float(dst.dtype(), "copy", [&](auto otag) {
        using TI = decltype(itag);
        using TO = decltype(otag);
        if constexpr (!std::is_same_v<TI, TO>) launch_elementwise<1, TO, TI>(dst, {&src}, Identity{});
      });
    });
    return;
  }
  const ElementwisePlan plan = make_elementwise_plan({&dst, &src});
  const DeviceState& s = device_state(dst.device());
  Ptrs<2> ptrs{{plan.data[0], plan.data[1]}};
  convert_any_kernel<<<blocks_for(plan.numel, kThreads, s), kThreads, 0, s.compute>>>(
      plan.numel, plan.dims.calc<2>(), ptrs, src.dtype(), dst.dtype(), static_cast<int>(src.element_size()),
      static_cast<int>(dst.element_size()));
  AF_CUDA_CHECK_LAUNCH();
}

namespace {

// ---- arange ---------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    arange_kernel(int64_t n, char* out, DType dt, int size, double start, double step_value) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    store_any(out + i * size, dt, start + static_cast<double>(i) * step_value);
}

void arange_cuda(const KernelArgs& a) {
  const auto& at = a.attr<ArangeAttrs>();
  const Tensor& out = a.out(0);
  AF_CHECK(out.dtype() != DType::Bool, "arange: Bool output is not supported");
  AF_ASSERT(out.is_contiguous(), "arange: output must be contiguous");
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device());
  const DeviceState& s = device_state(out.device());
  arange_kernel<<<blocks_for(out.numel(), kThreads, s), kThreads, 0, s.compute>>>(
      out.numel(), static_cast<char*>(out.data_ptr()), out.dtype(), static_cast<int>(out.element_size()), at.start,
      at.step);
  AF_CUDA_CHECK_LAUNCH();
}

// ---- binary arithmetic ------------------------------------------------------------------------------------

struct AddOp {
  template <class A>
  AF_DEV A operator()(A x, A y) const {
    return static_cast<A>(x + y);
  }
};
struct SubOp {
  template <class A>
  AF_DEV A operator()(A x, A y) const {
    return static_cast<A>(x - y);
  }
};
struct MulOp {
  template <class A>
  AF_DEV A operator()(A x, A y) const {
    return static_cast<A>(x * y);
  }
};
struct DivOp {
  AF_DEV float operator()(float x, float y) const { return x / y; }
};
struct PowOp {
  AF_DEV float operator()(float x, float y) const { return powf(x, y); }
};
// NaN propagates, as in PyTorch's maximum/minimum (and the CPU kernels).
struct MaximumOp {
  template <class A>
  AF_DEV A operator()(A x, A y) const {
    return (x != x || x > y) ? x : y;
  }
};
struct MinimumOp {
  template <class A>
  AF_DEV A operator()(A x, A y) const {
    return (x != x || x < y) ? x : y;
  }
};

template <class Op>
void binary_arith(const KernelArgs& a, const char* what) {
  visit_arith(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    constexpr bool is_float = !std::is_integral_v<S>;
    launch_elementwise<2, S, S, is_float>(a.out(0), {&a.in(0), &a.in(1)}, Op{});
  });
}

template <class Op>
void binary_float(const KernelArgs& a, const char* what) {
  visit_float(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    launch_elementwise<2, S, S>(a.out(0), {&a.in(0), &a.in(1)}, Op{});
  });
}

// ---- comparisons and where --------------------------------------------------------------------------------

enum class Cmp : int { Eq, Ne, Lt, Le, Gt, Ge };

// One functor for the six comparisons (a uniform branch per element): six times fewer kernels to compile
// for an op that is never the bottleneck.
struct CompareOp {
  Cmp cmp;
  template <class A>
  AF_DEV bool operator()(A x, A y) const {
    switch (cmp) {
      case Cmp::Eq: return x == y;
      case Cmp::Ne: return x != y;
      case Cmp::Lt: return x < y;
      case Cmp::Le: return x <= y;
      case Cmp::Gt: return x > y;
      case Cmp::Ge: return x >= y;
    }
    return false;
  }
};

void compare(const KernelArgs& a, Cmp cmp, const char* what) {
  const Tensor& out = a.out(0);
  const DType dt = a.in(0).dtype();
  auto run = [&](auto tag) {
    using S = decltype(tag);
    launch_elementwise<2, bool, S, false>(out, {&a.in(0), &a.in(1)}, CompareOp{cmp});
  };
  if (dt == DType::Bool)
    run(bool{});
  else if (dt == DType::U8)
    run(uint8_t{});
  else
    visit_arith(dt, what, run);
}

template <class U>
__global__ void __launch_bounds__(kThreads) where_kernel(int64_t n, OffsetCalc<4> calc, Ptrs<4> ptrs) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    int64_t off[4];
    calc.get(e, off);
    const bool c = reinterpret_cast<const uint8_t*>(ptrs.p[1])[off[1]] != 0;
    reinterpret_cast<U*>(ptrs.p[0])[off[0]] =
        c ? reinterpret_cast<const U*>(ptrs.p[2])[off[2]] : reinterpret_cast<const U*>(ptrs.p[3])[off[3]];
  }
}

void where_cuda(const KernelArgs& a) {
  const Tensor& out = a.out(0);
  const ElementwisePlan plan = make_elementwise_plan({&out, &a.in(0), &a.in(1), &a.in(2)});
  if (plan.numel == 0) return;
  DeviceGuard guard(out.device());
  const DeviceState& s = device_state(out.device());
  Ptrs<4> ptrs{{plan.data[0], plan.data[1], plan.data[2], plan.data[3]}};
  visit_width(out.element_size(), [&](auto utag) {
    using U = decltype(utag);
    where_kernel<U><<<blocks_for(plan.numel, kThreads, s), kThreads, 0, s.compute>>>(plan.numel, plan.dims.calc<4>(),
                                                                                    ptrs);
  });
  AF_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_elementwise_cuda() {
  auto reg = [](OpId op, KernelFn fn) { register_kernel(op, DeviceType::CUDA, fn); };
  reg(OpId::fill, fill_kernel);
  reg(OpId::arange, arange_cuda);
  reg(OpId::add, [](const KernelArgs& a) { binary_arith<AddOp>(a, "add"); });
  reg(OpId::sub, [](const KernelArgs& a) { binary_arith<SubOp>(a, "sub"); });
  reg(OpId::mul, [](const KernelArgs& a) { binary_arith<MulOp>(a, "mul"); });
  reg(OpId::div, [](const KernelArgs& a) { binary_float<DivOp>(a, "div"); });
  reg(OpId::pow, [](const KernelArgs& a) { binary_float<PowOp>(a, "pow"); });
  reg(OpId::maximum, [](const KernelArgs& a) { binary_arith<MaximumOp>(a, "maximum"); });
  reg(OpId::minimum, [](const KernelArgs& a) { binary_arith<MinimumOp>(a, "minimum"); });
  reg(OpId::eq, [](const KernelArgs& a) { compare(a, Cmp::Eq, "eq"); });
  reg(OpId::ne, [](const KernelArgs& a) { compare(a, Cmp::Ne, "ne"); });
  reg(OpId::lt, [](const KernelArgs& a) { compare(a, Cmp::Lt, "lt"); });
  reg(OpId::le, [](const KernelArgs& a) { compare(a, Cmp::Le, "le"); });
  reg(OpId::gt, [](const KernelArgs& a) { compare(a, Cmp::Gt, "gt"); });
  reg(OpId::ge, [](const KernelArgs& a) { compare(a, Cmp::Ge, "ge"); });
  reg(OpId::where, where_cuda);
}

}  // namespace ampforge::cuda
