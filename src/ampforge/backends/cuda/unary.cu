// CUDA unary kernels and the elementwise backward kernels. Same formulas as the CPU kernels
// (backends/cpu/elementwise.cpp), evaluated in float for F32/F16/BF16 with CUDA's accurate math functions
// (no fast-math intrinsics: expf/erff/tanhf are within 2 ulp, well inside the F32 tolerance).
#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

template <class Op>
void unary_float(const KernelArgs& a, const char* what, Op op) {
  visit_float(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    launch_elementwise<1, S, S>(a.out(0), {&a.in(0)}, op);
  });
}

// Floats and I32/I64 (neg, abs, sign, scalar add/mul, clamp work on integer tensors too).
template <class Op>
void unary_arith(const KernelArgs& a, const char* what, Op op) {
  visit_arith(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    constexpr bool is_float = !std::is_integral_v<S>;
    launch_elementwise<1, S, S, is_float>(a.out(0), {&a.in(0)}, op);
  });
}

template <class Op>
void binary_float(const KernelArgs& a, const char* what, Op op) {
  visit_float(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    launch_elementwise<2, S, S>(a.out(0), {&a.in(0), &a.in(1)}, op);
  });
}

AF_DEV float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
constexpr float kSqrt1_2 = 0.70710678118654752440f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

// ---- forward ----------------------------------------------------------------------------------------

struct NegOp {
  template <class A>
  AF_DEV A operator()(A x) const {
    return static_cast<A>(-x);
  }
};
struct AbsOp {
  template <class A>
  AF_DEV A operator()(A x) const {
    return x < A(0) ? static_cast<A>(-x) : x;
  }
};
struct SignOp {
  template <class A>
  AF_DEV A operator()(A x) const {
    return static_cast<A>((x > A(0)) - (x < A(0)));
  }
};
struct AddScalarOp {
  double s;
  template <class A>
  AF_DEV A operator()(A x) const {
    return static_cast<A>(x + static_cast<A>(s));
  }
};
struct MulScalarOp {
  double s;
  template <class A>
  AF_DEV A operator()(A x) const {
    return static_cast<A>(x * static_cast<A>(s));
  }
};
struct ClampOp {
  double lo, hi;
  bool has_lo, has_hi;
  template <class A>
  AF_DEV A operator()(A x) const {
    if (has_lo && x < static_cast<A>(lo)) x = static_cast<A>(lo);
    if (has_hi && x > static_cast<A>(hi)) x = static_cast<A>(hi);
    return x;
  }
};
struct ExpOp {
  AF_DEV float operator()(float x) const { return expf(x); }
};
struct LogOp {
  AF_DEV float operator()(float x) const { return logf(x); }
};
struct SqrtOp {
  AF_DEV float operator()(float x) const { return sqrtf(x); }
};
struct AtanOp {
  AF_DEV float operator()(float x) const { return atanf(x); }
};
struct RsqrtOp {  // 1 / sqrt(x), correctly rounded steps as on the CPU (not the approximate rsqrtf)
  AF_DEV float operator()(float x) const { return 1.0f / sqrtf(x); }
};
struct ReluOp {
  AF_DEV float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct GeluErfOp {
  AF_DEV float operator()(float x) const { return 0.5f * x * (1.0f + erff(x * kSqrt1_2)); }
};
struct GeluTanhOp {
  AF_DEV float operator()(float x) const { return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x))); }
};
struct SiluOp {
  AF_DEV float operator()(float x) const { return x * sigmoid_f(x); }
};
struct SigmoidOp {
  AF_DEV float operator()(float x) const { return sigmoid_f(x); }
};
struct TanhOp {
  AF_DEV float operator()(float x) const { return tanhf(x); }
};
struct SquareOp {
  AF_DEV float operator()(float x) const { return x * x; }
};
struct PowScalarOp {
  float s;
  AF_DEV float operator()(float x) const { return powf(x, s); }
};

// ---- backward: (grad, saved) -> grad_in ---------------------------------------------------------------

struct ReluBackwardOp {
  AF_DEV float operator()(float g, float y) const { return y > 0.0f ? g : 0.0f; }
};
struct GeluErfBackwardOp {
  AF_DEV float operator()(float g, float x) const {
    const float cdf = 0.5f * (1.0f + erff(x * kSqrt1_2));
    const float pdf = expf(-0.5f * x * x) * kInvSqrt2Pi;
    return g * (cdf + x * pdf);
  }
};
struct GeluTanhBackwardOp {
  AF_DEV float operator()(float g, float x) const {
    const float c = 0.044715f;
    const float t = tanhf(kSqrt2OverPi * (x + c * x * x * x));
    return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * c * x * x));
  }
};
struct SiluBackwardOp {
  AF_DEV float operator()(float g, float x) const {
    const float s = sigmoid_f(x);
    return g * s * (1.0f + x * (1.0f - s));
  }
};
struct SigmoidBackwardOp {
  AF_DEV float operator()(float g, float y) const { return g * y * (1.0f - y); }
};
struct TanhBackwardOp {
  AF_DEV float operator()(float g, float y) const { return g * (1.0f - y * y); }
};
struct ClampBackwardOp {
  float lo, hi;
  bool has_lo, has_hi;
  AF_DEV float operator()(float g, float x) const {
    const bool pass = (!has_lo || x >= lo) && (!has_hi || x <= hi);
    return pass ? g : 0.0f;
  }
};

}  // namespace

void register_unary_cuda() {
  auto reg = [](OpId op, KernelFn fn) { register_kernel(op, DeviceType::CUDA, fn); };
  reg(OpId::neg, [](const KernelArgs& a) { unary_arith(a, "neg", NegOp{}); });
  reg(OpId::abs, [](const KernelArgs& a) { unary_arith(a, "abs", AbsOp{}); });
  reg(OpId::sign, [](const KernelArgs& a) { unary_arith(a, "sign", SignOp{}); });
  reg(OpId::exp, [](const KernelArgs& a) { unary_float(a, "exp", ExpOp{}); });
  reg(OpId::log, [](const KernelArgs& a) { unary_float(a, "log", LogOp{}); });
  reg(OpId::sqrt, [](const KernelArgs& a) { unary_float(a, "sqrt", SqrtOp{}); });
  reg(OpId::atan, [](const KernelArgs& a) { unary_float(a, "atan", AtanOp{}); });
  reg(OpId::rsqrt, [](const KernelArgs& a) { unary_float(a, "rsqrt", RsqrtOp{}); });
  reg(OpId::relu, [](const KernelArgs& a) { unary_float(a, "relu", ReluOp{}); });
  reg(OpId::gelu, [](const KernelArgs& a) {
    if (a.attr<GeluAttrs>().approximate == GeluApprox::Tanh)
      unary_float(a, "gelu", GeluTanhOp{});
    else
      unary_float(a, "gelu", GeluErfOp{});
  });
  reg(OpId::silu, [](const KernelArgs& a) { unary_float(a, "silu", SiluOp{}); });
  reg(OpId::sigmoid, [](const KernelArgs& a) { unary_float(a, "sigmoid", SigmoidOp{}); });
  reg(OpId::tanh, [](const KernelArgs& a) { unary_float(a, "tanh", TanhOp{}); });
  reg(OpId::add_scalar, [](const KernelArgs& a) { unary_arith(a, "add", AddScalarOp{a.attr<ScalarAttrs>().scalar}); });
  reg(OpId::mul_scalar, [](const KernelArgs& a) { unary_arith(a, "mul", MulScalarOp{a.attr<ScalarAttrs>().scalar}); });
  reg(OpId::pow_scalar, [](const KernelArgs& a) {
    const double s = a.attr<ScalarAttrs>().scalar;
    if (s == 2.0)
      unary_float(a, "pow", SquareOp{});
    else
      unary_float(a, "pow", PowScalarOp{static_cast<float>(s)});
  });
  reg(OpId::clamp, [](const KernelArgs& a) {
    const auto& at = a.attr<ClampAttrs>();
    unary_arith(a, "clamp", ClampOp{at.min, at.max, at.has_min, at.has_max});
  });

  reg(OpId::relu_backward, [](const KernelArgs& a) { binary_float(a, "relu_backward", ReluBackwardOp{}); });
  reg(OpId::gelu_backward, [](const KernelArgs& a) {
    if (a.attr<GeluAttrs>().approximate == GeluApprox::Tanh)
      binary_float(a, "gelu_backward", GeluTanhBackwardOp{});
    else
      binary_float(a, "gelu_backward", GeluErfBackwardOp{});
  });
  reg(OpId::silu_backward, [](const KernelArgs& a) { binary_float(a, "silu_backward", SiluBackwardOp{}); });
  reg(OpId::sigmoid_backward, [](const KernelArgs& a) { binary_float(a, "sigmoid_backward", SigmoidBackwardOp{}); });
  reg(OpId::tanh_backward, [](const KernelArgs& a) { binary_float(a, "tanh_backward", TanhBackwardOp{}); });
  reg(OpId::clamp_backward, [](const KernelArgs& a) {
    const auto& at = a.attr<ClampAttrs>();
    binary_float(a, "clamp_backward", ClampBackwardOp{static_cast<float>(at.min), static_cast<float>(at.max),
                                                      at.has_min, at.has_max});
  });
}

}  // namespace ampforge::cuda
