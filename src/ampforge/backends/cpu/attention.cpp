// CPU fused attention and its backward. Contract: core/attrs.h (AttentionAttrs); ops/attention.cpp has made
// q, k, v (and grad_out, out) contiguous (N, T, D) and given the mask as a strided (N1, N2, Tq, Tk) Bool view.
//
// Arithmetic runs in float for F32/F16/BF16 (16-bit operands are converted once per batch slice, results
// rounded once) and in double for F64 (the parity harness's finite-difference checks).
//   attention            parallel over (n, query row): scores of the row (one Tk-long buffer, never the
//                        (Tq, Tk) matrix), max, exp, sum, then the weighted sum of value rows.
//   attention_backward   pass 1, parallel over (n, query row): delta_i = dO_i . O_i, dq_i = scale sum_j dS_ij k_j.
//                        pass 2, parallel over (n, key row): dv_j = sum_i P_ij dO_i, dk_j = scale sum_i dS_ij q_i,
//                        P recomputed from q, k and the saved lse.
// Every output element is one fixed sequence of additions: the same bits for any thread count.
#include <cmath>
#include <limits>
#include <vector>

#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cpu {
namespace {

// The mask as the kernels read it (null: no mask).
struct MaskView {
  const bool* p = nullptr;
  int64_t n2 = 1, s0 = 0, s1 = 0, si = 0, sj = 0;
  const bool* row(int64_t n, int64_t i) const { return p + (n / n2) * s0 + (n % n2) * s1 + i * si; }
};

MaskView mask_view(const KernelArgs& a, size_t index) {
  MaskView m;
  if (a.inputs.size() <= index) return m;
  const Tensor& t = a.in(index);
  m.p = static_cast<const bool*>(t.data_ptr());
  m.n2 = t.size(1);
  m.s0 = t.stride(0);
  m.s1 = t.stride(1);
  m.si = t.stride(2);
  m.sj = t.stride(3);
  return m;
}

// A (T, D) slice of batch n of a contiguous (N, T, D) tensor, in the compute type A: the memory itself when
// the storage type is A, else a converted copy (refreshed when the batch changes).
template <class S, class A>
class Slice {
 public:
  Slice(const S* base, int64_t T, int64_t D) : base_(base), T_(T), D_(D) {}
  const A* get(int64_t n) {
    const S* p = base_ + n * T_ * D_;
    if constexpr (std::is_same_v<S, A>) {
      return p;
    } else {
      if (n != n_) {
        buf_.resize(static_cast<size_t>(T_ * D_));
        load_n<S, A>(p, buf_.data(), T_ * D_);
        n_ = n;
      }
      return buf_.data();
    }
  }

 private:
  const S* base_;
  int64_t T_, D_;
  int64_t n_ = -1;
  std::vector<A> buf_;
};

template <class A>
inline A dot(const A* x, const A* y, int64_t n) {
  A s = 0;
  for (int64_t c = 0; c < n; ++c) s += x[c] * y[c];
  return s;
}

inline bool attends(const MaskView& m, const bool* mrow, bool causal, int64_t i, int64_t j) {
  if (causal && j > i) return false;
  return m.p == nullptr || mrow[j * m.sj];
}

int64_t grain_for(int64_t work_per_item) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(work_per_item, 1)); }

void attention_kernel(const KernelArgs& a) {
  const Tensor &q = a.in(0), &k = a.in(1), &v = a.in(2), &out = a.out(0), &lse = a.out(1);
  const AttentionAttrs& at = a.attr<AttentionAttrs>();
  const MaskView mv = mask_view(a, 3);
  const int64_t N = q.size(0), Tq = q.size(1), D = q.size(2), Tk = k.size(1), Dv = v.size(2);
  visit_float(q.dtype(), "attention", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* qp = static_cast<const S*>(q.data_ptr());
    const S* kp = static_cast<const S*>(k.data_ptr());
    const S* vp = static_cast<const S*>(v.data_ptr());
    S* op = static_cast<S*>(out.data_ptr());
    A* lp = static_cast<A*>(lse.data_ptr());  // F32 lse for float compute, F64 for double
    const A scale = static_cast<A>(at.scale);
    const A ninf = -std::numeric_limits<A>::infinity();
    parallel_for(N * Tq, grain_for(Tk * (D + Dv)), [&](int64_t r0, int64_t r1) {
      Slice<S, A> ks(kp, Tk, D), vs(vp, Tk, Dv);
      std::vector<A> qrow(static_cast<size_t>(D)), s(static_cast<size_t>(Tk)), o(static_cast<size_t>(Dv));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / Tq, i = r % Tq;
        const A* kn = ks.get(n);
        const A* vn = vs.get(n);
        load_n<S, A>(qp + r * D, qrow.data(), D);
        const bool* mrow = mv.p ? mv.row(n, i) : nullptr;
        A m = ninf;
        bool nan = false;
        for (int64_t j = 0; j < Tk; ++j) {
          if (!attends(mv, mrow, at.causal, i, j)) {
            s[j] = ninf;
            continue;
          }
          s[j] = dot(qrow.data(), kn + j * D, D) * scale;
          if (s[j] != s[j]) nan = true;
          m = s[j] > m ? s[j] : m;
        }
        std::fill(o.begin(), o.end(), A(0));
        if (m == ninf || nan) {  // every key masked (the softmax of all -inf) or NaN scores: NaN, as the composite
          const A qnan = std::numeric_limits<A>::quiet_NaN();
          std::fill(o.begin(), o.end(), qnan);
          lp[r] = nan ? qnan : ninf;
        } else {
          A sum = 0;
          for (int64_t j = 0; j < Tk; ++j) {
            if (s[j] == ninf) continue;
            const A p = std::exp(s[j] - m);
            sum += p;
            const A* vj = vn + j * Dv;
            for (int64_t c = 0; c < Dv; ++c) o[c] += p * vj[c];
          }
          const A inv = A(1) / sum;
          for (int64_t c = 0; c < Dv; ++c) o[c] *= inv;
          lp[r] = m + std::log(sum);
        }
        store_n<S, A>(o.data(), op + r * Dv, Dv);
      }
    });
  });
}

void attention_backward_kernel(const KernelArgs& a) {
  const Tensor &go = a.in(0), &q = a.in(1), &k = a.in(2), &v = a.in(3), &o = a.in(4), &lse = a.in(5);
  const Tensor &dq = a.out(0), &dk = a.out(1), &dv = a.out(2);
  const AttentionAttrs& at = a.attr<AttentionAttrs>();
  const MaskView mv = mask_view(a, 6);
  const int64_t N = q.size(0), Tq = q.size(1), D = q.size(2), Tk = k.size(1), Dv = v.size(2);
  visit_float(q.dtype(), "attention_backward", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* gp = static_cast<const S*>(go.data_ptr());
    const S* qp = static_cast<const S*>(q.data_ptr());
    const S* kp = static_cast<const S*>(k.data_ptr());
    const S* vp = static_cast<const S*>(v.data_ptr());
    const S* opp = static_cast<const S*>(o.data_ptr());
    const A* lp = static_cast<const A*>(lse.data_ptr());
    S* dqp = static_cast<S*>(dq.data_ptr());
    S* dkp = static_cast<S*>(dk.data_ptr());
    S* dvp = static_cast<S*>(dv.data_ptr());
    const A scale = static_cast<A>(at.scale);
    const A ninf = -std::numeric_limits<A>::infinity();
    std::vector<A> delta(static_cast<size_t>(N * Tq));
    // Pass 1: delta and dq, one query row per item.
    parallel_for(N * Tq, grain_for(Tk * (D + Dv)), [&](int64_t r0, int64_t r1) {
      Slice<S, A> ks(kp, Tk, D), vs(vp, Tk, Dv);
      std::vector<A> qrow(static_cast<size_t>(D)), grow(static_cast<size_t>(Dv)), orow(static_cast<size_t>(Dv)),
          acc(static_cast<size_t>(D));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / Tq, i = r % Tq;
        const A* kn = ks.get(n);
        const A* vn = vs.get(n);
        load_n<S, A>(qp + r * D, qrow.data(), D);
        load_n<S, A>(gp + r * Dv, grow.data(), Dv);
        load_n<S, A>(opp + r * Dv, orow.data(), Dv);
        const A di = dot(grow.data(), orow.data(), Dv);
        delta[static_cast<size_t>(r)] = di;
        const A li = lp[r];
        const bool* mrow = mv.p ? mv.row(n, i) : nullptr;
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t j = 0; j < Tk; ++j) {
          if (!attends(mv, mrow, at.causal, i, j)) continue;  // dS = 0 where masked
          const A p = std::exp(dot(qrow.data(), kn + j * D, D) * scale - li);
          const A ds = p * (dot(grow.data(), vn + j * Dv, Dv) - di);
          const A* kj = kn + j * D;
          for (int64_t c = 0; c < D; ++c) acc[c] += ds * kj[c];
        }
        for (int64_t c = 0; c < D; ++c) acc[c] *= scale;
        store_n<S, A>(acc.data(), dqp + r * D, D);
      }
    });
    // Pass 2: dk and dv, one key row per item, summing over every query row in order.
    parallel_for(N * Tk, grain_for(Tq * (D + Dv)), [&](int64_t r0, int64_t r1) {
      Slice<S, A> qs(qp, Tq, D), gs(gp, Tq, Dv);
      std::vector<A> krow(static_cast<size_t>(D)), vrow(static_cast<size_t>(Dv)), ak(static_cast<size_t>(D)),
          av(static_cast<size_t>(Dv));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / Tk, j = r % Tk;
        const A* qn = qs.get(n);
        const A* gn = gs.get(n);
        load_n<S, A>(kp + r * D, krow.data(), D);
        load_n<S, A>(vp + r * Dv, vrow.data(), Dv);
        std::fill(ak.begin(), ak.end(), A(0));
        std::fill(av.begin(), av.end(), A(0));
        for (int64_t i = 0; i < Tq; ++i) {
          const A li = lp[n * Tq + i];
          const A* gi = gn + i * Dv;
          const bool* mrow = mv.p ? mv.row(n, i) : nullptr;
          if (!attends(mv, mrow, at.causal, i, j)) {
            // P = exp(-inf - lse): 0, or NaN when the whole row is masked (lse = -inf), as in the composite.
            if (!(li > ninf)) {
              const A p = std::exp(ninf - li);
              for (int64_t c = 0; c < Dv; ++c) av[c] += p * gi[c];
            }
            continue;
          }
          const A* qi = qn + i * D;
          const A p = std::exp(dot(qi, krow.data(), D) * scale - li);
          for (int64_t c = 0; c < Dv; ++c) av[c] += p * gi[c];
          const A ds = p * (dot(gi, vrow.data(), Dv) - delta[static_cast<size_t>(n * Tq + i)]);
          for (int64_t c = 0; c < D; ++c) ak[c] += ds * qi[c];
        }
        for (int64_t c = 0; c < D; ++c) ak[c] *= scale;
        store_n<S, A>(ak.data(), dkp + r * D, D);
        store_n<S, A>(av.data(), dvp + r * Dv, Dv);
      }
    });
  });
}

}  // namespace

void register_attention_cpu() {
  register_kernel(OpId::attention, DeviceType::CPU, attention_kernel);
  register_kernel(OpId::attention_backward, DeviceType::CPU, attention_backward_kernel);
}

}  // namespace ampforge::cpu
