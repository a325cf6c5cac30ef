#include "ampforge/optim/optimizer.h"

#include <atomic>
#include <cmath>
#include <algorithm>
#include <set>

#include "ampforge/autograd/node.h"
#include "ampforge/core/runtime.h"
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
    g.warmup_start_lr = spec.warmup_start_lr;
    AF_CHECK(g.warmup_start_lr >= 0, "optimizer: warm-up start lr must be >= 0, got {}", g.warmup_start_lr);
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

void Optimizer::shard(int rank, int world) {
  AF_CHECK(world >= 1 && rank >= 0 && rank < world, "optimizer: shard {} of {} does not exist", rank, world);
  AF_CHECK(!sharded(), "optimizer: already sharded");
  autograd::NoGradGuard ng;
  write_zero_grads();  // the gradients are copied into the new buffers below, and re-pointed (which clears a mark)
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    ParamGroup& g = groups_[gi];
    AF_CHECK(g.step == 0, "optimizer: shard() must come before the first step");
    const int64_t n = g.flat_params.numel(), unit = kAlign * world;
    const int64_t padded = (n + unit - 1) / unit * unit;
    // Re-lay the flat buffers with the padding at the end: every parameter keeps its offset.
    Tensor params = ops::zeros({padded}, g.flat_params.dtype(), g.flat_params.device());
    Tensor grads = ops::zeros({padded}, g.flat_grads.dtype(), g.flat_grads.device());
    ops::copy_(ops::narrow(params, 0, 0, n), g.flat_params);
    ops::copy_(ops::narrow(grads, 0, 0, n), g.flat_grads);
    int64_t off = 0;
    for (const Tensor& p : g.params) {
      p.set_data(view_into(params, off, p));
      p.set_grad(view_into(grads, off, p));
      off += aligned(p.numel());
    }
    g.flat_params = params;
    g.flat_grads = grads;
    g.shard_size = padded / world;
    g.shard_begin = g.shard_size * rank;
    g.shard_grads = ops::zeros({g.shard_size}, grads.dtype(), grads.device());
    // F16 parameters: the F32 gradients the step reads (unscale_grads_) cover this rank's part only.
    if (g.master_grads.defined()) g.master_grads = ops::zeros({g.shard_size}, DType::F32, grads.device());
    g.master_grads_current = false;
    if (g.master.defined())
      g.master = ops::to_dtype(ops::narrow(params, 0, g.shard_begin, g.shard_size), DType::F32).contiguous();
    for (auto& [name, t] : state_[gi]) t = ops::zeros({g.shard_size}, DType::F32, t.device());
    // The parameters now live in the new buffer: it is the one in sync with the master (ensure_bound).
    g.synced_version = g.flat_params.storage()->version();
  }
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
  if (!runtime::device_runtime(groups_[group].hyper.device()).is_capturing()) sync_hyperparams();
  return groups_[group].hyper;
}

int64_t Optimizer::steps() const {
  if (groups_.empty()) return 0;
  if (!device_hyper_) return groups_[0].step;
  return static_cast<int64_t>(ops::to_device(groups_[0].hyper, kCPU).data<double>()[0]);
}

void Optimizer::add_state(const std::string& name) {
  for (size_t i = 0; i < groups_.size(); ++i) {
    const ParamGroup& g = groups_[i];
    state_[i][name] = ops::zeros({g.shard_size > 0 ? g.shard_size : g.flat_params.numel()}, DType::F32,
                                 g.flat_params.device());
  }
}

int64_t Optimizer::unpadded_size(size_t group) const {
  int64_t n = 0;
  for (const Tensor& p : groups_[group].params) n += aligned(p.numel());
  return n;
}

Tensor Optimizer::step_params(size_t group) const {
  const ParamGroup& g = groups_[group];
  return g.shard_size > 0 ? ops::narrow(g.flat_params, 0, g.shard_begin, g.shard_size) : g.flat_params;
}

void Optimizer::check_rounding(const RoundingOptions& r) const {
  if (!r.stochastic) return;
  AF_CHECK(!sharded(), "optimizer: stochastic rounding cannot be combined with sharded state (--zero 1): its noise "
                       "is keyed by the element's index in the whole buffer");
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
  ensure_bound(/*write_zeros=*/false);
  for (auto& g : groups_) {
    g.master_grads_current = false;
    int64_t off = 0;
    for (auto& p : g.params) {
      // Re-attach in case user code replaced a .grad (e.g. set it to a fresh tensor).
      Tensor cur = p.grad_as_is();
      if (!cur.defined() || cur.storage() != g.flat_grads.storage()) p.set_grad(view_into(g.flat_grads, off, p));
      // Zeros written lazily (Tensor::mark_grad_zero): backward copies each gradient in instead of adding it to a
      // filled buffer, and whatever reads the buffer first writes the zeros of the parameters backward missed
      // (ensure_bound, DataParallel). The padding between parameters is never written: zero since construction.
      p.mark_grad_zero();
      off += aligned(p.numel());
    }
  }
}

void Optimizer::write_zero_grads() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.grad();  // writes a marked gradient's zeros
}

std::vector<Tensor> Optimizer::grad_buffers() {
  ensure_bound();
  std::vector<Tensor> out;
  for (auto& g : groups_)
    out.push_back(g.master_grads_current ? g.master_grads : g.shard_size > 0 ? g.shard_grads : g.flat_grads);
  return out;
}

void Optimizer::unscale_grads_(const Tensor& inv_scale, const Tensor& found_inf) {
  ensure_bound();
  autograd::NoGradGuard ng;
  for (auto& g : groups_) {
    // ZeRO-1: the step reads this rank's reduce-scattered part only.
    const Tensor& grads = g.shard_size > 0 ? g.shard_grads : g.flat_grads;
    if (g.master_grads.defined()) {
      // F16 -> F32 is exact; the division then happens in F32, where a gradient of 1e-8 survives.
      ops::copy_(g.master_grads, grads);
      ops::amp_unscale_(g.master_grads, inv_scale, found_inf);
      g.master_grads_current = true;
    } else {
      ops::amp_unscale_(grads, inv_scale, found_inf);
    }
  }
}

Tensor Optimizer::take_step_grads(size_t group) {
  ParamGroup& g = groups_[group];
  const bool master = g.master_grads_current;
  g.master_grads_current = false;
  if (master) return g.master_grads;
  return g.shard_size > 0 ? g.shard_grads : g.flat_grads;  // ZeRO-1: this rank's reduce-scattered part
}

void Optimizer::note_stepped(size_t group) {
  groups_[group].synced_version = groups_[group].flat_params.storage()->version();
}

std::vector<char> Optimizer::masters_in_sync() const {
  std::vector<char> in_sync;
  for (const ParamGroup& g : groups_)
    in_sync.push_back(g.master.defined() && still_bound(g) && g.flat_params.storage()->version() == g.synced_version);
  return in_sync;
}

void Optimizer::keep_masters_after_restore(const std::vector<char>& in_sync_before) {
  AF_CHECK(in_sync_before.size() == groups_.size(), "keep_masters_after_restore: {} flags for {} groups",
           in_sync_before.size(), groups_.size());
  for (size_t i = 0; i < groups_.size(); ++i)
    if (in_sync_before[i] != 0 && still_bound(groups_[i]))
      groups_[i].synced_version = groups_[i].flat_params.storage()->version();
}

void Optimizer::ensure_bound(bool write_zeros) {
  autograd::NoGradGuard ng;
  if (write_zeros) write_zero_grads();  // the caller reads the flat gradient buffers
  for (size_t i = 0; i < groups_.size(); ++i) {
    ParamGroup& g = groups_[i];
    if (!still_bound(g)) {
      AF_CHECK(g.shard_size == 0, "optimizer: the parameters of a sharded (ZeRO-1) optimizer were moved or replaced "
                                  "after it was built; move the model before building the optimizer");
      rebind_group(i);
    } else if (g.master.defined() && g.flat_params.storage()->version() != g.synced_version) {
      // Written in place from outside (a state-dict load, a broadcast): the step must start from these. A sharded
      // master holds this rank's part.
      ops::copy_(g.master, step_params(i));
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
    const ParamGroup& g = groups_[i];
    // Saved buffers hold the group's elements without a sharded layout's padding (data parallel gathers
    // sharded state that way): a sharded optimizer takes its part, zero past the end.
    const int64_t plain = unpadded_size(i);
    auto load_into = [&](Tensor& t, const Tensor& saved, const std::string& name) {
      AF_CHECK(saved.numel() == plain, "optimizer state '{}{}': {} elements, expected {} (different model?)", p, name,
               saved.numel(), plain);
      const int64_t begin = g.shard_size > 0 ? g.shard_begin : 0;
      const int64_t n = std::min(t.numel(), std::max<int64_t>(0, plain - begin));
      if (n < t.numel()) ops::fill_(t, 0.0);
      if (n > 0)
        ops::copy_(ops::narrow(t.reshape({t.numel()}), 0, 0, n),
                   ops::to_device(ops::narrow(saved.reshape({saved.numel()}), 0, begin, n), t.device()));
    };
    for (auto& [n, t] : state_[i]) load_into(t, need(p + n), n);
    if (groups_[i].master.defined()) load_into(groups_[i].master, need(p + "master"), "master");
    if (groups_[i].master.defined())  // the saved master is the precise copy of the saved (rounded) parameters
      groups_[i].synced_version = groups_[i].flat_params.storage()->version();
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

void Optimizer::set_momentum(double) {
  AF_THROW(InvalidArgument, "{} has no momentum to set (momentum warm-up is for SGD)", name());
}

double clip_grad_norm_(Optimizer& opt, double max_norm) {
  AF_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got {}", max_norm);
  autograd::NoGradGuard ng;
  double sq = 0;
  for (auto& g : opt.grad_buffers()) {
    Tensor f = ops::to_dtype(g, DType::F32);
    Tensor part = ops::sum(ops::mul(f, f));
    // The meta device has no values: the norm is unknown (NaN) and assumed to exceed max_norm, so the gradients
    // are scaled as when clipping is active (in place: no memory either way).
    sq += part.device().is_meta() ? std::nan("") : part.item();
  }
  const double norm = std::sqrt(sq);
  if (std::isnan(norm) && !opt.grad_buffers().empty() && opt.grad_buffers().front().device().is_meta()) {
    for (auto& g : opt.grad_buffers()) ops::mul_scalar_(g, 1.0);
    return norm;
  }
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
