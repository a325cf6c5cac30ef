// Differentiable reductions.
#include <algorithm>

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

// Re-inserts reduced dims (size 1) into a gradient so it broadcasts against the input.
Tensor unsqueeze_reduced(const Tensor& g, const Shape& in_shape, const std::vector<int64_t>& dims, bool keepdim) {
  if (keepdim) return g;
  std::vector<int> d = ops::normalize_dims(dims, in_shape.size(), "reduction backward");
  Tensor r = g;
  for (int x : d) r = ops::unsqueeze(r, x);
  return r;
}

Tensor expand_back(const Tensor& g, const Shape& in_shape, const std::vector<int64_t>& dims, bool keepdim) {
  return ops::expand(unsqueeze_reduced(g, in_shape, dims, keepdim), in_shape);
}

// Gradient of amax/amin: split evenly among the elements equal to the extreme (as torch.amax).
Tensor extreme_backward(const Tensor& g, const Tensor& x, const Tensor& out, const std::vector<int64_t>& dims,
                        bool keepdim) {
  Tensor o = unsqueeze_reduced(out, x.shape(), dims, keepdim);
  Tensor mask = ops::to_dtype(ops::compare(OpId::eq, x, o), g.dtype());
  Tensor count = ops::reduce(OpId::sum, mask, dims, true);
  Tensor gg = unsqueeze_reduced(g, x.shape(), dims, keepdim);
  return ops::mul(mask, ops::div(gg, count));
}

}  // namespace

Tensor sum(const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::sum, {&x});
  Tensor out = ops::reduce(OpId::sum, x, dims, keepdim);
  if (needs_grad({&x})) {
    const Shape s = x.shape();
    record("SumBackward", {x}, {out}, [s, dims, keepdim](const Grads& g) -> Grads {
      return {ops::contiguous(expand_back(g[0], s, dims, keepdim))};
    });
  }
  return out;
}

Tensor mean(const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::mean, {&x});
  Tensor out = ops::reduce(OpId::mean, x, dims, keepdim);
  if (needs_grad({&x})) {
    const Shape s = x.shape();
    const int64_t n = std::max<int64_t>(1, x.numel() / std::max<int64_t>(1, out.numel()));
    record("MeanBackward", {x}, {out}, [s, dims, keepdim, n](const Grads& g) -> Grads {
      return {ops::mul_scalar(ops::contiguous(expand_back(g[0], s, dims, keepdim)), 1.0 / static_cast<double>(n))};
    });
  }
  return out;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = ops::reduce(OpId::amax, x, dims, keepdim);
  if (needs_grad({&x}))
    record("AmaxBackward", {x}, {out}, [dims, keepdim, X = SavedTensor(x), O = SavedTensor(out)](const Grads& g) -> Grads {
      return {extreme_backward(g[0], X.get(), O.get(), dims, keepdim)};
    });
  return out;
}

Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = ops::reduce(OpId::amin, x, dims, keepdim);
  if (needs_grad({&x}))
    record("AminBackward", {x}, {out}, [dims, keepdim, X = SavedTensor(x), O = SavedTensor(out)](const Grads& g) -> Grads {
      return {extreme_backward(g[0], X.get(), O.get(), dims, keepdim)};
    });
  return out;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return ops::reduce(OpId::argmax, x, {dim}, keepdim); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return ops::reduce(OpId::argmin, x, {dim}, keepdim); }

namespace {
// torch.max(x, dim): the gradient goes to the element at the returned index only.
std::pair<Tensor, Tensor> extreme_dim(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  Tensor idx = ops::reduce(is_max ? OpId::argmax : OpId::argmin, x, {dim}, true);
  Tensor vals = ops::reduce(is_max ? OpId::amax : OpId::amin, x, {dim}, true);
  const int d = wrap_dim(dim, x.dim(), is_max ? "max" : "min");
  Tensor v = keepdim ? vals : ops::squeeze_dim(vals, d);
  Tensor i = keepdim ? idx : ops::squeeze_dim(idx, d);
  if (needs_grad({&x})) {
    const Shape s = x.shape();
    record(is_max ? "MaxBackward" : "MinBackward", {x}, {v}, [s, d, I = SavedTensor(idx)](const Grads& g) -> Grads {
      // one-hot along d at the index: arange(size) == idx
      Tensor positions = ops::arange(0, static_cast<double>(s[d]), 1, DType::I64, g[0].device());
      Shape ps = Shape::filled(s.size(), 1);
      ps[d] = s[d];
      positions = ops::view_as_shape(positions, ps);
      Tensor onehot = ops::to_dtype(ops::compare(OpId::eq, positions, I.get()), g[0].dtype());
      Tensor gg = g[0].dim() == static_cast<int>(s.size()) ? g[0] : ops::unsqueeze(g[0], d);
      return {ops::mul(onehot, gg)};
    });
  }
  return {v, i};
}
}  // namespace

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) { return extreme_dim(x, dim, keepdim, true); }
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) { return extreme_dim(x, dim, keepdim, false); }

Tensor var(const Tensor& x_in, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::var, {&x});
  Tensor out = ops::reduce(OpId::var, x, dims, keepdim, correction);
  if (needs_grad({&x})) {
    const int64_t n = x.numel() / std::max<int64_t>(1, out.numel());
    record("VarBackward", {x}, {out}, [dims, keepdim, n, correction, X = SavedTensor(x)](const Grads& g) -> Grads {
      Tensor xx = X.get();
      Tensor m = ops::reduce(OpId::mean, xx, dims, true);
      Tensor gg = unsqueeze_reduced(g[0], xx.shape(), dims, keepdim);
      // d var / dx = 2 (x - mean) / (n - correction)
      return {ops::mul(ops::mul_scalar(ops::sub(xx, m), 2.0 / static_cast<double>(n - correction)), gg)};
    });
  }
  return out;
}

}  // namespace ampforge
