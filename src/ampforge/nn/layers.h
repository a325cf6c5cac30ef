// Layers with PyTorch's constructor arguments, defaults, parameter names and initialisation.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "ampforge/nn/module.h"

namespace ampforge::nn {

struct LinearOptions {
  bool bias = true;
};
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions opt = {});
  Tensor forward(const Tensor& x) override;  // (..., in) -> (..., out)
  Tensor weight, bias;                         // (out, in), (out) or undefined
  int64_t in_features, out_features;

 protected:
  std::string extra_repr() const override;
};

struct Conv2dOptions {
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
  bool bias = true;
};
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dOptions opt = {});
  Tensor forward(const Tensor& x) override;  // (N, C_in, H, W) -> (N, C_out, H', W')
  Tensor weight, bias;                         // (C_out, C_in/groups, k, k), (C_out)
  int64_t in_channels, out_channels, kernel_size;
  Conv2dOptions options;

 protected:
  std::string extra_repr() const override;
};

// Sums a tensor over the replicas of a data-parallel job, in place (every replica ends with the sum). What a
// BatchNorm2d needs for SyncBatchNorm; train/data_parallel.h provides one over a dist::Communicator.
class ReplicaSum {
 public:
  virtual ~ReplicaSum() = default;
  // t: contiguous, on the replicas' device; every replica calls with the same shape and dtype, in the same order.
  virtual void all_reduce_sum(const Tensor& t) = 0;
};

struct BatchNormOptions {
  double eps = 1e-5, momentum = 0.1;
  bool affine = true, track_running_stats = true;
};
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions opt = {});
  Tensor forward(const Tensor& x) override;  // (N, C, H, W) or (N, C)
  // act(forward(x)) in one fused op where the device allows (autograd batch_norm_act): what conv blocks call
  // for "BN then ReLU/SiLU". Same state-dict, same values, less memory and time.
  virtual Tensor forward_act(const Tensor& x, NormAct act);
  // act(forward(x) + residual), act None or ReLU (autograd batch_norm_add_act): a residual block's end
  // (ResNet's bn3, shortcut add and ReLU) in one fused op where the device allows.
  virtual Tensor forward_add_act(const Tensor& x, const Tensor& residual, NormAct act);
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  // Set: SyncBatchNorm. In training, the statistics are those of the global batch (every replica's), as
  // torch.nn.SyncBatchNorm (autograd sync_batch_norm); eval and the state dict are unchanged.
  std::shared_ptr<ReplicaSum> sync;
  int64_t num_features;
  BatchNormOptions options;

 protected:
  std::string extra_repr() const override;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  Shape normalized_shape;
  double eps;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx = -1);
  Tensor forward(const Tensor& indices) override;  // (...) I64 -> (..., dim)
  Tensor weight;                                     // (num_embeddings, dim), init N(0, 1)
  int64_t padding_idx;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return relu(x); }
};
class GELU : public Module {
 public:
  explicit GELU(GeluApprox approximate = GeluApprox::None) : Module("GELU"), approximate(approximate) {}
  Tensor forward(const Tensor& x) override { return gelu(x, approximate); }
  GeluApprox approximate;
};
class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override { return silu(x); }
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = -1, int64_t padding = 0);  // stride -1: = kernel
  Tensor forward(const Tensor& x) override;
  Pool2dAttrs attrs;
};
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = -1, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  Pool2dAttrs attrs;
};
class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(int64_t out_h, int64_t out_w) : Module("AdaptiveAvgPool2d"), out_h(out_h), out_w(out_w) {}
  Tensor forward(const Tensor& x) override { return adaptive_avg_pool2d(x, out_h, out_w); }
  int64_t out_h, out_w;
};
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : Module("Flatten"), start(start_dim), end(end_dim) {}
  Tensor forward(const Tensor& x) override { return flatten(x, start, end); }
  int64_t start, end;
};

// Runs its children in order; children are named "0", "1", ... as in PyTorch.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<ModulePtr> modules);
  Sequential& push_back(ModulePtr m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return children().size(); }
};

}  // namespace ampforge::nn
