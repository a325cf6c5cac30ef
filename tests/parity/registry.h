// The parity harness's sample registry: each differentiable op declares its sample inputs once, here, and
// three consumers use them:
//   - parity_test.cpp: finite-difference gradient checks in F64, comparison with the PyTorch golden file
//     in each dtype the golden has, and the op-list coverage check;
//   - dump_main.cpp (ampforge_parity_dump): writes manifest.json + inputs.safetensors for
//     scripts/gen_golden.py, which maps each case's `op` + `attrs` to the PyTorch call.
//
// A case = name, op, attrs (a small JSON object, read by both the C++ lambda and the Python mapping, so
// the two cannot disagree about a parameter), input specs, and the lambda calling the ampforge function.
// The lambda returns the outputs: outputs[0] is the differentiable one (gradients are checked through it);
// any further outputs are compared forward-only (e.g. batch_norm's updated running statistics).
//
// Input values: generated in F32 (or the integer/bool dtype) by Philox with a seed derived from the case
// name and the input's position, so they depend on nothing else; the layout ("contiguous",
// "channels_last", "transposed": last two dims swapped in memory, "strided": every other element of a
// wider buffer) is applied afterwards, so the logical values do not depend on it.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge::parity {

using json = nlohmann::ordered_json;

struct InputSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  // "randn" (N(0,1)), "uniform" [lo, hi), "int" [lo, hi) (I64), "bernoulli" (Bool, P(true) = lo; the
  // first element along the last dim is forced true so attention rows never have every key masked),
  // "dropout_mask" (Bool: the mask ampforge::dropout draws with p = lo and seed = hi; the golden's PyTorch
  // side multiplies by it, so a change of the dropout stream shows up as a parity failure).
  std::string gen = "randn";
  double lo = 0, hi = 1;
  std::string layout = "contiguous";
  bool requires_grad = true;
  // Follows the case dtype in F16/BF16 runs (false for F32 running statistics and non-float inputs).
  bool cast16 = true;
  // int gen only: every `ignore_every`-th element (from 0) is replaced by `ignore_value` (cross_entropy).
  int64_t ignore_every = 0, ignore_value = -100;
};

using CaseFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&, const json&)>;

struct Case {
  std::string name;  // unique, [A-Za-z0-9_]
  std::string op;    // the op-list name when the case samples an op-list op; else the composite's name
  json attrs = json::object();
  std::vector<InputSpec> inputs;
  CaseFn fn;
  bool gradcheck = true;  // false only where FD is meaningless (documented at the case)
};

// All cases, in registration order (samples_*.cpp).
const std::vector<Case>& cases();
const Case* find_case(const std::string& name);

// The manifest: everything gen_golden.py needs to rebuild each case in PyTorch. The golden file embeds
// the manifest it was generated from; the parity test compares it with this one.
json manifest();
json case_manifest(const Case& c);

// Logical input values (contiguous, F32 or the spec's non-float dtype), deterministic per case.
std::vector<Tensor> generate_inputs(const Case& c);
// The fixed random gradient for outputs[0] (F32, deterministic per case).
Tensor generate_grad_output(const Case& c, const Shape& out_shape);

// Turns logical values into the tensors a case receives: casts floating inputs with cast16 to `dtype`
// (F32 values stay F32 when dtype is F32; pass F64 for gradchecks), moves them to `device`, applies the
// layout there, and marks requires_grad. The results are leaves.
std::vector<Tensor> prepare_inputs(const Case& c, const std::vector<Tensor>& values, DType dtype,
                                   Device device = kCPU);

// Registration (called once by cases()).
void register_core_samples(std::vector<Case>& out);
void register_nn_samples(std::vector<Case>& out);

// Helpers for samples.
inline InputSpec in(std::string name, Shape shape, std::string gen = "randn", double lo = 0, double hi = 1) {
  InputSpec s;
  s.name = std::move(name);
  s.shape = shape;
  s.gen = std::move(gen);
  s.lo = lo;
  s.hi = hi;
  if (s.gen == "int") s.dtype = DType::I64;
  if (s.gen == "bernoulli" || s.gen == "dropout_mask") s.dtype = DType::Bool;
  if (s.dtype != DType::F32) s.requires_grad = false, s.cast16 = false;
  return s;
}
inline InputSpec with_layout(InputSpec s, std::string layout) {
  s.layout = std::move(layout);
  return s;
}
inline InputSpec no_grad(InputSpec s) {
  s.requires_grad = false;
  return s;
}

}  // namespace ampforge::parity
