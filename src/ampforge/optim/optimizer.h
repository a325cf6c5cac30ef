// Optimizers over flat buffers. The constructor moves every parameter of a group into one contiguous
// allocation (Tensor::set_data: the module's handles now view the flat buffer), gives each parameter a
// gradient that is a view into one flat gradient buffer, and keeps optimizer state flat too. A step is
// then one fused kernel per group, zero_grad a mark per gradient (its zeros are written by the next backward's
// first copy into it), and the gradient norm one reduction.
//
// Semantics differences from PyTorch, on purpose: gradients are never None — zero_grad() zeroes them in
// place — so a parameter that received no gradient in a step is still updated with a zero gradient
// (AdamW decays it and moves it by its momentum), where PyTorch would skip it.
//
// Master weights (Apex "O2"): when a group's parameters are F16/BF16, the optimizer keeps an F32 master
// copy, updates it, and writes the rounded result back into the 16-bit parameters (optionally with
// stochastic rounding for BF16: see RoundingOptions). F16 groups also get F32 master gradients: the
// backward pass accumulates scaled gradients in the F16 buffer (the loss scale keeps them above F16's
// underflow), and unscale_grads_() (GradScaler) divides them into the F32 buffer, which the step then
// reads. Unscaling in place in F16 would flush every gradient below 2^-24 to zero; PyTorch avoids that by
// refusing to unscale F16 gradients at all.
//
// Parameters that move after the optimizer was built (Module::to(dtype/device) rebinds their storage)
// are followed: before zero_grad(), a step or an unscale, a group whose parameters no longer view its flat
// buffer is rebuilt on their new dtype and device, keeping the optimizer's state (moments, step count, and
// on a device move the F32 master; a dtype change starts the master from the converted parameters, as an
// optimizer built after the conversion would). Values written into
// the parameters in place from outside (Module::load_state_dict) are noticed by the storage version and
// copied into the F32 master, so the next step starts from them. So `model.to(...)` before or after
// building the optimizer gives the same training; parameters of one group that end up on different
// dtypes or devices are an error naming them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/core/attrs.h"
#include "ampforge/core/tensor.h"

namespace ampforge::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  double lr = 1e-3;
  double weight_decay = 0;
  double warmup_start_lr = 0;  // where the scheduler's warm-up starts this group's lr (lr_scheduler.h)
  // Flat storage (filled by the optimizer).
  Tensor flat_params;  // parameter dtype: the module's parameters are views into it
  Tensor flat_grads;   // parameter dtype: each parameter's .grad is a view into it
  Tensor master;       // F32 copy when the parameters are 16-bit, else undefined
  Tensor master_grads;  // F32 unscaled gradients when the parameters are F16 (unscale_grads_ fills them); sharded: this rank's part
  bool master_grads_current = false;  // the step reads master_grads (set by unscale_grads_, reset by a step)
  uint64_t synced_version = 0;        // flat_params' storage version when master last matched it
  int64_t step = 0;    // completed (not skipped) steps of this group (host mode; see device hyperparameters)
  // Device hyperparameters {completed steps, lr} (F64, 2) on the parameters' device, when the optimizer
  // runs in that mode; `step` is then stale and steps()/state_dict() read this tensor.
  Tensor hyper;
  double hyper_lr = -1;  // the lr last written into `hyper` (-1: none yet)
  // ZeRO-1 (Optimizer::shard): this process steps elements [shard_begin, shard_begin + shard_size) of the
  // flat buffers; its state and master copy hold those elements only, and shard_grads (shard_size elements,
  // the parameters' dtype) is the gradient it steps with. shard_size 0: not sharded.
  int64_t shard_begin = 0, shard_size = 0;
  Tensor shard_grads;
};

// How the optimizer writes 16-bit model copies in master-weight mode. Stochastic rounding (BF16 only)
// makes each BF16 weight an unbiased estimate of its F32 master: small updates that round-to-nearest
// would hide for many steps show up in the model copy in expectation. The noise comes from
// Philox(seed mixed with the group index, counter = completed steps x ceil(numel / 4) + element / 4), so
// it depends only on the seed, the group and the step: identical for any thread count and on resume.
struct RoundingOptions {
  bool stochastic = false;
  uint64_t seed = 0;
};

// A group spec: parameters and per-group overrides (negative: use the optimizer default).
struct ParamGroupSpec {
  std::vector<Tensor> params;
  double lr = -1;
  double weight_decay = -1;
  double warmup_start_lr = 0;  // the scheduler's warm-up ramps the lr from here (0: from zero)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates parameters. found_inf: optional one-element F32 tensor on the parameters' device; non-zero
  // skips the whole step on the device (GradScaler). Returns nothing: skipping is the kernel's decision.
  virtual void step(const Tensor& found_inf = Tensor()) = 0;
  // Zeroes every gradient, lazily: each parameter's .grad is marked zero (Tensor::mark_grad_zero) and written
  // by the next backward's copy, or with zeros by write_zero_grads() / its first read.
  void zero_grad();
  // Writes the zeros of the gradients zero_grad() marked that backward did not reach, so the flat gradient
  // buffers hold every value. Every method of this class that reads those buffers does this first; code that
  // reads flat_grads directly (data parallel's reductions) calls it.
  void write_zero_grads();

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // The gradients the next step reads, one flat buffer per group: after unscale_grads_(), an F16 group's
  // F32 master gradients, else the flat gradient buffer (gradient clipping works on these).
  std::vector<Tensor> grad_buffers();
  // Divides the gradients by the loss scale (inv_scale: one F32 value) and sets found_inf (one F32 value)
  // on Inf/NaN, one fused pass per group; F16 groups write into their F32 master gradients.
  void unscale_grads_(const Tensor& inv_scale, const Tensor& found_inf);
  // Steps taken (by group 0); used by schedulers and checkpoints. With device hyperparameters this reads
  // the count from the device (a synchronisation).
  int64_t steps() const;

  // Device hyperparameters (core/attrs.h): the step count and learning rate of each group live in a small
  // tensor on the parameters' device, which the fused kernel reads and advances itself. A step then never
  // reads found_inf on the host (no synchronisation: the GradScaler's skip stays on the device), and a
  // step captured in a CUDA graph uses the current lr and step number at every replay. On by default
  // for parameters on a CUDA device, off on the CPU (where reading found_inf costs nothing); the result is
  // the same either way.
  void set_device_hyperparams(bool on);
  bool device_hyperparams() const { return device_hyper_; }
  // Writes each group's lr into its device hyperparameters when it changed. step() does this itself except
  // while a CUDA graph is being captured (a value written then would be frozen into the graph): code that
  // replays a captured step calls it before each replay, after changing the lr.
  void sync_hyperparams();

  // ZeRO stage 1 (optimizer state sharded over the ranks of data parallel, train/data_parallel.h): keeps
  // the state of shard `rank` of `world` equal parts of each group's flat buffer and steps those elements
  // only. The flat buffers are padded to a multiple of world x 16 elements (the parameters and their
  // gradients are re-pointed into the new buffers, values kept); moments and F32 masters shrink to the
  // shard. The caller fills each group's shard_grads before unscaling and stepping (a reduce-scatter of
  // flat_grads), and gathers flat_params from every rank's shard after the step (an all-gather):
  // grad_buffers() returns the shard gradients, so GradScaler unscales exactly what is stepped. Call
  // before any step or state load. Stochastic rounding is refused (its noise is keyed by element index).
  void shard(int rank, int world);
  bool sharded() const { return !groups_.empty() && groups_[0].shard_size > 0; }
  // Elements of group i's flat buffers without a sharded layout's padding.
  int64_t unpadded_size(size_t group) const;

  // A temporary overwrite of the parameters that ends with their exact values written back (a weight average
  // swapped in for an evaluation, train/ema.h) is no outside write: the F32 master weights still match them.
  // Without telling the optimizer, its next step would restart the masters from the 16-bit parameters and drop
  // the bits rounding to 16 bits had cut off. masters_in_sync() before the overwrite; after the write-back,
  // keep_masters_after_restore(that) marks the groups whose master matched then as matching now.
  std::vector<char> masters_in_sync() const;
  void keep_masters_after_restore(const std::vector<char>& in_sync_before);

  // Optimizer state (flat buffers and step counts), for checkpoints. Names: "group<i>.<buffer>". Sharded,
  // the per-element buffers are this rank's shard (train/data_parallel.h gathers them for a checkpoint,
  // without the padding); loading takes this rank's part of an unpadded buffer, so a checkpoint moves
  // between sharded and plain runs.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state);
  virtual const char* name() const = 0;
  // Momentum for optimizers that have one (SGD); -1 otherwise. set_momentum changes it from the next step
  // (the scheduler's momentum warm-up); optimizers without momentum refuse.
  virtual double momentum() const { return -1; }
  virtual void set_momentum(double m);
  // Identity of this optimizer for the GradScaler's per-optimizer bookkeeping.
  uint64_t id() const { return id_; }

 protected:
  Optimizer(const std::vector<ParamGroupSpec>& groups, double default_lr, double default_wd);
  // Throws unless stochastic rounding, when asked for, has BF16 parameters (with F32 masters) to act on.
  void check_rounding(const RoundingOptions& r) const;
  // The kernel attrs' rounding for group i's next step.
  ModelCopyRounding model_copy_rounding(size_t group, const RoundingOptions& r) const;
  // Registers a flat state buffer (zero-initialised, F32) for every group under `name`.
  void add_state(const std::string& name);
  Tensor& state(size_t group, const std::string& name);

  // What the fused kernel steps for group i: the flat parameters, or this shard of them.
  Tensor step_params(size_t group) const;
  // The device hyperparameters to pass to the fused kernel for group i (undefined in host mode); brings
  // them up to date first unless a CUDA graph is being captured.
  Tensor step_hyper(size_t group);
  // Called at the start of step(): follows moved or overwritten parameters (ensure_bound).
  void prepare_step() { ensure_bound(); }
  // The gradient buffer group i's step reads; marks master gradients consumed.
  Tensor take_step_grads(size_t group);
  // Records that the step wrote group i's parameters (its own version bump is not an outside write).
  void note_stepped(size_t group);

  std::vector<ParamGroup> groups_;
  std::vector<std::map<std::string, Tensor>> state_;

 private:
  // Writes pending zeros first (write_zero_grads) unless `write_zeros` is false: zero_grad marks them all again.
  void ensure_bound(bool write_zeros = true);
  void rebind_group(size_t group);
  uint64_t id_;
  bool device_hyper_ = false;
};

// Global L2 norm of all gradients; scales them by max_norm / (norm + 1e-6) when the norm exceeds
// max_norm (torch.nn.utils.clip_grad_norm_). Returns the norm before clipping. One reduction per group.
double clip_grad_norm_(Optimizer& opt, double max_norm);
// The same clipping with the norm kept on the device: gradients are multiplied by
// min(1, max_norm / (norm + 1e-6)) computed there (multiplying by exactly 1 changes nothing), and the norm
// is returned as a one-element F32 tensor. No host synchronisation (the CUDA training step uses it).
Tensor clip_grad_norm_on_device_(Optimizer& opt, double max_norm);

}  // namespace ampforge::optim
