// Op parameters passed to kernels (KernelArgs::attrs). One struct per op family; field comments give
// units and conventions. Kernels read them; ops/ fills them after validation.
#pragma once

#include <cstdint>
#include <vector>

#include "ampforge/core/generator.h"

namespace ampforge {

struct FillAttrs {
  double value = 0;
};

struct ArangeAttrs {
  double start = 0, step = 1;
};

struct RandAttrs {
  PhiloxState philox;
  double a = 0, b = 1;  // uniform: [a, b); normal: mean a, std b
};

struct ScalarAttrs {
  double scalar = 0;  // add_scalar: x + s; mul_scalar: x * s; pow_scalar: x ^ s
};

struct ClampAttrs {
  double min = 0, max = 0;
  bool has_min = false, has_max = false;
};

enum class GeluApprox : uint8_t { None, Tanh };
struct GeluAttrs {
  GeluApprox approximate = GeluApprox::None;
};

// Reductions over `dims` (sorted, unique, non-negative). Outputs keep reduced dims as size 1 when keepdim.
struct ReduceAttrs {
  std::vector<int> dims;
  bool keepdim = false;
  int64_t correction = 1;  // var: divide by (n - correction)
};

// matmul: out[b] = op(A[b]) @ op(B[b]); inputs are 3-D (batch, rows, cols) after ops/ has folded batch
// dims; a batch stride of 0 broadcasts. linear: out = x @ W^T (+ bias), x 2-D (M, K), W (N, K).
struct MatmulAttrs {
  bool trans_a = false, trans_b = false;
};

struct Conv2dAttrs {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
};

struct Pool2dAttrs {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg_pool2d
};

struct UpsampleAttrs {
  int64_t scale_h = 2, scale_w = 2;
};

struct BatchNormAttrs {
  bool training = true;
  double momentum = 0.1;
  double eps = 1e-5;
};

struct LayerNormAttrs {
  int normalized_dims = 1;  // how many trailing dims are normalised
  double eps = 1e-5;
};

struct SoftmaxAttrs {
  int dim = -1;
};

enum class Reduction : uint8_t { None, Mean, Sum };
struct CrossEntropyAttrs {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
};

struct BceAttrs {
  Reduction reduction = Reduction::Mean;
};

struct EmbeddingAttrs {
  int64_t padding_idx = -1;  // -1: none; its row gets no gradient
  int64_t num_weights = 0;   // embedding_backward: rows of the weight
};

struct CatAttrs {
  int dim = 0;
};

struct DropoutAttrs {
  double p = 0.5;
  PhiloxState philox;
};

struct AttentionAttrs {
  bool causal = false;
  double scale = 0;  // 0: 1/sqrt(head_dim)
};

}  // namespace ampforge
