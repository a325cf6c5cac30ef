// Loading weights by name with a report (see state_dict.h).
#include "ampforge/nn/state_dict.h"

#include <map>

#include "ampforge/autograd/node.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/ops/ops.h"

namespace ampforge::nn {

namespace {

std::string join(const std::vector<std::string>& xs) {
  std::string s;
  for (const auto& x : xs) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string plural(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

std::string LoadReport::str() const {
  const size_t model_keys = loaded_keys.size() + missing_keys.size() + mismatched_keys.size();
  std::string s = "loaded " + std::to_string(loaded_keys.size()) + " of " + std::to_string(model_keys) + " keys";
  if (!missing_keys.empty())
    s += "; " + plural(missing_keys.size(), "missing key", "missing keys") + ": " + join(missing_keys);
  if (!unexpected_keys.empty())
    s += "; " + plural(unexpected_keys.size(), "unexpected key", "unexpected keys") + ": " + join(unexpected_keys);
  if (!mismatched_keys.empty()) {
    std::vector<std::string> m;
    for (const auto& x : mismatched_keys)
      m.push_back(x.key + " (model " + x.expected.str() + ", state " + x.found.str() + ")");
    s += "; " + plural(m.size(), "shape mismatch", "shape mismatches") + ": " + join(m);
  }
  return s;
}

LoadReport compare_state_dict(const Module& module, const NamedTensors& state, const std::string& prefix) {
  std::map<std::string, const Tensor*> given;
  LoadReport r;
  for (const auto& [name, t] : state) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    AF_CHECK(t.defined(), "load_state_dict: the state's tensor '{}' is undefined", name);
    AF_CHECK(given.emplace(name.substr(prefix.size()), &t).second, "load_state_dict: the state has key '{}' twice",
             name);
  }
  std::map<std::string, bool> in_model;
  for (const auto& [name, t] : module.state_dict()) {
    in_model[name] = true;
    auto it = given.find(name);
    if (it == given.end())
      r.missing_keys.push_back(name);
    else if (it->second->shape() != t.shape())
      r.mismatched_keys.push_back({name, t.shape(), it->second->shape()});
    else
      r.loaded_keys.push_back(name);
  }
  for (const auto& [name, t] : state) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    if (!in_model.count(name.substr(prefix.size()))) r.unexpected_keys.push_back(name.substr(prefix.size()));
  }
  return r;
}

LoadReport load_state_dict(Module& module, const NamedTensors& state, const LoadOptions& opt) {
  LoadReport r = compare_state_dict(module, state, opt.prefix);
  AF_CHECK(!opt.strict || r.ok(),
           "load_state_dict: the state does not fit this {} model, nothing was loaded: {} (saved from a different "
           "model or configuration? load with strict = false to load the keys that match)",
           module.type_name(), r.str());
  std::map<std::string, Tensor> given;
  for (const auto& [name, t] : state)
    if (name.compare(0, opt.prefix.size(), opt.prefix) == 0) given.emplace(name.substr(opt.prefix.size()), t);
  std::map<std::string, Tensor> mine;
  for (auto& [name, t] : module.state_dict()) mine.emplace(name, t);
  autograd::NoGradGuard ng;
  for (const auto& name : r.loaded_keys) {
    const Tensor& dst = mine.at(name);
    ops::copy_(dst, ops::to_device(given.at(name), dst.device()));
  }
  return r;
}

LoadReport load_safetensors(Module& module, const std::string& path, const LoadOptions& opt) {
  SafetensorsFile f = ampforge::load_safetensors(path);
  try {
    return load_state_dict(module, f.tensors, opt);
  } catch (const Error& e) {
    AF_THROW(InvalidArgument, "'{}': {}", path, e.what());
  }
}

}  // namespace ampforge::nn
