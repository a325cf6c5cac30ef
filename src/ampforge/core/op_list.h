// The op list: one line per kernel-level op. Everything keyed by op (the OpId enum, names, the
// dispatch table, the autocast policy, the parity harness's coverage check) is generated from it.
//
// Columns: name, CUDA autocast category, differentiable (has a backward formula in autograd/).
//   Lower    run in the autocast dtype (F16/BF16) under autocast — matmul, conv, ... (PyTorch's "lower_precision_fp")
//   F32      run in F32 under autocast — softmax, losses, layer_norm, exp/log/pow, sum (PyTorch's "fp32")
//   None     autocast leaves the inputs alone; binary ops then follow type promotion (ops/ result_type:
//            f16 activations times an F32 0-dim tensor stay f16, as in PyTorch, where they are in no list)
// The column is PyTorch's CUDA autocast lists (docs, "Autocast Op Reference": "CUDA Ops that can autocast
// to float16 / float32"): batch_norm, mean and var are in neither list, so they keep their input dtype
// (batch_norm still accumulates its statistics in F32 and keeps F32 running statistics). The CPU policy is
// PyTorch's CPU lists, derived from this column in core/dispatch.cpp (op_amp_category). Both are checked
// against a fixture written from PyTorch's documentation (amp/autocast_test.cpp).
// Backward kernels are ops too (differentiable = false), so a backend can register them.
// Composite functions (cat, stack, split, ...) have no entry: they are written with these ops in
// autograd/functions/ and run on every backend that has the ops. scaled_dot_product_attention calls the
// fused `attention` op where it applies and falls back to a composite (matmul, where, softmax) elsewhere.
#pragma once

#include <cstdint>

#include "ampforge/core/device.h"

#define AF_FOR_EACH_OP(X)                              \
  /* creation and copies */                            \
  X(fill, None, false)                                 \
  X(copy, None, false)                                 \
  X(arange, None, false)                               \
  X(rand_uniform, None, false)                         \
  X(rand_normal, None, false)                          \
  /* elementwise unary */                              \
  X(neg, None, true)                                   \
  X(abs, None, true)                                   \
  X(sign, None, false)                                 \
  X(exp, F32, true)                                    \
  X(log, F32, true)                                    \
  X(sqrt, None, true)                                  \
  X(rsqrt, F32, true)                                  \
  X(relu, None, true)                                  \
  X(gelu, None, true)                                  \
  X(silu, None, true)                                  \
  X(sigmoid, None, true)                               \
  X(tanh, None, true)                                  \
  X(atan, None, true)                                  \
  X(add_scalar, None, true)                            \
  X(mul_scalar, None, true)                            \
  X(pow_scalar, F32, true)                             \
  X(clamp, None, true)                                 \
  /* elementwise binary (broadcasting) */              \
  X(add, None, true)                                \
  X(sub, None, true)                                \
  X(mul, None, true)                                \
  X(div, None, true)                                \
  X(pow, F32, true)                                    \
  X(maximum, None, true)                            \
  X(minimum, None, true)                            \
  X(eq, None, false)                                \
  X(ne, None, false)                                \
  X(lt, None, false)                                \
  X(le, None, false)                                \
  X(gt, None, false)                                \
  X(ge, None, false)                                \
  X(where, None, true)                              \
  /* elementwise backward */                           \
  X(relu_backward, None, false)                        \
  X(gelu_backward, None, false)                        \
  X(silu_backward, None, false)                        \
  X(sigmoid_backward, None, false)                     \
  X(tanh_backward, None, false)                        \
  X(clamp_backward, None, false)                       \
  /* reductions */                                     \
  X(sum, F32, true)                                    \
  X(mean, None, true)                                  \
  X(amax, None, true)                                  \
  X(amin, None, true)                                  \
  X(argmax, None, false)                               \
  X(argmin, None, false)                               \
  X(var, None, true)                                   \
  /* linear algebra */                                 \
  X(matmul, Lower, true)                               \
  X(linear, Lower, true)                               \
  /* fused attention (ops/attention.cpp) */            \
  X(attention, Lower, true)                            \
  X(attention_backward, None, false)                   \
  /* convolution and pooling */                        \
  X(conv2d, Lower, true)                               \
  X(conv2d_backward_input, None, false)                \
  X(conv2d_backward_weight, None, false)               \
  X(max_pool2d, None, true)                            \
  X(max_pool2d_backward, None, false)                  \
  X(avg_pool2d, None, true)                            \
  X(avg_pool2d_backward, None, false)                  \
  X(adaptive_avg_pool2d, None, true)                   \
  X(adaptive_avg_pool2d_backward, None, false)         \
  X(upsample_nearest2d, None, true)                    \
  X(upsample_nearest2d_backward, None, false)          \
  /* normalisation */                                  \
  X(batch_norm, None, true)                            \
  X(batch_norm_backward, None, false)                  \
  X(layer_norm, F32, true)                             \
  X(layer_norm_backward, None, false)                  \
  /* softmax and losses */                             \
  X(softmax, F32, true)                                \
  X(softmax_backward, None, false)                     \
  X(log_softmax, F32, true)                            \
  X(log_softmax_backward, None, false)                 \
  X(cross_entropy, F32, true)                          \
  X(cross_entropy_backward, None, false)               \
  X(bce_with_logits, F32, true)                        \
  X(bce_with_logits_backward, None, false)             \
  /* indexing and shape */                             \
  X(embedding, None, true)                             \
  X(embedding_backward, None, false)                   \
  X(dropout, None, true)                               \
  /* optimizers (fused over flat buffers) */           \
  X(adamw_step, None, false)                           \
  X(sgd_step, None, false)                             \
  /* mixed precision (GradScaler state stays on the device) */ \
  X(amp_unscale, None, false)                          \
  X(amp_update_scale, None, false)

namespace ampforge {

enum class OpId : uint16_t {
#define AF_OP_ENUM(name, amp, diff) name,
  AF_FOR_EACH_OP(AF_OP_ENUM)
#undef AF_OP_ENUM
};

#define AF_OP_COUNT_ONE(...) +1
inline constexpr int kNumOps = 0 AF_FOR_EACH_OP(AF_OP_COUNT_ONE);
#undef AF_OP_COUNT_ONE

enum class AmpCategory : uint8_t { None, Lower, F32 };

const char* op_name(OpId op);
// The autocast category of `op` for tensors on `device` (PyTorch's lists for that device type).
AmpCategory op_amp_category(OpId op, DeviceType device);
bool op_differentiable(OpId op);

}  // namespace ampforge
