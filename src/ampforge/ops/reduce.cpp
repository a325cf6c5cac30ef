// ops/: reductions.
#include <algorithm>

#include "ampforge/ops/ops.h"

namespace ampforge::ops {

std::vector<int> normalize_dims(const std::vector<int64_t>& dims, int ndim, const char* what) {
  std::vector<int> out;
  if (dims.empty()) {
    for (int d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) {
    const int w = wrap_dim(d, ndim, what);
    AF_CHECK(std::find(out.begin(), out.end(), w) == out.end(), "{}: dimension {} appears more than once", what, w);
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  if (ndim == 0) out.clear();
  return out;
}

Tensor reduce(OpId op, const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim, int64_t correction) {
  const char* what = op_name(op);
  check_defined(x_in, what, "input");
  Tensor x = x_in;
  const bool arg = op == OpId::argmax || op == OpId::argmin;
  const bool valued = op == OpId::amax || op == OpId::amin || arg;
  if (!valued && !x.is_floating_point()) x = to_dtype(x, DType::F32);
  AF_CHECK(x.dtype() != DType::Bool || !valued, "{}: Bool tensors are not supported", what);
  ReduceAttrs at;
  at.dims = normalize_dims(dims, x.dim(), what);
  at.keepdim = keepdim;
  at.correction = correction;
  Shape kshape = x.shape();
  for (int d : at.dims) {
    if (valued) AF_CHECK(x.shape()[d] > 0, "{}: cannot reduce over dimension {} of size 0 (no identity)", what, d);
    kshape[d] = 1;
  }
  Tensor out = Tensor::empty(kshape, arg ? DType::I64 : x.dtype(), x.device());
  dispatch(op, x.device(), {x}, {out}, &at);
  if (keepdim) return out;
  Shape s;
  for (int d = 0; d < x.dim(); ++d)
    if (std::find(at.dims.begin(), at.dims.end(), d) == at.dims.end()) s.push_back(x.shape()[d]);
  return out.as_strided_raw(s, contiguous_strides(s), 0);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int lead = x.dim() - shape.size();
  AF_ASSERT(lead >= 0, "sum_to: shape {} has more dims than {}", shape.str(), x.shape().str());
  std::vector<int64_t> dims;
  for (int d = 0; d < x.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] == 1 && x.shape()[d] != 1) {
      dims.push_back(d);
    }
  }
  // keepdim output is contiguous; dropping the (now size-1) leading dims is a view.
  return view_as_shape(reduce(OpId::sum, x, dims, true), shape);
}

}  // namespace ampforge::ops
