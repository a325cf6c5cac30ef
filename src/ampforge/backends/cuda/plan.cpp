// Host-side builders of the CUDA kernels' iteration plans (see plan.h).
#include "ampforge/backends/cuda/plan.h"

#include <algorithm>

#include "ampforge/core/tensor.h"

namespace ampforge::cuda {

void DimList::coalesce() {
  std::vector<int64_t> ns;
  std::vector<std::vector<int64_t>> nst(static_cast<size_t>(nops));
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    bool merge = !ns.empty();
    // merge the previous kept dim (outer) with this one (inner) when the outer one is exactly
    // `size` inner steps apart in every operand
    for (int k = 0; k < nops && merge; ++k) merge = nst[k].back() == strides[k][d] * sizes[d];
    if (merge) {
      ns.back() *= sizes[d];
      for (int k = 0; k < nops; ++k) nst[k].back() = strides[k][d];
    } else {
      ns.push_back(sizes[d]);
      for (int k = 0; k < nops; ++k) nst[k].push_back(strides[k][d]);
    }
  }
  sizes = std::move(ns);
  strides = std::move(nst);
}

ElementwisePlan make_elementwise_plan(const Tensor* const* operands, int nops) {
  AF_ASSERT(nops >= 1 && nops <= kMaxOperands, "elementwise plan with {} operands", nops);
  ElementwisePlan p;
  p.nops = nops;
  const Tensor& out = *operands[0];
  const Shape& shape = out.shape();
  const int nd = shape.size();
  p.numel = out.numel();
  for (int k = 0; k < nops; ++k) p.data[k] = p.numel > 0 ? static_cast<char*>(operands[k]->data_ptr()) : nullptr;

  // Per-operand strides in the output's shape (right-aligned; 0 where broadcast).
  std::vector<std::vector<int64_t>> st(static_cast<size_t>(nops), std::vector<int64_t>(static_cast<size_t>(nd), 0));
  for (int k = 0; k < nops; ++k) {
    const Tensor& t = *operands[k];
    const int lead = nd - t.dim();
    AF_ASSERT(lead >= 0, "elementwise operand {} has more dims ({}) than the output ({})", k, t.dim(), nd);
    for (int d = 0; d < t.dim(); ++d) {
      const int64_t s = t.shape()[d];
      AF_ASSERT(s == shape[d + lead] || s == 1, "operand {} shape {} does not broadcast to {}", k, t.shape().str(),
                shape.str());
      st[k][d + lead] = (s == 1 && shape[d + lead] != 1) ? 0 : t.strides()[d];
    }
  }
  // Order dims by the output's layout: larger output stride = outer; stable, so ties keep the logical
  // order. Size-1 dims carry no elements and are left out.
  std::vector<int> order;
  for (int d = 0; d < nd; ++d)
    if (shape[d] != 1) order.push_back(d);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return st[0][a] > st[0][b]; });
  p.dims.nops = nops;
  p.dims.strides.assign(static_cast<size_t>(nops), {});
  for (int d : order) {
    p.dims.sizes.push_back(shape[d]);
    for (int k = 0; k < nops; ++k) p.dims.strides[k].push_back(st[k][d]);
  }
  p.dims.coalesce();
  p.contiguous = true;
  if (p.dims.sizes.size() > 1) p.contiguous = false;
  if (p.dims.sizes.size() == 1)
    for (int k = 0; k < nops; ++k) p.contiguous = p.contiguous && p.dims.strides[k][0] == 1;
  return p;
}

ReducePlan make_reduce_plan(const Tensor& x, const Tensor& out, const std::vector<int>& dims) {
  ReducePlan p;
  AF_ASSERT(out.dim() == x.dim(), "reduce plan: output rank {} differs from the input's {} (keepdim form expected)",
            out.dim(), x.dim());
  std::vector<bool> is_red(static_cast<size_t>(x.dim()), false);
  for (int d : dims) is_red[static_cast<size_t>(d)] = true;
  p.kept.nops = 2;
  p.kept.strides.assign(2, {});
  p.red.nops = 1;
  p.red.strides.assign(1, {});
  for (int d = 0; d < x.dim(); ++d) {
    const int64_t s = x.shape()[d];
    if (is_red[static_cast<size_t>(d)]) {
      p.n_red *= s;
      p.red.sizes.push_back(s);
      p.red.strides[0].push_back(x.strides()[d]);
    } else {
      p.n_out *= s;
      p.kept.sizes.push_back(s);
      p.kept.strides[0].push_back(x.strides()[d]);
      p.kept.strides[1].push_back(out.strides()[d]);
    }
  }
  p.kept.coalesce();
  p.red.coalesce();
  // Where does the input move fastest? Compare the innermost stride of each group.
  if (p.n_out <= 1 || p.red.sizes.empty()) {
    p.inner = p.n_out <= 1;
  } else if (p.kept.sizes.empty()) {
    p.inner = true;
  } else {
    const int64_t red_min = *std::min_element(p.red.strides[0].begin(), p.red.strides[0].end());
    const int64_t kept_min = *std::min_element(p.kept.strides[0].begin(), p.kept.strides[0].end());
    p.inner = red_min <= kept_min;
  }
  return p;
}

std::optional<GemmOperand> gemm_operand(int64_t R, int64_t C, int64_t rs, int64_t cs) {
  GemmOperand m;
  if ((cs == 1 || C == 1) && (R == 1 || rs >= std::max<int64_t>(C, 1))) {
    m.rows = C;
    m.cols = R;
    m.ld = R == 1 ? std::max<int64_t>(C, 1) : rs;
    m.trans = false;
    return m;
  }
  if ((rs == 1 || R == 1) && (C == 1 || cs >= std::max<int64_t>(R, 1))) {
    m.rows = R;
    m.cols = C;
    m.ld = C == 1 ? std::max<int64_t>(R, 1) : cs;
    m.trans = true;
    return m;
  }
  return std::nullopt;
}

std::vector<bool> conv_layout_attempts(bool nhwc, bool sixteen_bit) {
  if (nhwc) return {true, false};
  if (sixteen_bit) return {false, true};
  return {false};
}

}  // namespace ampforge::cuda
