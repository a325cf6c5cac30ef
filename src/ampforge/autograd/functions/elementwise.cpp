// Differentiable elementwise functions and their backward formulas.
#include <cmath>

#include "ampforge/autograd/autocast.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge {

using autograd::Grads;
using autograd::SavedTensor;
using autograd::needs_grad;
using autograd::record;

namespace {

// Gradient of a broadcast operand: sum over the broadcast dims back to its shape.
Tensor reduce_grad(const Tensor& g, const Shape& shape) { return ops::sum_to(g, shape); }

Tensor binary_fwd(OpId op, Tensor a, Tensor b) {
  autograd::autocast_inputs(op, {&a, &b});
  Tensor out = ops::binary(op, a, b);
  if (!needs_grad({&a, &b})) return out;
  const Shape sa = a.shape(), sb = b.shape();
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  switch (op) {
    case OpId::add: {
      auto node = record("AddBackward", {a, b}, {out}, [sa, sb, ga, gb](const Grads& g) -> Grads {
        return {ga ? reduce_grad(g[0], sa) : Tensor(), gb ? reduce_grad(g[0], sb) : Tensor()};
      });
      // Recompute mode: a sum of two rebuildable tensors (a residual connection after batch norm) is rebuilt
      // from them; referencing them keeps no memory.
      if (autograd::recompute_enabled() && autograd::is_recomputable(a) && autograd::is_recomputable(b))
        autograd::set_recompute(node, [A = SavedTensor(a), B = SavedTensor(b)](uint32_t) {
          return ops::binary(OpId::add, A.get(), B.get());
        });
      break;
    }
    case OpId::sub:
      record("SubBackward", {a, b}, {out}, [sa, sb, ga, gb](const Grads& g) -> Grads {
        return {ga ? reduce_grad(g[0], sa) : Tensor(), gb ? reduce_grad(ops::mul_scalar(g[0], -1.0), sb) : Tensor()};
      });
      break;
    case OpId::mul:
      record("MulBackward", {a, b}, {out},
             [sa, sb, ga, gb, A = SavedTensor(gb ? a : Tensor()), B = SavedTensor(ga ? b : Tensor())](const Grads& g) -> Grads {
               return {ga ? reduce_grad(ops::mul(g[0], B.get()), sa) : Tensor(),
                       gb ? reduce_grad(ops::mul(g[0], A.get()), sb) : Tensor()};
             });
      break;
    case OpId::div:
      record("DivBackward", {a, b}, {out},
             [sa, sb, ga, gb, A = SavedTensor(gb ? a : Tensor()), B = SavedTensor(b)](const Grads& g) -> Grads {
               Tensor bb = B.get();
               Tensor gaa = ga ? reduce_grad(ops::div(g[0], bb), sa) : Tensor();
               Tensor gbb;
               if (gb) {  // -g * a / b^2
                 gbb = reduce_grad(ops::mul_scalar(ops::div(ops::mul(g[0], A.get()), ops::mul(bb, bb)), -1.0), sb);
               }
               return {gaa, gbb};
             });
      break;
    case OpId::pow:
      record("PowBackward", {a, b}, {out},
             [sa, sb, ga, gb, A = SavedTensor(a), B = SavedTensor(b), O = SavedTensor(out)](const Grads& g) -> Grads {
               Tensor aa = A.get(), bb = B.get();
               Tensor gaa, gbb;
               if (ga)  // b * a^(b-1)
                 gaa = reduce_grad(ops::mul(g[0], ops::mul(bb, ops::binary(OpId::pow, aa, ops::add_scalar(bb, -1.0)))), sa);
               if (gb) {  // a^b * log(a), with 0 where a == 0 (as PyTorch masks)
                 Tensor la = ops::unary(OpId::log, aa);
                 Tensor zero = ops::zeros_like(la);
                 la = ops::where(ops::compare(OpId::eq, aa, zero), zero, la);
                 gbb = reduce_grad(ops::mul(g[0], ops::mul(O.get(), la)), sb);
               }
               return {gaa, gbb};
             });
      break;
    case OpId::maximum:
    case OpId::minimum:
      // The gradient goes to the selected operand; ties split it evenly (as PyTorch).
      record(op == OpId::maximum ? "MaximumBackward" : "MinimumBackward", {a, b}, {out},
             [sa, sb, ga, gb, A = SavedTensor(a), B = SavedTensor(b), op](const Grads& g) -> Grads {
               Tensor aa = A.get(), bb = B.get();
               Tensor pick_a = ops::to_dtype(ops::compare(op == OpId::maximum ? OpId::gt : OpId::lt, aa, bb), g[0].dtype());
               Tensor tie = ops::to_dtype(ops::compare(OpId::eq, aa, bb), g[0].dtype());
               Tensor wa = ops::add(pick_a, ops::mul_scalar(tie, 0.5));
               Tensor wb = ops::add_scalar(ops::mul_scalar(wa, -1.0), 1.0);
               return {ga ? reduce_grad(ops::mul(g[0], wa), sa) : Tensor(),
                       gb ? reduce_grad(ops::mul(g[0], wb), sb) : Tensor()};
             });
      break;
    default:
      AF_ASSERT(false, "binary_fwd: {} is not a differentiable binary op", op_name(op));
  }
  return out;
}

// Unary op whose backward is g * f'(saved) computed by a registered backward kernel. `gelu` carries the
// GELU variant to both kernels; the other activations have no parameters.
Tensor unary_kernel_grad(OpId op, OpId bwd, Tensor x, bool save_output, const char* name,
                         const GeluAttrs* gelu = nullptr) {
  autograd::autocast_inputs(op, {&x});
  Tensor out = ops::unary(op, x, gelu);
  if (!needs_grad({&x})) return out;
  const GeluAttrs gat = gelu ? *gelu : GeluAttrs{};
  record(name, {x}, {out}, [bwd, gat, S = SavedTensor(save_output ? out : x)](const Grads& g) -> Grads {
    return {ops::pointwise_backward(bwd, g[0], S.get(), &gat)};
  });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_fwd(OpId::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_fwd(OpId::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_fwd(OpId::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_fwd(OpId::div, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary_fwd(OpId::pow, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_fwd(OpId::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary_fwd(OpId::minimum, a, b); }

Tensor add(const Tensor& a, double s) {
  Tensor out = ops::add_scalar(a, s);
  if (needs_grad({&a})) record("AddScalarBackward", {a}, {out}, [](const Grads& g) -> Grads { return {g[0]}; });
  return out;
}

Tensor mul(const Tensor& a, double s) {
  Tensor out = ops::mul_scalar(a, s);
  if (needs_grad({&a}))
    record("MulScalarBackward", {a}, {out}, [s](const Grads& g) -> Grads { return {ops::mul_scalar(g[0], s)}; });
  return out;
}

Tensor pow(const Tensor& a_in, double e) {
  Tensor a = a_in;
  autograd::autocast_inputs(OpId::pow_scalar, {&a});
  Tensor out = ops::pow_scalar(a, e);
  if (needs_grad({&a}))
    record("PowScalarBackward", {a}, {out}, [e, A = SavedTensor(a)](const Grads& g) -> Grads {
      if (e == 0.0) return {ops::zeros_like(g[0])};
      return {ops::mul(g[0], ops::mul_scalar(ops::pow_scalar(A.get(), e - 1.0), e))};
    });
  return out;
}

Tensor neg(const Tensor& x) {
  Tensor out = ops::unary(OpId::neg, x);
  if (needs_grad({&x})) record("NegBackward", {x}, {out}, [](const Grads& g) -> Grads { return {ops::mul_scalar(g[0], -1.0)}; });
  return out;
}

Tensor abs(const Tensor& x) {
  Tensor out = ops::unary(OpId::abs, x);
  if (needs_grad({&x}))
    record("AbsBackward", {x}, {out}, [X = SavedTensor(x)](const Grads& g) -> Grads {
      return {ops::mul(g[0], ops::unary(OpId::sign, X.get()))};
    });
  return out;
}

Tensor sign(const Tensor& x) { return ops::unary(OpId::sign, x); }

Tensor exp(const Tensor& x_in) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::exp, {&x});
  Tensor out = ops::unary(OpId::exp, x);
  if (needs_grad({&x}))
    record("ExpBackward", {x}, {out}, [O = SavedTensor(out)](const Grads& g) -> Grads { return {ops::mul(g[0], O.get())}; });
  return out;
}

Tensor log(const Tensor& x_in) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::log, {&x});
  Tensor out = ops::unary(OpId::log, x);
  if (needs_grad({&x}))
    record("LogBackward", {x}, {out}, [X = SavedTensor(x)](const Grads& g) -> Grads { return {ops::div(g[0], X.get())}; });
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = ops::unary(OpId::sqrt, x);
  if (needs_grad({&x}))
    record("SqrtBackward", {x}, {out}, [O = SavedTensor(out)](const Grads& g) -> Grads {
      return {ops::div(g[0], ops::mul_scalar(O.get(), 2.0))};
    });
  return out;
}

// d/dx atan(x) = 1 / (1 + x^2), written with ops so it runs on every backend.
Tensor atan(const Tensor& x) {
  Tensor out = ops::unary(OpId::atan, x);
  if (needs_grad({&x}))
    record("AtanBackward", {x}, {out}, [X = SavedTensor(x)](const Grads& g) -> Grads {
      const Tensor xv = X.get();
      return {ops::div(g[0], ops::add_scalar(ops::mul(xv, xv), 1.0))};
    });
  return out;
}

Tensor rsqrt(const Tensor& x_in) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::rsqrt, {&x});
  Tensor out = ops::unary(OpId::rsqrt, x);
  if (needs_grad({&x}))
    record("RsqrtBackward", {x}, {out}, [O = SavedTensor(out)](const Grads& g) -> Grads {
      Tensor o = O.get();  // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 o^3
      return {ops::mul(g[0], ops::mul_scalar(ops::mul(o, ops::mul(o, o)), -0.5))};
    });
  return out;
}

Tensor relu(const Tensor& x_in) {
  // Recompute mode with a rebuildable input (batch norm, a residual sum): keep the input's recipe instead of
  // the output. relu_backward's mask is saved > 0, the same for the input as for the output.
  if (!autograd::recompute_enabled() || !autograd::is_recomputable(x_in))
    return unary_kernel_grad(OpId::relu, OpId::relu_backward, x_in, true, "ReluBackward");
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::relu, {&x});
  Tensor out = ops::unary(OpId::relu, x);
  if (!needs_grad({&x})) return out;
  const SavedTensor X(x);
  auto node = record("ReluBackward", {x}, {out}, [X](const Grads& g) -> Grads {
    return {ops::pointwise_backward(OpId::relu_backward, g[0], X.get())};
  });
  autograd::set_recompute(node, [X](uint32_t) { return ops::unary(OpId::relu, X.get()); }, /*keep=*/true);
  return out;
}
Tensor sigmoid(const Tensor& x) {
  return unary_kernel_grad(OpId::sigmoid, OpId::sigmoid_backward, x, true, "SigmoidBackward");
}
Tensor tanh(const Tensor& x) { return unary_kernel_grad(OpId::tanh, OpId::tanh_backward, x, true, "TanhBackward"); }
Tensor silu(const Tensor& x) { return unary_kernel_grad(OpId::silu, OpId::silu_backward, x, false, "SiluBackward"); }
Tensor gelu(const Tensor& x, GeluApprox approximate) {
  GeluAttrs at{approximate};
  return unary_kernel_grad(OpId::gelu, OpId::gelu_backward, x, false, "GeluBackward", &at);
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  Tensor out = ops::clamp(x, min, max);
  if (needs_grad({&x})) {
    ClampAttrs at{min.value_or(0), max.value_or(0), min.has_value(), max.has_value()};
    record("ClampBackward", {x}, {out}, [at, X = SavedTensor(x)](const Grads& g) -> Grads {
      return {ops::pointwise_backward(OpId::clamp_backward, g[0], X.get(), &at)};
    });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a_in, const Tensor& b_in) {
  Tensor a = a_in, b = b_in;
  autograd::autocast_inputs(OpId::where, {&a, &b});
  Tensor out = ops::where(cond, a, b);
  if (needs_grad({&a, &b})) {
    const Shape sa = a.shape(), sb = b.shape();
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    record("WhereBackward", {a, b}, {out}, [sa, sb, ga, gb, C = SavedTensor(cond)](const Grads& g) -> Grads {
      Tensor zero = ops::zeros(Shape{}, g[0].dtype(), g[0].device());
      Tensor c = C.get();
      return {ga ? ops::sum_to(ops::where(c, g[0], zero), sa) : Tensor(),
              gb ? ops::sum_to(ops::where(c, zero, g[0]), sb) : Tensor()};
    });
  }
  return out;
}

Tensor eq(const Tensor& a, const Tensor& b) { return ops::compare(OpId::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return ops::compare(OpId::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return ops::compare(OpId::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return ops::compare(OpId::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return ops::compare(OpId::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return ops::compare(OpId::ge, a, b); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double s) { return add(a, s); }
Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
Tensor operator+(double s, const Tensor& a) { return add(a, s); }

}  // namespace ampforge
