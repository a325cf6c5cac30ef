// Tensor's gradient hooks (declared in core/tensor.h), as PyTorch's Tensor.register_hook,
// register_post_accumulate_grad_hook and retain_grad. Where each hook lives:
//   - a leaf: in its AutogradMeta; its one AccumulateGrad node (node.h) runs them before and after the
//     accumulation, so hooks registered before or after the graph was built both run;
//   - a non-leaf: on its grad_fn node, keyed by output number (the node is where its gradient appears).
#include "ampforge/autograd/hooks.h"

#include <atomic>

#include "ampforge/autograd/node.h"

namespace ampforge {
namespace {
std::atomic<uint64_t> g_next_hook{1};

void check_hookable(const Tensor& t, const char* what) {
  AF_CHECK(t.defined(), "{}: the tensor is undefined", what);
  AF_CHECK(t.requires_grad(), "{}: cannot register a hook on a tensor that doesn't require gradient", what);
}
}  // namespace

uint64_t Tensor::register_hook(GradHook hook) const {
  check_hookable(*this, "register_hook");
  AF_CHECK(hook != nullptr, "register_hook: the hook is empty");
  const uint64_t id = g_next_hook.fetch_add(1);
  if (is_leaf())
    impl_->autograd->hooks.emplace_back(id, std::move(hook));
  else
    grad_fn()->output_hooks.push_back({id, output_nr(), std::move(hook)});
  return id;
}

uint64_t Tensor::register_post_accumulate_grad_hook(PostAccumulateHook hook) const {
  check_hookable(*this, "register_post_accumulate_grad_hook");
  AF_CHECK(is_leaf(), "register_post_accumulate_grad_hook: post accumulate grad hooks cannot be registered on "
                      "non-leaf tensors (they never accumulate a gradient)");
  AF_CHECK(hook != nullptr, "register_post_accumulate_grad_hook: the hook is empty");
  const uint64_t id = g_next_hook.fetch_add(1);
  impl_->autograd->post_accumulate_hooks.emplace_back(id, std::move(hook));
  return id;
}

bool Tensor::remove_hook(uint64_t handle) const {
  if (!defined() || !impl_->autograd) return false;
  AutogradMeta& m = *impl_->autograd;
  auto erase = [&](auto& v, auto id_of) {
    for (auto it = v.begin(); it != v.end(); ++it)
      if (id_of(*it) == handle) {
        v.erase(it);
        return true;
      }
    return false;
  };
  auto pair_id = [](const auto& p) { return p.first; };
  if (erase(m.hooks, pair_id) || erase(m.post_accumulate_hooks, pair_id)) return true;
  return m.grad_fn && erase(m.grad_fn->output_hooks, [](const autograd::Node::OutputHook& h) { return h.id; });
}

void Tensor::retain_grad() const {
  AF_CHECK(defined(), "retain_grad: the tensor is undefined");
  AF_CHECK(requires_grad(), "retain_grad: can't retain_grad on a tensor that has requires_grad=False");
  if (is_leaf() || impl_->autograd->retains_grad) return;  // a leaf keeps its .grad anyway
  impl_->autograd->retains_grad = true;
  grad_fn()->retained.push_back({output_nr(), impl_});
}

bool Tensor::retains_grad() const { return defined() && impl_->autograd && impl_->autograd->retains_grad; }

}  // namespace ampforge

namespace ampforge::autograd {

std::unique_ptr<HookHandle> register_post_accumulate_grad_hook(const Tensor& leaf, Tensor::PostAccumulateHook hook) {
  const uint64_t id = leaf.register_post_accumulate_grad_hook(std::move(hook));
  return std::make_unique<HookHandle>(leaf, id);
}

}  // namespace ampforge::autograd
