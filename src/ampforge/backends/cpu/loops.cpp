#include "ampforge/backends/cpu/loops.h"

#include <algorithm>

namespace ampforge::cpu {

ElementwiseIter make_elementwise_iter(const Tensor& out, std::initializer_list<const Tensor*> inputs) {
  ElementwiseIter it;
  AF_ASSERT(static_cast<int>(inputs.size()) + 1 <= kMaxOperands, "too many operands");
  const int nd = out.dim();
  it.nops = 1 + static_cast<int>(inputs.size());
  it.numel = out.numel();

  // Per-operand byte strides aligned to the output's dims (broadcast dims get 0).
  std::array<std::array<int64_t, kMaxDims>, kMaxOperands> st{};
  std::array<const Tensor*, kMaxOperands> ops{};
  ops[0] = &out;
  int k = 1;
  for (const Tensor* t : inputs) ops[k++] = t;
  for (k = 0; k < it.nops; ++k) {
    const Tensor& t = *ops[k];
    const int64_t es = t.element_size();
    const int off = nd - t.dim();
    AF_ASSERT(off >= 0, "input has more dims ({}) than output ({})", t.dim(), nd);
    for (int d = 0; d < nd; ++d) {
      if (d < off) {
        st[k][d] = 0;
      } else {
        const int64_t s = t.shape()[d - off];
        AF_ASSERT(s == out.shape()[d] || s == 1, "operand shape {} does not broadcast to {}", t.shape().str(),
                  out.shape().str());
        st[k][d] = (s == 1 && out.shape()[d] != 1) ? 0 : t.strides()[d - off] * es;
      }
    }
    it.base[k] = static_cast<char*>(t.data_ptr());
  }

  // Order dims so the output's largest stride comes first (memory order for permuted layouts).
  // Size-1 dims are dropped: they do not move any pointer.
  std::array<int, kMaxDims> perm{};
  int np = 0;
  for (int d = 0; d < nd; ++d)
    if (out.shape()[d] != 1) perm[np++] = d;
  std::stable_sort(perm.begin(), perm.begin() + np, [&](int a, int b) { return st[0][a] > st[0][b]; });

  // Merge dims that are contiguous in every operand.
  int n = 0;
  for (int i = 0; i < np; ++i) {
    const int d = perm[i];
    const int64_t s = out.shape()[d];
    if (n > 0) {
      bool mergeable = true;
      for (k = 0; k < it.nops; ++k)
        if (it.strides[k][n - 1] != st[k][d] * s) mergeable = false;
      if (mergeable) {
        it.shape[n - 1] *= s;
        for (k = 0; k < it.nops; ++k) it.strides[k][n - 1] = st[k][d];
        continue;
      }
    }
    it.shape[n] = s;
    for (k = 0; k < it.nops; ++k) it.strides[k][n] = st[k][d];
    ++n;
  }
  if (n == 0) {  // scalar (or all dims of size 1)
    it.shape[0] = 1;
    for (k = 0; k < it.nops; ++k) it.strides[k][0] = 0;
    n = 1;
  }
  it.ndim = n;
  return it;
}

}  // namespace ampforge::cpu
