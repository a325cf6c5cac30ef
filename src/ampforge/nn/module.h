// nn::Module: named parameters, buffers and child modules; train/eval mode; state_dict; moving to a
// dtype, device or memory format. Parameters are leaf tensors that require grad; modules keep handles
// to them, and anything that rebinds a parameter's data (Module::to, the optimizer's flat buffers) does
// so with Tensor::set_data, so every handle sees the change.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/tensor.h"

namespace ampforge::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Single-input forward (the layers of a Sequential). Modules with other signatures add their own.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Recursive, in registration order, names joined with '.' ("features.0.weight").
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // Parameters and buffers, as torch's state_dict (same names for the same architecture).
  NamedTensors state_dict() const;
  // Copies values in. strict: every entry must exist on both sides with the same shape, else one error
  // lists every missing, unexpected and mis-shaped key and nothing is loaded; otherwise only matching names
  // are loaded, but a mis-shaped key is still an error. dtypes are converted. For a report of what loaded
  // (and skipping mis-shaped keys) see nn/state_dict.h.
  void load_state_dict(const NamedTensors& state, bool strict = true);
  int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Converts floating-point parameters and buffers (running statistics stay F32 as in PyTorch AMP
  // "O2": keep_f32_buffers).
  Module& to(DType dtype, bool keep_f32_buffers = true);
  Module& to(Device device);
  const std::string& type_name() const { return type_name_; }
  // One line per module, like PyTorch's repr.
  std::string describe(int indent = 0) const;

  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

 protected:
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }
  virtual std::string extra_repr() const { return ""; }

 private:
  void collect(const std::string& prefix, bool params, NamedTensors& out) const;
  std::string type_name_;
  bool training_ = true;
  NamedTensors params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

using ModulePtr = std::shared_ptr<Module>;

}  // namespace ampforge::nn
