#include "ampforge/nn/init.h"

#include <cmath>

#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge::nn::init {

std::pair<int64_t, int64_t> fans(const Tensor& w) {
  AF_CHECK(w.dim() >= 2, "init: fan in/out need a weight with at least 2 dims, got shape {}", w.shape().str());
  int64_t receptive = 1;
  for (int d = 2; d < w.dim(); ++d) receptive *= w.size(d);
  return {w.size(1) * receptive, w.size(0) * receptive};
}

namespace {
thread_local bool t_skip_init = false;
}  // namespace

SkipInitGuard::SkipInitGuard() : prev_(t_skip_init) { t_skip_init = true; }
SkipInitGuard::~SkipInitGuard() { t_skip_init = prev_; }
bool SkipInitGuard::active() { return t_skip_init; }

// Initialisers write in place into parameters: no graph, and the version bump is expected.
void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  if (t_skip_init) return;
  autograd::NoGradGuard ng;
  if (t.is_contiguous()) {
    ops::uniform_(t, low, high, gen);
  } else {
    ops::copy_(t, ops::rand(t.shape(), t.dtype(), t.device(), gen, low, high));
  }
}

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  if (t_skip_init) return;
  autograd::NoGradGuard ng;
  if (t.is_contiguous()) {
    ops::normal_(t, mean, std, gen);
  } else {
    ops::copy_(t, ops::randn(t.shape(), t.dtype(), t.device(), gen, mean, std));
  }
}

void zeros_(const Tensor& t) {
  if (!t_skip_init) ops::fill_(t, 0.0);
}
void ones_(const Tensor& t) {
  if (!t_skip_init) ops::fill_(t, 1.0);
}

void kaiming_uniform_(const Tensor& w, double a, Generator* gen) {
  const double fan_in = static_cast<double>(fans(w).first);
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double bound = gain * std::sqrt(3.0 / std::max(fan_in, 1.0));
  uniform_(w, -bound, bound, gen);
}

void kaiming_normal_fan_out_(const Tensor& w, Generator* gen) {
  const double fan_out = static_cast<double>(fans(w).second);
  normal_(w, 0.0, std::sqrt(2.0) / std::sqrt(std::max(fan_out, 1.0)), gen);
}

}  // namespace ampforge::nn::init
