// Finite-difference gradient checker; see gradcheck.h for the contract.
#include "ampforge/autograd/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ampforge/autograd/node.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"

namespace ampforge::autograd {

namespace {

// An F64 copy of x that keeps x's memory order when x is dense (a permutation of a contiguous layout:
// transposed, channels-last), so kernels see the same kind of strides in F64 as in the original dtype.
Tensor to_f64_keep_layout(const Tensor& x) {
  const int nd = x.dim();
  std::vector<int64_t> order(static_cast<size_t>(nd));
  std::iota(order.begin(), order.end(), 0);
  // Outermost first: larger stride first; size-1 dims do not matter, keep their relative position.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (x.shape()[a] == 1 || x.shape()[b] == 1) return false;
    return x.strides()[a] > x.strides()[b];
  });
  Shape pshape;
  for (int64_t d : order) pshape.push_back(x.shape()[d]);
  const Strides want = contiguous_strides(pshape);
  bool dense = true;
  for (int i = 0; i < nd; ++i)
    if (pshape[i] != 1 && x.strides()[order[i]] != want[i]) dense = false;
  Tensor y;
  if (dense) {
    std::vector<int64_t> inv(static_cast<size_t>(nd));
    for (int i = 0; i < nd; ++i) inv[order[i]] = i;
    y = ops::permute(Tensor::empty(pshape, DType::F64), inv);
  } else {
    y = Tensor::empty(x.shape(), DType::F64);
  }
  ops::copy_(y, x);
  return y;
}

// Storage offsets (in elements) of every element of t in row-major logical order.
std::vector<int64_t> element_offsets(const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<int64_t> offs(static_cast<size_t>(n));
  const int nd = t.dim();
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  int64_t off = t.offset();
  for (int64_t i = 0; i < n; ++i) {
    offs[static_cast<size_t>(i)] = off;
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < t.shape()[d]) {
        off += t.strides()[d];
        break;
      }
      off -= t.strides()[d] * (t.shape()[d] - 1);
      idx[d] = 0;
    }
  }
  return offs;
}

std::string multi_index(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(static_cast<size_t>(s.size()));
  for (int d = s.size() - 1; d >= 0; --d) {
    idx[d] = s[d] == 0 ? 0 : flat % s[d];
    flat = s[d] == 0 ? 0 : flat / s[d];
  }
  return Shape(idx).str();
}

double weighted_sum(const Tensor& out, const Tensor& w) {
  return ops::sum(ops::mul(out, w)).item();
}

}  // namespace

GradcheckReport gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& opts) {
  const ToleranceEntry& tol = gradcheck_tolerance();
  const double h = opts.step > 0 ? opts.step : tol.fd_step;
  const double rtol = opts.rtol > 0 ? opts.rtol : tol.rtol, atol = opts.atol > 0 ? opts.atol : tol.atol;

  // F64 copies; the checked ones become leaves that require grad.
  std::vector<Tensor> xs;
  std::vector<int> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    const bool keep = std::find(opts.keep_dtype.begin(), opts.keep_dtype.end(), static_cast<int>(i)) != opts.keep_dtype.end();
    if (!x.defined() || !x.is_floating_point() || keep) {
      xs.push_back(x);
      continue;
    }
    AF_CHECK(x.device().is_cpu(), "gradcheck: input {} is on {}; gradcheck runs on the CPU", i, x.device().str());
    Tensor y = to_f64_keep_layout(x.detach());
    if (x.requires_grad()) {
      y.requires_grad_(true);
      checked.push_back(static_cast<int>(i));
    }
    xs.push_back(y);
  }
  AF_CHECK(!checked.empty(), "gradcheck: no floating input requires grad; nothing to check");

  // Analytic: grad of sum(out * W) = autograd::grad(out, inputs, W).
  Tensor out = fn(xs);
  AF_CHECK(out.defined() && out.dtype() == DType::F64,
           "gradcheck: fn returned {} for F64 inputs; the check needs an F64 output",
           out.defined() ? std::string(dtype_name(out.dtype())) : std::string("an undefined tensor"));
  Generator gen(opts.seed);
  const Tensor w = ops::randn(out.shape(), DType::F64, kCPU, &gen);
  std::vector<Tensor> leaves;
  for (int i : checked) leaves.push_back(xs[i]);
  std::vector<Tensor> analytic = out.requires_grad() ? grad({out}, leaves, {w}) : std::vector<Tensor>(leaves.size());

  GradcheckReport report;
  NoGradGuard no_grad;
  std::vector<Tensor> plain;  // the same storages without the autograd flags, for the FD evaluations
  for (const Tensor& x : xs) plain.push_back(x.defined() ? x.detach() : x);
  for (size_t k = 0; k < checked.size(); ++k) {
    const int i = checked[k];
    Tensor x = plain[i];
    GradcheckInputReport r;
    r.index = i;
    r.shape = x.shape();
    Tensor a = analytic[k].defined() ? ops::contiguous(ops::to_dtype(analytic[k], DType::F64))
                                     : ops::zeros(x.shape(), DType::F64);
    if (a.shape() != x.shape()) {
      r.ok = report.ok = false;
      report.message += fmt::format("gradcheck: analytic gradient of input {} has shape {}, the input has {}\n", i,
                                    a.shape().str(), x.shape().str());
      report.inputs.push_back(r);
      continue;
    }
    const double* ap = a.data<double>();
    const std::vector<int64_t> offs = element_offsets(x);
    double* base = static_cast<double*>(x.storage()->data());
    std::vector<double> num(offs.size());
    for (size_t e = 0; e < offs.size(); ++e) {
      double& v = base[offs[e]];
      const double orig = v;
      v = orig + h;
      const double fp = weighted_sum(fn(plain), w);
      v = orig - h;
      const double fm = weighted_sum(fn(plain), w);
      v = orig;
      num[e] = (fp - fm) / (2 * h);
    }
    double scale = 1;
    for (double n : num) scale = std::max(scale, std::abs(n));
    double worst = -1;
    for (size_t e = 0; e < num.size(); ++e) {
      const double err = std::abs(ap[e] - num[e]);
      if (!(err <= atol * scale + rtol * std::abs(num[e]))) r.ok = false;  // NaN fails too
      r.max_abs_err = std::max(r.max_abs_err, std::isnan(err) ? INFINITY : err);
      const double rel = std::isnan(err) ? INFINITY : err / std::max(std::abs(num[e]), scale);
      r.max_rel_err = std::max(r.max_rel_err, rel);
      const double scaled = std::isnan(err) ? INFINITY : err / (atol * scale + rtol * std::abs(num[e]));
      if (scaled > worst) {
        worst = scaled;
        r.worst_element = static_cast<int64_t>(e);
        r.analytic_at_worst = ap[e];
        r.numerical_at_worst = num[e];
      }
    }
    if (!r.ok) {
      report.ok = false;
      const double n = r.numerical_at_worst;
      report.message += fmt::format(
          "gradcheck failed for input {} (shape {}) at element {} (index {}): analytic {:.10g}, numerical {:.10g}, "
          "|diff| {:.3g} > atol*scale + rtol*|numerical| = {:.3g} (atol {:.3g}, rtol {:.3g}, scale {:.3g}, step {:.3g})\n",
          i, x.shape().str(), r.worst_element, multi_index(x.shape(), r.worst_element), r.analytic_at_worst, n,
          std::abs(r.analytic_at_worst - n), atol * scale + rtol * std::abs(n), atol, rtol, scale, h);
    }
    report.inputs.push_back(r);
  }
  return report;
}

}  // namespace ampforge::autograd
