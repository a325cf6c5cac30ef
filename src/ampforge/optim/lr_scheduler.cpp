#include "ampforge/optim/lr_scheduler.h"

#include <cmath>

#include "ampforge/util/error.h"

namespace ampforge::optim {

Schedule schedule_from_string(const std::string& s) {
  if (s == "constant" || s == "none") return Schedule::Constant;
  if (s == "step") return Schedule::Step;
  if (s == "cosine") return Schedule::Cosine;
  if (s == "linear") return Schedule::Linear;
  AF_THROW(InvalidArgument, "unknown lr schedule '{}': expected constant, step, cosine or linear", s);
}


LRScheduler::LRScheduler(Optimizer& opt, ScheduleOptions o) : opt_(opt), o_(o) {
  AF_CHECK(o.kind != Schedule::Step || o.step_size > 0, "step schedule needs step_size > 0");
  AF_CHECK(o.kind != Schedule::Cosine || o.total_steps > 0, "cosine schedule needs total_steps > 0");
  AF_CHECK(o.kind != Schedule::Linear || o.total_steps > o.warmup_steps,
           "linear schedule needs total_steps ({}) > warm-up steps ({})", o.total_steps, o.warmup_steps);
  AF_CHECK(o.warmup_steps >= 0, "warm-up steps must be >= 0");
  AF_CHECK(o.final_factor >= 0 && o.final_factor <= 1, "final lr factor must be in [0, 1], got {}", o.final_factor);
  for (auto& g : opt.param_groups()) {
    base_.push_back(g.lr);
    start_.push_back(g.warmup_start_lr);
  }
  if (o.warmup_momentum >= 0) {
    momentum_ = opt.momentum();
    AF_CHECK(momentum_ >= 0, "momentum warm-up needs an optimizer with momentum (SGD); {} has none", opt.name());
  }
}

double LRScheduler::factor(int64_t step) const { return decay(step) * warmup_ramp(step); }

double LRScheduler::decay(int64_t step) const {
  double f = 1.0;
  switch (o_.kind) {
    case Schedule::Constant: break;
    case Schedule::Step: f = std::pow(o_.gamma, static_cast<double>(step / o_.step_size)); break;
    case Schedule::Cosine: {
      const double t = std::min<double>(static_cast<double>(step), static_cast<double>(o_.total_steps));
      f = o_.final_factor + (1.0 - o_.final_factor) * 0.5 * (1.0 + std::cos(M_PI * t / static_cast<double>(o_.total_steps)));
      break;
    }
    case Schedule::Linear: {
      // Hugging Face's get_linear_schedule_with_warmup: 1 at the end of warm-up, 0 at total_steps.
      const double left = static_cast<double>(o_.total_steps - std::max(step, o_.warmup_steps));
      f = o_.final_factor + (1.0 - o_.final_factor) *
                                std::max(0.0, left / static_cast<double>(o_.total_steps - o_.warmup_steps));
      break;
    }
  }
  return f;
}

double LRScheduler::warmup_ramp(int64_t step) const {
  return o_.warmup_steps > 0 && step < o_.warmup_steps
             ? static_cast<double>(step + 1) / static_cast<double>(o_.warmup_steps)
             : 1.0;
}

void LRScheduler::apply(int64_t step) {
  auto& groups = opt_.param_groups();
  const double f = decay(step), ramp = warmup_ramp(step);
  for (size_t i = 0; i < groups.size(); ++i) {
    const double scheduled = o_.kind == Schedule::Cosine ? o_.min_lr + (base_[i] - o_.min_lr) * f : base_[i] * f;
    groups[i].lr = start_[i] + (scheduled - start_[i]) * ramp;
  }
  if (momentum_ >= 0) opt_.set_momentum(o_.warmup_momentum + (momentum_ - o_.warmup_momentum) * ramp);
}

}  // namespace ampforge::optim
