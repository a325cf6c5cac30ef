// AdamW (Loshchilov & Hutter) with PyTorch's semantics and defaults: lr 1e-3, betas (0.9, 0.999),
// eps 1e-8, weight_decay 1e-2 (decoupled: p *= 1 - lr * wd before the Adam update), bias-corrected.
// One fused kernel per parameter group per step.
#pragma once

#include "ampforge/optim/optimizer.h"

namespace ampforge::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  RoundingOptions rounding = {};  // BF16 master-weight mode: stochastic rounding of the model copy
};

class AdamW final : public Optimizer {
 public:
  AdamW(const std::vector<Tensor>& params, AdamWOptions opt = {});
  AdamW(const std::vector<ParamGroupSpec>& groups, AdamWOptions opt = {});
  void step(const Tensor& found_inf = Tensor()) override;
  const char* name() const override { return "adamw"; }
  AdamWOptions options;
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  RoundingOptions rounding = {};  // BF16 master-weight mode: stochastic rounding of the model copy
};

// SGD with momentum / Nesterov / weight decay, as torch.optim.SGD.
class SGD final : public Optimizer {
 public:
  SGD(const std::vector<Tensor>& params, SGDOptions opt = {});
  SGD(const std::vector<ParamGroupSpec>& groups, SGDOptions opt = {});
  void step(const Tensor& found_inf = Tensor()) override;
  const char* name() const override { return "sgd"; }
  double momentum() const override { return options.momentum; }
  void set_momentum(double m) override;
  SGDOptions options;
};

}  // namespace ampforge::optim
