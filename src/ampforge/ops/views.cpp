// ops/: views. They share storage; only shape, strides and offset change.
#include <algorithm>

#include "ampforge/ops/ops.h"

namespace ampforge::ops {

Shape infer_shape(const Shape& shape, int64_t numel, const char* what) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      AF_CHECK(infer < 0, "{}: only one dimension can be -1, got shape {}", what, shape.str());
      infer = i;
    } else {
      AF_CHECK(shape[i] >= 0, "{}: invalid size {} in shape {}", what, shape[i], shape.str());
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    AF_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for a tensor of {} elements", what, shape.str(),
             numel);
    out[infer] = numel / known;
  } else {
    AF_CHECK(known == numel, "{}: shape {} is invalid for a tensor of {} elements", what, shape.str(), numel);
  }
  return out;
}

// Strides that make `shape` a view of t, when they exist (PyTorch's computeStride rule: old dims that
// are merged must be contiguous with each other).
std::optional<Strides> view_strides(const Tensor& t, const Shape& shape) {
  const Shape& os = t.shape();
  const Strides& ost = t.strides();
  Strides ns = Strides::filled(shape.size(), 1);
  if (t.numel() == 0) return contiguous_strides(shape);
  int view_d = shape.size() - 1;
  int64_t chunk_base_stride = ost.size() ? ost.back() : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int td = os.size() - 1; td >= 0; --td) {
    tensor_numel *= os[td];
    if (td == 0 || (os[td - 1] != 1 && ost[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        ns[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base_stride = ost[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return ns;
}

Tensor view_as_shape(const Tensor& t, const Shape& shape_in) {
  Shape shape = infer_shape(shape_in, t.numel(), "view");
  auto st = view_strides(t, shape);
  AF_CHECK(st.has_value(), "view: shape {} is not compatible with the strides {} of a tensor of shape {} (use "
           "reshape(), which copies when needed)", shape.str(), t.strides().str(), t.shape().str());
  return t.as_strided_raw(shape, *st, t.offset());
}

Tensor reshape(const Tensor& t, const Shape& shape_in) {
  Shape shape = infer_shape(shape_in, t.numel(), "reshape");
  if (auto st = view_strides(t, shape)) return t.as_strided_raw(shape, *st, t.offset());
  Tensor c = contiguous(t);
  return c.as_strided_raw(shape, contiguous_strides(shape), c.offset());
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  AF_CHECK(static_cast<int>(dims.size()) == t.dim(), "permute: expected {} dims for a tensor of shape {}, got {}",
           t.dim(), t.shape().str(), dims.size());
  Shape s;
  Strides st;
  std::vector<bool> seen(t.dim(), false);
  for (int64_t d : dims) {
    const int w = wrap_dim(d, t.dim(), "permute");
    AF_CHECK(!seen[w], "permute: dimension {} appears twice", w);
    seen[w] = true;
    s.push_back(t.shape()[w]);
    st.push_back(t.strides()[w]);
  }
  return t.as_strided_raw(s, st, t.offset());
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  const int d = wrap_dim(dim, t.dim(), "narrow");
  const int64_t n = t.shape()[d];
  if (start < 0) start += n;
  AF_CHECK(start >= 0 && length >= 0 && start + length <= n,
           "narrow: range [{}, {}) is out of bounds for dimension {} of size {}", start, start + length, d, n);
  Shape s = t.shape();
  s[d] = length;
  return t.as_strided_raw(s, t.strides(), t.offset() + start * t.strides()[d]);
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const int d = wrap_dim(dim, t.dim(), "slice");
  AF_CHECK(step > 0, "slice: step must be positive, got {}", step);
  const int64_t n = t.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = t.shape();
  Strides st = t.strides();
  s[d] = (end - start + step - 1) / step;
  st[d] *= step;
  return t.as_strided_raw(s, st, t.offset() + start * t.strides()[d]);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  AF_CHECK(shape.size() >= t.dim(), "expand: the target shape {} has fewer dims than the tensor's shape {}",
           shape.str(), t.shape().str());
  Shape s = shape;
  Strides st = Strides::filled(shape.size(), 0);
  const int off = shape.size() - t.dim();
  for (int i = 0; i < shape.size(); ++i) {
    if (i < off) {
      AF_CHECK(shape[i] >= 0, "expand: size -1 is not allowed for a new leading dimension ({})", shape.str());
      continue;
    }
    const int64_t cur = t.shape()[i - off];
    if (shape[i] == -1) s[i] = cur;
    AF_CHECK(s[i] == cur || cur == 1, "expand: cannot expand shape {} to {} (dimension {}: {} vs {})",
             t.shape().str(), shape.str(), i, cur, s[i]);
    st[i] = (cur == 1 && s[i] != 1) ? 0 : t.strides()[i - off];
  }
  return t.as_strided_raw(s, st, t.offset());
}

Tensor squeeze_dim(const Tensor& t, int64_t dim) {
  if (t.dim() == 0) return t;
  const int d = wrap_dim(dim, t.dim(), "squeeze");
  if (t.shape()[d] != 1) return t;
  Shape s = t.shape();
  Strides st = t.strides();
  s.erase(d);
  st.erase(d);
  return t.as_strided_raw(s, st, t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  const int d = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Shape s = t.shape();
  Strides st = t.strides();
  const int64_t stride = d < t.dim() ? t.strides()[d] * t.shape()[d] : 1;
  s.insert(d, 1);
  st.insert(d, stride);
  return t.as_strided_raw(s, st, t.offset());
}

}  // namespace ampforge::ops
