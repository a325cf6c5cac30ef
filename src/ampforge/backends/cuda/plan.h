// Iteration plans for the CUDA kernels, built on the host, read on the device.
//
// OffsetCalc maps the linear index of an element (row-major over the plan's sizes) to the element offset
// of each operand. It is plain data passed by value as a kernel parameter and works on host and device,
// so the host-side plan builders are unit-tested without a GPU (plan_test.cpp).
//
// Elementwise plans: operand 0 is the output, inputs follow; inputs broadcast to the output's shape
// (stride 0 in broadcast dims). Dims are ordered by the output's memory layout (outermost = largest
// output stride), so consecutive threads write consecutive addresses even for channels-last or
// transposed outputs, then merged where contiguous in every operand: a contiguous tensor becomes one dim,
// which needs no division at all. Sizes are stored innermost first (index 0 = fastest dim), so the
// device loop indexes the arrays with unrolled constants and keeps them in registers/parameter space.
//
// Reduction plans: the input's dims split into kept dims (row-major order = the output's order) and
// reduced dims (kept in their original order, so a linear reduced index is the one argmax reports, as on
// the CPU), each group merged where contiguous.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "ampforge/core/shape.h"

#if defined(__CUDACC__)
#define AF_HD __host__ __device__ __forceinline__
#else
#define AF_HD inline
#endif
// Loop unrolling in device code only (host compilers warn about the pragma).
#if defined(__CUDA_ARCH__)
#define AF_UNROLL _Pragma("unroll")
#else
#define AF_UNROLL
#endif

namespace ampforge {
class Tensor;
}

namespace ampforge::cuda {

inline constexpr int kMaxOperands = 4;

template <int N>
struct OffsetCalc {
  int ndim = 0;
  // Every size and the element count fit in 32 bits: the device divides in 32 bits (a 64-bit division is
  // a long software sequence on GPUs).
  bool narrow = true;
  int64_t sizes[kMaxDims] = {};       // innermost first
  int64_t strides[N][kMaxDims] = {};  // in elements, innermost first

  AF_HD void get(int64_t linear, int64_t (&off)[N]) const {
AF_UNROLL
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (narrow) {
      uint32_t rem = static_cast<uint32_t>(linear);
AF_UNROLL
      for (int d = 0; d < kMaxDims; ++d) {
        if (d == ndim) break;
        uint32_t i;
        if (d == ndim - 1) {  // the outermost dim takes what is left: no division
          i = rem;
        } else {
          const uint32_t sz = static_cast<uint32_t>(sizes[d]);
          const uint32_t q = rem / sz;
          i = rem - q * sz;
          rem = q;
        }
AF_UNROLL
        for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(i) * strides[k][d];
      }
    } else {
      int64_t rem = linear;
AF_UNROLL
      for (int d = 0; d < kMaxDims; ++d) {
        if (d == ndim) break;
        int64_t i;
        if (d == ndim - 1) {
          i = rem;
        } else {
          const int64_t q = rem / sizes[d];
          i = rem - q * sizes[d];
          rem = q;
        }
AF_UNROLL
        for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
      }
    }
  }
};

// Dims in outermost-first order with per-operand strides; the builders' working form.
struct DimList {
  int nops = 0;
  std::vector<int64_t> sizes;                  // outermost first
  std::vector<std::vector<int64_t>> strides;   // [operand][dim]

  // Drops size-1 dims and merges dim d into d+1 when stride[d] == stride[d+1] * size[d+1] for every operand.
  void coalesce();
  template <int N>
  OffsetCalc<N> calc() const {
    OffsetCalc<N> c;
    c.ndim = static_cast<int>(sizes.size());
    int64_t numel = 1;
    for (int64_t s : sizes) numel *= s;
    c.narrow = numel < (int64_t{1} << 31);
    for (int j = 0; j < c.ndim; ++j) {
      const int d = c.ndim - 1 - j;
      c.sizes[j] = sizes[d];
      for (int k = 0; k < N && k < nops; ++k) c.strides[k][j] = strides[k][d];
    }
    return c;
  }
};

struct ElementwisePlan {
  int64_t numel = 0;
  int nops = 0;
  DimList dims;
  char* data[kMaxOperands] = {};
  // One dim (or none) and every operand at unit stride: the kernels may use vector loads.
  bool contiguous = false;
};

// operands[0] is the output; inputs must broadcast to its shape (ops/ has checked). Pointers include each
// tensor's offset.
ElementwisePlan make_elementwise_plan(const Tensor* const* operands, int nops);
inline ElementwisePlan make_elementwise_plan(std::initializer_list<const Tensor*> ops) {
  return make_elementwise_plan(ops.begin(), static_cast<int>(ops.size()));
}

struct ReducePlan {
  int64_t n_out = 1;  // product of kept sizes
  int64_t n_red = 1;  // product of reduced sizes
  DimList kept;       // operand 0: input strides, operand 1: output strides
  DimList red;        // operand 0: input strides
  // The input's fastest-moving dim (smallest stride) is reduced, or there is one output: threads of a
  // warp share one output and read consecutive reduced elements. Otherwise consecutive threads take
  // consecutive outputs and each walks the reduction (coalesced along the kept dim).
  bool inner = true;
};

// `dims`: sorted, unique reduced dims of x; `out`: the keepdim-shaped output.
ReducePlan make_reduce_plan(const Tensor& x, const Tensor& out, const std::vector<int>& dims);

// GEMM operands for column-major libraries (cuBLASLt). A row-major product C = A @ B is computed as the
// column-major C^T = B^T @ A^T. GemmOperand describes X^T for a logical row-major (R x C) matrix X with
// element strides (rs, cs): the column-major storage (rows x cols, leading dimension ld) and whether the
// library must transpose it. Unit column stride: memory holds X^T column-major (trans = false). Unit row
// stride: memory holds X column-major (trans = true). Size-1 dims may have any stride. nullopt: neither
// stride is a unit stride with a valid leading dimension (the caller copies the operand).
struct GemmOperand {
  int64_t rows = 0, cols = 0, ld = 0;
  bool trans = false;
};
std::optional<GemmOperand> gemm_operand(int64_t R, int64_t C, int64_t rs, int64_t cs);

// The layouts a cuDNN convolution is tried in, in order (true: channels-last): the call's own layout
// first; a channels-last problem then NCHW (cuDNN's generic kernels cover any NCHW problem), a 16-bit
// NCHW problem then channels-last (cuDNN's F16/BF16 tensor-core kernels are NHWC kernels, and some
// versions have nothing else for a problem); an F32 NCHW problem has no other layout to try.
std::vector<bool> conv_layout_attempts(bool nhwc, bool sixteen_bit);

}  // namespace ampforge::cuda
