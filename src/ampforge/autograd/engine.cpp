// The backward engine: counts, for every node reachable from the roots, how many gradients it waits
// for; runs nodes whose inputs are complete (the most recently created first); sums gradients that
// meet at the same input (a leaf used k times has one AccumulateGrad, so its gradient is summed here and
// accumulated once); runs tensor hooks on a node's incoming gradients before the node; checks each
// gradient's shape and device and casts it to the input's dtype (so a gradient that crossed an autocast
// cast arrives in the parameter's dtype).
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge::autograd {
namespace {

struct ByLatest {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

// Captures gradients that reach chosen (node, output) pairs instead of going further (used by grad()).
struct Capture {
  std::unordered_map<const Node*, std::vector<std::pair<uint32_t, size_t>>> at;  // node -> (output, slot)
  std::vector<Tensor> values;
};

// Whether the gradient sum so far, `acc`, may take the next gradient `g` in place: nothing but the engine's buffer
// refers to it or to its memory (a gradient a node also keeps, hands to two inputs, or returns as a view of another
// gradient is shared, and stays untouched), it has no autograd state, and g matches it in shape, dtype and device.
// Saves the new buffer and its first-touch (read-for-ownership) traffic of an out-of-place add; the bits are the same.
bool sole_owner(const Tensor& acc, const Tensor& g) {
  const TensorImpl* a = acc.impl();
  return acc.impl_ptr().use_count() == 1 && a->storage.use_count() == 1 && a->autograd == nullptr &&
         acc.shape() == g.shape() && acc.dtype() == g.dtype() && acc.device() == g.device() &&
         (acc.is_contiguous() || (acc.dim() == 4 && acc.is_contiguous(MemoryFormat::ChannelsLast)));
}

void execute(const std::vector<Edge>& roots, const std::vector<Tensor>& seeds, bool retain_graph, Capture* capture) {
  NoGradGuard no_grad;  // backward formulas are not recorded (no double backward)
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;
  {
    std::vector<Node*> stack;
    std::unordered_set<Node*> seen;
    for (const Edge& e : roots)
      if (e.fn && seen.insert(e.fn.get()).second) {
        stack.push_back(e.fn.get());
        keep[e.fn.get()] = e.fn;
      }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.fn) continue;
        deps[e.fn.get()]++;
        if (seen.insert(e.fn.get()).second) {
          stack.push_back(e.fn.get());
          keep[e.fn.get()] = e.fn;
        }
      }
    }
  }
  std::unordered_map<Node*, Grads> buffers;
  auto accumulate = [&](Node* n, uint32_t slot, const Tensor& g) {
    Grads& buf = buffers[n];
    if (buf.size() < n->num_outputs) buf.resize(n->num_outputs);
    if (!g.defined()) return;
    if (!buf[slot].defined())
      buf[slot] = g;
    else if (sole_owner(buf[slot], g))
      ops::add_(buf[slot], g);
    else
      buf[slot] = ops::add(buf[slot], g);
  };
  std::priority_queue<Node*, std::vector<Node*>, ByLatest> ready;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].fn) continue;
    accumulate(roots[i].fn.get(), roots[i].input_nr, seeds[i]);
  }
  for (size_t i = 0; i < roots.size(); ++i) {
    Node* n = roots[i].fn.get();
    if (n && deps[n] == 0) {
      deps[n] = -1;  // queued
      ready.push(n);
    }
  }
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    Grads in = std::move(buffers[n]);
    buffers.erase(n);
    in.resize(n->num_outputs);
    n->run_pre_hooks(in, capture == nullptr);
    if (capture) {
      auto it = capture->at.find(n);
      if (it != capture->at.end()) {
        for (auto [out_nr, slot] : it->second)
          if (in[out_nr].defined()) {
            Tensor& v = capture->values[slot];
            v = v.defined() ? ops::add(v, in[out_nr]) : in[out_nr];
          }
      }
      if (dynamic_cast<AccumulateGrad*>(n)) continue;  // grad() never touches .grad of leaves
    }
    Grads out = n->apply(std::move(in));
    if (!retain_graph) {
      n->release();
      n->released = true;
    }
    AF_ASSERT(out.size() == n->next_edges.size() || out.empty(), "{} returned {} gradients for {} inputs", n->name(),
              out.size(), n->next_edges.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.fn) continue;
      Tensor g = out[i];
      if (g.defined()) {
        const InputMeta& m = n->input_meta[i];
        AF_ASSERT(g.shape() == m.shape, "{}: gradient for input {} has shape {}, expected {}", n->name(), i,
                  g.shape().str(), m.shape.str());
        // A backward written by a user (autograd::record) can return its gradient anywhere; passing it on would
        // fail later far from the cause, or not at all (autograd::grad hands it back as it is).
        AF_CHECK(g.device() == m.device, "autograd: {} returned an invalid gradient at index {} - expected device {} "
                 "but got {}", n->name(), i, m.device.str(), g.device().str());
        if (g.dtype() != m.dtype) g = ops::to_dtype(g, m.dtype);
      }
      accumulate(e.fn.get(), e.input_nr, g);
      int& d = deps[e.fn.get()];
      if (--d == 0) {
        d = -1;
        ready.push(e.fn.get());
      }
    }
  }
}

Edge root_edge(const Tensor& t) {
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  if (t.requires_grad()) return {grad_accumulator(t), 0};
  return {};
}

}  // namespace

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  std::vector<Edge> edges;
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    AF_CHECK(r.requires_grad(), "backward: element {} of the outputs does not require grad and has no grad_fn "
                                "(did you compute it under no_grad, or from tensors without requires_grad?)", i);
    Tensor g = i < grads.size() ? grads[i] : Tensor();
    if (!g.defined()) {
      AF_CHECK(r.numel() == 1, "backward: a gradient can be implied only for one-element outputs; this output has "
                               "shape {} — pass the gradient explicitly", r.shape().str());
      g = ops::ones(r.shape(), r.dtype(), r.device());
    } else {
      AF_CHECK(g.shape() == r.shape(), "backward: gradient shape {} does not match output shape {}", g.shape().str(),
               r.shape().str());
    }
    edges.push_back(root_edge(r));
    seeds.push_back(g);
  }
  execute(edges, seeds, retain_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  Capture cap;
  cap.values.resize(inputs.size());
  std::vector<std::shared_ptr<Node>> hold;
  // Inputs must be reached through their grad_fn or, for leaves, through the AccumulateGrad nodes the
  // graph holds for them: find those by walking the graph.
  std::unordered_map<const TensorImpl*, size_t> leaf_slot;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    AF_CHECK(t.requires_grad(), "grad: input {} does not require grad", i);
    if (t.grad_fn())
      cap.at[t.grad_fn().get()].push_back({t.output_nr(), i});
    else
      leaf_slot[t.impl()] = i;
  }
  std::vector<Edge> edges;
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < outputs.size(); ++i) {
    edges.push_back(root_edge(outputs[i]));
    seeds.push_back(i < grad_outputs.size() && grad_outputs[i].defined()
                        ? grad_outputs[i]
                        : ops::ones(outputs[i].shape(), outputs[i].dtype(), outputs[i].device()));
  }
  if (!leaf_slot.empty()) {
    std::vector<Node*> stack;
    std::unordered_set<Node*> seen;
    for (auto& e : edges)
      if (e.fn && seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
        auto it = leaf_slot.find(acc->leaf.impl());
        if (it != leaf_slot.end()) cap.at[n].push_back({0, it->second});
      }
      for (auto& e : n->next_edges)
        if (e.fn && seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
  execute(edges, seeds, retain_graph, &cap);
  return cap.values;
}

}  // namespace ampforge::autograd

namespace ampforge {
void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::run_backward({*this}, {grad}, retain_graph);
}
}  // namespace ampforge
