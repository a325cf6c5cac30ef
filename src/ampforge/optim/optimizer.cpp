#include "ampforge/optim/optimizer.h"

#include <atomic>
#include <cmath>
#include <set>

#include "ampforge/autograd/node.h"
#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/ops/ops.h"

namespace ampforge::optim {
namespace {
std::atomic<uint64_t> g_next_id{1};
constexpr int64_t kAlign = 16;  // elements: each parameter starts on a 64-byte boundary in F32

int64_t aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A view of `flat` at `off` with the shape and memory format of `like`.
Tensor view_into(const Tensor& flat, int64_t off, const Tensor& like) {
  const MemoryFormat f = like.suggest_memory_format();
  Strides st = f == MemoryFormat::ChannelsLast ? channels_last_strides(like.shape()) : contiguous_strides(like.shape());
  return flat.as_strided_raw(like.shape(), st, flat.offset() + off);
}

// Allocates g's flat parameter and gradient buffers (total elements, dtype dt on dev), copies each
// parameter's current data into its slot and makes the parameter and its .grad views of the buffers.
// keep_grads: a parameter's existing .grad (in any dtype or device) is copied into its slot.
void bind_flat(ParamGroup& g, DType dt, Device dev, int64_t total, bool keep_grads) {
  g.flat_params = ops::zeros({total}, dt, dev);
  g.flat_grads = ops::zeros({total}, dt, dev);
  int64_t off = 0;
  for (const Tensor& p : g.params) {
    Tensor v = view_into(g.flat_params, off, p);
    ops::copy_(v, p.detach());
    Tensor gv = view_into(g.flat_grads, off, p);
    const Tensor old = p.grad();
    if (keep_grads && old.defined() && old.shape() == p.shape())
      ops::copy_(gv, ops::to_device(ops::to_dtype(old, dt), dev));
    p.set_data(v);
    p.set_grad(gv);
    off += aligned(p.numel());
  }
}

// Whether every parameter of g is still the view of g.flat_params the optimizer made.
bool still_bound(const ParamGroup& g) {
  int64_t off = g.flat_params.offset();
  for (const Tensor& p : g.params) {
    if (p.storage() != g.flat_params.storage() || p.offset() != off || p.dtype() != g.flat_params.dtype()) return false;
    off += aligned(p.numel());
  }
  return true;
}
}  // namespace

Optimizer::Optimizer(const std::vector<ParamGroupSpec>& specs, double default_lr, double default_wd)
    : id_(g_next_id.fetch_add(1)) {
  AF_CHECK(!specs.empty(), "optimizer: got no parameter groups");
  std::set<const TensorImpl*> seen;
  autograd::NoGradGuard ng;
  for (size_t gi = 0; gi < specs.size(); ++gi) {
    const auto& spec = specs[gi];
    AF_CHECK(!spec.params.empty(), "optimizer: parameter group {} is empty", gi);
    ParamGroup g;
    g.lr = spec.lr >= 0 ? spec.lr : default_lr;
    g.weight_decay = spec.weight_decay >= 0 ? spec.weight_decay : default_wd;
    AF_CHECK(g.lr >= 0, "optimizer: learning rate must be >= 0, got {}", g.lr);
    const DType dt = spec.params[0].dtype();
    const Device dev = spec.params[0].device();
    int64_t total = 0;
    for (const Tensor& p : spec.params) {
      AF_CHECK(p.defined() && p.requires_grad() && p.is_leaf(),
               "optimizer: every parameter must be a leaf tensor with requires_grad (group {})", gi);
      AF_CHECK(seen.insert(p.impl()).second, "optimizer: a parameter appears in more than one group");
      AF_CHECK(p.dtype() == dt && p.device() == dev,
               "optimizer: all parameters of a group must share dtype and device; found {} on {} and {} on {}",
               dtype_name(dt), dev.str(), dtype_name(p.dtype()), p.device().str());
      AF_CHECK(dtype_is_float(dt), "optimizer: parameters must be floating point, got {}", dtype_name(dt));
      total += aligned(p.numel());
    }
    g.params = spec.params;
    bind_flat(g, dt, dev, total, /*keep_grads=*/false);
    if (dt != DType::F32) g.master = ops::to_dtype(g.flat_params, DType::F32);
    if (dt == DType::F16) g.master_grads = ops::zeros({total}, DType::F32, dev);
    g.synced_version = g.flat_params.storage()->version();
    groups_.push_back(std::move(g));
    state_.emplace_back();
  }
  set_device_hyperparams(groups_[0].flat_params.device().is_cuda());
}

void Optimizer::set_device_hyperparams(bool on) {
  autograd::NoGradGuard ng;
  if (on == device_hyper_) return;
  for (ParamGroup& g : groups_) {
    if (on) {
      g.hyper = ops::to_device(Tensor::from_vector<double>({static_cast<double>(g.step), g.lr}),
                               g.flat_params.device());
      g.hyper_lr = g.lr;
    } else {
      g.step = static_cast<int64_t>(ops::to_device(g.hyper, kCPU).data<double>()[0]);
      g.hyper = Tensor();
      g.hyper_lr = -1;
    }
  }
  device_hyper_ = on;
}

void Optimizer::sync_hyperparams() {
  if (!device_hyper_) return;
  autograd::NoGradGuard ng;
  for (ParamGroup& g : groups_) {
    if (g.lr == g.hyper_lr) continue;
    ops::fill_(ops::narrow(g.hyper, 0, 1, 1), g.lr);
    g.hyper_lr = g.lr;
  }
}

Tensor Optimizer::step_hyper(size_t group) {
  if (!device_hyper_) return Tensor();
  if (!cuda::is_capturing()) sync_hyperparams();
  return groups_[group].hyper;
}

int64_t Optimizer::steps() const {
  if (groups_.empty()) return 0;
  if (!device_hyper_) return groups_[0].step;
  return static_cast<int64_t>(ops::to_device(groups_[0].hyper, kCPU).data<double>()[0]);
}

void Optimizer::add_state(const std::string& name) {
  for (size_t i = 0; i < groups_.size(); ++i)
    state_[i][name] = ops::zeros({groups_[i].flat_params.numel()}, DType::F32, groups_[i].flat_params.device());
}

void Optimizer::check_rounding(const RoundingOptions& r) const {
  if (!r.stochastic) return;
  for (size_t i = 0; i < groups_.size(); ++i)
    AF_CHECK(groups_[i].master.defined() && groups_[i].flat_params.dtype() == DType::BF16,
             "optimizer: stochastic rounding applies to BF16 parameters with F32 master weights; group {} has {} "
             "parameters (use --precision bf16 --master-weights)",
             i, dtype_name(groups_[i].flat_params.dtype()));
}

ModelCopyRounding Optimizer::model_copy_rounding(size_t group, const RoundingOptions& r) const {
  if (!r.stochastic) return {};
  const ParamGroup& g = groups_[group];
  const auto blocks = static_cast<uint64_t>((g.flat_params.numel() + 3) / 4);
  // Golden-ratio mixing keeps the groups' key streams apart for the same user seed. With device
  // hyperparameters the kernel derives the offset from the count on the device (blocks_per_step).
  return {true, r.seed ^ (0x9E3779B97F4A7C15ull * (group + 1)), static_cast<uint64_t>(g.step) * blocks, blocks};
}

Tensor& Optimizer::state(size_t group, const std::string& name) { return state_[group].at(name); }

void Optimizer::zero_grad() {
  ensure_bound();
  for (auto& g : groups_) {
    ops::fill_(g.flat_grads, 0.0);
    g.master_grads_current = false;
    // Re-attach in case user code replaced a .grad (e.g. set it to a fresh tensor).
    int64_t off = 0;
    for (auto& p : g.params) {
      Tensor cur = p.grad();
      if (!cur.defined() || cur.storage() != g.flat_grads.storage()) p.set_grad(view_into(g.flat_grads, off, p));
      off += aligned(p.numel());
    }
  }
}

std::vector<Tensor> Optimizer::grad_buffers() {
  ensure_bound();
  std::vector<Tensor> out;
  for (auto& g : groups_) out.push_back(g.master_grads_current ? g.master_grads : g.flat_grads);
  return out;
}

void Optimizer::unscale_grads_(const Tensor& inv_scale, const Tensor& found_inf) {
  ensure_bound();
  autograd::NoGradGuard ng;
  for (auto& g : groups_) {
    if (g.master_grads.defined()) {
      // F16 -> F32 is exact; the division then happens in F32, where a gradient of 1e-8 survives.
      ops::copy_(g.master_grads, g.flat_grads);
      ops::amp_unscale_(g.master_grads, inv_scale, found_inf);
      g.master_grads_current = true;
    } else {
      ops::amp_unscale_(g.flat_grads, inv_scale, found_inf);
    }
  }
}

Tensor Optimizer::take_step_grads(size_t group) {
  ParamGroup& g = groups_[group];
  const bool master = g.master_grads_current;
  g.master_grads_current = false;
  return master ? g.master_grads : g.flat_grads;
}

void Optimizer::note_stepped(size_t group) {
  groups_[group].synced_version = groups_[group].flat_params.storage()->version();
}

void Optimizer::ensure_bound() {
  autograd::NoGradGuard ng;
  for (size_t i = 0; i < groups_.size(); ++i) {
    ParamGroup& g = groups_[i];
    if (!still_bound(g)) {
      rebind_group(i);
    } else if (g.master.defined() && g.flat_params.storage()->version() != g.synced_version) {
      // Written in place from outside (a state-dict load, a broadcast): the step must start from these.
      ops::copy_(g.master, g.flat_params);
      g.synced_version = g.flat_params.storage()->version();
    }
  }
}

void Optimizer::rebind_group(size_t gi) {
  ParamGroup& g = groups_[gi];
  const DType dt = g.params[0].dtype();
  const Device dev = g.params[0].device();
  int64_t total = 0;
  for (const Tensor& p : g.params) {
    AF_CHECK(p.dtype() == dt && p.device() == dev,
             "optimizer: the parameters of group {} were moved after the optimizer was built and no longer share one "
             "dtype and device ({} on {} and {} on {}); move the whole model with Module::to(), or build the "
             "optimizer after moving it", gi, dtype_name(dt), dev.str(), dtype_name(p.dtype()), p.device().str());
    AF_CHECK(dtype_is_float(dt), "optimizer: parameters must be floating point, got {}", dtype_name(dt));
    total += aligned(p.numel());
  }
  AF_CHECK(total == g.flat_params.numel(), "optimizer: the parameters of group {} changed size after the optimizer was "
           "built ({} elements, now {}); build a new optimizer for a changed model", gi, g.flat_params.numel(), total);
  // A device move keeps the F32 master (the precise weights). A dtype change, or a write into the parameters
  // after the last step, starts from the parameters as they are now, as an optimizer built at this point
  // would: so Module::to(dtype) before or after building the optimizer trains identically.
  const Tensor keep_master = g.master.defined() && g.flat_params.dtype() == dt &&
                                     g.flat_params.storage()->version() == g.synced_version
                                 ? g.master
                                 : Tensor();
  bind_flat(g, dt, dev, total, /*keep_grads=*/true);
  if (dt == DType::F32) g.master = Tensor();
  else g.master = keep_master.defined() ? ops::to_device(keep_master, dev) : ops::to_dtype(g.flat_params, DType::F32);
  g.master_grads = dt == DType::F16 ? ops::zeros({total}, DType::F32, dev) : Tensor();
  g.master_grads_current = false;
  for (auto& [name, t] : state_[gi]) t = ops::to_device(t, dev);
  if (g.hyper.defined()) g.hyper = ops::to_device(g.hyper, dev);
  g.synced_version = g.flat_params.storage()->version();
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const std::string p = "group" + std::to_string(i) + ".";
    for (auto& [n, t] : state_[i]) out.emplace_back(p + n, t);
    if (groups_[i].master.defined()) out.emplace_back(p + "master", groups_[i].master);
    const int64_t step = device_hyper_ ? static_cast<int64_t>(ops::to_device(groups_[i].hyper, kCPU).data<double>()[0])
                                       : groups_[i].step;
    out.emplace_back(p + "step", Tensor::from_vector<int64_t>({step}, Shape{}));
    out.emplace_back(p + "lr", Tensor::from_vector<double>({groups_[i].lr}, Shape{}));
  }
  return out;
}

void Optimizer::load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state) {
  std::map<std::string, Tensor> m(state.begin(), state.end());
  auto need = [&](const std::string& k) -> const Tensor& {
    auto it = m.find(k);
    AF_CHECK(it != m.end(), "optimizer state: missing entry '{}' (saved by a different optimizer?)", k);
    return it->second;
  };
  ensure_bound();
  autograd::NoGradGuard ng;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const std::string p = "group" + std::to_string(i) + ".";
    for (auto& [n, t] : state_[i]) {
      const Tensor& s = need(p + n);
      AF_CHECK(s.numel() == t.numel(), "optimizer state '{}{}': {} elements, expected {} (different model?)", p, n,
               s.numel(), t.numel());
      ops::copy_(t, ops::to_device(s.reshape(t.shape()), t.device()));
    }
    if (groups_[i].master.defined()) {
      ops::copy_(groups_[i].master, ops::to_device(need(p + "master"), groups_[i].master.device()));
      // The saved master is the precise copy of the saved (rounded) parameters: it stays in charge.
      groups_[i].synced_version = groups_[i].flat_params.storage()->version();
    }
    groups_[i].step = static_cast<int64_t>(need(p + "step").item());
    groups_[i].lr = need(p + "lr").item();
    if (device_hyper_) {
      ops::copy_(groups_[i].hyper, ops::to_device(Tensor::from_vector<double>({static_cast<double>(groups_[i].step),
                                                                               groups_[i].lr}),
                                                  groups_[i].hyper.device()));
      groups_[i].hyper_lr = groups_[i].lr;
    }
  }
}

double clip_grad_norm_(Optimizer& opt, double max_norm) {
  AF_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got {}", max_norm);
  autograd::NoGradGuard ng;
  double sq = 0;
  for (auto& g : opt.grad_buffers()) {
    Tensor f = ops::to_dtype(g, DType::F32);
    sq += ops::sum(ops::mul(f, f)).item();
  }
  const double norm = std::sqrt(sq);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (auto& g : opt.grad_buffers()) ops::mul_scalar_(g, coef);
  return norm;
}

Tensor clip_grad_norm_on_device_(Optimizer& opt, double max_norm) {
  AF_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got {}", max_norm);
  autograd::NoGradGuard ng;
  Tensor sq;
  for (auto& g : opt.grad_buffers()) {
    Tensor f = ops::to_dtype(g, DType::F32);
    Tensor part = ops::sum(ops::mul(f, f));
    sq = sq.defined() ? ops::add(sq, part) : part;
  }
  const Tensor norm = ops::unary(OpId::sqrt, sq);
  const Tensor coef = ops::clamp(ops::div(ops::full({}, max_norm, DType::F32, norm.device()), ops::add_scalar(norm, 1e-6)),
                                 std::nullopt, 1.0);
  for (auto& g : opt.grad_buffers()) ops::mul_(g, ops::to_dtype(coef, g.dtype()));
  return norm;
}

}  // namespace ampforge::optim
