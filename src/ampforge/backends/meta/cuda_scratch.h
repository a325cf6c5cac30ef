// What the CUDA kernels take from the device's caching allocator besides their outputs, modelled for a meta
// device that stands for CUDA (meta.h). Each function receives the KernelArgs the CUDA kernel would receive and
// allocates, for the duration of the call, what that kernel allocates (backends/cuda/*: `Scratch`):
//   blas                   the cuBLASLt workspace, 32 MiB, allocated by the first matmul/linear and kept (blas.cpp)
//   conv2d*                cuDNN's workspace: an estimate (below), the one figure not taken from our own kernels
//   batch_norm(_backward)  per-channel partial sums (double) over fixed splits, and the coefficients (norm.cu)
//   layer_norm_backward    the weight/bias column partials over 256-row splits, and a row buffer (norm.cu)
//   cross_entropy          one F32 loss per row when the loss is reduced (softmax.cu)
//   bce_with_logits        one F32 term per element when reduced (softmax.cu)
//   attention_backward     delta = rowsum(dO * O), one F32 per query row (attention.cu)
//   embedding_backward     run boundaries (V + 1 pairs), the (key, position) pairs and CUB's radix-sort
//                          temporary storage, estimated as the pairs' size again (embedding.cu)
// Not modelled: the reductions' cross-block partials (their count depends on the GPU's SM count; a few KiB to a
// few MiB per call, freed at once) and operand copies the CUDA kernels make for unusual layouts (the ops/ layer
// already hands them the common dense layouts).
//
// cuDNN workspace estimate (no GPU was available to calibrate it): cuDNN's heuristics pick implicit-GEMM kernels
// first for the dense layouts we use. Forward and backward-data: none for a 1x1, stride-1, unpadded, ungrouped
// convolution (a plain GEMM); otherwise the filter's size in F32 (the transformed filter of the precomputed
// variant). Backward-filter: split-K over the N*H*W reduction with up to 8 partial filters in F32. Capped at
// the 1 GiB the CUDA backend allows one call (conv.cpp's kMaxWorkspaceBytes).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::meta::cuda_scratch {

void blas(const KernelArgs& args);
void conv2d(const KernelArgs& args);
void conv2d_backward_input(const KernelArgs& args);
void conv2d_backward_weight(const KernelArgs& args);
void batch_norm(const KernelArgs& args);
void batch_norm_backward(const KernelArgs& args);
void layer_norm_backward(const KernelArgs& args);
void cross_entropy(const KernelArgs& args);
void bce_with_logits(const KernelArgs& args);
void attention_backward(const KernelArgs& args);
void embedding_backward(const KernelArgs& args);

// The cuDNN workspace estimate above, in bytes. dir: 0 forward, 1 backward data, 2 backward filter.
size_t cudnn_workspace_estimate(int dir, const Shape& weight, const Conv2dAttrs& attrs);

}  // namespace ampforge::meta::cuda_scratch
