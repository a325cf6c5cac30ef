#include "ampforge/nn/module.h"

#include <fmt/ranges.h>

#include "ampforge/autograd/node.h"
#include "ampforge/nn/state_dict.h"
#include "ampforge/ops/ops.h"

namespace ampforge::nn {

Tensor Module::forward(const Tensor&) {
  AF_THROW(InvalidArgument, "{} has no single-input forward()", type_name_);
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  AF_CHECK(t.defined(), "register_parameter: '{}' is undefined", name);
  for (auto& p : params_) AF_ASSERT(p.first != name, "parameter '{}' registered twice in {}", name, type_name_);
  t.requires_grad_(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  for (auto& p : buffers_) AF_ASSERT(p.first != name, "buffer '{}' registered twice in {}", name, type_name_);
  buffers_.emplace_back(name, t);
  return t;
}

void Module::collect(const std::string& prefix, bool params, NamedTensors& out) const {
  for (auto& [n, t] : params ? params_ : buffers_) out.emplace_back(prefix + n, t);
  for (auto& [n, m] : children_) m->collect(prefix + n + ".", params, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  // PyTorch orders each module's parameters, then its buffers, then children; names are what matter.
  std::function<void(const Module&, const std::string&)> rec = [&](const Module& m, const std::string& prefix) {
    for (auto& [n, t] : m.params_) out.emplace_back(prefix + n, t);
    for (auto& [n, t] : m.buffers_) out.emplace_back(prefix + n, t);
    for (auto& [n, c] : m.children_) rec(*c, prefix + n + ".");
  };
  rec(*this, "");
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  if (!strict) {
    // Missing and unexpected keys are fine here; a mis-shaped one is not (nn::load_state_dict reports it).
    const LoadReport r = compare_state_dict(*this, state);
    std::vector<std::string> bad;
    for (const auto& m : r.mismatched_keys)
      bad.push_back(fmt::format("'{}': the model has {}, the state has {}", m.key, m.expected.str(), m.found.str()));
    AF_CHECK(bad.empty(), "load_state_dict: shape mismatch for {} (the checkpoint was saved from a different model "
             "configuration?)", fmt::join(bad, "; "));
  }
  LoadOptions opt;
  opt.strict = strict;
  nn::load_state_dict(*this, state, opt);
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& t : parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

namespace {
// A parameter's .grad follows it to a new dtype or device (as torch's Module._apply), as a fresh tensor: an
// optimizer that built the old gradient buffer rebinds the parameter and copies this in (optimizer.h).
void convert_grad(const Tensor& p, DType dtype, Device device) {
  const Tensor g = p.grad();
  if (g.defined() && (g.dtype() != dtype || g.device() != device))
    p.set_grad(ops::to_device(ops::to_dtype(g, dtype), device));
}
}  // namespace

Module& Module::to(DType dtype, bool keep_f32_buffers) {
  AF_CHECK(dtype_is_float(dtype), "Module::to: expected a floating dtype, got {}", dtype_name(dtype));
  autograd::NoGradGuard ng;
  for (auto& t : parameters())
    if (t.is_floating_point() && t.dtype() != dtype) {
      t.set_data(ops::to_dtype(t.detach(), dtype));
      convert_grad(t, dtype, t.device());
    }
  if (!keep_f32_buffers)
    for (auto& [n, t] : named_buffers())
      if (t.is_floating_point() && t.dtype() != dtype) t.set_data(ops::to_dtype(t.detach(), dtype));
  return *this;
}

Module& Module::to(Device device) {
  autograd::NoGradGuard ng;
  for (auto& t : parameters())
    if (t.device() != device) {
      t.set_data(ops::to_device(t.detach(), device));
      convert_grad(t, t.dtype(), device);
    }
  for (auto& [n, t] : named_buffers())
    if (t.device() != device) t.set_data(ops::to_device(t.detach(), device));
  return *this;
}

std::string Module::describe(int indent) const {
  std::string pad(static_cast<size_t>(indent), ' ');
  std::string s = type_name_ + "(" + extra_repr();
  if (children_.empty()) return s + ")";
  s += "\n";
  for (auto& [n, m] : children_) s += pad + "  (" + n + "): " + m->describe(indent + 2) + "\n";
  return s + pad + ")";
}

}  // namespace ampforge::nn
