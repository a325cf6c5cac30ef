// The one per-dtype tolerance table. Every numerical comparison in the tests (parity with PyTorch,
// finite-difference gradient checks, backend-vs-CPU checks) takes its rtol/atol from here; a test that
// needs something else must say why next to the call.
//
// Definitions (p = significand precision in bits, counting the implicit bit):
//   eps            machine epsilon 2^(1-p): the gap between 1 and the next representable number.
//   unit_roundoff  u = eps / 2 = 2^-p: the largest relative error of one round-to-nearest.
//   dtype  p   eps      u
//   F64    53  2^-52    2^-53
//   F32    24  2^-23    2^-24    (DESIGN.md's "F32 eps 2^-23")
//   F16    11  2^-10    2^-11    (DESIGN.md's "F16 2^-11" is u)
//   BF16    8  2^-7     2^-8     (DESIGN.md's "BF16 2^-8 unit roundoff")
//
// Comparison rule (tolerance_close): |actual - expected| <= atol * scale + rtol * |expected|, where scale
// is max(1, max |expected| over the tensor). atol is relative to the tensor's magnitude because rounding
// errors of sums and products are proportional to the magnitude of their terms, not of the (possibly
// cancelled) result; with scale >= 1 it is at least an absolute floor for tiny tensors.
//
// rtol = atol = factor * eps. The factors (two implementations of the same op, e.g. ampforge vs PyTorch,
// both computing in the given dtype):
//   F32  factor 8 (rtol 9.5e-7). Both sides accumulate in F32 (or wider) but in different orders and with
//        different formulas (fused vs composed backward). A recursively summed n-term sum or dot product has
//        error <= n*u*sum|terms| in the worst case (Higham, Accuracy and Stability, ch. 3) and ~sqrt(n)*u in
//        practice; the parity samples keep n <= 256 terms, so sqrt(n)*u <= 16u = 8 eps.
//   F16  factor 8 (rtol 7.8e-3), BF16 factor 8 (rtol 6.3e-2). PyTorch's CPU kernels and ours both compute
//        16-bit ops in F32 and round each op's output once (1 eps apart when the two F32 values straddle a
//        rounding boundary). Our composite functions and backward formulas are chains of ops, each rounding
//        to 16 bits, where PyTorch often has one fused kernel: a chain of k roundings adds up to k*u. Our
//        longest chains (softmax/log_softmax/norm backward, attention) have ~8 roundings -> 8u = 4 eps, plus
//        1 eps for the final rounding on each side, doubled for gradients of products of rounded
//        operands: 8 eps.
//   F64  factor 8, as F32 (only to compare two F64 computations that differ in order).
//   Integer/bool dtypes: exact (0).
// Measured on the parity samples (AMPFORGE_PARITY_VERBOSE=1 ampforge_parity_harness prints every ratio
// error / bound): the worst errors are 1.5 eps in F32 (a 256-term sum, conv2d gradients), 0.5 eps in F16
// and 1.4 eps in BF16 (rsqrt gradient, attention, conv2d/matmul with K = 27..64), i.e. at most ~1/5 of
// the bounds above, so a real bug (errors of O(1) relative) cannot hide under them.
//
// Finite differences (gradcheck in F64), a separate row because the error is not one rounding:
//   step h = 2^-17 (~ eps64^(1/3), which balances the truncation error h^2*|f'''|/6 against the rounding
//   error eps64*|L|/h of a central difference; a power of two keeps x +- h and the division by 2h exact).
//   Error bound: 2^-35*|L| + 2^-36*|f'''|. Our samples keep |L| (sum of |out * w|) and |f'''| below ~2^12,
//   which gives <= 2^-23 + 2^-24 ~ 1.8e-7; tolerance rtol = atol = 2^-20 (9.5e-7) leaves a margin of ~5x
//   over the bound while a wrong backward formula is off by O(1). Measured on the parity samples: worst
//   |analytic - numerical| 3e-9 (conv2d weight gradient), worst error / scale 3e-10.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "ampforge/core/dtype.h"

namespace ampforge {

struct ToleranceEntry {
  DType dtype;
  int precision_bits;    // p
  double eps;            // 2^(1-p)
  double unit_roundoff;  // 2^-p
  double factor;         // rtol = atol = factor * eps (justified in the header comment)
  double rtol, atol;
  double fd_step;        // finite-difference step (gradcheck row only; 0 elsewhere)
};

namespace detail {
constexpr double pow2(int e) { return e >= 0 ? double(1ull << e) : 1.0 / double(1ull << -e); }
constexpr ToleranceEntry tol_row(DType d, int p, double factor) {
  return {d, p, pow2(1 - p), pow2(-p), factor, factor * pow2(1 - p), factor * pow2(1 - p), 0.0};
}
}  // namespace detail

// Comparison of two implementations computing in `dtype`. Integer and bool dtypes compare exactly.
constexpr ToleranceEntry tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return detail::tol_row(DType::F64, 53, 8);
    case DType::F32: return detail::tol_row(DType::F32, 24, 8);
    case DType::F16: return detail::tol_row(DType::F16, 11, 8);
    case DType::BF16: return detail::tol_row(DType::BF16, 8, 8);
    default: return {dtype, 0, 0, 0, 0, 0, 0, 0};
  }
}

// Finite-difference gradient checks in F64 (see the derivation above).
inline const ToleranceEntry& gradcheck_tolerance() {
  static const ToleranceEntry e = {DType::F64, 53, detail::pow2(-52), detail::pow2(-53), detail::pow2(32),
                                   detail::pow2(-20), detail::pow2(-20), detail::pow2(-17)};
  return e;
}

// Outcome of tolerance_close; scale is the comparison rule's max(1, max |expected|).
struct CloseResult {
  bool ok = true;
  double max_abs_err = 0;    // max |actual - expected|
  double max_ratio = 0;      // max |actual - expected| / (atol*scale + rtol*|expected|): <= 1 passes
  int64_t worst = -1;        // flat index of the element with the largest ratio
  double actual_at_worst = 0, expected_at_worst = 0;
  int64_t mismatches = 0;
  double scale = 1;
};

// Compares two equally long sequences of values with the rule above (NaN matches NaN only, inf matches
// the same inf).
template <class GetA, class GetE>
CloseResult tolerance_close(int64_t n, GetA actual, GetE expected, double rtol, double atol) {
  CloseResult r;
  for (int64_t i = 0; i < n; ++i) {
    const double e = expected(i);
    if (std::isfinite(e)) r.scale = std::max(r.scale, std::abs(e));
  }
  for (int64_t i = 0; i < n; ++i) {
    const double a = actual(i), e = expected(i);
    double ratio;
    if (std::isnan(e) || std::isnan(a) || std::isinf(e) || std::isinf(a)) {
      const bool same = (std::isnan(e) && std::isnan(a)) || a == e;
      ratio = same ? 0 : INFINITY;
    } else {
      const double err = std::abs(a - e), bound = atol * r.scale + rtol * std::abs(e);
      r.max_abs_err = std::max(r.max_abs_err, err);
      ratio = bound > 0 ? err / bound : (err == 0 ? 0 : INFINITY);
    }
    if (ratio > 1) ++r.mismatches;
    if (ratio > r.max_ratio || r.worst < 0) {
      r.max_ratio = ratio;
      r.worst = i;
      r.actual_at_worst = a;
      r.expected_at_worst = e;
    }
  }
  r.ok = r.mismatches == 0;
  return r;
}

}  // namespace ampforge
