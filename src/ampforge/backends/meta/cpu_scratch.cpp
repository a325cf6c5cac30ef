// The CPU kernels' allocator scratch, for a meta device standing for the CPU (cpu_scratch.h says what and why).
#include "ampforge/backends/meta/cpu_scratch.h"

#include "ampforge/backends/cpu/conv_onednn.h"
#include "ampforge/backends/meta/meta.h"
#include "ampforge/core/attrs.h"

namespace ampforge::meta::cpu_scratch {

namespace {

size_t f32_bytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * sizeof(float); }

// conv.cpp's kernels: the two operands' F32 copies, in argument order, then the F32 result; all live until the end
// of the call (destroyed in reverse order).
void conv(const KernelArgs& a, const Tensor* bias) {
  if (!cpu::cpu_conv_in_f32_copies(a.out(0).dtype())) return;
  MetaScratch first(f32_bytes(a.in(0)));
  MetaScratch second(f32_bytes(a.in(1)));
  MetaScratch b(bias != nullptr ? f32_bytes(*bias) : 0);
  MetaScratch result(f32_bytes(a.out(0)));
}

}  // namespace

void conv2d(const KernelArgs& a) {  // {x, w[, b]} -> {y}
  conv(a, a.inputs.size() > 2 && a.in(2).defined() ? &a.in(2) : nullptr);
}
void conv2d_backward_input(const KernelArgs& a) { conv(a, nullptr); }   // {gy, w} -> {gx}
void conv2d_backward_weight(const KernelArgs& a) { conv(a, nullptr); }  // {gy, x} -> {gw}

// norm.cpp's batch_norm_backward: with SiLU fused, in training, on F16/BF16 storage, and grad_input wanted, the sums
// pass stores dz (computed in F32) in a buffer of x's size that the last pass reads.
void batch_norm_backward(const KernelArgs& a) {  // {g, x, w, mean, invstd, ...} -> {gx, gw, gb[, gres]}
  const auto& at = a.attr<BatchNormAttrs>();
  const Tensor& x = a.in(1);
  const bool sixteen = x.dtype() == DType::F16 || x.dtype() == DType::BF16;
  if (at.act != NormAct::SiLU || !sixteen || !at.training || !a.out(0).defined()) return;
  MetaScratch dz(f32_bytes(x));
}

}  // namespace ampforge::meta::cpu_scratch
