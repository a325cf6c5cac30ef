// Differentiable batch_norm and layer_norm. Both run in F32 under autocast (op list: F32); their backward
// formulas are the fused backward kernels (batch_norm_backward, layer_norm_backward), which produce the
// input, weight and bias gradients in one call. Running statistics are state, not inputs: no gradient.
#include <algorithm>
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

Tensor batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps) {
  Tensor x = x_in, w = weight, b = bias;
  autograd::autocast_inputs(OpId::batch_norm, {&x, &w, &b});
  const BatchNormAttrs at{training, momentum, eps};
  ops::BatchNormResult r = ops::batch_norm(x, w, b, running_mean, running_var, at);
  if (needs_grad({&x, &w, &b})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad(), gb = b.defined() && b.requires_grad();
    const DType bias_dtype = b.defined() ? b.dtype() : DType::F32;
    const SavedTensor X(x), W(w);
    auto node = record("BatchNormBackward", {x, w, b}, {r.out},
                       [at, gx, gw, gb, bias_dtype, X, W, M = SavedTensor(r.save_mean),
                        I = SavedTensor(r.save_invstd)](const Grads& g) -> Grads {
                         ops::NormGrads d =
                             ops::batch_norm_backward(g[0], X.get(), W.get(), M.get(), I.get(), at, {gx, gw, gb});
                         if (d.grad_bias.defined()) d.grad_bias = ops::to_dtype(d.grad_bias, bias_dtype);
                         return {d.grad_input, d.grad_weight, d.grad_bias};
                       });
    // Recompute mode: the output is rebuilt from the saved input by the same kernel in training mode, which
    // computes the same batch statistics (fixed-order sums) and so the same values bit for bit; without the
    // running statistics, which the forward already updated.
    if (training)
      autograd::set_recompute(node, [at, X, W, B = SavedTensor(b)](uint32_t) {
        return ops::batch_norm(X.get(), W.get(), B.get(), Tensor(), Tensor(), at).out;
      });
  }
  return r.out;
}

Tensor norm_act(const Tensor& y, NormAct act) {
  return act == NormAct::ReLU ? relu(y) : act == NormAct::SiLU ? silu(y) : y;
}

Tensor batch_norm_act(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                      const Tensor& running_var, bool training, double momentum, double eps, NormAct act) {
  if (act == NormAct::None || !ops::batch_norm_fuses_activation(x_in.device())) {
    return norm_act(batch_norm(x_in, weight, bias, running_mean, running_var, training, momentum, eps), act);
  }
  Tensor x = x_in, w = weight, b = bias;
  autograd::autocast_inputs(OpId::batch_norm, {&x, &w, &b});
  const BatchNormAttrs at{training, momentum, eps, act};
  ops::BatchNormResult r = ops::batch_norm(x, w, b, running_mean, running_var, at);
  if (needs_grad({&x, &w, &b})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad(), gb = b.defined() && b.requires_grad();
    const DType bias_dtype = b.defined() ? b.dtype() : DType::F32;
    // Saved: what batch_norm's backward keeps, plus the bias (to recompute bn(x)); not the output.
    const SavedTensor X(x), W(w), B(b);
    auto node = record(act == NormAct::ReLU ? "BatchNormReluBackward" : "BatchNormSiluBackward", {x, w, b}, {r.out},
                       [at, gx, gw, gb, bias_dtype, X, W, B, M = SavedTensor(r.save_mean),
                        I = SavedTensor(r.save_invstd)](const Grads& g) -> Grads {
                         ops::NormGrads d = ops::batch_norm_backward(g[0], X.get(), W.get(), M.get(), I.get(), at,
                                                                     {gx, gw, gb}, B.get());
                         if (d.grad_bias.defined()) d.grad_bias = ops::to_dtype(d.grad_bias, bias_dtype);
                         return {d.grad_input, d.grad_weight, d.grad_bias};
                       });
    // Recompute mode: as batch_norm's (same kernel, same statistics), kept once rebuilt as relu's output is
    // (it is a layer's input: see autograd::set_recompute).
    if (training)
      autograd::set_recompute(
          node, [at, X, W, B](uint32_t) { return ops::batch_norm(X.get(), W.get(), B.get(), Tensor(), Tensor(), at).out; },
          /*keep=*/true);
  }
  return r.out;
}

Tensor batch_norm_add_act(const Tensor& x_in, const Tensor& residual_in, const Tensor& weight, const Tensor& bias,
                          const Tensor& running_mean, const Tensor& running_var, bool training, double momentum,
                          double eps, NormAct act) {
  AF_CHECK(norm_act_takes_residual(act), "batch_norm_add_act: the activation must be None or ReLU");
  // Recompute mode composes too: the fused op would keep its output for the ReLU mask, where the separate ops
  // keep only what they rebuild it from (bn3's input and the shortcut, which the block keeps anyway).
  if (!ops::batch_norm_fuses_activation(x_in.device()) || autograd::recompute_enabled()) {
    return norm_act(add(batch_norm(x_in, weight, bias, running_mean, running_var, training, momentum, eps), residual_in),
                    act);
  }
  Tensor x = x_in, w = weight, b = bias, res = residual_in;
  autograd::autocast_inputs(OpId::batch_norm, {&x, &w, &b});
  // The sum is taken in bn's dtype (F32 under autocast), as add would promote a 16-bit residual to it.
  if (res.dtype() != x.dtype()) res = to(res, x.dtype());
  const BatchNormAttrs at{training, momentum, eps, act};
  ops::BatchNormResult r = ops::batch_norm(x, w, b, running_mean, running_var, at, res);
  if (needs_grad({&x, &res, &w, &b})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad(), gb = b.defined() && b.requires_grad();
    const DType bias_dtype = b.defined() ? b.dtype() : DType::F32;
    // Saved: batch_norm's (input, weight, statistics) and the output, whose sign is the ReLU's mask.
    const SavedTensor X(x), W(w), Y(r.out);
    record(act == NormAct::ReLU ? "BatchNormAddReluBackward" : "BatchNormAddBackward", {x, res, w, b}, {r.out},
           [at, gx, gw, gb, bias_dtype, X, W, Y, M = SavedTensor(r.save_mean),
            I = SavedTensor(r.save_invstd)](const Grads& g) -> Grads {
             ops::NormGrads d = ops::batch_norm_backward(g[0], X.get(), W.get(), M.get(), I.get(), at, {gx, gw, gb},
                                                         Tensor(), Y.get());
             if (d.grad_bias.defined()) d.grad_bias = ops::to_dtype(d.grad_bias, bias_dtype);
             return {d.grad_input, d.grad_residual, d.grad_weight, d.grad_bias};
           });
  }
  return r.out;
}

namespace {

std::vector<double> host_doubles(const Tensor& t) {
  const Tensor h = ops::contiguous(ops::to_dtype(ops::to_device(t, kCPU), DType::F64));
  const double* p = h.data<double>();
  return std::vector<double>(p, p + h.numel());
}

Tensor device_vector(const std::vector<double>& v, DType dtype, Device device) {
  return ops::to_device(ops::to_dtype(Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}), dtype), device);
}

// Sums `v` over the replicas (F64 on `device`, one collective).
std::vector<double> replica_sum(const std::vector<double>& v, Device device,
                                const std::function<void(const Tensor&)>& all_reduce_sum) {
  Tensor t = device_vector(v, DType::F64, device);
  all_reduce_sum(t);
  return host_doubles(t);
}

// A per-channel vector as (1, C, 1, ...) for broadcasting against x.
Tensor per_channel(const std::vector<double>& v, const Tensor& x) {
  Shape s;
  for (int d = 0; d < x.dim(); ++d) s.push_back(d == 1 ? x.size(1) : 1);
  return ops::reshape(device_vector(v, x.dtype(), x.device()), s);
}

}  // namespace

Tensor sync_batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, double momentum, double eps,
                       const std::function<void(const Tensor&)>& all_reduce_sum) {
  AF_CHECK(all_reduce_sum != nullptr, "sync_batch_norm: no replica reduction given");
  Tensor x = x_in, w = weight, b = bias;
  autograd::autocast_inputs(OpId::batch_norm, {&x, &w, &b});
  AF_CHECK(x.dim() >= 2, "sync_batch_norm: expected input of shape (N, C) or (N, C, *), got {}", x.shape().str());
  const int64_t C = x.size(1);
  // The replica's statistics from the batch-norm kernel (shifted sums in double), combined over the replicas in
  // two sums (Chan et al.'s pairwise update): first count and count * mean give the global mean, then
  // count * (var + (mean - global mean)^2) the global variance. One pass of sum(x^2) - n mean^2 would cancel
  // when the mean is large against the spread (the replica's mean is stored in F32) and miss the one-process
  // statistics by far more than the F32 table allows.
  const ops::BatchNormResult local = ops::batch_norm(x, w, b, Tensor(), Tensor(), BatchNormAttrs{true, momentum, eps});
  const std::vector<double> lm = host_doubles(local.save_mean), li = host_doubles(local.save_invstd);
  const double n_local = static_cast<double>(C == 0 ? 0 : x.numel() / C);
  std::vector<double> first(static_cast<size_t>(C + 1));
  for (int64_t c = 0; c < C; ++c) first[c] = n_local * lm[c];
  first[C] = n_local;
  first = replica_sum(first, x.device(), all_reduce_sum);
  const double n = first[C];
  AF_CHECK(n > 1, "sync_batch_norm: expected more than 1 value per channel over all replicas, got {}", n);
  std::vector<double> mean(C), var(C), second(C);
  for (int64_t c = 0; c < C; ++c) {
    mean[c] = first[c] / n;
    const double local_var = std::max(0.0, 1.0 / (li[c] * li[c]) - eps);
    second[c] = n_local * (local_var + (lm[c] - mean[c]) * (lm[c] - mean[c]));
  }
  second = replica_sum(second, x.device(), all_reduce_sum);
  for (int64_t c = 0; c < C; ++c) var[c] = second[c] / n;
  if (running_mean.defined()) {  // PyTorch: the global mean and the unbiased global variance
    autograd::NoGradGuard ng;
    std::vector<double> rm = host_doubles(running_mean), rv = host_doubles(running_var);
    for (int64_t c = 0; c < C; ++c) {
      rm[c] = (1 - momentum) * rm[c] + momentum * mean[c];
      rv[c] = (1 - momentum) * rv[c] + momentum * var[c] * n / (n - 1);
    }
    ops::copy_(running_mean, device_vector(rm, running_mean.dtype(), running_mean.device()));
    ops::copy_(running_var, device_vector(rv, running_var.dtype(), running_var.device()));
  }
  // Normalise with the global statistics: the kernel's eval mode, which reads them as running statistics.
  const BatchNormAttrs global_at{false, momentum, eps};
  const DType stat = x.dtype() == DType::F64 ? DType::F64 : DType::F32;  // the kernels' statistics dtype
  ops::BatchNormResult r = ops::batch_norm(x, w, b, device_vector(mean, stat, x.device()),
                                           device_vector(var, stat, x.device()), global_at);
  if (needs_grad({&x, &w, &b})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad(), gb = b.defined() && b.requires_grad();
    const DType bias_dtype = b.defined() ? b.dtype() : DType::F32;
    const Tensor w_or_one = w.defined() ? w : ops::ones({C}, DType::F32, x.device());
    record("SyncBatchNormBackward", {x, w, b}, {r.out},
           [global_at, gx, gw, gb, bias_dtype, n, all_reduce_sum, X = SavedTensor(x), W = SavedTensor(w_or_one),
            M = SavedTensor(r.save_mean), I = SavedTensor(r.save_invstd)](const Grads& g) -> Grads {
             // The replica's sum(g) and sum(g * (x - mean)) * invstd, from the kernel (eval mode: no batch terms).
             ops::NormGrads d =
                 ops::batch_norm_backward(g[0], X.get(), W.get(), M.get(), I.get(), global_at, {false, true, true});
             Tensor grad_x;
             if (gx) {
               const std::vector<double> inv = host_doubles(I.get()), wv = host_doubles(W.get());
               const std::vector<double> sg = host_doubles(d.grad_bias), sgw = host_doubles(d.grad_weight);
               const int64_t C = static_cast<int64_t>(inv.size());
               std::vector<double> sums(static_cast<size_t>(2 * C));
               for (int64_t c = 0; c < C; ++c) {
                 sums[c] = sg[c];
                 sums[C + c] = sgw[c] / inv[c];  // sum(g * (x - mean))
               }
               sums = replica_sum(sums, X.get().device(), all_reduce_sum);
               // dx = k (g - mean(g) - (x - mean) invstd^2 mean(g (x - mean))), k = invstd w, means over all replicas.
               std::vector<double> alpha(C), beta(C), gamma(C);
               const std::vector<double> mv = host_doubles(M.get());
               for (int64_t c = 0; c < C; ++c) {
                 const double k = inv[c] * wv[c];
                 beta[c] = -k * inv[c] * inv[c] * sums[C + c] / n;
                 alpha[c] = k;
                 gamma[c] = -k * sums[c] / n;
               }
               const Tensor& xs = X.get();
               const Tensor centred = ops::sub(xs, per_channel(mv, xs));
               grad_x = ops::add(ops::add(ops::mul(g[0], per_channel(alpha, xs)), ops::mul(centred, per_channel(beta, xs))),
                                 per_channel(gamma, xs));
             }
             Tensor grad_b = gb ? ops::to_dtype(d.grad_bias, bias_dtype) : Tensor();
             return {grad_x, gw ? d.grad_weight : Tensor(), grad_b};
           });
  }
  return r.out;
}

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  Tensor x = x_in, w = weight, b = bias;
  autograd::autocast_inputs(OpId::layer_norm, {&x, &w, &b});
  ops::LayerNormResult r = ops::layer_norm(x, normalized_shape, w, b, eps);
  if (needs_grad({&x, &w, &b})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad(), gb = b.defined() && b.requires_grad();
    const int nd = normalized_shape.size();
    const DType bias_dtype = b.defined() ? b.dtype() : x.dtype();
    record("LayerNormBackward", {x, w, b}, {r.out},
           [gx, gw, gb, nd, bias_dtype, X = SavedTensor(x), W = SavedTensor(w), M = SavedTensor(r.mean),
            R = SavedTensor(r.rstd)](const Grads& g) -> Grads {
             ops::NormGrads d = ops::layer_norm_backward(g[0], X.get(), M.get(), R.get(), W.get(), nd, {gx, gw, gb});
             if (d.grad_bias.defined()) d.grad_bias = ops::to_dtype(d.grad_bias, bias_dtype);
             return {d.grad_input, d.grad_weight, d.grad_bias};
           });
  }
  return r.out;
}

}  // namespace ampforge
