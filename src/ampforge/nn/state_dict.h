// Loading weights by name with a report, as PyTorch's Module.load_state_dict returns
// (missing_keys, unexpected_keys): a state (name -> tensor, e.g. a torchvision state dict saved as
// safetensors by scripts/torchvision_to_safetensors.py) is matched against the module's state_dict() by name.
//
// Contract:
//   - Matching is by exact name; the order of the state does not matter. A key is loaded when the model has
//     it with the same shape; values are converted to the model tensor's dtype and copied to its device.
//   - strict (the default): nothing is loaded unless every model key is present with its shape and no key is
//     unexpected; otherwise one InvalidArgument lists every missing, unexpected and mis-shaped key, and the
//     model is unchanged.
//   - not strict: the keys that match are loaded, the rest are reported and the model's tensors for them are
//     left as they were. Unlike PyTorch, which raises on a mis-shaped key even with strict=False, a mis-shaped
//     key is skipped and reported (the fine-tuning case: ImageNet weights into a model with another number of
//     classes reports fc.weight and fc.bias), so the caller decides.
//   - prefix: only state keys starting with it are considered, with it removed ("model." reads the model
//     part of an ampforge training checkpoint); other keys are ignored, not unexpected.
#pragma once

#include <string>
#include <vector>

#include "ampforge/nn/module.h"

namespace ampforge::nn {

struct ShapeMismatch {
  std::string key;
  Shape expected;  // the model's
  Shape found;     // the state's
};

struct LoadReport {
  std::vector<std::string> loaded_keys;      // in model order
  std::vector<std::string> missing_keys;     // in the model, not in the state (model order)
  std::vector<std::string> unexpected_keys;  // in the state, not in the model (state order)
  std::vector<ShapeMismatch> mismatched_keys;  // in both, different shapes (model order)

  bool ok() const { return missing_keys.empty() && unexpected_keys.empty() && mismatched_keys.empty(); }
  // "loaded 320 of 320 keys" or "loaded 318 of 320 keys; 2 shape mismatches: fc.weight (model [10, 2048],
  // state [1000, 2048]), fc.bias (...); 1 unexpected key: ...".
  std::string str() const;
};

struct LoadOptions {
  bool strict = true;
  std::string prefix;  // "" : every key
};

// Matches `state` against module.state_dict() without loading anything.
LoadReport compare_state_dict(const Module& module, const NamedTensors& state, const std::string& prefix = "");

// Loads `state` into `module` by name (contract above) and returns what happened.
LoadReport load_state_dict(Module& module, const NamedTensors& state, const LoadOptions& opt = {});

// The same from a safetensors file (core/safetensors.h: the file is validated before anything is loaded).
// Errors name the file.
LoadReport load_safetensors(Module& module, const std::string& path, const LoadOptions& opt = {});

}  // namespace ampforge::nn
