#include "ampforge/autograd/node.h"

#include <atomic>
#include <mutex>

#include "ampforge/ops/ops.h"

namespace ampforge::autograd {
namespace {
std::atomic<uint64_t> g_sequence{0};
thread_local bool t_grad_enabled = true;
thread_local bool t_recompute = false;
}  // namespace

Node::Node() : sequence_nr(g_sequence.fetch_add(1, std::memory_order_relaxed)) {}

AccumulateGrad::AccumulateGrad(Tensor leaf_) : leaf(std::move(leaf_)) {}

Grads AccumulateGrad::apply(Grads&& grads) {
  Tensor g = grads[0];
  if (!g.defined()) return {};
  bool zero = false;
  Tensor cur = leaf.grad_as_is(&zero);
  if (cur.defined() && zero) {
    ops::copy_(cur, g);  // over zeros not yet written (Optimizer::zero_grad): the sum is the gradient itself
    leaf.set_grad(cur);
  } else if (cur.defined()) {
    ops::add_(cur, g);
  } else {
    // A fresh gradient tensor the leaf owns, laid out like the leaf.
    Tensor mine = empty_like(leaf);
    ops::copy_(mine, g);
    leaf.set_grad(mine);
  }
  const AutogradMeta* meta = leaf.impl()->autograd.get();
  if (meta != nullptr && !meta->post_accumulate_hooks.empty()) {
    // A copy: a hook may register or remove hooks.
    const auto hooks = meta->post_accumulate_hooks;
    for (const auto& [id, fn] : hooks) fn(leaf);
  }
  return {};
}

namespace {
// Runs one tensor hook on `g`; a defined result replaces it.
void apply_hook(const Tensor::GradHook& fn, Tensor& g) {
  Tensor r = fn(g);
  if (!r.defined()) return;
  AF_CHECK(r.shape() == g.shape(), "autograd: a tensor hook returned a gradient of shape {} for a tensor of shape {}; "
           "a hook must return a gradient of the same shape (or nothing)", r.shape().str(), g.shape().str());
  g = r;
}
}  // namespace

void Node::run_pre_hooks(Grads& grads, bool retain) {
  for (const OutputHook& h : output_hooks)
    if (h.output_nr < grads.size() && grads[h.output_nr].defined()) apply_hook(h.fn, grads[h.output_nr]);
  if (!retain) return;
  for (const Retained& r : retained) {
    if (r.output_nr >= grads.size() || !grads[r.output_nr].defined()) continue;
    std::shared_ptr<TensorImpl> impl = r.tensor.lock();
    if (!impl) continue;
    Tensor t(impl);
    // As PyTorch: the first gradient is kept as a copy, later backward passes add to it out of place, so a
    // retained .grad never aliases a buffer the engine keeps using.
    const Tensor& g = grads[r.output_nr];
    Tensor cur = t.grad();
    t.set_grad(cur.defined() ? ops::add(cur, g) : ops::clone(g));
  }
}

void AccumulateGrad::run_pre_hooks(Grads& grads, bool) {
  const AutogradMeta* meta = leaf.impl()->autograd.get();
  if (meta == nullptr || meta->hooks.empty() || grads.empty() || !grads[0].defined()) return;
  const auto hooks = meta->hooks;  // a copy: a hook may register or remove hooks
  for (const auto& [id, fn] : hooks) apply_hook(fn, grads[0]);
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AF_ASSERT(leaf.defined() && leaf.requires_grad() && leaf.is_leaf(), "grad_accumulator: not a leaf requiring grad");
  // Graphs may be built on several threads at once (data loaders, data-parallel replicas): one lock makes
  // "find or create" atomic, so two threads never make two accumulators for one parameter.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  AutogradMeta& meta = *leaf.impl()->autograd;
  if (std::shared_ptr<Node> acc = meta.grad_accumulator.lock()) return acc;
  auto acc = std::make_shared<AccumulateGrad>(leaf);
  meta.grad_accumulator = acc;
  return acc;
}

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  was_defined_ = true;
  if (is_recomputable(t)) {
    source_ = std::static_pointer_cast<FunctionNode>(t.grad_fn());
    source_output_ = t.output_nr();
    return;
  }
  t_ = t.detach();
  version_ = t.storage()->version();
}

Tensor SavedTensor::get() const {
  if (source_ != nullptr) return source_->recompute(source_output_);
  if (!t_.defined()) {
    AF_CHECK(!was_defined_, "autograd: trying to backward through the graph a second time (or directly access saved "
                            "tensors after they have already been freed); pass retain_graph=true to backward() the "
                            "first time if you need to");
    return t_;
  }
  AF_CHECK(t_.storage()->version() == version_,
           "autograd: a tensor needed for gradient computation was modified by an in-place operation after it was "
           "saved (version {} at save, now {}); make a copy (clone()) before modifying it",
           version_, t_.storage()->version());
  return t_;
}

Tensor FunctionNode::recompute(uint32_t output_nr) const {
  AF_CHECK(recompute_ != nullptr, "autograd: trying to rebuild an output of {} after its backward ran (a second "
           "backward?); pass retain_graph=true to backward() the first time if you need to", name_);
  if (keep_ && output_nr == 0) {
    if (!cached_.defined()) cached_ = recompute_(0);
    return cached_;
  }
  return recompute_(output_nr);
}

Grads FunctionNode::apply(Grads&& grads) {
  AF_CHECK(fn_ != nullptr, "autograd: trying to backward through the graph a second time ({} was already freed); "
                           "pass retain_graph=true to backward() the first time if you need to", name_);
  return fn_(grads);
}

bool recompute_enabled() { return t_recompute; }
RecomputeGuard::RecomputeGuard(bool on) : prev_(t_recompute) { t_recompute = on; }
RecomputeGuard::~RecomputeGuard() { t_recompute = prev_; }

bool is_recomputable(const Tensor& t) {
  if (!t.defined()) return false;
  const auto* fn = dynamic_cast<const FunctionNode*>(t.grad_fn().get());
  return fn != nullptr && fn->can_recompute();
}

void set_recompute(const std::shared_ptr<Node>& node, FunctionNode::Recompute r, bool keep) {
  if (node == nullptr || !t_recompute) return;
  auto* fn = dynamic_cast<FunctionNode*>(node.get());
  AF_ASSERT(fn != nullptr, "set_recompute: {} is not a FunctionNode", node->name());
  fn->set_recompute(std::move(r), keep);
}

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

namespace {
Edge edge_for(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  return {grad_accumulator(t), 0};
}
}  // namespace

std::shared_ptr<Node> record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             FunctionNode::Backward backward) {
  if (!needs_grad(inputs)) return nullptr;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->next_edges.reserve(inputs.size());
  node->input_meta.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    node->next_edges.push_back(edge_for(t));
    node->input_meta.push_back(t.defined() ? InputMeta{t.shape(), t.dtype(), t.device()} : InputMeta{});
  }
  node->num_outputs = static_cast<uint32_t>(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    if (!o.defined() || !o.is_floating_point()) continue;  // integer outputs (indices) carry no gradient
    // Outputs are fresh tensors (or views made by this op): give them their history.
    TensorImpl* impl = o.impl();
    if (!impl->autograd) impl->autograd = std::make_unique<AutogradMeta>();
    impl->autograd->requires_grad = true;
    impl->autograd->grad_fn = node;
    impl->autograd->output_nr = static_cast<uint32_t>(i);
  }
  return node;
}

}  // namespace ampforge::autograd
