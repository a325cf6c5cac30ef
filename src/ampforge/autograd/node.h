// Autograd graph nodes. A Node is the backward of one op call: it maps gradients of the op's outputs to
// gradients of its inputs. Edges point from a node to the nodes of its inputs (or to an AccumulateGrad
// for a leaf that requires grad). Saved tensors are stored detached (no grad_fn), so an op that saves
// its own output does not make a reference cycle; each records the storage version at save time and
// unpacking it after an in-place change raises a clear error.
//
// Recomputation of cheap activations (RecomputeGuard, below): in recompute mode, ops whose output can be
// rebuilt from what their own backward keeps anyway (batch_norm in training, from its saved input; relu and
// add, from inputs that are rebuildable themselves) give their node a recompute function. A SavedTensor of
// such an output holds the node instead of the tensor, so the output is freed as soon as the forward pass
// drops it, and get() rebuilds it, bit-identical (the same kernels on the same inputs), when a backward
// formula needs it. Every consumer of an output runs its backward before the output's producer does, so the
// producer's saved state is still there; the producer's release() drops it as usual.
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

class FunctionNode;
// The AccumulateGrad node of a leaf that requires grad: the existing one while any graph holds it, else
// a new one (remembered weakly in the leaf's AutogradMeta).
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);

class SavedTensor {
 public:
  SavedTensor() = default;
  // Keeps `t`, or, when t is the output of a node that can recompute it (recompute mode), that node.
  explicit SavedTensor(const Tensor& t);
  // Returns the saved tensor (rebuilt when it was not kept); throws when it was modified in place after
  // saving or already released.
  Tensor get() const;
  void reset() {
    t_ = Tensor();
    source_.reset();
  }
  bool defined() const { return t_.defined() || source_ != nullptr; }
  // Whether the tensor is rebuilt by its producer instead of being kept.
  bool recomputed() const { return source_ != nullptr; }

 private:
  Tensor t_;
  std::shared_ptr<FunctionNode> source_;  // recompute mode: the producer that rebuilds the tensor
  uint32_t source_output_ = 0;
  uint32_t version_ = 0;
  bool was_defined_ = false;
};

// A node whose backward is a closure: the differentiable functions in autograd/functions/ use it so
// that each op's backward sits next to its forward.
class FunctionNode final : public Node {
 public:
  using Backward = std::function<Grads(const Grads&)>;
  // Rebuilds the forward output `output_nr` from the node's saved state (recompute mode; see the top).
  using Recompute = std::function<Tensor(uint32_t output_nr)>;
  FunctionNode(const char* name, Backward fn) : name_(name), fn_(std::move(fn)) {}
  Grads apply(Grads&& grads) override;
  std::string name() const override { return name_; }
  void release() override {
    fn_ = nullptr;
    recompute_ = nullptr;
    cached_ = Tensor();
  }
  // keep: hold the first rebuilt output until release(), so that later consumers (and rebuilds that start
  // from it) reuse it instead of rebuilding a chain again.
  void set_recompute(Recompute r, bool keep) {
    recompute_ = std::move(r);
    keep_ = keep;
  }
  bool can_recompute() const { return recompute_ != nullptr; }
  // Throws (as a second backward does) when the node was released.
  Tensor recompute(uint32_t output_nr) const;

 private:
  const char* name_;
  Backward fn_;
  Recompute recompute_;
  bool keep_ = false;
  mutable Tensor cached_;  // keep_: output 0 once rebuilt
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

// ---- recompute mode ---------------------------------------------------------------------------------
// While a RecomputeGuard with `on` lives, this thread's cheap ops record how to rebuild their outputs instead
// of having them kept for backward (see the top of this file): less activation memory, a few extra
// elementwise passes and batch-norm statistics in backward. Gradients are bit-identical. Guards nest.
bool recompute_enabled();
class RecomputeGuard {
 public:
  explicit RecomputeGuard(bool on = true);
  ~RecomputeGuard();
  RecomputeGuard(const RecomputeGuard&) = delete;
  RecomputeGuard& operator=(const RecomputeGuard&) = delete;

 private:
  bool prev_;
};
// Whether `t` is an output its producer can rebuild (saving it costs no memory).
bool is_recomputable(const Tensor& t);
// Gives `node` (from record(); may be null) a recompute function, when recompute mode is on. keep: see
// FunctionNode::set_recompute. Activations that layers consume (relu outputs: convolution inputs, residual
// identities) are kept once rebuilt: a residual stage's outputs form a chain (each is rebuilt from the one
// before), which would otherwise be rebuilt from its start by every consumer. Intermediates (batch-norm
// outputs, sums) are rebuilt each time: they have one consumer.
void set_recompute(const std::shared_ptr<Node>& node, FunctionNode::Recompute r, bool keep = false);

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
