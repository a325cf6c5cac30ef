// ops: the primitive, non-differentiable op functions. Each validates its arguments (throwing
// InvalidArgument with the op's name, what was expected and what was found), allocates the output and
// dispatches to the kernel registered for the inputs' device. No kernels here, no autograd here: the
// differentiable API (ampforge::relu, ampforge::conv2d, ...) is in autograd/functions.h and calls these.
//
// Conventions: outputs are new tensors unless the name ends in '_' (in place into the first argument,
// which bumps its version counter). Shapes in comments are (N, C, H, W)-style.
#pragma once

#include <array>
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

// ---- optimizers (fused, over flat buffers; everything in place) -----------------------------------
// param/exp_avg/exp_avg_sq: F32 flat buffers; grad: same length, F32 or 16-bit; found_inf: optional
// one-element F32 (non-zero skips the step); model_param: optional 16-bit copy written after the update
// (master-weight mode); hyper: optional device hyperparameters {completed steps, lr} (F64, 2; core/attrs.h),
// read and advanced by the kernel.
void adamw_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamWAttrs& attrs, const Tensor& found_inf = Tensor(), const Tensor& model_param = Tensor(),
                 const Tensor& hyper = Tensor());
void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, const SgdAttrs& attrs,
               const Tensor& found_inf = Tensor(), const Tensor& model_param = Tensor(), const Tensor& hyper = Tensor());

// ---- normalisation (ops/norm.cpp) -----------------------------------------------------------------
// Statistics outputs (save_mean, save_invstd, mean, rstd) are F32, or F64 for F64 inputs.
struct BatchNormResult {
  Tensor out;          // x's shape, dtype and memory format (contiguous or channels-last)
  Tensor save_mean;    // (C): batch mean (training) or running_mean (eval)
  Tensor save_invstd;  // (C): 1/sqrt(var + eps) of the batch (biased) or running variance
};
// x (N, C, *); weight, bias, running_mean, running_var: (C) or undefined. Training updates the running
// stats in place (momentum, unbiased variance). Eval requires the running stats. attrs.act: out =
// act(bn(x)) in the same pass (devices where batch_norm_fuses_activation). `residual` (x's shape, dtype;
// same devices; attrs.act None or ReLU): out = act(bn(x) + residual), a residual block's end in one pass.
BatchNormResult batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, const BatchNormAttrs& attrs, const Tensor& residual = Tensor());
struct NormGrads {
  Tensor grad_input, grad_weight, grad_bias;  // undefined where not asked for
  Tensor grad_residual;                       // the residual form only (`out` given to batch_norm_backward)
};
// want = {input, weight, bias}: which gradients to compute (weight/bias only when weight is defined).
// attrs.act != None (the forward applied an activation, attrs the forward's): grad is the gradient of
// act(bn(x)); bn(x) is recomputed from x, save_mean, save_invstd, weight and `bias` (the forward's).
// `out` given (the residual form's output, act(bn(x) + residual)): the activation's gradient is read from it
// (ReLU: out > 0) instead, and grad_residual, the gradient of bn(x) + residual, is returned as well (always).
NormGrads batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                              const Tensor& save_invstd, const BatchNormAttrs& attrs, std::array<bool, 3> want,
                              const Tensor& bias = Tensor(), const Tensor& out = Tensor());
// Whether batch_norm's kernels on this device apply attrs.act themselves (the CPU, and a meta device standing
// for it); elsewhere attrs.act must be None.
bool batch_norm_fuses_activation(Device device);
struct LayerNormResult {
  Tensor out;   // x's shape, contiguous
  Tensor mean;  // (*leading, 1, ..., 1): one per normalised row
  Tensor rstd;  // same shape as mean
};
// Normalises over the trailing dims equal to normalized_shape; weight, bias: normalized_shape or undefined.
LayerNormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                           double eps);
NormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, int normalized_dims, std::array<bool, 3> want);

// ---- softmax and losses (ops/softmax.cpp) ---------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Backward from the forward output y: (grad, y) -> grad_x.
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);
struct CrossEntropyResult {
  Tensor loss;  // (N, d...) for Reduction::None, else 0-d; logits' dtype
  Tensor lse;   // (N, d...) log-sum-exp of each row (F32, or F64 for F64 logits), for the backward
};
// logits (N, C) or (N, C, d1, ...); target (N) or (N, d1, ...) class indices (I64; I32 is converted).
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyAttrs& attrs);
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const CrossEntropyAttrs& attrs);
// logits and target of the same shape (target converted to logits' dtype).
Tensor bce_with_logits(const Tensor& logits, const Tensor& target, Reduction reduction);
Tensor bce_with_logits_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, Reduction reduction);

// ---- fused attention (ops/attention.cpp) ------------------------------------------------------------
// q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv) with identical leading dims and one floating dtype;
// mask: undefined or Bool broadcastable to (..., Tq, Tk) (true = attend). scale 0 means 1/sqrt(D).
struct AttentionResult {
  Tensor out;  // (..., Tq, Dv), q's dtype
  Tensor lse;  // (..., Tq) log-sum-exp of the masked scaled scores (F32, F64 for F64 inputs)
};
// Whether the fused op takes these operands (same device, dtype, leading dims; non-empty; on CUDA F32/F16/BF16
// with D, Dv <= kAttentionMaxHeadDimCuda). Otherwise scaled_dot_product_attention uses its composite.
inline constexpr int64_t kAttentionMaxHeadDimCuda = 128;
bool attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                          const AttentionAttrs& attrs);
struct AttentionGrads {
  Tensor dq, dk, dv;  // shapes of q, k, v; q's dtype
};
AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& mask,
                                  const AttentionAttrs& attrs);

// ---- embedding and dropout (ops/index.cpp) ---------------------------------------------------------
// weight (V, D), indices any shape (I64 or I32) -> (*indices, D). padding_idx: -1 (none) or in [0, V).
Tensor embedding(const Tensor& indices, const Tensor& weight, int64_t padding_idx = -1);
// Sum of grad rows into a (V, D) tensor of grad's dtype; the padding_idx row stays zero.
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights, int64_t padding_idx = -1);
struct DropoutResult {
  Tensor out;   // x's shape and dtype, contiguous
  Tensor mask;  // Bool, true = kept
};
// Always draws (callers handle eval / p == 0 as the identity); p in [0, 1]. Reserves numel values of `gen`
// (default: the global generator).
DropoutResult dropout(const Tensor& x, double p, Generator* gen = nullptr);

// ---- convolution, pooling, upsampling (ops/conv.cpp, ops/pool.cpp) --------------------------------
// Images are (N, C, H, W), contiguous or channels-last (other layouts are accepted and copied or read
// through strides). Outputs and input gradients take image_memory_format() of the input / grad_output.
// Dtypes: F32, F64, F16, BF16 (16-bit computed in float); all operands of one dtype and device.
//
// The layout of image x: channels-last when x is laid out so, else Contiguous. When size-1 dims make both
// hold (C == 1, 1x1 kernels), the strides decide, as in PyTorch's suggest_memory_format. A view that is
// neither (a channel slice of a channels-last image: YOLOv8's C2f chunks) is channels-last when its strides
// are ordered so (C smallest, then W, H, N), as PyTorch's is_channels_last_strides_2d decides: the copy a
// kernel then makes keeps a channels-last network channels-last.
MemoryFormat image_memory_format(const Tensor& x);
// conv2d's output layout: channels-last when x or the weight is (PyTorch's rule, which keeps a
// single-channel first layer channels-last when its weight is).
MemoryFormat conv2d_memory_format(const Tensor& x, const Tensor& weight);
// x itself when contiguous in `format`, else a copy laid out so.
Tensor to_image_layout(const Tensor& x, MemoryFormat format);
// Checks input (N, C, H, W) against weight (C_out, C / groups, kH, kW) and attrs (errors name "conv2d");
// returns (N, C_out, OH, OW) with OH = floor((H + 2p - d*(kH-1) - 1) / s) + 1.
Shape conv2d_output_shape(const Shape& input_shape, const Shape& weight_shape, const Conv2dAttrs& attrs);
// x (N, C, H, W), weight (C_out, C / groups, kH, kW), bias (C_out) or undefined -> (N, C_out, OH, OW)
// laid out as conv2d_memory_format(x, weight).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dAttrs& attrs);
// Backward kernels: `format` is the input gradient's layout (the forward's choice); Preserve takes
// image_memory_format(grad_out).
// grad_out (N, C_out, OH, OW), weight -> grad_input of input_shape.
Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dAttrs& attrs, MemoryFormat format = MemoryFormat::Preserve);
// grad_out (N, C_out, OH, OW), x -> grad_weight of weight_shape (contiguous). The bias gradient is
// sum(grad_out, {0, 2, 3}).
Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dAttrs& attrs);
// PyTorch's pooling output size; with ceil_mode the last window must start inside the input or the left
// padding.
int64_t pool2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation,
                           bool ceil_mode);
// (values, indices): indices I64 of the output's shape and layout, h * W + w within each (n, c) plane.
// padding <= kernel / 2 per dim; the output must be at least 1x1.
std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dAttrs& attrs);
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape,
                           const Pool2dAttrs& attrs, MemoryFormat format = MemoryFormat::Preserve);
// No dilation (must be 1); count_include_pad and ceil_mode as PyTorch.
Tensor avg_pool2d(const Tensor& x, const Pool2dAttrs& attrs);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const Pool2dAttrs& attrs,
                           MemoryFormat format = MemoryFormat::Preserve);
// Window i spans [floor(i * In / Out), ceil((i + 1) * In / Out)) in each spatial dim.
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape,
                                    MemoryFormat format = MemoryFormat::Preserve);
// (N, C, H, W) -> (N, C, H * scale_h, W * scale_w); integer scales >= 1.
Tensor upsample_nearest2d(const Tensor& x, int64_t scale_h, int64_t scale_w);
Tensor upsample_nearest2d_backward(const Tensor& grad_out, const Shape& input_shape, int64_t scale_h, int64_t scale_w,
                                   MemoryFormat format = MemoryFormat::Preserve);

// ---- mixed precision (GradScaler) ------------------------------------------------------------------
// grads *= inv_scale in place, and found_inf = 1 if any grad is Inf/NaN (one fused pass).
void amp_unscale_(const Tensor& grads, const Tensor& inv_scale, const Tensor& found_inf);
void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       const AmpUpdateAttrs& attrs);

// ---- helpers for ops/ -----------------------------------------------------------------------------
// Output memory format for an op with these inputs: channels-last when a full-shape input is.
MemoryFormat output_format(const Tensor& a, const Shape& out_shape);
// The dtype of a binary op's result, by PyTorch's type promotion: dimensioned operands decide; a 0-dim
// operand only when it is of a higher category (Bool < integer < floating) than the dimensioned ones.
DType result_type(const Tensor& a, const Tensor& b);
std::vector<int> normalize_dims(const std::vector<int64_t>& dims, int ndim, const char* what);

}  // namespace ampforge::ops
