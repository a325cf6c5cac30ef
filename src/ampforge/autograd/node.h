// Autograd graph nodes. A Node is the backward of one op call: it maps gradients of the op's outputs to
// gradients of its inputs. Edges point from a node to the nodes of its inputs (or to an AccumulateGrad
// for a leaf that requires grad). Saved tensors are stored detached (no grad_fn), so an op that saves
// its own output does not make a reference cycle; each records the storage version at save time and
// unpacking it after an in-place change raises a clear error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
  uint32_t input_nr = 0;     // which output of `fn` the gradient belongs to
};

struct InputMeta {
  Shape shape;
  DType dtype = DType::F32;
  Device device;
};

using Grads = std::vector<Tensor>;

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grads: one per output of the forward op (undefined when that output got no gradient).
  // Returns one gradient per input (next_edges order); undefined entries mean "no gradient".
  virtual Grads apply(Grads&& grads) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors once backward has passed through (unless retain_graph).
  virtual void release() {}
  // Runs the tensor hooks on the incoming gradients before apply() (engine.cpp): hooks registered on this
  // node's outputs (non-leaf tensors), then the retain_grad() copies; AccumulateGrad runs its leaf's hooks.
  // `retain`: false in autograd::grad(), which leaves every .grad alone.
  virtual void run_pre_hooks(Grads& grads, bool retain);

  std::vector<Edge> next_edges;
  std::vector<InputMeta> input_meta;  // shape/dtype/device of each input, for checking gradients
  uint32_t num_outputs = 1;
  uint64_t sequence_nr;  // creation order: later nodes run first among the ready ones
  bool released = false;

  // Hooks of the non-leaf tensors this node produced (Tensor::register_hook), by output number.
  struct OutputHook {
    uint64_t id;
    uint32_t output_nr;
    Tensor::GradHook fn;
  };
  std::vector<OutputHook> output_hooks;
  // Outputs whose gradient is kept in their .grad (Tensor::retain_grad). Weak: the tensor owns this node
  // through its grad_fn; a dead tensor needs no gradient.
  struct Retained {
    uint32_t output_nr;
    std::weak_ptr<TensorImpl> tensor;
  };
  std::vector<Retained> retained;
};

// The gradient sink of a leaf: adds incoming gradients into leaf.grad (in place when it exists, so
// gradients that are views into a flat buffer stay views).
// A leaf has one AccumulateGrad however often it is used (grad_accumulator()): the engine sums the
// uses' gradients before it runs, so its hooks see the total and .grad gets one addition per backward.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  Grads apply(Grads&& grads) override;
  void run_pre_hooks(Grads& grads, bool retain) override;
  std::string name() const override { return "AccumulateGrad"; }
  Tensor leaf;
};

// The AccumulateGrad node of a leaf that requires grad: the existing one while any graph holds it, else
// a new one (remembered weakly in the leaf's AutogradMeta).
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);

class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // Returns the saved tensor; throws when it was modified in place after saving or already released.
  Tensor get() const;
  void reset() { t_ = Tensor(); }
  bool defined() const { return t_.defined(); }

 private:
  Tensor t_;
  uint32_t version_ = 0;
  bool was_defined_ = false;
};

// A node whose backward is a closure: the differentiable functions in autograd/functions/ use it so
// that each op's backward sits next to its forward.
class FunctionNode final : public Node {
 public:
  using Backward = std::function<Grads(const Grads&)>;
  FunctionNode(const char* name, Backward fn) : name_(name), fn_(std::move(fn)) {}
  Grads apply(Grads&& grads) override;
  std::string name() const override { return name_; }
  void release() override { fn_ = nullptr; }

 private:
  const char* name_;
  Backward fn_;
};

// ---- grad mode ------------------------------------------------------------------------------------
bool grad_enabled();
void set_grad_enabled(bool enabled);

// RAII: disables graph recording in this thread (optimizer steps, evaluation).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// True when grad mode is on and any of the tensors requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Connects outputs to a new node with `backward`, if any input requires grad (and grad mode is on).
// Returns the node (null when nothing was recorded).
std::shared_ptr<Node> record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             FunctionNode::Backward backward);

// Runs backward from `roots` with the given seed gradients (see engine.cpp).
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph);

// Gradients of `outputs` w.r.t. `inputs`, returned instead of accumulated into .grad (used by the
// gradient checker). Inputs that do not influence the outputs get undefined tensors.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph = false);

}  // namespace ampforge::autograd
