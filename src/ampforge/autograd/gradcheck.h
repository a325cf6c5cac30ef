// Finite-difference gradient checking (the reference for every backward formula).
//
// gradcheck(fn, inputs) runs fn in F64 on the CPU and compares, for every input that requires grad,
// the analytic gradient of  L = sum(fn(inputs) * W)  (W: fixed random weights, so every output element
// contributes with a different weight and a transposed or permuted gradient cannot pass) computed by
// autograd::grad, with the central difference  (L(x + h e_i) - L(x - h e_i)) / 2h  for every element i.
//
// Contract:
//   - Floating inputs are cast to F64 (copies: the caller's tensors are never modified); the copy keeps
//     a dense non-contiguous layout (transposed, channels-last) so those kernel paths are exercised,
//     while non-dense views (slices with steps, expanded) become contiguous. Inputs listed in
//     opts.keep_dtype are passed as they are (e.g. F32 running statistics). Integer/bool inputs are
//     passed unchanged.
//   - Inputs checked: the floating inputs whose requires_grad() is true.
//   - fn must be deterministic (seed any generator inside fn) and return a floating tensor; it is called
//     2 * (checked elements) + 1 times.
//   - Step and tolerances come from core/tolerance.h (gradcheck_tolerance()) unless overridden.
//   - Element e passes when |analytic - numerical| <= atol * scale + rtol * |numerical|, where scale is
//     max(1, max |numerical| over that input) (FD rounding error grows with the magnitude of L).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge::autograd {

struct GradcheckOptions {
  uint64_t seed = 0x6772616463686bull;  // for the weights W
  double step = 0;                      // 0: gradcheck_tolerance().step
  double rtol = 0, atol = 0;            // 0: from gradcheck_tolerance()
  std::vector<int> keep_dtype;          // indices of inputs not to cast to F64
};

struct GradcheckInputReport {
  int index = 0;                 // position in `inputs`
  Shape shape;
  double max_abs_err = 0;        // max over elements of |analytic - numerical|
  double max_rel_err = 0;        // max over elements of |analytic - numerical| / max(|numerical|, scale)
  int64_t worst_element = -1;    // flat (row-major) index of the element with the largest scaled error
  double analytic_at_worst = 0, numerical_at_worst = 0;
  bool ok = true;
};

struct GradcheckReport {
  bool ok = true;
  std::vector<GradcheckInputReport> inputs;  // one per checked input
  std::string message;  // on failure: which input, which element (flat and multi-index), both values, the tolerance
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

GradcheckReport gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& opts = {});

}  // namespace ampforge::autograd
