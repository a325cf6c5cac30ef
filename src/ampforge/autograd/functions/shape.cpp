// Differentiable views, layout changes, casts, concatenation and splitting.
#include <numeric>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;

namespace {

Tensor reshape_like_input(const Tensor& g, const Shape& s) { return ops::reshape(g, s); }

// The layout an input's gradient is built in: the input's own (channels-last images stay channels-last, so
// the scatter below is a straight copy and the producer's backward gets the layout it wrote).
MemoryFormat grad_layout(const Tensor& x) {
  return x.dim() == 4 ? ops::image_memory_format(x) : MemoryFormat::Contiguous;
}

// Records a view whose backward scatters the gradient into zeros of the input's shape.
void record_slice_like(const char* name, const Tensor& x, const Tensor& out,
                       std::function<Tensor(const Tensor&)> same_view) {
  const Shape s = x.shape();
  const DType dt = x.dtype();
  const Device dev = x.device();
  const MemoryFormat fmt = grad_layout(x);
  record(name, {x}, {out}, [s, dt, dev, fmt, same_view](const Grads& g) -> Grads {
    Tensor gi = Tensor::empty(s, dt, dev, fmt);
    ops::fill_(gi, 0.0);
    ops::copy_(same_view(gi), g[0]);
    return {gi};
  });
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor out = ops::reshape(x, shape);
  if (needs_grad({&x})) {
    const Shape s = x.shape();
    record("ReshapeBackward", {x}, {out}, [s](const Grads& g) -> Grads { return {reshape_like_input(g[0], s)}; });
  }
  return out;
}

Tensor view(const Tensor& x, const Shape& shape) {
  Tensor out = ops::view_as_shape(x, shape);
  if (needs_grad({&x})) {
    const Shape s = x.shape();
    record("ViewBackward", {x}, {out}, [s](const Grads& g) -> Grads { return {reshape_like_input(g[0], s)}; });
  }
  return out;
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, Shape{1});
  const int s = wrap_dim(start_dim, x.dim(), "flatten"), e = wrap_dim(end_dim, x.dim(), "flatten");
  AF_CHECK(s <= e, "flatten: start_dim ({}) must not come after end_dim ({})", start_dim, end_dim);
  Shape ns;
  for (int d = 0; d < s; ++d) ns.push_back(x.shape()[d]);
  int64_t m = 1;
  for (int d = s; d <= e; ++d) m *= x.shape()[d];
  ns.push_back(m);
  for (int d = e + 1; d < x.dim(); ++d) ns.push_back(x.shape()[d]);
  return reshape(x, ns);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor out = ops::permute(x, dims);
  if (needs_grad({&x})) {
    std::vector<int64_t> inv(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inv[wrap_dim(dims[i], x.dim(), "permute")] = static_cast<int64_t>(i);
    record("PermuteBackward", {x}, {out}, [inv](const Grads& g) -> Grads { return {ops::permute(g[0], inv)}; });
  }
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  std::vector<int64_t> p(x.dim());
  std::iota(p.begin(), p.end(), 0);
  if (x.dim() == 0) return x;
  std::swap(p[wrap_dim(d0, x.dim(), "transpose")], p[wrap_dim(d1, x.dim(), "transpose")]);
  return permute(x, p);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Tensor out = ops::narrow(x, dim, start, length);
  if (needs_grad({&x}))
    record_slice_like("NarrowBackward", x, out, [dim, start, length](const Tensor& t) { return ops::narrow(t, dim, start, length); });
  return out;
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  Tensor out = ops::slice(x, dim, start, end, step);
  if (needs_grad({&x}))
    record_slice_like("SliceBackward", x, out, [dim, start, end, step](const Tensor& t) { return ops::slice(t, dim, start, end, step); });
  return out;
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  const int d = wrap_dim(dim, x.dim(), "select");
  const int64_t n = x.shape()[d];
  AF_CHECK(index >= -n && index < n, "select: index {} is out of range for dimension {} of size {}", index, d, n);
  if (index < 0) index += n;
  Tensor out = ops::squeeze_dim(ops::narrow(x, d, index, 1), d);
  if (needs_grad({&x}))
    record_slice_like("SelectBackward", x, out, [d, index](const Tensor& t) { return ops::squeeze_dim(ops::narrow(t, d, index, 1), d); });
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  Tensor out = ops::expand(x, shape);
  if (needs_grad({&x})) {
    const Shape s = x.shape();
    record("ExpandBackward", {x}, {out}, [s](const Grads& g) -> Grads { return {ops::sum_to(g[0], s)}; });
  }
  return out;
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  Tensor out = ops::squeeze_dim(x, dim);
  if (needs_grad({&x})) {
    const Shape s = x.shape();
    record("SqueezeBackward", {x}, {out}, [s](const Grads& g) -> Grads { return {ops::reshape(g[0], s)}; });
  }
  return out;
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  Tensor out = ops::unsqueeze(x, dim);
  if (needs_grad({&x})) {
    const Shape s = x.shape();
    record("UnsqueezeBackward", {x}, {out}, [s](const Grads& g) -> Grads { return {ops::reshape(g[0], s)}; });
  }
  return out;
}

Tensor contiguous(const Tensor& x, MemoryFormat format) {
  Tensor out = ops::contiguous(x, format);
  if (out.is_same(x)) return x;
  if (needs_grad({&x})) record("ContiguousBackward", {x}, {out}, [](const Grads& g) -> Grads { return {g[0]}; });
  return out;
}

Tensor to(const Tensor& x, DType dtype) {
  Tensor out = ops::to_dtype(x, dtype);
  if (out.is_same(x)) return x;
  if (needs_grad({&x}) && dtype_is_float(dtype)) {
    const DType src = x.dtype();
    record("ToCopyBackward", {x}, {out}, [src](const Grads& g) -> Grads { return {ops::to_dtype(g[0], src)}; });
  }
  return out;
}

Tensor to(const Tensor& x, Device device) {
  Tensor out = ops::to_device(x, device);
  if (out.is_same(x)) return x;
  if (needs_grad({&x})) {
    const Device src = x.device();
    record("ToDeviceBackward", {x}, {out}, [src](const Grads& g) -> Grads { return {ops::to_device(g[0], src)}; });
  }
  return out;
}

Tensor clone(const Tensor& x) {
  Tensor out = ops::clone(x);
  if (needs_grad({&x})) record("CloneBackward", {x}, {out}, [](const Grads& g) -> Grads { return {g[0]}; });
  return out;
}

Tensor cat(const std::vector<Tensor>& xs_in, int64_t dim) {
  AF_CHECK(!xs_in.empty(), "cat: expected a non-empty list of tensors");
  std::vector<Tensor> xs = xs_in;
  const Tensor& first = xs[0];
  const int d = wrap_dim(dim, first.dim(), "cat");
  DType dt = first.dtype();
  for (auto& t : xs) {
    check_defined(t, "cat", "tensors");
    check_same_device(first, t, "cat");
    dt = promote_types(dt, t.dtype());
  }
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& t = xs[i];
    AF_CHECK(t.dim() == first.dim(), "cat: tensor {} has {} dims, tensor 0 has {}", i, t.dim(), first.dim());
    for (int k = 0; k < t.dim(); ++k)
      if (k != d)
        AF_CHECK(t.shape()[k] == first.shape()[k],
                 "cat: sizes must match except in dimension {}; tensor {} has shape {}, tensor 0 has shape {}", d, i,
                 t.shape().str(), first.shape().str());
    out_shape[d] += t.shape()[d];
  }
  // The first input's layout, as PyTorch's cat: channels-last images concatenated along channels (YOLOv8's
  // C2f, SPPF and neck) stay channels-last.
  Tensor out = Tensor::empty(out_shape, dt, first.device(),
                             first.dim() == 4 ? ops::image_memory_format(first) : MemoryFormat::Contiguous);
  int64_t off = 0;
  std::vector<int64_t> sizes;
  for (auto& t : xs) {
    ops::copy_(ops::narrow(out, d, off, t.shape()[d]), t);
    off += t.shape()[d];
    sizes.push_back(t.shape()[d]);
  }
  if (needs_grad(xs)) {
    record("CatBackward", xs, {out}, [d, sizes](const Grads& g) -> Grads {
      Grads r;
      int64_t o = 0;
      for (int64_t s : sizes) {
        r.push_back(ops::narrow(g[0], d, o, s));
        o += s;
      }
      return r;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  AF_CHECK(!xs.empty(), "stack: expected a non-empty list of tensors");
  const int d = wrap_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> u;
  for (size_t i = 0; i < xs.size(); ++i) {
    AF_CHECK(xs[i].shape() == xs[0].shape(), "stack: all tensors must have the same shape; tensor {} has {}, tensor 0 has {}",
             i, xs[i].shape().str(), xs[0].shape().str());
    u.push_back(unsqueeze(xs[i], d));
  }
  return cat(u, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  AF_CHECK(split_size > 0, "split: split_size must be positive, got {}", split_size);
  const int d = wrap_dim(dim, x.dim(), "split");
  std::vector<Tensor> out;
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < x.shape()[d]; s += split_size) {
    sizes.push_back(std::min(split_size, x.shape()[d] - s));
    out.push_back(ops::narrow(x, d, s, sizes.back()));
  }
  // One node for all pieces (PyTorch's SplitBackward): the input's gradient is the pieces' gradients written
  // side by side, zeros where a piece got none. One pass over the gradient, where a backward per piece would
  // build a full-size zero gradient for each and then add them (YOLOv8's C2f splits every block's input).
  if (needs_grad({&x})) {
    const Shape s = x.shape();
    const DType dt = x.dtype();
    const Device dev = x.device();
    const MemoryFormat fmt = grad_layout(x);
    record("SplitBackward", {x}, out, [s, dt, dev, fmt, d, sizes](const Grads& g) -> Grads {
      Tensor gi = Tensor::empty(s, dt, dev, fmt);
      int64_t off = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        Tensor piece = ops::narrow(gi, d, off, sizes[i]);
        if (i < g.size() && g[i].defined())
          ops::copy_(piece, g[i]);
        else
          ops::fill_(piece, 0.0);
        off += sizes[i];
      }
      return {gi};
    });
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  AF_CHECK(chunks > 0, "chunk: the number of chunks must be positive, got {}", chunks);
  const int d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.shape()[d];
  return split(x, std::max<int64_t>(1, (n + chunks - 1) / chunks), d);
}

}  // namespace ampforge
