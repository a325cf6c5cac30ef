// The differentiable tensor API (namespace ampforge). Each function applies the autocast policy, calls
// the primitive in ops/, and records a backward node (written with ops/, so it runs on every backend)
// when grad mode is on and an input requires grad. Implementations: autograd/functions/<family>.cpp.
//
// Shapes use PyTorch's conventions: images (N, C, H, W), sequences (B, T, E), attention (B, H, T, D).
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "ampforge/core/attrs.h"
#include "ampforge/core/generator.h"
#include "ampforge/core/tensor.h"

namespace ampforge {

// ---- creation (no history; pass requires_grad_() afterwards for leaves) ----------------------------
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = kCPU);
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = kCPU);
Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = kCPU);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor arange(double start, double end, double step = 1, DType dtype = DType::I64, Device device = kCPU);
Tensor rand(const Shape& shape, DType dtype = DType::F32, Device device = kCPU, Generator* gen = nullptr);
Tensor randn(const Shape& shape, DType dtype = DType::F32, Device device = kCPU, Generator* gen = nullptr);

// ---- elementwise ----------------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApprox approximate = GeluApprox::None);
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor atan(const Tensor& x);  // float only (integers are converted to F32), as torch.atan
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Comparisons return Bool tensors (no gradient).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator*(double s, const Tensor& a);
Tensor operator+(double s, const Tensor& a);

// ---- reductions (dims empty: all) ------------------------------------------------------------------
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Max along one dim: (values, indices), as torch.max(x, dim).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), as torch.var.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);

// ---- shape and views -------------------------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor view(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor contiguous(const Tensor& x, MemoryFormat format = MemoryFormat::Contiguous);
Tensor to(const Tensor& x, DType dtype);
Tensor to(const Tensor& x, Device device);
Tensor clone(const Tensor& x);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// ---- linear algebra --------------------------------------------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x @ weight^T + bias; x (..., in), weight (out, in), bias (out) or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- convolution and pooling (x: (N, C, H, W), any memory format) ---------------------------------
// weight (C_out, C_in / groups, kH, kW), bias (C_out) or undefined. Output keeps x's memory format.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dAttrs& attrs = {});
Tensor max_pool2d(const Tensor& x, const Pool2dAttrs& attrs);
Tensor avg_pool2d(const Tensor& x, const Pool2dAttrs& attrs);
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);
Tensor upsample_nearest2d(const Tensor& x, int64_t scale_h = 2, int64_t scale_w = 2);

// ---- normalisation ----------------------------------------------------------------------------------
// Training: normalises with batch statistics and updates running_mean/var in place (momentum, unbiased
// variance), as torch.nn.functional.batch_norm. Eval: uses the running statistics.
// weight/bias (C) or undefined; running stats (C) F32, or undefined (training only).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);
// act(y) as its own op: relu(y), silu(y), or y itself for None. What the fused batch-norm ops compose where they
// do not fuse.
Tensor norm_act(const Tensor& y, NormAct act);
// act(batch_norm(...)) for act = ReLU or SiLU (None: batch_norm), the pair every conv block of ResNet and YOLOv8
// ends with. Same values and gradients as the two ops; on the CPU one kernel writes act(bn(x)) and the backward
// recomputes bn(x) from x, so bn(x) is never stored and two elementwise passes each way disappear. On other
// devices the two ops run as they are.
Tensor batch_norm_act(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                      const Tensor& running_var, bool training, double momentum, double eps, NormAct act);
// act(batch_norm(x, ...) + residual) for act = None or ReLU: the end of a ResNet residual block (bn3, the
// shortcut's add, the ReLU). Same values as the three ops in F32 (BF16/F16 round once instead of after each);
// on the CPU one pass writes the output and the backward reads the ReLU mask from it, so neither the sum nor
// bn(x) is ever stored. residual: x's shape (its layout may differ). Elsewhere, and in recompute mode (which
// keeps less than the fused op's output), the three ops run as they are.
Tensor batch_norm_add_act(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                          const Tensor& running_mean, const Tensor& running_var, bool training, double momentum,
                          double eps, NormAct act);
// Training-mode batch_norm whose statistics are those of the global batch of a data-parallel job
// (torch.nn.SyncBatchNorm): each replica's per-channel count and mean, then its spread about the global mean
// (F64), are summed over the replicas by `all_reduce_sum` (in place on a contiguous tensor on x's device; every
// replica calls it the same number of times in the same order), the running statistics take the global mean
// and unbiased variance, and the backward sums sum(g) and sum(g * (x - mean)) over the replicas the same way.
// weight and bias gradients are the replica's own, as PyTorch's (data parallel averages them like every
// gradient). Three collectives per layer and step; the host reads the sums (a device synchronisation on CUDA).
Tensor sync_batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, double momentum, double eps,
                       const std::function<void(const Tensor&)>& all_reduce_sum);
// Normalises over the trailing dims given by normalized_shape.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// ---- softmax and losses -------------------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// logits (N, C), target (N) class indices (I64).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyAttrs& attrs = {});
// logits and target of the same shape; target holds probabilities in [0, 1].
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean);

// ---- other -------------------------------------------------------------------------------------------
// weight (num_embeddings, dim), indices (any shape, I64) -> (*indices.shape, dim).
Tensor embedding(const Tensor& indices, const Tensor& weight, int64_t padding_idx = -1);
// Zeroes elements with probability p and scales the rest by 1/(1-p) when training; identity otherwise.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);
// q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv); mask: Bool, broadcastable to (B, H, Tq, Tk),
// true = attend. Returns (B, H, Tq, Dv). Runs the fused `attention` op when q, k, v share dtype, device and
// leading dims (ops::attention_applies), else a composite of matmul, where and softmax.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = Tensor(),
                                    bool causal = false, double scale = 0);

}  // namespace ampforge
