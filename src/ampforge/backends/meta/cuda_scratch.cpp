// The CUDA kernels' allocator scratch, for a meta device standing for CUDA (cuda_scratch.h says what and why).
// The sizes are the CUDA kernels' own formulas (named constants copied from backends/cuda with their files).
#include "ampforge/backends/meta/cuda_scratch.h"

#include <algorithm>

#include "ampforge/backends/meta/meta.h"

namespace ampforge::meta::cuda_scratch {

namespace {

constexpr size_t kMaxCudnnWorkspace = size_t{1} << 30;  // conv.cpp: kMaxWorkspaceBytes
constexpr int64_t kBnSplitElems = 16384;                // norm.cu: elements of one channel per split (inner > 1)
constexpr int64_t kBnSplitRows = 1024;                  // norm.cu: rows per split (inner == 1)
constexpr int64_t kLnSplitRows = 256;                   // norm.cu: rows per split of the weight/bias sums
constexpr int64_t kSplitKPartials = 8;                  // the estimate's partial filters (cuda_scratch.h)

size_t bytes(int64_t n, size_t elem) { return static_cast<size_t>(std::max<int64_t>(n, 0)) * elem; }

// norm.cu's bn_splits: channels-last (and 2-D) inputs are rows of C; NCHW splits each channel's plane.
int64_t bn_splits(const Tensor& x) {
  const int64_t C = x.size(1), count = C > 0 ? x.numel() / C : 0;
  int64_t spatial = 1;
  for (int d = 2; d < x.dim(); ++d) spatial *= x.size(d);
  const bool rows = !x.is_contiguous() || spatial == 1;  // inner == 1
  if (rows) return (count + kBnSplitRows - 1) / kBnSplitRows;
  return (count + kBnSplitElems - 1) / kBnSplitElems;
}

void conv(int dir, const Shape& weight, const KernelArgs& args) {
  MetaScratch ws(cudnn_workspace_estimate(dir, weight, args.attr<Conv2dAttrs>()));
}

}  // namespace

size_t cudnn_workspace_estimate(int dir, const Shape& w, const Conv2dAttrs& at) {
  const size_t filter_f32 = bytes(shape_numel(w), sizeof(float));
  size_t n = 0;
  if (dir == 2) {
    n = kSplitKPartials * filter_f32;
  } else {
    const bool gemm = w[2] == 1 && w[3] == 1 && at.stride[0] == 1 && at.stride[1] == 1 && at.padding[0] == 0 &&
                      at.padding[1] == 0 && at.groups == 1;
    n = gemm ? 0 : filter_f32;
  }
  return std::min(n, kMaxCudnnWorkspace);
}

void blas(const KernelArgs&) { ensure_blas_workspace(); }

void conv2d(const KernelArgs& a) { conv(0, a.in(1).shape(), a); }              // {x, w[, b]} -> {y}
void conv2d_backward_input(const KernelArgs& a) { conv(1, a.in(1).shape(), a); }  // {gy, w} -> {gx}
void conv2d_backward_weight(const KernelArgs& a) { conv(2, a.out(0).shape(), a); }  // {gy, x} -> {gw}

void batch_norm(const KernelArgs& a) {  // {x, w, b, rm, rv} -> {y, mean, invstd}
  const Tensor& x = a.in(0);
  if (x.dim() < 2) return;
  const int64_t C = x.size(1), nsplit = a.attr<BatchNormAttrs>().training ? bn_splits(x) : 0;
  MetaScratch partial(bytes(nsplit * C * 2, sizeof(double)));
  MetaScratch coef(bytes(2 * C, sizeof(float)));
}

void batch_norm_backward(const KernelArgs& a) {  // {g, x, w, mean, invstd} -> {gx, gw, gb}
  const Tensor& x = a.in(1);
  if (x.dim() < 2) return;
  const bool need_sums = (a.attr<BatchNormAttrs>().training && a.out(0).defined()) || a.out(1).defined() ||
                         a.out(2).defined();
  const int64_t C = x.size(1), nsplit = need_sums ? bn_splits(x) : 0;
  MetaScratch partial(bytes(nsplit * C * 2, sizeof(double)));
  MetaScratch coef(bytes(4 * C, sizeof(float)));
}

void layer_norm_backward(const KernelArgs& a) {  // {g, x, mean, rstd, w} -> {gx, gw, gb}
  const int64_t M = a.in(2).numel();
  if (M == 0) return;
  const int64_t N = a.in(1).numel() / M;
  const bool want_params = a.out(1).defined() || a.out(2).defined();
  const int64_t nsplit = want_params ? (M + kLnSplitRows - 1) / kLnSplitRows : 0;
  MetaScratch wbuf(a.out(0).defined() ? bytes(N, sizeof(float)) : 0);
  MetaScratch partial(bytes(2 * nsplit * N, sizeof(float)));
}

void cross_entropy(const KernelArgs& a) {  // {logits, target} -> {loss, lse}
  if (a.attr<CrossEntropyAttrs>().reduction == Reduction::None) return;
  MetaScratch row_loss(bytes(std::max<int64_t>(a.in(1).numel(), 1), sizeof(float)));
}

void bce_with_logits(const KernelArgs& a) {  // {x, t} -> {loss}
  if (a.attr<BceAttrs>().reduction == Reduction::None) return;
  MetaScratch terms(bytes(std::max<int64_t>(a.in(0).numel(), 1), sizeof(float)));
}

void attention_backward(const KernelArgs& a) {  // {go, q, k, v, o, lse[, mask]} -> {dq, dk, dv}
  const Tensor& q = a.in(1);
  const int64_t D = q.size(-1);
  if (D == 0 || q.numel() == 0) return;
  MetaScratch delta(bytes(q.numel() / D, sizeof(float)));  // N * Tq rows
}

void embedding_backward(const KernelArgs& a) {  // {g, idx} -> {gw}
  const Tensor& gw = a.out(0);
  if (gw.numel() == 0) return;
  const int64_t V = a.attr<EmbeddingAttrs>().num_weights, n = a.in(1).numel();
  MetaScratch bounds(bytes(2 * (V + 1), sizeof(uint32_t)));
  MetaScratch pairs(bytes(4 * n, sizeof(uint32_t)));
  if (n > 0) MetaScratch temp(bytes(std::max<int64_t>(4 * n, 1), sizeof(uint32_t)));
}

}  // namespace ampforge::meta::cuda_scratch
