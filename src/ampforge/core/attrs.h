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
  // Upper bound, in bytes, of the CPU kernels' scratch (im2col columns plus staging) per batch of images;
  // 0: the backend's default (64 MiB). At least one image is always processed at a time.
  int64_t max_scratch_bytes = 0;
};

struct Pool2dAttrs {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg_pool2d
  int64_t output_size[2] = {0, 0};  // adaptive_avg_pool2d (and its backward): (out_h, out_w)
};

struct UpsampleAttrs {
  int64_t scale_h = 2, scale_w = 2;
};

// An activation applied to batch_norm's output inside the same kernel (ops::batch_norm_act): y = act(bn(x)).
// The backward kernel recomputes bn(x) from x, so neither bn(x) nor a mask is kept.
enum class NormAct : uint8_t { None, ReLU, SiLU };
// The activations batch_norm's residual form takes (act(bn(x) + residual)): those whose gradient its backward
// reads from the output alone (ReLU: output > 0).
inline bool norm_act_takes_residual(NormAct a) { return a == NormAct::None || a == NormAct::ReLU; }

struct BatchNormAttrs {
  bool training = true;
  double momentum = 0.1;
  double eps = 1e-5;
  NormAct act = NormAct::None;  // CPU kernels only; ops/ composes the activation on other devices
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

// Fused attention (ops/attention.cpp validates and reshapes; kernels in backends/*/attention.*).
//   attention           in:  q (N, Tq, D), k (N, Tk, D), v (N, Tk, Dv), all contiguous, one floating dtype;
//                            optionally mask: Bool of shape (N1, N2, Tq, Tk) with N1 * N2 = N, read through its
//                            strides (zero strides for broadcast dims); batch n is (n / N2, n % N2); true = attend.
//                       out: out (N, Tq, Dv) in q's dtype, contiguous; lse (N, Tq) the log-sum-exp of each row of
//                            the masked scaled scores (F32, F64 for F64 inputs); -inf for a row with every key
//                            masked (whose output is NaN: the softmax of all -inf, as the composite gives).
//   attention_backward  in:  grad_out (N, Tq, Dv) in q's dtype, q, k, v, out, lse[, mask] as above.
//                       out: dq (N, Tq, D), dk (N, Tk, D), dv (N, Tk, Dv), contiguous, q's dtype.
// S = scale * q k^T with masked (and, when causal, j > i) entries -inf; P = exp(S - lse):
//   dv = P^T dO;  dP = dO v^T;  dS = P * (dP - rowsum(dO * O)), 0 where masked;  dq = scale dS k;  dk = scale dS^T q.
// A fully masked row has lse = -inf, so its P is NaN (as in the composite: its dv contributions are NaN, its
// dq row and dk contributions 0). The kernels see scale already resolved (ops/ turns 0 into 1/sqrt(D)).
struct AttentionAttrs {
  bool causal = false;  // query i attends keys j <= i (top-left aligned)
  double scale = 0;     // 0: 1/sqrt(head_dim) (resolved in ops/)
};

// Fused optimizer steps over flat buffers. Inputs: param, grad, state buffers..., and optionally a
// one-element F32 `found_inf` tensor: when it holds a non-zero value the step is skipped on the device
// (GradScaler), leaving every buffer untouched.
//
// Master-weight mode: an extra output holds the 16-bit model copy, written from the updated F32 master.
// BF16 copies can be written with stochastic rounding: the F32 value rounds up to the next BF16 value
// with probability equal to the dropped fraction, so the copy is an unbiased estimate of the master
// (E[bf16] = f32) instead of a deterministic nearest value. The noise for flat element i is word i % 4 of
// Philox(seed, offset + i / 4): independent of threads and devices, and the same on resume if the
// caller derives offset from the step count.
struct ModelCopyRounding {
  bool stochastic = false;  // BF16 copies only; F16 copies always round to nearest even
  uint64_t seed = 0;
  uint64_t offset = 0;      // Philox counter of element 0
  // With device hyperparameters (below) the offset is instead completed steps x blocks_per_step, the
  // count read where it lives.
  uint64_t blocks_per_step = 0;
};

// Device hyperparameters (optional input 2 of adamw_step / sgd_step): a contiguous F64 tensor of two
// elements on the parameters' device, {completed steps, lr}. When given, the kernel takes the step number
// (completed + 1; SGD's first step: completed == 0) and the learning rate from it instead of the attrs,
// and advances `completed` by one unless found_inf skipped the step. The host then never needs to know
// whether a step was skipped, and a captured CUDA graph reads the current values at every replay (the
// attrs' values would be frozen into the graph).

struct AdamWAttrs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  int64_t step = 1;  // 1-based step number after increment (bias corrections use it)
  ModelCopyRounding rounding;
};

struct SgdAttrs {
  double lr = 0.01, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // momentum buffer is initialised to the gradient on the first step
  ModelCopyRounding rounding;
};

// GradScaler's scale update (torch's _amp_update_scale_): on found_inf, scale *= backoff and the
// growth tracker resets; otherwise the tracker counts up and, at growth_interval, scale *= growth
// (only if the grown scale is finite) and the tracker resets.
struct AmpUpdateAttrs {
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

}  // namespace ampforge
