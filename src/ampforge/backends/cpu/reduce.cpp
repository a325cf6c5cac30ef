// CPU reductions: sum, mean, amax, amin, argmax, argmin, var over any set of dims.
//
// The output arrives in keepdim form (reduced dims have size 1). Three paths, all with results that do
// not depend on the thread count (each output is computed by one fixed sequence of additions):
//   full   every dim reduced, input contiguous: fixed 16K-element chunks, partials summed in order;
//   outer  reduced dims lie outside the kept dims of a contiguous input (x viewed as [R, K]): fixed
//          blocks of rows accumulate K-vectors (vectorised), partials summed in block order;
//   generic  one output at a time, nested loops over the reduced dims (double accumulators).
#include <cmath>
#include <limits>
#include <vector>

#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cpu {
namespace {

enum class RedKind { Sum, Mean, Max, Min, ArgMax, ArgMin, Var };

struct RedPlan {
  // kept dims (output order) and reduced dims, each coalesced where possible
  std::vector<int64_t> kept_shape, kept_xstride, kept_ostride;
  std::vector<int64_t> red_shape, red_xstride;
  int64_t n_out = 1, n_red = 1;
};

RedPlan make_plan(const Tensor& x, const Tensor& out, const std::vector<int>& dims) {
  RedPlan p;
  std::vector<bool> is_red(x.dim(), false);
  for (int d : dims) is_red[d] = true;
  for (int d = 0; d < x.dim(); ++d) {
    const int64_t s = x.shape()[d];
    if (is_red[d]) {
      if (s == 1) continue;
      p.red_shape.push_back(s);
      p.red_xstride.push_back(x.strides()[d]);
      p.n_red *= s;
    } else {
      if (s == 1) continue;
      p.kept_shape.push_back(s);
      p.kept_xstride.push_back(x.strides()[d]);
      p.kept_ostride.push_back(out.strides()[d]);
      p.n_out *= s;
    }
  }
  return p;
}

// Offsets of the index `lin` in a multi-dim space (row-major over shape) under strides.
inline int64_t offset_of(int64_t lin, const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  int64_t off = 0;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    off += (lin % shape[d]) * stride[d];
    lin /= shape[d];
  }
  return off;
}

template <class S>
double load_d(const S* p) {
  return static_cast<double>(static_cast<compute_t<S>>(p[0]));
}

template <class S>
void store_d(S* p, double v) {
  if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
    *p = S(static_cast<float>(v));
  else
    *p = static_cast<S>(v);
}

// Generic path: one output at a time. The reduced index space is walked as (outer reduced index) x
// (innermost reduced dim): offsets are computed once per inner run, and the inner run is a strided
// loop (unit stride when the reduced dim is contiguous), so the cost per element is one load and add.
template <class S>
void reduce_generic(const Tensor& x, const Tensor& out, const RedPlan& p, RedKind kind, int64_t correction) {
  const S* xp = static_cast<const S*>(x.data_ptr());
  const bool arg = kind == RedKind::ArgMax || kind == RedKind::ArgMin;
  const bool is_max = kind == RedKind::Max || kind == RedKind::ArgMax;
  // Innermost reduced dim as the run; the rest as the outer reduced space.
  const int nr = static_cast<int>(p.red_shape.size());
  const int64_t run = nr > 0 ? p.red_shape[nr - 1] : 1;
  const int64_t run_stride = nr > 0 ? p.red_xstride[nr - 1] : 0;
  std::vector<int64_t> outer_shape(p.red_shape.begin(), p.red_shape.begin() + std::max(nr - 1, 0));
  std::vector<int64_t> outer_stride(p.red_xstride.begin(), p.red_xstride.begin() + std::max(nr - 1, 0));
  const int64_t n_outer = p.n_red / std::max<int64_t>(run, 1);
  // Visits every reduced element of one output in a fixed order: f(value, linear reduced index).
  auto visit = [&](const S* base, auto&& f) {
    for (int64_t ro = 0; ro < n_outer; ++ro) {
      const S* q = base + offset_of(ro, outer_shape, outer_stride);
      const int64_t lin0 = ro * run;
      if (run_stride == 1) {
        for (int64_t i = 0; i < run; ++i) f(load_d(q + i), lin0 + i);
      } else {
        for (int64_t i = 0; i < run; ++i) f(load_d(q + i * run_stride), lin0 + i);
      }
    }
  };
  parallel_for(p.n_out, std::max<int64_t>(1, 16384 / std::max<int64_t>(p.n_red, 1)), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      const S* base = xp + offset_of(o, p.kept_shape, p.kept_xstride);
      const int64_t ooff = offset_of(o, p.kept_shape, p.kept_ostride);
      if (kind == RedKind::Var) {
        double mean = 0, acc = 0;
        visit(base, [&](double v, int64_t) { mean += v; });
        mean /= static_cast<double>(std::max<int64_t>(p.n_red, 1));
        visit(base, [&](double v, int64_t) { acc += (v - mean) * (v - mean); });
        const double denom = static_cast<double>(p.n_red - correction);
        store_d(static_cast<S*>(out.data_ptr()) + ooff,
                denom > 0 ? acc / denom : std::numeric_limits<double>::quiet_NaN());
        continue;
      }
      if (kind == RedKind::Sum || kind == RedKind::Mean) {
        double acc = 0;
        visit(base, [&](double v, int64_t) { acc += v; });
        if (kind == RedKind::Mean) acc /= static_cast<double>(p.n_red);
        store_d(static_cast<S*>(out.data_ptr()) + ooff, acc);
        continue;
      }
      double best = 0;
      int64_t best_i = -1;
      bool nan_seen = false;
      visit(base, [&](double v, int64_t r) {
        if (nan_seen) return;
        if (v != v) {  // NaN wins, as in PyTorch
          nan_seen = true;
          best = v;
          best_i = r;
        } else if (best_i < 0 || (is_max ? v > best : v < best)) {
          best = v;
          best_i = r;
        }
      });
      if (arg)
        static_cast<int64_t*>(out.data_ptr())[ooff] = best_i;
      else
        store_d(static_cast<S*>(out.data_ptr()) + ooff, best);
    }
  });
}

// Outer path for sum/mean: x is contiguous and viewed as [R, K] (reduced outer, kept inner).
template <class S>
void reduce_outer_sum(const Tensor& x, const Tensor& out, int64_t R, int64_t K, bool mean) {
  using A = compute_t<S>;
  const S* xp = static_cast<const S*>(x.data_ptr());
  constexpr int64_t kBlockRows = 256;
  const int64_t nblocks = (R + kBlockRows - 1) / kBlockRows;
  std::vector<A> partial(static_cast<size_t>(nblocks * K), A(0));
  parallel_for(nblocks, 1, [&](int64_t b, int64_t e) {
    std::vector<A> row(static_cast<size_t>(K));
    for (int64_t blk = b; blk < e; ++blk) {
      A* acc = partial.data() + blk * K;
      const int64_t r1 = std::min(R, (blk + 1) * kBlockRows);
      for (int64_t r = blk * kBlockRows; r < r1; ++r) {
        const S* src = xp + r * K;
        if constexpr (std::is_same_v<S, A>) {
          for (int64_t k = 0; k < K; ++k) acc[k] += src[k];
        } else {
          load_n<S, A>(src, row.data(), K);
          for (int64_t k = 0; k < K; ++k) acc[k] += row[k];
        }
      }
    }
  });
  std::vector<A> total(static_cast<size_t>(K), A(0));
  for (int64_t blk = 0; blk < nblocks; ++blk)
    for (int64_t k = 0; k < K; ++k) total[k] += partial[blk * K + k];
  if (mean)
    for (auto& v : total) v /= static_cast<A>(R);
  store_n<S, A>(total.data(), static_cast<S*>(out.data_ptr()), K);
}

// Full path for sum/mean of a contiguous tensor.
template <class S>
void reduce_full_sum(const Tensor& x, const Tensor& out, bool mean) {
  using A = compute_t<S>;
  const S* xp = static_cast<const S*>(x.data_ptr());
  const int64_t n = x.numel();
  constexpr int64_t kChunkElems = 16384;
  const int64_t nchunks = (n + kChunkElems - 1) / kChunkElems;
  std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(nchunks, 1)), 0.0);
  parallel_for(nchunks, 1, [&](int64_t b, int64_t e) {
    alignas(64) A buf[kChunk];
    for (int64_t c = b; c < e; ++c) {
      const int64_t i0 = c * kChunkElems, i1 = std::min(n, i0 + kChunkElems);
      // 32 independent lanes (4 AVX vectors): the adds of one lane form a dependency chain, and with a
      // single vector of lanes the 3-4 cycle add latency, not memory, bounded an L3-resident sum.
      constexpr int kLanes = 32;
      A lanes[kLanes] = {};
      for (int64_t i = i0; i < i1; i += kChunk) {
        const int64_t m = std::min(kChunk, i1 - i);
        const A* src;
        if constexpr (std::is_same_v<S, A>) {
          src = xp + i;
        } else {
          load_n<S, A>(xp + i, buf, m);
          src = buf;
        }
        int64_t j = 0;
        for (; j + kLanes <= m; j += kLanes)
          for (int l = 0; l < kLanes; ++l) lanes[l] += src[j + l];
        for (; j < m; ++j) lanes[j % kLanes] += src[j];
      }
      double s = 0;
      for (int l = 0; l < kLanes; ++l) s += static_cast<double>(lanes[l]);
      partial[c] = s;
    }
  });
  double total = 0;
  for (double v : partial) total += v;
  if (mean) total /= static_cast<double>(n);
  store_d(static_cast<S*>(out.data_ptr()), total);
}

void reduce_kernel(const KernelArgs& a, RedKind kind) {
  const Tensor& x = a.in(0);
  const Tensor& out = a.out(0);
  const auto& at = a.attr<ReduceAttrs>();
  RedPlan p = make_plan(x, out, at.dims);
  const bool sumlike = kind == RedKind::Sum || kind == RedKind::Mean;
  auto run = [&](auto tag) {
    using S = decltype(tag);
    if (sumlike && x.numel() > 0 && x.is_contiguous() && out.is_contiguous()) {
      if (p.n_out == 1) return reduce_full_sum<S>(x, out, kind == RedKind::Mean);
      // Reduced dims all outside the kept ones in a contiguous x: [R, K] view.
      bool outer = true;
      bool seen_kept = false;
      for (int d = 0; d < x.dim(); ++d) {
        if (x.shape()[d] == 1) continue;
        const bool red = std::find(at.dims.begin(), at.dims.end(), d) != at.dims.end();
        if (red && seen_kept) outer = false;
        if (!red) seen_kept = true;
      }
      if (outer) return reduce_outer_sum<S>(x, out, p.n_red, p.n_out, kind == RedKind::Mean);
    }
    if (p.n_red == 0) {  // empty reduction: sum 0, mean NaN; max/min/arg are rejected in ops/
      const double v = kind == RedKind::Sum ? 0.0 : std::numeric_limits<double>::quiet_NaN();
      S* op = static_cast<S*>(out.data_ptr());
      for (int64_t i = 0; i < out.numel(); ++i) store_d(op + i, v);
      return;
    }
    reduce_generic<S>(x, out, p, kind, at.correction);
  };
  if (kind == RedKind::ArgMax || kind == RedKind::ArgMin || kind == RedKind::Max || kind == RedKind::Min)
    visit_arith(x.dtype(), "reduction", run);
  else
    visit_float(x.dtype(), "reduction", run);
}

}  // namespace

void register_reduce_cpu() {
  auto reg = [](OpId op, KernelFn fn) { register_kernel(op, DeviceType::CPU, fn); };
  reg(OpId::sum, [](const KernelArgs& a) { reduce_kernel(a, RedKind::Sum); });
  reg(OpId::mean, [](const KernelArgs& a) { reduce_kernel(a, RedKind::Mean); });
  reg(OpId::amax, [](const KernelArgs& a) { reduce_kernel(a, RedKind::Max); });
  reg(OpId::amin, [](const KernelArgs& a) { reduce_kernel(a, RedKind::Min); });
  reg(OpId::argmax, [](const KernelArgs& a) { reduce_kernel(a, RedKind::ArgMax); });
  reg(OpId::argmin, [](const KernelArgs& a) { reduce_kernel(a, RedKind::ArgMin); });
  reg(OpId::var, [](const KernelArgs& a) { reduce_kernel(a, RedKind::Var); });
}

}  // namespace ampforge::cpu
