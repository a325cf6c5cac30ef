// Parameter initialisers with PyTorch's default semantics. All draw from an ampforge Generator
// (default: the global one), so the same seed gives the same model on every machine.
#pragma once

#include "ampforge/core/generator.h"
#include "ampforge/core/tensor.h"

namespace ampforge::nn::init {

// While a SkipInitGuard lives, this thread's initialisers below leave tensors as they are (uninitialised
// memory from Tensor::empty) and draw nothing from any generator. For building a model only to inspect
// its structure (parameter counts, state-dict names), as Hugging Face's no_init_weights; the values of a
// model built under it are garbage. Guards nest.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;
  static bool active();

 private:
  bool prev_;
};

// fan_in, fan_out of a weight: (out, in) for linear, (out, in/groups, kh, kw) for conv.
std::pair<int64_t, int64_t> fans(const Tensor& w);
void uniform_(const Tensor& t, double low, double high, Generator* gen = nullptr);
void normal_(const Tensor& t, double mean, double std, Generator* gen = nullptr);
void zeros_(const Tensor& t);
void ones_(const Tensor& t);
// PyTorch's kaiming_uniform_(a, mode='fan_in', nonlinearity='leaky_relu'): bound = gain * sqrt(3 / fan_in),
// gain = sqrt(2 / (1 + a^2)). nn.Linear / nn.Conv2d use a = sqrt(5), i.e. bound = 1 / sqrt(fan_in).
void kaiming_uniform_(const Tensor& w, double a, Generator* gen = nullptr);
// PyTorch's kaiming_normal_(mode='fan_out', nonlinearity='relu') (torchvision ResNets' conv init).
void kaiming_normal_fan_out_(const Tensor& w, Generator* gen = nullptr);

}  // namespace ampforge::nn::init
