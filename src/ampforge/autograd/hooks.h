// Post-accumulate-grad hooks (PyTorch's Tensor.register_post_accumulate_grad_hook): a function the backward
// engine calls right after the last gradient of the current backward pass has been added into a leaf's
// .grad, while the rest of backward continues. Data parallel uses it to start a gradient bucket's all-reduce
// as soon as the bucket's gradients are complete (train/data_parallel.h).
//
// "Last" counts the leaf's gradient sinks (AccumulateGrad nodes) that the backward pass reaches, so a leaf
// used by several ops gets its hook once, after all of them. A leaf the pass does not reach gets no call.
// grad() (gradients returned, not accumulated) calls no hook. Hooks run on the thread running backward, in
// registration order; they must not start another backward.
#pragma once

#include <functional>
#include <memory>

#include "ampforge/core/tensor.h"

namespace ampforge::autograd {

using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

// Removes its hook when destroyed.
class HookHandle {
 public:
  HookHandle(const TensorImpl* leaf, uint64_t id) : leaf_(leaf), id_(id) {}
  ~HookHandle();
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;

 private:
  const TensorImpl* leaf_;
  uint64_t id_;
};

// `leaf` must be a leaf tensor that requires grad. The hook lives until the handle is destroyed.
std::unique_ptr<HookHandle> register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);

// For the engine: whether any hook is registered (one atomic load), and running a leaf's hooks.
bool has_post_accumulate_grad_hooks();
bool has_post_accumulate_grad_hooks(const TensorImpl* leaf);
void run_post_accumulate_grad_hooks(const Tensor& leaf);

}  // namespace ampforge::autograd
