#include "ampforge/amp/grad_scaler.h"

#include <cmath>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/runtime.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge::amp {

namespace {
constexpr double kStateVersion = 1;
}

GradScaler::GradScaler(GradScalerOptions opt) : opt_(opt) {
  AF_CHECK(opt.init_scale > 0 && std::isfinite(opt.init_scale), "GradScaler: init_scale must be positive and finite");
  AF_CHECK(opt.growth_factor > 1.0, "GradScaler: growth_factor must be > 1, got {}", opt.growth_factor);
  AF_CHECK(opt.backoff_factor > 0 && opt.backoff_factor < 1.0, "GradScaler: backoff_factor must be in (0, 1), got {}",
           opt.backoff_factor);
  AF_CHECK(opt.growth_interval > 0, "GradScaler: growth_interval must be positive, got {}", opt.growth_interval);
}

void GradScaler::lazy_init(Device device) {
  if (scale_.defined()) return;
  scale_ = ops::full({}, opt_.init_scale, DType::F32, device);
  growth_tracker_ = ops::full({}, static_cast<double>(init_growth_tracker_), DType::I32, device);
  skipped_dev_ = ops::zeros({}, DType::F32, device);
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!opt_.enabled) return loss;
  check_defined(loss, "GradScaler::scale", "loss");
  lazy_init(loss.device());
  AF_CHECK(loss.device() == scale_.device(), "GradScaler::scale: loss is on {}, the scaler's state on {}",
           loss.device().str(), scale_.device().str());
  // Scale in F32 (the loss may be 16-bit; PyTorch multiplies by the F32 scale tensor too).
  return mul(loss.to(DType::F32), scale_);
}

void GradScaler::unscale_(optim::Optimizer& o) {
  if (!opt_.enabled) return;
  AF_CHECK(scale_.defined(), "GradScaler::unscale_: no scale yet; call scale(loss) earlier in the iteration");
  PerOptimizer& st = per_opt_[o.id()];
  AF_CHECK(st.stage != Stage::Unscaled, "GradScaler::unscale_() has already been called on this optimizer since the "
                                        "last update()");
  AF_CHECK(st.stage != Stage::Stepped, "GradScaler::unscale_() is being called after step()");
  autograd::NoGradGuard ng;
  // inv_scale in double then rounded, as PyTorch computes scale.double().reciprocal().float(). Without F64
  // arithmetic (the CUDA backend) the reciprocal is one correctly rounded F32 division, which is the
  // same value whenever the scale is a power of two (always, from the default init_scale, growth and
  // backoff factors).
  Tensor inv = runtime::has_capability(scale_.device(), runtime::Capability::F64Arithmetic)
                   ? ops::to_dtype(ops::div(ops::ones({}, DType::F64, scale_.device()), ops::to_dtype(scale_, DType::F64)),
                                   DType::F32)
                   : ops::div(ops::ones({}, DType::F32, scale_.device()), scale_);
  st.found_inf = ops::zeros({}, DType::F32, scale_.device());
  // F16 groups unscale into their F32 master gradients (optimizer.h), never in place in F16.
  o.unscale_grads_(inv, st.found_inf);
  st.stage = Stage::Unscaled;
}

Tensor GradScaler::found_inf(const optim::Optimizer& o) const {
  auto it = per_opt_.find(o.id());
  return it == per_opt_.end() ? Tensor() : it->second.found_inf;
}

bool GradScaler::step(optim::Optimizer& o) {
  if (!opt_.enabled) {
    o.step();
    return true;
  }
  AF_CHECK(scale_.defined(), "GradScaler::step: attempted step but the scale is not initialised; this may indicate "
                             "your loop did not use scaler.scale(loss) earlier in the iteration");
  PerOptimizer& st = per_opt_[o.id()];
  AF_CHECK(st.stage != Stage::Stepped, "GradScaler::step() has already been called since the last update()");
  if (st.stage == Stage::Ready) unscale_(o);
  if (o.device_hyperparams()) {
    // The fused kernel reads found_inf where it lives and skips itself; count the skip there too.
    autograd::NoGradGuard ng;
    o.step(st.found_inf);
    AF_ASSERT(skipped_dev_.defined() && skipped_dev_.device() == st.found_inf.device(), "GradScaler: no device counter");
    ops::add_(skipped_dev_, st.found_inf);
    st.stage = Stage::Stepped;
    return true;
  }
  // The one host read per step (host-mode optimizer). A meta device has no values: it assumes no Inf/NaN
  // gradient, the common case, so the optimizer step (and its memory) is part of a meta step.
  const bool overflow = !st.found_inf.device().is_meta() && st.found_inf.item() != 0.0;
  if (!overflow) o.step();
  else ++skipped_;
  st.stage = Stage::Stepped;
  return !overflow;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!opt_.enabled) return;
  AF_CHECK(scale_.defined(), "GradScaler::update: no scale yet; call scale(loss) first");
  autograd::NoGradGuard ng;
  if (new_scale) {
    AF_CHECK(*new_scale > 0 && std::isfinite(*new_scale), "GradScaler::update: new_scale must be positive and finite");
    ops::fill_(scale_, *new_scale);
  } else {
    std::vector<Tensor> founds;
    for (auto& [id, st] : per_opt_)
      if (st.found_inf.defined()) founds.push_back(st.found_inf);
    AF_CHECK(!founds.empty(), "GradScaler::update: no inf checks were recorded prior to update() (call step() or "
                              "unscale_() first)");
    Tensor combined = founds[0];
    for (size_t i = 1; i < founds.size(); ++i) combined = ops::add(combined, founds[i]);
    AmpUpdateAttrs at{opt_.growth_factor, opt_.backoff_factor, opt_.growth_interval};
    ops::amp_update_scale_(scale_, growth_tracker_, combined, at);
  }
  per_opt_.clear();
}

double GradScaler::get_scale() const {
  if (!opt_.enabled) return 1.0;
  return scale_.defined() ? scale_.item() : opt_.init_scale;
}

int64_t GradScaler::skipped_steps() const {
  return skipped_ + (skipped_dev_.defined() ? static_cast<int64_t>(skipped_dev_.item()) : 0);
}

int64_t GradScaler::growth_tracker() const {
  return growth_tracker_.defined() ? static_cast<int64_t>(growth_tracker_.item()) : init_growth_tracker_;
}

std::map<std::string, double> GradScaler::state_dict() const {
  if (!opt_.enabled) return {};
  return {{"scale", get_scale()},
          {"growth_factor", opt_.growth_factor},
          {"backoff_factor", opt_.backoff_factor},
          {"growth_interval", static_cast<double>(opt_.growth_interval)},
          {"_growth_tracker", static_cast<double>(growth_tracker())},
          {"version", kStateVersion}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  AF_CHECK(opt_.enabled, "GradScaler::load_state_dict: this scaler is disabled");
  AF_CHECK(!state.empty(), "GradScaler::load_state_dict: the source state dict is empty, possibly because it was "
                           "saved from a disabled GradScaler");
  // PyTorch's GradScaler.state_dict() keys; "version" is ours and optional (a PyTorch state has none).
  for (const char* k : {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})
    AF_CHECK(state.count(k), "GradScaler::load_state_dict: missing key '{}'", k);
  if (state.count("version"))
    AF_CHECK(state.at("version") == kStateVersion, "GradScaler::load_state_dict: state version {} is not supported "
             "(this build reads version {})", state.at("version"), kStateVersion);
  const double scale = state.at("scale"), growth = state.at("growth_factor"), backoff = state.at("backoff_factor");
  const double interval = state.at("growth_interval"), tracker = state.at("_growth_tracker");
  AF_CHECK(std::isfinite(scale) && scale > 0, "GradScaler::load_state_dict: scale must be a positive finite number, "
           "got {}", scale);
  AF_CHECK(std::isfinite(growth) && growth > 1, "GradScaler::load_state_dict: growth_factor must be > 1, got {}", growth);
  AF_CHECK(backoff > 0 && backoff < 1, "GradScaler::load_state_dict: backoff_factor must be in (0, 1), got {}", backoff);
  AF_CHECK(interval >= 1 && interval <= 9.0e15 && interval == std::floor(interval),
           "GradScaler::load_state_dict: growth_interval must be a positive integer, got {}", interval);
  AF_CHECK(tracker >= 0 && tracker < interval && tracker == std::floor(tracker),
           "GradScaler::load_state_dict: _growth_tracker must be an integer in [0, growth_interval), got {}", tracker);
  opt_.growth_factor = state.at("growth_factor");
  opt_.backoff_factor = state.at("backoff_factor");
  opt_.growth_interval = static_cast<int64_t>(state.at("growth_interval"));
  if (!scale_.defined()) {
    // Not on a device yet (as PyTorch's scaler before its lazy init): the values wait for the first scale(),
    // which creates the state on the loss's device (a resumed CUDA run must not get CPU state).
    opt_.init_scale = state.at("scale");
    init_growth_tracker_ = static_cast<int64_t>(state.at("_growth_tracker"));
    return;
  }
  ops::fill_(scale_, state.at("scale"));
  ops::fill_(growth_tracker_, state.at("_growth_tracker"));
}

}  // namespace ampforge::amp
