// ops/: embedding, embedding_backward, dropout: validation, contiguous operands, output allocation, dispatch.
#include "ampforge/ops/ops.h"

namespace ampforge::ops {
namespace {

void check_indices_dtype(const Tensor& idx, const char* what) {
  AF_CHECK(idx.dtype() == DType::I64 || idx.dtype() == DType::I32,
           "{}: expected integer indices (i64 or i32), got dtype {}", what, dtype_name(idx.dtype()));
}

void check_padding_idx(int64_t padding_idx, int64_t V, const char* what) {
  AF_CHECK(padding_idx == -1 || (padding_idx >= 0 && padding_idx < V),
           "{}: padding_idx must be -1 (none) or in [0, {}) for a weight with {} rows, got {}", what, V, V,
           padding_idx);
}

}  // namespace

Tensor embedding(const Tensor& indices, const Tensor& weight, int64_t padding_idx) {
  check_defined(indices, "embedding", "indices");
  check_defined(weight, "embedding", "weight");
  check_same_device(indices, weight, "embedding");
  check_indices_dtype(indices, "embedding");
  AF_CHECK(weight.dim() == 2, "embedding: expected weight of shape (num_embeddings, dim), got {}",
           weight.shape().str());
  check_padding_idx(padding_idx, weight.size(0), "embedding");
  Tensor idx = contiguous(indices);
  Tensor w = contiguous(weight);
  Shape out_shape = idx.shape();
  out_shape.push_back(w.size(1));
  Tensor out = Tensor::empty(out_shape, w.dtype(), w.device());
  EmbeddingAttrs at{padding_idx, w.size(0)};
  dispatch(OpId::embedding, w.device(), {idx, w}, {out}, &at);
  return out;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights, int64_t padding_idx) {
  check_defined(grad, "embedding_backward", "grad");
  check_defined(indices, "embedding_backward", "indices");
  check_same_device(grad, indices, "embedding_backward");
  check_indices_dtype(indices, "embedding_backward");
  check_float(grad, "embedding_backward", "grad");
  AF_CHECK(grad.dim() == indices.dim() + 1, "embedding_backward: grad shape {} must be indices shape {} plus one dim",
           grad.shape().str(), indices.shape().str());
  for (int d = 0; d < indices.dim(); ++d)
    AF_CHECK(grad.size(d) == indices.size(d), "embedding_backward: grad shape {} must start with indices shape {}",
             grad.shape().str(), indices.shape().str());
  AF_CHECK(num_weights >= 0, "embedding_backward: num_weights must be >= 0, got {}", num_weights);
  check_padding_idx(padding_idx, num_weights, "embedding_backward");
  Tensor g = contiguous(grad);
  Tensor idx = contiguous(indices);
  Tensor out = Tensor::empty({num_weights, g.size(-1)}, g.dtype(), g.device());
  EmbeddingAttrs at{padding_idx, num_weights};
  dispatch(OpId::embedding_backward, g.device(), {g, idx}, {out}, &at);
  return out;
}

DropoutResult dropout(const Tensor& x_in, double p, Generator* gen) {
  check_defined(x_in, "dropout", "input");
  check_float(x_in, "dropout", "input");
  AF_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got {}", p);
  Tensor x = contiguous(x_in);
  Generator& g = gen != nullptr ? *gen : default_generator();
  DropoutAttrs at{p, g.reserve(x.numel())};
  DropoutResult r;
  r.out = Tensor::empty(x.shape(), x.dtype(), x.device());
  r.mask = Tensor::empty(x.shape(), DType::Bool, x.device());
  dispatch(OpId::dropout, x.device(), {x}, {r.out, r.mask}, &at);
  return r;
}

}  // namespace ampforge::ops
