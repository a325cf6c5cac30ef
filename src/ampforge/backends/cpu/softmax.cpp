// CPU softmax, log_softmax, cross_entropy, bce_with_logits and their backward kernels.
//
// Contracts (ops/softmax.cpp has validated the operands and made them contiguous):
//   softmax / log_softmax            in: x.  out: y (x's shape).  attrs: SoftmaxAttrs (dim >= 0).
//   softmax_backward                 in: grad, y (the forward output).  out: grad_x.  dx = y * (g - sum(g*y))
//   log_softmax_backward             in: grad, y.  out: grad_x.  dx = g - exp(y) * sum(g)
//   cross_entropy                    in: logits (N, C, d...), target I64 (N, d...).
//                                    out: loss ((N, d...) for Reduction::None, else a 0-d tensor; logits'
//                                    dtype), lse (N, d...) log-sum-exp per row (F32, or F64 for F64 logits).
//   cross_entropy_backward           in: grad (loss's shape), logits, target, lse.  out: grad_logits.
//   bce_with_logits                  in: x, target (same shape and dtype).  out: loss (x's shape or 0-d).
//   bce_with_logits_backward         in: grad (loss's shape), x, target.  out: grad_x.
// All arithmetic on 16-bit inputs runs in float; row statistics (sums of exp, losses) in double.
// Reductions to a scalar add fixed blocks of rows in block order: the same bits for any thread count.
// A target outside [0, C) that is not ignore_index raises InvalidArgument before anything is written.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/backends/cpu/vec_math.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cpu {
namespace {

constexpr int64_t kRowsGrainElems = 16384;  // elements per parallel task for row-wise kernels
constexpr int64_t kLossBlockRows = 1024;    // rows per partial sum of a reduced loss (fixed)

template <class S>
inline S from_d(double v) {
  if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
    return S(static_cast<float>(v));
  else
    return static_cast<S>(v);
}

template <class S>
inline double to_d(S v) {
  return static_cast<double>(static_cast<compute_t<S>>(v));
}

// A tensor viewed as (outer, D, inner) around dimension `dim`: row r = (o, i) holds D elements at
// stride `inner` starting at o * D * inner + i.
struct RowSpace {
  int64_t outer = 1, D = 1, inner = 1;
  int64_t rows() const { return outer * inner; }
  int64_t base(int64_t r) const { return (r / inner) * D * inner + r % inner; }
};

RowSpace row_space(const Shape& s, int dim) {
  RowSpace rs;
  for (int d = 0; d < dim; ++d) rs.outer *= s[d];
  rs.D = s.size() == 0 ? 1 : s[dim];
  for (int d = dim + 1; d < s.size(); ++d) rs.inner *= s[d];
  return rs;
}

// Gathers row elements (stride `st`) into compute-type buf; returns the memory itself when contiguous
// and already in the compute type.
template <class S, class A>
inline const A* gather(const S* p, int64_t st, int64_t n, A* buf) {
  if (st == 1) {
    if constexpr (std::is_same_v<S, A>) {
      return p;
    } else {
      load_n<S, A>(p, buf, n);
      return buf;
    }
  }
  for (int64_t j = 0; j < n; ++j) buf[j] = static_cast<A>(p[j * st]);
  return buf;
}

template <class S, class A>
inline void scatter(const A* buf, S* p, int64_t st, int64_t n) {
  if (st == 1) {
    if constexpr (std::is_same_v<S, A>) {
      if (reinterpret_cast<const void*>(buf) != reinterpret_cast<const void*>(p)) std::copy(buf, buf + n, p);
    } else {
      store_n<S, A>(buf, p, n);
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) p[j * st] = from_d<S>(static_cast<double>(buf[j]));
}

template <class A>
inline A row_max(const A* x, int64_t n) {
  // Sixteen running maxima (lanes j mod 16), which the compiler turns into vector compares and blends: one
  // running maximum is a scalar chain it may not vectorise without -ffast-math (it was 80% of cross_entropy's time
  // over a 8k vocabulary). x[j] > m is false for NaN, so NaNs are noted apart.
  constexpr int kLanes = 16;
  A mk[kLanes];
  int bad[kLanes];
  for (int k = 0; k < kLanes; ++k) mk[k] = -std::numeric_limits<A>::infinity(), bad[k] = 0;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const A v = x[j + k];
      mk[k] = v > mk[k] ? v : mk[k];
      bad[k] |= v != v;
    }
  A m = -std::numeric_limits<A>::infinity();
  int nan = 0;
  for (int k = 0; k < kLanes; ++k) {
    m = mk[k] > m ? mk[k] : m;
    nan |= bad[k];
  }
  for (; j < n; ++j) {
    m = x[j] > m ? x[j] : m;
    nan |= x[j] != x[j];
  }
  // NaN anywhere: propagate the first one.
  if (nan)
    for (int64_t i = 0; i < n; ++i)
      if (x[i] != x[i]) return x[i];
  return m;
}

// The fixed tree that adds eight lane sums (lane k at lane[k * stride]) and the tail after the last full group of
// eight: every row sum below (and the column tiles' per-column sums) adds in this one order, so the paths keep one
// another's bits.
inline double lanes_tree(const double* lane, int64_t stride, double tail) {
  const double* l = lane;
  const int64_t s = stride;
  return (((l[0] + l[s]) + (l[2 * s] + l[3 * s])) + ((l[4 * s] + l[5 * s]) + (l[6 * s] + l[7 * s]))) + tail;
}

// sum(term(j)) for j < n in double, in eight interleaved partial sums (lanes j mod 8) added by lanes_tree: vectorised
// where one running sum is a chain of dependent additions (~4 cycles per element: cross_entropy over a 30k
// vocabulary, softmax over BERT's 128-long attention rows).
template <class Term>
inline double sum_lanes8(int64_t n, Term term) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) acc[k] += term(j + k);
  double tail = 0;
  for (; j < n; ++j) tail += term(j);
  return lanes_tree(acc, 1, tail);
}

template <class A>
inline double sum_d8(const A* e, int64_t n) {
  return sum_lanes8(n, [e](int64_t j) { return static_cast<double>(e[j]); });
}

// sum(g[j] * y[j]) (softmax's backward).
template <class A>
inline double dot_d8(const A* g, const A* y, int64_t n) {
  return sum_lanes8(n, [g, y](int64_t j) { return static_cast<double>(g[j]) * static_cast<double>(y[j]); });
}

// ---- softmax -------------------------------------------------------------------------------------

// softmax over a dim that is not the last (st = inner > 1: YOLOv8's DFL, (B, 16, 4, A) over the 16 bins): blocks
// of up to 256 neighbouring rows, which are contiguous in memory along `inner`, go through an L1 tile [D][cols]
// so every pass runs along contiguous memory and exp gets one call per tile (a row at a time gathered D strided
// values and called exp on D of them). Per element the same operations in the same order as the row path (max,
// exp(x - m) by vmath, the sum in double in sum_lanes8's lanes and order, 1 / sum in double or vmath's log of the sum rounded to
// the compute type): the same bits.
constexpr int64_t kColumnTile = 4096;  // elements of a tile (two tiles: 32 KiB of floats)

template <bool kLog, class S, class A>
void softmax_columns(const S* xp, S* yp, const RowSpace& rs) {
  const int64_t D = rs.D, inner = rs.inner;
  const int64_t cols_max = std::clamp<int64_t>(kColumnTile / std::max<int64_t>(D, 1), 1, 256);
  const int64_t col_blocks = (inner + cols_max - 1) / cols_max;
  parallel_for(rs.outer * col_blocks, std::max<int64_t>(1, kRowsGrainElems / (D * cols_max)), [&](int64_t t0, int64_t t1) {
    std::vector<A> xm(static_cast<size_t>(D * cols_max)), e(static_cast<size_t>(D * cols_max));
    std::vector<A> m(static_cast<size_t>(cols_max));
    std::vector<double> sum(static_cast<size_t>(cols_max)), lanes(static_cast<size_t>(9 * cols_max));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / col_blocks, i0 = (t % col_blocks) * cols_max;
      const int64_t nc = std::min(cols_max, inner - i0);
      const int64_t base = o * D * inner + i0;
      for (int64_t j = 0; j < D; ++j) load_n<S, A>(xp + base + j * inner, xm.data() + j * nc, nc);
      // max per column; a NaN anywhere in a column makes it NaN (as row_max).
      std::fill(m.begin(), m.begin() + nc, -std::numeric_limits<A>::infinity());
      for (int64_t j = 0; j < D; ++j) {
        const A* xr = xm.data() + j * nc;
        for (int64_t i = 0; i < nc; ++i) m[i] = (xr[i] > m[i] || xr[i] != xr[i]) && m[i] == m[i] ? xr[i] : m[i];
      }
      for (int64_t j = 0; j < D; ++j) {
        A* xr = xm.data() + j * nc;
        for (int64_t i = 0; i < nc; ++i) xr[i] = xr[i] - m[i];
      }
      vmath::exp(xm.data(), e.data(), D * nc);
      // Each column's sum in sum_lanes8's lanes and order (j mod 8 while 8 remain, then the tail, then lanes_tree).
      std::fill(lanes.begin(), lanes.begin() + 9 * nc, 0.0);
      const int64_t D8 = D / 8 * 8;
      for (int64_t j = 0; j < D; ++j) {
        const A* er = e.data() + j * nc;
        double* acc = lanes.data() + (j < D8 ? j % 8 : 8) * nc;
        for (int64_t i = 0; i < nc; ++i) acc[i] += static_cast<double>(er[i]);
      }
      for (int64_t i = 0; i < nc; ++i) sum[i] = lanes_tree(lanes.data() + i, nc, lanes[static_cast<size_t>(8 * nc + i)]);
      if constexpr (kLog) {
        for (int64_t i = 0; i < nc; ++i) m[i] = static_cast<A>(sum[i]);  // m is free now: the log of each sum
        vmath::log(m.data(), m.data(), nc);
      }
      for (int64_t j = 0; j < D; ++j) {
        A* out = e.data() + j * nc;
        const A* xr = xm.data() + j * nc;
        if constexpr (kLog) {
          for (int64_t i = 0; i < nc; ++i) out[i] = xr[i] - m[i];
        } else {
          for (int64_t i = 0; i < nc; ++i) out[i] *= static_cast<A>(1.0 / sum[i]);
        }
        store_n<S, A>(out, yp + base + j * inner, nc);
      }
    }
  });
}

// softmax over short contiguous rows (D <= 64: YOLOv8's DFL loss, 16 bins per side): blocks of rows share one
// exp call (a row at a time cost a call and its setup per 16 values). Per element the same operations in the
// same order as the row path: the same bits.
template <bool kLog, class S, class A>
void softmax_short_rows(const S* xp, S* yp, const RowSpace& rs) {
  const int64_t D = rs.D, R = rs.rows();
  const int64_t rows_max = std::max<int64_t>(1, kColumnTile / D);
  const int64_t blocks = (R + rows_max - 1) / rows_max;
  parallel_for(blocks, std::max<int64_t>(1, kRowsGrainElems / (D * rows_max)), [&](int64_t b0, int64_t b1) {
    std::vector<A> xm(static_cast<size_t>(D * rows_max)), e(static_cast<size_t>(D * rows_max));
    std::vector<A> ls(static_cast<size_t>(rows_max));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * rows_max, nr = std::min(rows_max, R - r0);
      load_n<S, A>(xp + r0 * D, xm.data(), nr * D);
      for (int64_t r = 0; r < nr; ++r) {
        A* xr = xm.data() + r * D;
        const A m = row_max(xr, D);
        for (int64_t j = 0; j < D; ++j) xr[j] = xr[j] - m;
      }
      vmath::exp(xm.data(), e.data(), nr * D);
      for (int64_t r = 0; r < nr; ++r) {
        A* er = e.data() + r * D;
        const double sum = sum_d8(er, D);
        if constexpr (kLog) {
          ls[static_cast<size_t>(r)] = static_cast<A>(sum);
        } else {
          const A inv = static_cast<A>(1.0 / sum);
          for (int64_t j = 0; j < D; ++j) er[j] *= inv;
        }
      }
      if constexpr (kLog) {
        vmath::log(ls.data(), ls.data(), nr);  // one call for the block: a scalar log per row cost ~1 ms per YOLOv8n step
        for (int64_t r = 0; r < nr; ++r) {
          A* er = e.data() + r * D;
          const A* xr = xm.data() + r * D;
          for (int64_t j = 0; j < D; ++j) er[j] = xr[j] - ls[static_cast<size_t>(r)];
        }
      }
      store_n<S, A>(e.data(), yp + r0 * D, nr * D);
    }
  });
}

template <bool kLog>
void softmax_kernel(const KernelArgs& a) {
  const Tensor &x = a.in(0), &y = a.out(0);
  const RowSpace rs = row_space(x.shape(), a.attr<SoftmaxAttrs>().dim);
  visit_float(x.dtype(), kLog ? "log_softmax" : "softmax", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* xp = static_cast<const S*>(x.data_ptr());
    S* yp = static_cast<S*>(y.data_ptr());
    const int64_t D = rs.D, st = rs.inner;
    if (st > 1 && D <= kColumnTile / 8) {
      softmax_columns<kLog, S, A>(xp, yp, rs);
      return;
    }
    if (st == 1 && D <= 64) {
      softmax_short_rows<kLog, S, A>(xp, yp, rs);
      return;
    }
    parallel_for(rs.rows(), std::max<int64_t>(1, kRowsGrainElems / std::max<int64_t>(D, 1)), [&](int64_t r0, int64_t r1) {
      std::vector<A> xbuf(static_cast<size_t>(D)), obuf(static_cast<size_t>(D));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t base = rs.base(r);
        const A* xr = gather<S, A>(xp + base, st, D, xbuf.data());
        A* o = (st == 1 && std::is_same_v<S, A>) ? reinterpret_cast<A*>(yp + base) : obuf.data();
        const A m = row_max(xr, D);
        // o first holds exp(x - m) (vectorised; o never aliases xr: the output is a fresh tensor).
        for (int64_t j = 0; j < D; ++j) o[j] = xr[j] - m;
        vmath::exp(o, o, D);
        const double sum = sum_d8(o, D);
        if constexpr (kLog) {
          A ls = static_cast<A>(sum);
          vmath::log(&ls, &ls, 1);  // log of the sum rounded to A: the tiled paths take it 16 rows at a time
          for (int64_t j = 0; j < D; ++j) o[j] = (xr[j] - m) - ls;
        } else {
          const A inv = static_cast<A>(1.0 / sum);
          for (int64_t j = 0; j < D; ++j) o[j] *= inv;
        }
        scatter<S, A>(o, yp + base, st, D);
      }
    });
  });
}

template <bool kLog>
void softmax_backward_kernel(const KernelArgs& a) {
  const Tensor &g = a.in(0), &y = a.in(1), &gx = a.out(0);
  const RowSpace rs = row_space(y.shape(), a.attr<SoftmaxAttrs>().dim);
  visit_float(y.dtype(), kLog ? "log_softmax_backward" : "softmax_backward", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* gp = static_cast<const S*>(g.data_ptr());
    const S* yp = static_cast<const S*>(y.data_ptr());
    S* op = static_cast<S*>(gx.data_ptr());
    const int64_t D = rs.D, st = rs.inner;
    parallel_for(rs.rows(), std::max<int64_t>(1, kRowsGrainElems / std::max<int64_t>(D, 1)), [&](int64_t r0, int64_t r1) {
      std::vector<A> gbuf(static_cast<size_t>(D)), ybuf(static_cast<size_t>(D)), obuf(static_cast<size_t>(D));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t base = rs.base(r);
        const A* gr = gather<S, A>(gp + base, st, D, gbuf.data());
        const A* yr = gather<S, A>(yp + base, st, D, ybuf.data());
        A* o = (st == 1 && std::is_same_v<S, A>) ? reinterpret_cast<A*>(op + base) : obuf.data();
        double s = 0;
        if constexpr (kLog) {
          s = sum_d8(gr, D);
          const A sa = static_cast<A>(s);
          vmath::exp(yr, o, D);  // o never aliases gr or yr (fresh output)
          for (int64_t j = 0; j < D; ++j) o[j] = gr[j] - o[j] * sa;
        } else {
          s = dot_d8(gr, yr, D);
          const A sa = static_cast<A>(s);
          for (int64_t j = 0; j < D; ++j) o[j] = yr[j] * (gr[j] - sa);
        }
        scatter<S, A>(o, op + base, st, D);
      }
    });
  });
}

// ---- cross entropy ---------------------------------------------------------------------------------

// Validates every target; returns the number of non-ignored ones.
int64_t check_targets(const int64_t* t, int64_t n, int64_t C, int64_t ignore_index, const char* what) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore_index) continue;
    AF_CHECK(t[i] >= 0 && t[i] < C,
             "{}: target value {} (at flat position {}) is out of range for {} classes; expected 0 <= target < {} "
             "(or target == ignore_index = {})",
             what, t[i], i, C, C, ignore_index);
    ++count;
  }
  return count;
}

// The cross-entropy row space: logits (N, C, d...) contiguous viewed around dim 1.
RowSpace ce_space(const Tensor& logits) { return row_space(logits.shape(), 1); }

void cross_entropy_kernel(const KernelArgs& a) {
  const Tensor &x = a.in(0), &target = a.in(1);
  const Tensor &loss = a.out(0), &lse_t = a.out(1);
  const auto& at = a.attr<CrossEntropyAttrs>();
  const RowSpace rs = ce_space(x);
  const int64_t C = rs.D, R = rs.rows();
  const int64_t* tp = target.data<int64_t>();
  const int64_t count = check_targets(tp, R, C, at.ignore_index, "cross_entropy");
  const double eps = at.label_smoothing;
  const int64_t nblk = (R + kLossBlockRows - 1) / kLossBlockRows;
  const bool lse_f64 = lse_t.dtype() == DType::F64;
  visit_float(x.dtype(), "cross_entropy", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* xp = static_cast<const S*>(x.data_ptr());
    S* lp = static_cast<S*>(loss.data_ptr());
    // Rows in parallel by size (a masked-LM batch is a few hundred rows of a 30k vocabulary: blocks of 1024 rows
    // ran it on one thread), exp vectorised over the row; the reduced loss then adds the rows' losses in fixed
    // blocks, in order: the same bits for any thread count.
    std::vector<double> row_loss(at.reduction == Reduction::None ? 0 : static_cast<size_t>(R));
    parallel_for(R, std::max<int64_t>(1, kRowsGrainElems / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
      std::vector<A> buf(static_cast<size_t>(C)), e(static_cast<size_t>(C));
      for (int64_t r = r0; r < r1; ++r) {
        const A* xr = gather<S, A>(xp + rs.base(r), rs.inner, C, buf.data());
        const A m = row_max(xr, C);
        for (int64_t j = 0; j < C; ++j) e[j] = xr[j] - m;
        vmath::exp(e.data(), e.data(), C);
        const double lse = static_cast<double>(m) + std::log(sum_d8(e.data(), C));
        if (lse_f64)
          static_cast<double*>(lse_t.data_ptr())[r] = lse;
        else
          static_cast<float*>(lse_t.data_ptr())[r] = static_cast<float>(lse);
        double l = 0;
        if (tp[r] != at.ignore_index) {
          const double nll = lse - static_cast<double>(xr[tp[r]]);
          l = nll;
          if (eps > 0) {  // -mean_c log p_c = lse - mean_c x_c
            double sx = 0;
            for (int64_t j = 0; j < C; ++j) sx += static_cast<double>(xr[j]);
            l = (1.0 - eps) * nll + eps * (lse - sx / static_cast<double>(C));
          }
        }
        if (at.reduction == Reduction::None)
          lp[r] = from_d<S>(l);
        else
          row_loss[static_cast<size_t>(r)] = l;
      }
    });
    if (at.reduction != Reduction::None) {
      double total = 0;
      for (int64_t blk = 0; blk < nblk; ++blk) {
        double acc = 0;
        const int64_t r1 = std::min(R, (blk + 1) * kLossBlockRows);
        for (int64_t r = blk * kLossBlockRows; r < r1; ++r) acc += row_loss[static_cast<size_t>(r)];
        total += acc;
      }
      // mean over non-ignored targets (0/0 = NaN when every target is ignored, as PyTorch)
      if (at.reduction == Reduction::Mean) total /= static_cast<double>(count);
      lp[0] = from_d<S>(total);
    }
  });
}

void cross_entropy_backward_kernel(const KernelArgs& a) {
  const Tensor &g = a.in(0), &x = a.in(1), &target = a.in(2), &lse_t = a.in(3);
  const Tensor& gx = a.out(0);
  const auto& at = a.attr<CrossEntropyAttrs>();
  const RowSpace rs = ce_space(x);
  const int64_t C = rs.D, R = rs.rows();
  const int64_t* tp = target.data<int64_t>();
  const int64_t count = check_targets(tp, R, C, at.ignore_index, "cross_entropy_backward");
  const double eps = at.label_smoothing;
  const bool lse_f64 = lse_t.dtype() == DType::F64;
  visit_float(x.dtype(), "cross_entropy_backward", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* xp = static_cast<const S*>(x.data_ptr());
    const S* gp = static_cast<const S*>(g.data_ptr());
    S* op = static_cast<S*>(gx.data_ptr());
    double g0 = at.reduction == Reduction::None ? 0.0 : to_d(gp[0]);
    if (at.reduction == Reduction::Mean) g0 /= static_cast<double>(count);
    parallel_for(R, std::max<int64_t>(1, kRowsGrainElems / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
      std::vector<A> buf(static_cast<size_t>(C)), obuf(static_cast<size_t>(C));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t base = rs.base(r);
        const int64_t t = tp[r];
        if (t == at.ignore_index) {
          std::fill(obuf.begin(), obuf.end(), A(0));
        } else {
          const A* xr = gather<S, A>(xp + base, rs.inner, C, buf.data());
          const A lse = static_cast<A>(lse_f64 ? static_cast<const double*>(lse_t.data_ptr())[r]
                                               : static_cast<double>(static_cast<const float*>(lse_t.data_ptr())[r]));
          const A scale = static_cast<A>(at.reduction == Reduction::None ? to_d(gp[r]) : g0);
          const A smooth = static_cast<A>(eps / static_cast<double>(C));
          for (int64_t j = 0; j < C; ++j) obuf[j] = xr[j] - lse;
          vmath::exp(obuf.data(), obuf.data(), C);
          for (int64_t j = 0; j < C; ++j) obuf[j] = scale * (obuf[j] - smooth);
          obuf[t] -= scale * static_cast<A>(1.0 - eps);
        }
        scatter<S, A>(obuf.data(), op + base, rs.inner, C);
      }
    });
  });
}

// ---- binary cross entropy with logits --------------------------------------------------------------

void bce_kernel(const KernelArgs& a) {
  const Tensor &x = a.in(0), &t = a.in(1), &loss = a.out(0);
  const auto& at = a.attr<BceAttrs>();
  const int64_t n = x.numel();
  visit_float(x.dtype(), "binary_cross_entropy_with_logits", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* xp = static_cast<const S*>(x.data_ptr());
    const S* tp = static_cast<const S*>(t.data_ptr());
    S* lp = static_cast<S*>(loss.data_ptr());
    const int64_t nblk = (n + kRowsGrainElems - 1) / kRowsGrainElems;
    std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(nblk, 1)), 0.0);
    parallel_for(nblk, 1, [&](int64_t b0, int64_t b1) {
      alignas(64) A xb[kChunk], tb[kChunk], ob[kChunk];
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t i1 = std::min(n, (blk + 1) * kRowsGrainElems);
        double acc = 0;
        for (int64_t i0 = blk * kRowsGrainElems; i0 < i1; i0 += kChunk) {
          const int64_t m = std::min(kChunk, i1 - i0);
          load_n<S, A>(xp + i0, xb, m);
          load_n<S, A>(tp + i0, tb, m);
          // max(x, 0) - x t + log(1 + exp(-|x|)): never exponentiates a positive number. exp and log1p
          // over the chunk with vmath (SLEEF's vector functions): the scalar libm calls were 4/5 of the time.
          for (int64_t i = 0; i < m; ++i) ob[i] = -std::abs(xb[i]);
          vmath::exp(ob, ob, m);
          vmath::log1p(ob, ob, m);
          for (int64_t i = 0; i < m; ++i) ob[i] += std::max(xb[i], A(0)) - xb[i] * tb[i];
          if (at.reduction == Reduction::None)
            store_n<S, A>(ob, lp + i0, m);
          else
            for (int64_t i = 0; i < m; ++i) acc += static_cast<double>(ob[i]);
        }
        partial[blk] = acc;
      }
    });
    if (at.reduction != Reduction::None) {
      double total = 0;
      for (double v : partial) total += v;
      if (at.reduction == Reduction::Mean) total /= static_cast<double>(n);
      lp[0] = from_d<S>(total);
    }
  });
}

void bce_backward_kernel(const KernelArgs& a) {
  const Tensor &g = a.in(0), &x = a.in(1), &t = a.in(2), &gx = a.out(0);
  const auto& at = a.attr<BceAttrs>();
  const int64_t n = x.numel();
  visit_float(x.dtype(), "binary_cross_entropy_with_logits_backward", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* xp = static_cast<const S*>(x.data_ptr());
    const S* tp = static_cast<const S*>(t.data_ptr());
    const S* gp = static_cast<const S*>(g.data_ptr());
    S* op = static_cast<S*>(gx.data_ptr());
    const bool per_elem = at.reduction == Reduction::None;
    double g0 = per_elem ? 0.0 : to_d(gp[0]);
    if (at.reduction == Reduction::Mean) g0 /= static_cast<double>(n);
    const A gs = static_cast<A>(g0);
    parallel_for(n, kElementwiseGrain, [&](int64_t i0, int64_t i1) {
      alignas(64) A xb[kChunk], tb[kChunk], gb[kChunk], ob[kChunk];
      for (int64_t c = i0; c < i1; c += kChunk) {
        const int64_t m = std::min(kChunk, i1 - c);
        load_n<S, A>(xp + c, xb, m);
        load_n<S, A>(tp + c, tb, m);
        if (per_elem) load_n<S, A>(gp + c, gb, m);
        for (int64_t i = 0; i < m; ++i) ob[i] = -xb[i];
        vmath::exp(ob, ob, m);
        for (int64_t i = 0; i < m; ++i) {
          const A sig = A(1) / (A(1) + ob[i]);
          ob[i] = (sig - tb[i]) * (per_elem ? gb[i] : gs);
        }
        store_n<S, A>(ob, op + c, m);
      }
    });
  });
}

}  // namespace

void register_softmax_cpu() {
  register_kernel(OpId::softmax, DeviceType::CPU, softmax_kernel<false>);
  register_kernel(OpId::log_softmax, DeviceType::CPU, softmax_kernel<true>);
  register_kernel(OpId::softmax_backward, DeviceType::CPU, softmax_backward_kernel<false>);
  register_kernel(OpId::log_softmax_backward, DeviceType::CPU, softmax_backward_kernel<true>);
  register_kernel(OpId::cross_entropy, DeviceType::CPU, cross_entropy_kernel);
  register_kernel(OpId::cross_entropy_backward, DeviceType::CPU, cross_entropy_backward_kernel);
  register_kernel(OpId::bce_with_logits, DeviceType::CPU, bce_kernel);
  register_kernel(OpId::bce_with_logits_backward, DeviceType::CPU, bce_backward_kernel);
}

}  // namespace ampforge::cpu
