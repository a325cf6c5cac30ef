// ops: the primitive, non-differentiable op functions. Each validates its arguments (throwing
// InvalidArgument with the op's name, what was expected and what was found), allocates the output and
// dispatches to the kernel registered for the inputs' device. No kernels here, no autograd here: the
// differentiable API (ampforge::relu, ampforge::conv2d, ...) is in autograd/functions.h and calls these.
//
// Conventions: outputs are new tensors unless the name ends in '_' (in place into the first argument,
// which bumps its version counter). Shapes in comments are (N, C, H, W)-style.
#pragma once

#include <optional>
#include <vector>

#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/core/generator.h"
#include "ampforge/core/tensor.h"

namespace ampforge::ops {

// ---- creation -------------------------------------------------------------------------------------
Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = kCPU);
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = kCPU);
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = kCPU);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
Tensor arange(double start, double end, double step = 1, DType dtype = DType::I64, Device device = kCPU);
// Uniform in [low, high) / normal(mean, std), from `gen` (default: the global generator).
Tensor rand(const Shape& shape, DType dtype = DType::F32, Device device = kCPU, Generator* gen = nullptr,
            double low = 0, double high = 1);
Tensor randn(const Shape& shape, DType dtype = DType::F32, Device device = kCPU, Generator* gen = nullptr,
             double mean = 0, double std = 1);
void fill_(const Tensor& t, double value);
void uniform_(const Tensor& t, double low, double high, Generator* gen = nullptr);
void normal_(const Tensor& t, double mean, double std, Generator* gen = nullptr);

// ---- copies and layout ----------------------------------------------------------------------------
// dst <- src (src broadcast to dst's shape, converted to dst's dtype). Same device only.
void copy_(const Tensor& dst, const Tensor& src);
Tensor to_dtype(const Tensor& t, DType dtype);  // returns t itself when the dtype already matches
Tensor contiguous(const Tensor& t, MemoryFormat format = MemoryFormat::Contiguous);
Tensor clone(const Tensor& t, MemoryFormat format = MemoryFormat::Preserve);
Tensor to_device(const Tensor& t, Device device);

// ---- elementwise ----------------------------------------------------------------------------------
Tensor unary(OpId op, const Tensor& x, const void* attrs = nullptr);
Tensor binary(OpId op, const Tensor& a, const Tensor& b, const void* attrs = nullptr);
// In place: a <- op(a, b); b broadcasts to a's shape.
void binary_(OpId op, const Tensor& a, const Tensor& b);
Tensor compare(OpId op, const Tensor& a, const Tensor& b);  // Bool result

inline Tensor add(const Tensor& a, const Tensor& b) { return binary(OpId::add, a, b); }
inline Tensor sub(const Tensor& a, const Tensor& b) { return binary(OpId::sub, a, b); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(OpId::mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(OpId::div, a, b); }
inline void add_(const Tensor& a, const Tensor& b) { binary_(OpId::add, a, b); }
inline void mul_(const Tensor& a, const Tensor& b) { binary_(OpId::mul, a, b); }
Tensor add_scalar(const Tensor& x, double s);
Tensor mul_scalar(const Tensor& x, double s);
Tensor pow_scalar(const Tensor& x, double s);
void mul_scalar_(const Tensor& x, double s);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor gelu(const Tensor& x, GeluApprox approximate);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Backward kernels of the pointwise activations: (grad_out, saved) -> grad_in.
Tensor pointwise_backward(OpId op, const Tensor& grad, const Tensor& saved, const void* attrs = nullptr);

// ---- reductions -----------------------------------------------------------------------------------
// `dims` empty means all dims. Sum/mean of integer tensors are computed in (and return) F32.
Tensor reduce(OpId op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, int64_t correction = 1);
inline Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false) {
  return reduce(OpId::sum, x, dims, keepdim);
}
inline Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false) {
  return reduce(OpId::mean, x, dims, keepdim);
}
// Sums `x` down to `shape` (the reverse of broadcasting `shape` to x's shape).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra -------------------------------------------------------------------------------
// matmul with numpy semantics: 1-D/2-D/batched, batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
// x (..., K) @ W (N, K)^T + bias (N) -> (..., N).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

// ---- views (no data copied; used by the differentiable view functions) -----------------------------
Tensor view_as_shape(const Tensor& t, const Shape& shape);  // errors when strides do not allow a view
Tensor reshape(const Tensor& t, const Shape& shape);        // a view when possible, else a contiguous copy
std::optional<Strides> view_strides(const Tensor& t, const Shape& shape);
Shape infer_shape(const Shape& shape, int64_t numel, const char* what);  // resolves one -1
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor squeeze_dim(const Tensor& t, int64_t dim);
Tensor unsqueeze(const Tensor& t, int64_t dim);

// ---- helpers for ops/ -----------------------------------------------------------------------------
// Output memory format for an op with these inputs: channels-last when a full-shape input is.
MemoryFormat output_format(const Tensor& a, const Shape& out_shape);
std::vector<int> normalize_dims(const std::vector<int64_t>& dims, int ndim, const char* what);

}  // namespace ampforge::ops
