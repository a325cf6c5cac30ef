// CPU convolution on oneDNN (libdnnl): conv2d forward and its input and weight gradients, called by the
// kernels of conv.cpp before their im2col + GEMM path. Why, and how the threads are shared: see
// conv_onednn.cpp and docs/ARCHITECTURE.md ("CPU kernels").
//
// Which path runs: AMPFORGE_CPU_CONV=onednn (the default in a build with oneDNN) or im2col, read at every
// call so that a test or an A/B measurement can switch it. A problem oneDNN has no fast kernel for (F64, a problem
// for which it offers only its reference implementation or its gemm-based one, as for most plain NCHW activations)
// runs on im2col whatever the variable says. F16 (no F16 convolution in oneDNN 2.6), and BF16 where bf16_compute.h
// chooses the F32 way, reach the functions below as F32 problems on F32 copies (conv.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "ampforge/core/attrs.h"
#include "ampforge/core/tensor.h"

namespace ampforge::cpu {

enum class CpuConvPath { Im2col, OneDnn };

// Whether this build has oneDNN (CMake option AMPFORGE_ONEDNN).
bool onednn_built();
// The path AMPFORGE_CPU_CONV asks for: unset or empty is OneDnn when built, else Im2col. "onednn" in a
// build without oneDNN, or any other value, raises InvalidArgument naming the variable.
CpuConvPath cpu_conv_path();

// The algorithm AMPFORGE_CPU_CONV_ALGO asks for (read at every call): unset, empty or "auto" is a fixed rule
// (conv_onednn.cpp): 3x3 stride-1 F32 convolutions with >= 64 channels on >= 14x14 outputs (>= 32 on >= 56x56) run
// on oneDNN's Winograd kernels (faster there; rounding within the F32 tolerance table of the direct sum), strided
// weight gradients with >= 32 channels on its blocked-layout kernels, and the gradients of 1x1 F32 convolutions on
// channels-last activations as GEMMs; "direct" keeps every problem on direct convolution kernels (PyTorch's CPU
// choice); "benchmark" (as torch.backends.cudnn.benchmark) times the
// candidates of each problem on its first call (direct kernels on the tensors' layout, direct kernels on
// activations copied to nChw16c, Winograd) and keeps the fastest for the process: the fastest this CPU has,
// at the price of a slower first step and a choice that may differ from run to run (results within the F32
// table of each other). Any other value raises InvalidArgument naming the variable.
enum class CpuConvAlgo { Auto, Direct, Benchmark };
CpuConvAlgo cpu_conv_algo();

// Whether conv.cpp's kernels run a convolution of this dtype as the F32 problem on F32 copies of its operands: F16, and
// BF16 where bf16_compute.h chooses the F32 way, when AMPFORGE_CPU_CONV is onednn. Those copies come from the caching
// allocator (the meta device standing for the CPU takes the same: backends/meta/cpu_scratch.h).
bool cpu_conv_in_f32_copies(DType dtype);

// Which path and kernels run convolutions here, for `ampforge info` and the bench header: "oneDNN 2.6.3
// (avx512_core_bf16); BF16: F32 copies (measured: ...)" (bf16_compute.h), or "im2col (16-bit operands staged in F32)".
std::string cpu_conv_summary();

// oneDNN convolution primitives executed by this process so far (all three directions), for the tests
// that check which path ran.
int64_t onednn_conv_executions();
// The transient buffers the threads keep for their next calls (thread_scratch.h: the oneDNN convolutions' scratchpad,
// reordered weights and blocked activations, shared with the matrix products' scratch and conversions), in bytes, and
// how many times one of them was (re)allocated because a call needed more: a thread's buffers grow to its largest
// problem and are reused after.
int64_t onednn_scratch_bytes();
int64_t onednn_scratch_grows();
// Problems benchmark mode has measured so far (each once per process).
int64_t onednn_benchmarked_problems();
// The oneDNN implementation that ran (or would run) the last problem handed to the functions below, e.g.
// "brgconv:avx512_core_amx" or "jit:avx512_core"; when oneDNN declined it (the problem then runs on im2col),
// "declined: " and why: "declined: ref:any" / "declined: gemm:jit" (only a reference or gemm-based kernel on this
// CPU, both slower than im2col), "declined: no implementation" (e.g. BF16 below AVX-512 in oneDNN 2.6), or the
// library's rejection. Empty before any problem.
std::string onednn_last_impl();

// What this CPU's oneDNN offers beyond its reference and gemm-based kernels (which conv_onednn.cpp declines), asked
// of the library itself: one probe descriptor per question, made once per process. The answers depend on the ISA
// oneDNN dispatches to (the CPU's, capped by ONEDNN_MAX_CPU_ISA): in oneDNN 2.6 the BF16 convolution kernels and
// the Winograd kernels exist for avx512_core and above only, so on an AVX2 CPU BF16 convolutions run on im2col
// with F32 staging and the Winograd rule runs the direct kernels. Tests assert the path that must run from these.
struct OneDnnConvOffer {
  std::string isa;        // the strongest ISA oneDNN dispatches to here, e.g. "avx2", "avx512_core_bf16"
  bool bf16 = false;      // a BF16 direct kernel (3x3, 64 channels, channels-last, forward)
  bool winograd = false;  // an F32 Winograd kernel (the same problem on nChw16c)
};
// All false and isa "" in a build without oneDNN.
const OneDnnConvOffer& onednn_conv_offer();

// Each runs the problem on oneDNN and returns true, or returns false without touching the outputs when
// oneDNN offers no usable kernel for it (the caller then runs im2col). Same contract as conv.cpp's kernels:
// x, y, gy, gx 4-D and each contiguous or channels-last; weight (Co, C/groups, kH, kW) any strides.
bool onednn_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y,
                           const Conv2dAttrs& a);
bool onednn_conv2d_backward_input(const Tensor& gy, const Tensor& w, const Tensor& gx, const Conv2dAttrs& a);
bool onednn_conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Tensor& gw, const Conv2dAttrs& a);

}  // namespace ampforge::cpu
