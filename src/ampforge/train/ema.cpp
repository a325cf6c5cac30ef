#include "ampforge/train/ema.h"

#include <cmath>
#include <map>
#include <string>

#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"

namespace ampforge::train {

nn::NamedTensors ModelEma::float_entries(const nn::Module& model) {
  nn::NamedTensors out;
  for (auto& [name, t] : model.state_dict())
    if (dtype_is_float(t.dtype())) out.emplace_back(name, t);
  return out;
}

ModelEma::ModelEma(const nn::Module& model, EmaOptions options) : o_(options) {
  AF_CHECK(o_.decay >= 0 && o_.decay < 1, "EMA decay must be in [0, 1), got {}", o_.decay);
  AF_CHECK(o_.tau >= 0, "EMA tau must be >= 0, got {}", o_.tau);
  autograd::NoGradGuard ng;
  for (auto& [name, t] : float_entries(model)) state_.emplace_back(name, ops::to_dtype(t.detach(), DType::F32).contiguous().detach());
  // to_dtype returns the tensor itself for F32 entries: own a copy.
  for (auto& [name, t] : state_) t = ops::clone(t).detach();
}

double ModelEma::decay_at(int64_t n) const {
  return o_.tau > 0 ? o_.decay * (1.0 - std::exp(-static_cast<double>(n) / o_.tau)) : o_.decay;
}

void ModelEma::update(const nn::Module& model) {
  autograd::NoGradGuard ng;
  const double d = decay_at(++updates_);
  const nn::NamedTensors cur = float_entries(model);
  AF_ASSERT(cur.size() == state_.size(), "ModelEma: the model has {} floating-point entries, the average {}", cur.size(),
            state_.size());
  for (size_t i = 0; i < cur.size(); ++i) {
    const Tensor& e = state_[i].second;
    ops::mul_scalar_(e, d);
    ops::add_(e, ops::mul_scalar(ops::to_dtype(cur[i].second.detach(), DType::F32), 1.0 - d));
  }
}

void ModelEma::load(const nn::NamedTensors& state, int64_t updates) {
  AF_CHECK(updates >= 0, "EMA: negative update count {}", updates);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : state) by_name[name] = &t;
  autograd::NoGradGuard ng;
  for (auto& [name, mine] : state_) {
    auto it = by_name.find(name);
    AF_CHECK(it != by_name.end(), "EMA state has no '{}'", name);
    AF_CHECK(it->second->shape() == mine.shape(), "EMA state '{}': shape {} where the model has {}", name,
             it->second->shape().str(), mine.shape().str());
    ops::copy_(mine, ops::to_device(*it->second, mine.device()));
  }
  updates_ = updates;
}

nn::NamedTensors ModelEma::full_state_dict(const nn::Module& model) const {
  autograd::NoGradGuard ng;
  nn::NamedTensors out;
  size_t i = 0;
  for (auto& [name, t] : model.state_dict()) {
    if (dtype_is_float(t.dtype())) {
      AF_ASSERT(i < state_.size() && state_[i].first == name, "ModelEma::full_state_dict: another model at '{}'", name);
      out.emplace_back(name, ops::to_dtype(state_[i++].second, t.dtype()));
    } else {
      out.emplace_back(name, t.detach());
    }
  }
  return out;
}

ModelEma::Applied::~Applied() {
  autograd::NoGradGuard ng;
  for (size_t i = 0; i < targets_.size(); ++i) ops::copy_(targets_[i], saved_[i]);
}

ModelEma::Applied ModelEma::apply_to(const nn::Module& model) const {
  autograd::NoGradGuard ng;
  const nn::NamedTensors cur = float_entries(model);
  AF_ASSERT(cur.size() == state_.size(), "ModelEma::apply_to: another model ({} entries, {} averaged)", cur.size(),
            state_.size());
  std::vector<Tensor> targets, saved;
  for (size_t i = 0; i < cur.size(); ++i) {
    const Tensor t = cur[i].second.detach();
    saved.push_back(ops::clone(t).detach());
    ops::copy_(t, state_[i].second);
    targets.push_back(t);
  }
  return Applied(std::move(targets), std::move(saved));
}

}  // namespace ampforge::train
