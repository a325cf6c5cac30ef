#include "ampforge/optim/adamw.h"

#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge::optim {

namespace {
void validate(const AdamWOptions& o) {
  AF_CHECK(o.lr >= 0, "AdamW: lr must be >= 0, got {}", o.lr);
  AF_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW: betas must be in [0, 1), got ({}, {})",
           o.beta1, o.beta2);
  AF_CHECK(o.eps >= 0, "AdamW: eps must be >= 0, got {}", o.eps);
  AF_CHECK(o.weight_decay >= 0, "AdamW: weight_decay must be >= 0, got {}", o.weight_decay);
}
void validate(const SGDOptions& o) {
  AF_CHECK(o.lr >= 0, "SGD: lr must be >= 0, got {}", o.lr);
  AF_CHECK(o.momentum >= 0, "SGD: momentum must be >= 0, got {}", o.momentum);
  AF_CHECK(o.weight_decay >= 0, "SGD: weight_decay must be >= 0, got {}", o.weight_decay);
  AF_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD: Nesterov momentum requires momentum > 0 and "
           "dampening = 0");
}
}  // namespace

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions opt) : AdamW(std::vector<ParamGroupSpec>{{params}}, opt) {}

AdamW::AdamW(const std::vector<ParamGroupSpec>& groups, AdamWOptions opt)
    : Optimizer(groups, opt.lr, opt.weight_decay), options(opt) {
  validate(opt);
  check_rounding(opt.rounding);
  add_state("exp_avg");
  add_state("exp_avg_sq");
}

void AdamW::step(const Tensor& found_inf) {
  autograd::NoGradGuard ng;
  prepare_step();
  check_rounding(options.rounding);
  // Host mode: the step counter advances only when the step is not skipped, so found_inf is read here
  // (free on the CPU). Device hyperparameters: the kernel keeps the count on the device, no read.
  const bool skipped = !device_hyperparams() && found_inf.defined() && !found_inf.device().is_meta() &&
                       found_inf.item() != 0.0;  // meta: no values, the step is assumed to run
  for (size_t i = 0; i < groups_.size(); ++i) {
    ParamGroup& g = groups_[i];
    AdamWAttrs at{g.lr, options.beta1, options.beta2, options.eps, g.weight_decay, g.step + 1,
                  model_copy_rounding(i, options.rounding)};
    const Tensor hyper = step_hyper(i);
    const Tensor grads = take_step_grads(i);
    if (g.master.defined()) {
      ops::adamw_step_(g.master, grads, state(i, "exp_avg"), state(i, "exp_avg_sq"), at, found_inf, step_params(i),
                       hyper);
    } else {
      ops::adamw_step_(step_params(i), grads, state(i, "exp_avg"), state(i, "exp_avg_sq"), at, found_inf, Tensor(),
                       hyper);
    }
    note_stepped(i);
    if (!skipped && !hyper.defined()) ++g.step;
  }
}

SGD::SGD(const std::vector<Tensor>& params, SGDOptions opt) : SGD(std::vector<ParamGroupSpec>{{params}}, opt) {}

SGD::SGD(const std::vector<ParamGroupSpec>& groups, SGDOptions opt)
    : Optimizer(groups, opt.lr, opt.weight_decay), options(opt) {
  validate(opt);
  check_rounding(opt.rounding);
  if (opt.momentum > 0) add_state("momentum_buffer");
}

void SGD::set_momentum(double m) {
  AF_CHECK(options.momentum > 0, "SGD::set_momentum: this SGD was built without momentum (no momentum buffer)");
  AF_CHECK(m > 0 && m < 1, "SGD momentum must be in (0, 1), got {}", m);
  options.momentum = m;
}

void SGD::step(const Tensor& found_inf) {
  autograd::NoGradGuard ng;
  prepare_step();
  check_rounding(options.rounding);
  const bool skipped = !device_hyperparams() && found_inf.defined() && !found_inf.device().is_meta() &&
                       found_inf.item() != 0.0;  // meta: no values, the step is assumed to run
  for (size_t i = 0; i < groups_.size(); ++i) {
    ParamGroup& g = groups_[i];
    SgdAttrs at{g.lr,           options.momentum, options.dampening, g.weight_decay, options.nesterov, g.step == 0,
                model_copy_rounding(i, options.rounding)};
    Tensor buf = options.momentum > 0 ? state(i, "momentum_buffer") : Tensor();
    const Tensor hyper = step_hyper(i);
    const Tensor grads = take_step_grads(i);
    if (g.master.defined())
      ops::sgd_step_(g.master, grads, buf, at, found_inf, step_params(i), hyper);
    else
      ops::sgd_step_(step_params(i), grads, buf, at, found_inf, Tensor(), hyper);
    note_stepped(i);
    if (!skipped && !hyper.defined()) ++g.step;
  }
}

}  // namespace ampforge::optim
