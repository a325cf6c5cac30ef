#include "ampforge/nn/layers.h"

#include <cmath>

#include "ampforge/nn/init.h"
#include "ampforge/ops/ops.h"

namespace ampforge::nn {

Linear::Linear(int64_t in, int64_t out, LinearOptions opt) : Module("Linear"), in_features(in), out_features(out) {
  AF_CHECK(in > 0 && out > 0, "Linear: in_features and out_features must be positive, got {} and {}", in, out);
  weight = register_parameter("weight", Tensor::empty({out, in}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (opt.bias) {
    bias = register_parameter("bias", Tensor::empty({out}));
    const double b = 1.0 / std::sqrt(static_cast<double>(in));
    init::uniform_(bias, -b, b);
  }
}
Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }
std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features, bias.defined());
}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t k, Conv2dOptions opt)
    : Module("Conv2d"), in_channels(in), out_channels(out), kernel_size(k), options(opt) {
  AF_CHECK(in > 0 && out > 0 && k > 0, "Conv2d: channels and kernel size must be positive");
  AF_CHECK(opt.groups > 0 && in % opt.groups == 0 && out % opt.groups == 0,
           "Conv2d: groups ({}) must divide in_channels ({}) and out_channels ({})", opt.groups, in, out);
  weight = register_parameter("weight", Tensor::empty({out, in / opt.groups, k, k}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (opt.bias) {
    bias = register_parameter("bias", Tensor::empty({out}));
    const double b = 1.0 / std::sqrt(static_cast<double>(init::fans(weight).first));
    init::uniform_(bias, -b, b);
  }
}
Tensor Conv2d::forward(const Tensor& x) {
  Conv2dAttrs a;
  a.stride[0] = a.stride[1] = options.stride;
  a.padding[0] = a.padding[1] = options.padding;
  a.dilation[0] = a.dilation[1] = options.dilation;
  a.groups = options.groups;
  return conv2d(x, weight, bias, a);
}
std::string Conv2d::extra_repr() const {
  return fmt::format("{}, {}, kernel_size={}, stride={}, padding={}{}", in_channels, out_channels, kernel_size,
                     options.stride, options.padding, bias.defined() ? "" : ", bias=False");
}

BatchNorm2d::BatchNorm2d(int64_t c, BatchNormOptions opt) : Module("BatchNorm2d"), num_features(c), options(opt) {
  AF_CHECK(c > 0, "BatchNorm2d: num_features must be positive, got {}", c);
  if (opt.affine) {
    weight = register_parameter("weight", ops::ones({c}));
    bias = register_parameter("bias", ops::zeros({c}));
  }
  if (opt.track_running_stats) {
    running_mean = register_buffer("running_mean", ops::zeros({c}));
    running_var = register_buffer("running_var", ops::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", ops::zeros({}, DType::I64));
  }
}
Tensor BatchNorm2d::forward(const Tensor& x) { return forward_act(x, NormAct::None); }
Tensor BatchNorm2d::forward_act(const Tensor& x, NormAct act) { return forward_add_act(x, Tensor(), act); }
Tensor BatchNorm2d::forward_add_act(const Tensor& x, const Tensor& residual, NormAct act) {
  const bool use_batch_stats = is_training() || !running_mean.defined();
  if (is_training() && num_batches_tracked.defined()) ops::add_(num_batches_tracked, ops::ones({}, DType::I64, num_batches_tracked.device()));
  if (sync && is_training()) {
    ReplicaSum* replicas = sync.get();
    Tensor y = sync_batch_norm(x, weight, bias, running_mean, running_var, options.momentum, options.eps,
                               [replicas](const Tensor& t) { replicas->all_reduce_sum(t); });
    return norm_act(residual.defined() ? add(y, residual) : y, act);
  }
  if (residual.defined())
    return batch_norm_add_act(x, residual, weight, bias, running_mean, running_var, use_batch_stats, options.momentum,
                              options.eps, act);
  return batch_norm_act(x, weight, bias, running_mean, running_var, use_batch_stats, options.momentum, options.eps, act);
}
std::string BatchNorm2d::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}", num_features, options.eps, options.momentum);
}

LayerNorm::LayerNorm(Shape ns, double e, bool affine) : Module("LayerNorm"), normalized_shape(ns), eps(e) {
  if (affine) {
    weight = register_parameter("weight", ops::ones(ns));
    bias = register_parameter("bias", ops::zeros(ns));
  }
}
Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

Embedding::Embedding(int64_t n, int64_t dim, int64_t pad) : Module("Embedding"), padding_idx(pad) {
  AF_CHECK(n > 0 && dim > 0, "Embedding: sizes must be positive, got {} x {}", n, dim);
  weight = register_parameter("weight", Tensor::empty({n, dim}));
  init::normal_(weight, 0.0, 1.0);
  if (pad >= 0) {
    AF_CHECK(pad < n, "Embedding: padding_idx {} is out of range for {} embeddings", pad, n);
    ops::fill_(ops::narrow(weight, 0, pad, 1), 0.0);
  }
}
Tensor Embedding::forward(const Tensor& idx) { return embedding(idx, weight, padding_idx); }

Dropout::Dropout(double prob) : Module("Dropout"), p(prob) {
  AF_CHECK(p >= 0 && p <= 1, "Dropout: p must be in [0, 1], got {}", p);
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training()); }

namespace {
Pool2dAttrs pool_attrs(int64_t k, int64_t s, int64_t p) {
  Pool2dAttrs a;
  a.kernel[0] = a.kernel[1] = k;
  a.stride[0] = a.stride[1] = s < 0 ? k : s;
  a.padding[0] = a.padding[1] = p;
  return a;
}
}  // namespace

MaxPool2d::MaxPool2d(int64_t k, int64_t s, int64_t p) : Module("MaxPool2d"), attrs(pool_attrs(k, s, p)) {}
Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, attrs); }
AvgPool2d::AvgPool2d(int64_t k, int64_t s, int64_t p) : Module("AvgPool2d"), attrs(pool_attrs(k, s, p)) {}
Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, attrs); }

Sequential::Sequential(std::initializer_list<ModulePtr> modules) : Module("Sequential") {
  for (auto& m : modules) push_back(m);
}
Sequential& Sequential::push_back(ModulePtr m) {
  register_module(std::to_string(children().size()), std::move(m));
  return *this;
}
Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& [n, m] : children()) y = m->forward(y);
  return y;
}

}  // namespace ampforge::nn
