// Whether the CPU's BF16 products (matmul / linear on matmul_onednn.h, convolutions on conv_onednn.h) run on oneDNN's
// native BF16 kernels or as F32 on F32 copies of their operands, rounded to BF16 on the way out.
//
// Why a choice: AVX512_BF16 does not make BF16 faster everywhere. Measured on 2 threads with oneDNN 2.6
// (docs/PERFORMANCE.md): on an AMD EPYC (Zen 5) VM its BF16 matmul ran BERT-base's products in a quarter of the time of
// F32 copies + SGEMM; on an Intel Xeon (model 207) VM that exposes AVX512_BF16 but not AMX, the same BF16 matmul took
// 1.2-1.8x the time of the F32 path, and its BF16 convolutions 1.5-3x the time of its F32 ones (Winograd included) for
// nearly every YOLOv8s and ResNet-50 convolution. No CPU flag tells the two apart, so `auto` measures.
//
// AMPFORGE_CPU_BF16, read at every call (a test or an A/B run can switch it):
//   unset, empty, "auto"  Native with AMX (its tiles multiply BF16 many times faster than F32) without measuring;
//                         F32 on a CPU without AVX512_BF16 (oneDNN would emulate it) or in a build without oneDNN;
//                         otherwise measured once per process and kind, on the first call that asks: one
//                         representative problem (matmul: 256 x 768 x 768, BERT-base's projection; convolution:
//                         3x3, 64 -> 64 channels, 2 x 56 x 56, channels-last) run both ways on one thread (the
//                         kernels' speed per core, which holds when other processes load the machine), the F32 way
//                         with its conversions in and out, alternating, best of 5; Native when it is not slower.
//                         Costs ~20-80 ms once. Results of the two ways differ in rounding (below), so a CPU on which the
//                         two are equally fast may choose differently from run to run: pin the variable for runs that
//                         must repeat bit for bit.
//   "native" / "f32"      that way (native on a CPU without AVX512_BF16: oneDNN's emulation, when it has one).
//   anything else         InvalidArgument naming the variable.
// Numerics: both ways multiply BF16 values exactly in F32 and accumulate in F32, rounding to BF16 once on store; the
// order of the additions differs (and the F32 convolution may run Winograd), so results agree within BF16's rounding.
#pragma once

#include <string>

namespace ampforge::cpu {

enum class Bf16Kind { Matmul, Conv };
enum class Bf16Compute { Native, F32 };

// How this kind's BF16 products run now (may measure, once per kind, on the first call: thread-safe).
Bf16Compute cpu_bf16_compute(Bf16Kind kind);

// What was chosen and why, for `ampforge info`, the bench header and doctor, e.g. "native (measured: 1.41 ms, F32
// 2.73 ms)", "F32 copies (measured: native 2.72 ms, F32 1.95 ms)", "native (AMX)", "F32 copies (no AVX512_BF16)",
// "F32 copies (AMPFORGE_CPU_BF16=f32)". Measures when the choice depends on it.
std::string cpu_bf16_summary(Bf16Kind kind);

}  // namespace ampforge::cpu
