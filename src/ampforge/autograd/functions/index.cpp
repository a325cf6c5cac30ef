// Differentiable embedding and dropout.
//   embedding: gradient only for the weight (scatter-add by the deterministic embedding_backward kernel;
//              the padding_idx row gets none).
//   dropout:   identity (the input itself, no copy) in eval mode or for p == 0; otherwise the kernel's Bool
//              mask is saved and the backward is grad * mask / (1 - p).
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge {

using autograd::Grads;
using autograd::SavedTensor;
using autograd::needs_grad;
using autograd::record;

Tensor embedding(const Tensor& indices, const Tensor& weight, int64_t padding_idx) {
  Tensor out = ops::embedding(indices, weight, padding_idx);
  if (needs_grad({&weight})) {
    const int64_t V = weight.size(0);
    record("EmbeddingBackward", {weight}, {out}, [V, padding_idx, I = SavedTensor(indices)](const Grads& g) -> Grads {
      return {ops::embedding_backward(g[0], I.get(), V, padding_idx)};
    });
  }
  return out;
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  AF_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got {}", p);
  if (!training || p == 0.0) return x;
  ops::DropoutResult r = ops::dropout(x, p, gen);
  if (needs_grad({&x})) {
    const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    record("DropoutBackward", {x}, {r.out}, [scale, M = SavedTensor(r.mask)](const Grads& g) -> Grads {
      return {ops::mul_scalar(ops::mul(g[0], ops::to_dtype(M.get(), g[0].dtype())), scale)};
    });
  }
  return r.out;
}

}  // namespace ampforge
