// Scoped ownership of a tensor hook. Tensor registers hooks by id (core/tensor.h: register_hook,
// register_post_accumulate_grad_hook, remove_hook; PyTorch's semantics, implemented in autograd/hooks.cpp and the
// leaf's one AccumulateGrad node). A HookHandle removes its hook when destroyed, for code that attaches hooks for a
// while: data parallel starts a gradient bucket's all-reduce from the post-accumulate hook of its last parameter,
// as soon as the bucket's gradients are complete, while the rest of backward continues (train/data_parallel.h).
//
// A post-accumulate hook runs once per backward pass, after the leaf's whole gradient of that pass (the sum over
// every use) is in .grad; not for leaves the pass does not reach, and not for autograd::grad (which accumulates
// nothing). Hooks run on the thread running backward, in registration order; they must not start another backward.
#pragma once

#include <cstdint>
#include <memory>

#include "ampforge/core/tensor.h"

namespace ampforge::autograd {

class HookHandle {
 public:
  HookHandle(Tensor tensor, uint64_t id) : tensor_(std::move(tensor)), id_(id) {}
  ~HookHandle() { tensor_.remove_hook(id_); }
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;
  uint64_t id() const { return id_; }

 private:
  Tensor tensor_;
  uint64_t id_;
};

// `leaf` must be a leaf tensor that requires grad (InvalidArgument otherwise). The hook lives until the handle is
// destroyed.
std::unique_ptr<HookHandle> register_post_accumulate_grad_hook(const Tensor& leaf, Tensor::PostAccumulateHook hook);

}  // namespace ampforge::autograd
