// CPU normalisation kernels: batch_norm, batch_norm_backward, layer_norm, layer_norm_backward.
//
// Contracts (ops/norm.cpp has validated and laid out the operands):
//   batch_norm           in: x (N, C, *), weight (C) | undef, bias (C) | undef, running_mean (C) | undef,
//                        running_var (C) | undef.   out: y (like x), save_mean (C), save_invstd (C).
//                        Training: batch statistics (biased variance) normalise; running stats, when given,
//                        are updated in place with momentum and the UNBIASED variance (PyTorch semantics).
//                        Eval: the running statistics normalise, and save_mean/save_invstd receive them, so
//                        the backward kernel reads one pair of statistics in both modes.
//                        in(5) residual | undef (layout of x): y = act(bn(x) + residual), act None or ReLU.
//   batch_norm_backward  in: grad (layout of x), x, weight | undef, save_mean, save_invstd, bias | undef,
//                        y | undef (the forward's output: residual form, the ReLU mask is y > 0).
//                        out: grad_input | undef, grad_weight | undef, grad_bias | undef, grad_residual
//                        (residual form only: the gradient before the activation, which is the residual's)
//                        (each written only when defined; all overwritten, never accumulated).
//   layer_norm           in: x (M, N...) contiguous, weight | undef, bias | undef (normalised shape).
//                        out: y contiguous, mean (M), rstd (M).
//   layer_norm_backward  in: grad, x, mean, rstd, weight | undef.  out: grad_input, grad_weight, grad_bias
//                        (each optional).
// Statistics (save_mean, save_invstd, mean, rstd) are F32 for F32/F16/BF16 inputs and F64 for F64; weight,
// bias and running stats may be any floating dtype (read and written through double).
//
// Layouts for batch_norm, chosen from x's strides (ops/ hands over x contiguous or channels-last, and y,
// grad, grad_input in the same layout as x):
//   planes  x contiguous (N, C, *): the I = prod(*) elements of (n, c) are one contiguous run;
//   rows    x channels-last (N, H, W, C), or I == 1: R = N*H*W rows of C contiguous channels, so per-channel
//           sums vectorise over C.
// Determinism: per-channel sums are shifted sums (shift = the channel's first element, which removes most
// of the cancellation of E[x^2] - E[x]^2) accumulated in double over FIXED blocks of the data; block
// partials are added in block order. The partition depends only on the shape, so every statistic (and
// so every output) is bit-identical for any thread count.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/norm_paths.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/backends/cpu/vec_math.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cpu {
namespace {

// Elements per statistics block. Fixed (never derived from the thread count): see the file comment.
constexpr int64_t kBlockElems = 16384;

template <class S>
inline double to_d(S v) {
  return static_cast<double>(static_cast<compute_t<S>>(v));
}

template <class S>
inline S from_d(double v) {
  if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
    return S(static_cast<float>(v));
  else
    return static_cast<S>(v);
}

// A 1-D parameter/statistics vector (any float dtype, any stride) as doubles; `fill` when undefined.
std::vector<double> load_vec(const Tensor& t, int64_t n, double fill) {
  std::vector<double> v(static_cast<size_t>(n), fill);
  if (!t.defined()) return v;
  visit_float(t.dtype(), "norm parameter", [&](auto tag) {
    using S = decltype(tag);
    const S* p = static_cast<const S*>(t.data_ptr());
    const int64_t st = t.dim() == 0 ? 0 : t.stride(t.dim() - 1);
    for (int64_t i = 0; i < n; ++i) v[i] = to_d(p[i * st]);
  });
  return v;
}

// Writes doubles into a 1-D (or any contiguous) float tensor of n elements.
void store_vec(const Tensor& t, const std::vector<double>& v) {
  visit_float(t.dtype(), "norm output", [&](auto tag) {
    using S = decltype(tag);
    S* p = static_cast<S*>(t.data_ptr());
    const int64_t st = t.dim() == 0 ? 0 : t.stride(t.dim() - 1);
    for (size_t i = 0; i < v.size(); ++i) p[static_cast<int64_t>(i) * st] = from_d<S>(v[i]);
  });
}

// Elements of storage type S at p as compute type A: the memory itself when the types agree, else
// converted into buf (which must hold n elements).
template <class S, class A>
inline const A* as_compute(const S* p, A* buf, int64_t n) {
  if constexpr (std::is_same_v<S, A>) {
    return p;
  } else {
    load_n<S, A>(p, buf, n);
    return buf;
  }
}

// ---- batch norm ------------------------------------------------------------------------------------

std::atomic<bool> g_bn_fused{true};

struct BnShape {
  int64_t outer = 0;  // planes: N; rows: number of rows (N*H*W)
  int64_t C = 0;
  int64_t inner = 1;  // planes: elements per (n, c) run; rows: 1
  bool rows = false;
  int64_t count() const { return outer * inner; }  // elements per channel
};

BnShape bn_shape(const Tensor& x) {
  BnShape s;
  s.C = x.size(1);
  int64_t spatial = 1;
  for (int d = 2; d < x.dim(); ++d) spatial *= x.size(d);
  if (x.is_contiguous()) {
    s.outer = x.size(0);
    s.inner = spatial;
    s.rows = spatial == 1;
  } else {
    AF_ASSERT(x.is_contiguous(MemoryFormat::ChannelsLast), "batch_norm: x {} must be contiguous or channels-last",
              x.shape().str());
    s.outer = x.size(0) * spatial;
    s.inner = 1;
    s.rows = true;
  }
  return s;
}

void check_same_layout(const Tensor& t, const Tensor& x, const char* what) {
  const bool ok = x.is_contiguous() ? t.is_contiguous() : t.is_contiguous(MemoryFormat::ChannelsLast);
  AF_ASSERT(ok && t.shape() == x.shape(), "{}: operand {} is not laid out like x {}", what, t.shape().str(),
            x.shape().str());
}

// Rows layout: the kernels move whole tiles of rows (about 1024 values in channel_apply, a statistics block of about
// 16384 in channel_sums) per step, so that a small C (YOLOv8n's 16- and 32-channel stages) does not pay per-row
// overheads (a loader call, an exp call on 16 values) 51200 times. Per-channel vectors are tiled to match: element i
// of a tile has channel i % C.
inline int64_t rows_per_tile(int64_t C) { return std::max<int64_t>(1, 1024 / std::max<int64_t>(C, 1)); }
// channel_sums' statistics blocks, which are also its tiles (see there): a loader that takes tiled per-channel
// vectors and feeds both channel_sums and channel_apply needs them tiled this many rows.
inline int64_t rows_per_block(int64_t C) { return std::max<int64_t>(1, kBlockElems / std::max<int64_t>(C, 1)); }

template <class A>
std::vector<A> tiled(const A* v, int64_t C, int64_t rows) {
  std::vector<A> t(static_cast<size_t>(C * rows));
  for (int64_t r = 0; r < rows; ++r) std::copy(v, v + C, t.begin() + r * C);
  return t;
}

// Loaders hand the kernels below the "a" operand as compute-type values. Call: load(off, n, c, buf) with
// off the element offset, n the count and c the channel of all n elements (planes) or -1 when element i is
// channel i % C (rows: whole rows, at most a tile; per-channel vectors are tiled); the result points at the
// values (the memory itself, or buf).
template <class S>
struct PlainLoad {
  using A = compute_t<S>;
  const S* p;
  const A* operator()(int64_t off, int64_t n, int64_t, A* buf) const { return as_compute<S, A>(p + off, buf, n); }
};

// y = act(y) in place over n values; t is scratch of n.
template <NormAct kAct, class A>
inline void act_n(A* y, A* t, int64_t n) {
  if constexpr (kAct == NormAct::ReLU) {
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] > A(0) ? y[i] : A(0);
  } else if constexpr (kAct == NormAct::SiLU) {
    vmath::sigmoid(y, t, n);  // as the silu kernels (elementwise.cpp): fused and separate ops agree
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] * t[i];
  }
}

// The gradient before the activation, dz = g * act'(z) with z = x * scale[c] + shift[c] recomputed from the
// saved input (the forward's y = act(z) is not kept). Per-thread scratch: loaders are called per row/chunk.
// store (grad_input itself when S == A; for 16-bit S an F32 buffer of x's size): also write dz there, in the compute
// type, at the same offsets, so that a later pass reads it instead of recomputing it; SiLU's backward does this, its
// exp costs more than the extra pass of memory (measured on BF16 YOLOv8s: docs/PERFORMANCE.md).
template <class S, NormAct kAct>
struct ActGradLoad {
  using A = compute_t<S>;
  const S* g;
  const S* x;
  const A* scale;
  const A* shift;
  A* store = nullptr;
  const A* operator()(int64_t off, int64_t n, int64_t c, A* buf) const {
    if (store != nullptr) buf = store + off;
    thread_local std::vector<A> xs, zs;
    if (static_cast<int64_t>(xs.size()) < n) {
      xs.resize(static_cast<size_t>(n));
      zs.resize(static_cast<size_t>(n));
    }
    const A* xv = as_compute<S, A>(x + off, xs.data(), n);
    const A* gv = as_compute<S, A>(g + off, buf, n);  // may be the memory itself: written to buf below
    if constexpr (kAct == NormAct::ReLU) {
      // One loop, z never stored. g loaded unconditionally: `z > 0 ? g[i] : 0` lets GCC load g under the mask
      // only, a masked load that merges into the previous iteration's register (a dependency chain through
      // memory: half the speed of this pass).
      if (c < 0) {
        for (int64_t i = 0; i < n; ++i) {
          const A gi = gv[i];
          buf[i] = xv[i] * scale[i] + shift[i] > A(0) ? gi : A(0);
        }
      } else {
        const A sc = scale[c], sh = shift[c];
        for (int64_t i = 0; i < n; ++i) {
          const A gi = gv[i];
          buf[i] = xv[i] * sc + sh > A(0) ? gi : A(0);
        }
      }
      return buf;
    }
    A* z = zs.data();
    if (c < 0) {
      for (int64_t i = 0; i < n; ++i) z[i] = xv[i] * scale[i] + shift[i];
    } else {
      const A sc = scale[c], sh = shift[c];
      for (int64_t i = 0; i < n; ++i) z[i] = xv[i] * sc + sh;
    }
    A* s = xs.data();  // SiLU; x is no longer needed (when xv aliases x's memory, xs is unused scratch anyway)
    vmath::sigmoid(z, s, n);
    for (int64_t i = 0; i < n; ++i) buf[i] = gv[i] * s[i] * (A(1) + z[i] * (A(1) - s[i]));
    return buf;
  }
};

// Residual form: dz = g where the forward's output y > 0 (ReLU; every element without an activation), written to
// `store` in the storage type (a selection, so exact) and handed on in the compute type.
template <class S, NormAct kAct>
struct MaskLoad {
  using A = compute_t<S>;
  const S* g;
  const S* y;
  S* store;
  const A* operator()(int64_t off, int64_t n, int64_t, A* buf) const {
    S* d = store + off;
    const S* gp = g + off;
    if constexpr (kAct == NormAct::ReLU) {
      const S* yp = y + off;
      const S zero(0.0f);
      for (int64_t i = 0; i < n; ++i) {  // g loaded unconditionally: see ActGradLoad
        const S gi = gp[i];
        d[i] = static_cast<A>(yp[i]) > A(0) ? gi : zero;
      }
    } else {
      std::copy(gp, gp + n, d);
    }
    return as_compute<S, A>(d, buf, n);
  }
};

// Software prefetch. On the 2-vCPU VMs this was measured on, loops that do some arithmetic per cache line read from
// DRAM at 20-30 GB/s without it and 50-90 GB/s with it (the hardware prefetchers keep too few lines in flight), while
// a bare streaming loop gets the latter anyway: batch norm's statistics over (8, 64, 112, 112) ~1.6 -> ~0.7 ms
// (docs/PERFORMANCE.md). The loops prefetch about 8 KiB ahead in a stream, and at least 8 rows ahead where they walk
// down a tile's columns (a prefetch past the end of an array is harmless: it never faults).
constexpr int64_t kPrefetchFloats = 2048;
inline int64_t prefetch_rows(int64_t C) { return std::max<int64_t>(8, kPrefetchFloats / std::max<int64_t>(C, 1)); }

// channel_sums' rows loop for float data, 16 channels at a time with the sums in registers across the m rows of a
// tile: the same additions in the same order as the loop in channel_sums (each channel adds its rows one by one,
// starting from pu/puv), so the bits are those of that loop, without a store and reload of every accumulator per
// row. Returns how many channels (a multiple of 16) it did; the caller does the rest.
using V8d = double __attribute__((vector_size(64)));
using V8f = float __attribute__((vector_size(32)));
inline V8d load8d(const double* p) {
  V8d v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline V8d load8f(const float* p) {
  V8f v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, V8d);
}
inline void store8d(double* p, V8d v) { std::memcpy(p, &v, sizeof v); }
// kV vectors of 8 channels from c0: the partial sums and shifts into registers, and the sums back.
template <int kV>
inline void load_sums(const double* pu, const double* puv, const double* k, int64_t c0, V8d* su, V8d* suv, V8d* kv) {
  for (int j = 0; j < kV; ++j) {
    su[j] = load8d(pu + c0 + 8 * j);
    suv[j] = load8d(puv + c0 + 8 * j);
    kv[j] = load8d(k + c0 + 8 * j);
  }
}
template <int kV>
inline void store_sums(double* pu, double* puv, int64_t c0, const V8d* su, const V8d* suv) {
  for (int j = 0; j < kV; ++j) {
    store8d(pu + c0 + 8 * j, su[j]);
    store8d(puv + c0 + 8 * j, suv[j]);
  }
}

// The forward's statistics, where a is b and ka is kb (v = u): 64 channels at a time, 256 contiguous bytes of each
// row per pass over the tile instead of 64 (the accumulators and shifts take 24 of the 32 vector registers). Same
// additions in the same order. Batch norm + ReLU forward at (8, 64, 112, 112): 2.7-3.5 -> 1.3-2.0 ms (ad-hoc
// program, min of 15, three alternations; docs/PERFORMANCE.md).
int64_t sums_same_in_registers(const float* at, int64_t m, int64_t C, const double* ka, double* pu, double* puv) {
  constexpr int kV = 8;  // vectors of 8 doubles: 64 channels
  const int64_t ahead = prefetch_rows(C) * C;
  int64_t c0 = 0;
  for (; c0 + 8 * kV <= C; c0 += 8 * kV) {
    V8d su[kV], suv[kV], k[kV];
    load_sums<kV>(pu, puv, ka, c0, su, suv, k);
    for (int64_t r = 0; r < m; ++r) {
      const float* ar = at + r * C + c0;
      for (int j = 0; j < kV; j += 2) __builtin_prefetch(ar + ahead + 8 * j, 0, 3);
      for (int j = 0; j < kV; ++j) {
        const V8d u = load8f(ar + 8 * j) - k[j];
        su[j] += u;
        suv[j] += u * u;
      }
    }
    store_sums<kV>(pu, puv, c0, su, suv);
  }
  return c0;
}

int64_t sums_in_registers(const float* at, const float* bt, int64_t m, int64_t C, const double* ka, const double* kb,
                          double* pu, double* puv) {
  int64_t c0 = at == bt && ka == kb ? sums_same_in_registers(at, m, C, ka, pu, puv) : 0;
  const int64_t ahead = prefetch_rows(C) * C;
  for (; c0 + 16 <= C; c0 += 16) {
    V8d su0 = load8d(pu + c0), su1 = load8d(pu + c0 + 8), suv0 = load8d(puv + c0), suv1 = load8d(puv + c0 + 8);
    const V8d ka0 = load8d(ka + c0), ka1 = load8d(ka + c0 + 8), kb0 = load8d(kb + c0), kb1 = load8d(kb + c0 + 8);
    for (int64_t r = 0; r < m; ++r) {
      const float* ar = at + r * C + c0;
      const float* br = bt + r * C + c0;
      __builtin_prefetch(ar + ahead, 0, 3);
      if (br != ar) __builtin_prefetch(br + ahead, 0, 3);
      const V8d u0 = load8f(ar) - ka0, u1 = load8f(ar + 8) - ka1;
      const V8d v0 = load8f(br) - kb0, v1 = load8f(br + 8) - kb1;
      su0 += u0;
      su1 += u1;
      suv0 += u0 * v0;
      suv1 += u1 * v1;
    }
    store8d(pu + c0, su0), store8d(pu + c0 + 8, su1), store8d(puv + c0, suv0), store8d(puv + c0 + 8, suv1);
  }
  return c0;
}

// The rows layout's statistics blocks, shared by every kernel that sums per channel over rows (channel_sums and the
// fused backward below), so they share the partition and the order of additions: blocks of rows_per_block(C) rows,
// in parallel; block(t, m, pu, puv) adds rows [t, t + m) into its zeroed partials pu, puv (C values each), and the
// partials are added into su, suv in block order. The partition depends on the shape only: the same bits for any
// thread count. Each block's two accumulator rows start on a 64-byte boundary: the row loops add into them row after
// row, and a vector store that straddles two cache lines is not forwarded to the next row's load.
template <class Block>
void rows_block_sums(int64_t R, int64_t C, double* su, double* suv, const Block& block) {
  std::fill(su, su + C, 0.0);
  std::fill(suv, suv + C, 0.0);
  if (R == 0) return;
  const int64_t block_rows = rows_per_block(C);
  const int64_t nblk = (R + block_rows - 1) / block_rows;
  const int64_t Cp = (C + 7) / 8 * 8;
  std::vector<double> partial_mem(static_cast<size_t>(nblk * 2 * Cp + 8));
  double* const partial = partial_mem.data() + (8 - (reinterpret_cast<uintptr_t>(partial_mem.data()) / 8) % 8) % 8;
  parallel_for(nblk, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      double* pu = partial + blk * 2 * Cp;
      std::fill(pu, pu + 2 * Cp, 0.0);
      const int64_t t = blk * block_rows;
      block(t, std::min(R, t + block_rows) - t, pu, pu + Cp);
    }
  });
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const double* pu = partial + blk * 2 * Cp;
    for (int64_t c = 0; c < C; ++c) {
      su[c] += pu[c];
      suv[c] += pu[Cp + c];
    }
  }
}

// Per-channel sums over the data: su[c] = sum(u), suv[c] = sum(u * v), where u = a - ka[c] and
// v = b - kb[c] elementwise (a from load_a; a_is_b: a is b itself, loaded once). Fixed blocks, double
// accumulation.
template <class S, class LoadA>
void channel_sums(const BnShape& sh, const LoadA& load_a, bool a_is_b, const S* b, const double* ka,
                  const double* kb, double* su, double* suv) {
  using A = compute_t<S>;
  const int64_t C = sh.C;
  std::fill(su, su + C, 0.0);
  std::fill(suv, suv + C, 0.0);
  if (sh.count() == 0) return;
  if (sh.rows) {
    // A block is loaded whole (one loader call of up to ~16384 values), so that sums_in_registers keeps its
    // accumulators in registers across all its rows: with 1024-value tiles that was 1 to 4 rows for ResNet-50's 256-
    // to 2048-channel tensors (a reload and store of every accumulator per row or two). Each channel still adds its
    // rows one by one (same bits). Batch norm + ReLU forward and backward at (8, 1024, 14, 14) and (8, 2048, 7, 7):
    // ~15% faster (docs/PERFORMANCE.md).
    const int64_t block_values = C * rows_per_block(C);
    rows_block_sums(sh.outer, C, su, suv, [&](int64_t t, int64_t m, double* pu, double* puv) {
      thread_local std::vector<A> abuf, bbuf;  // per thread: a parallel_for task calls this once per block
      if (static_cast<int64_t>(abuf.size()) < block_values) {
        abuf.resize(static_cast<size_t>(block_values));
        bbuf.resize(static_cast<size_t>(block_values));
      }
      const A* at = load_a(t * C, m * C, -1, abuf.data());
      const A* bt = a_is_b ? at : as_compute<S, A>(b + t * C, bbuf.data(), m * C);
      int64_t c_done = 0;
      if constexpr (std::is_same_v<A, float>) c_done = sums_in_registers(at, bt, m, C, ka, kb, pu, puv);
      for (int64_t r = 0; r < m && c_done < C; ++r) {
        const A* ar = at + r * C;
        const A* br = bt + r * C;
        for (int64_t c = c_done; c < C; ++c) {
          const double u = static_cast<double>(ar[c]) - ka[c];
          const double v = static_cast<double>(br[c]) - kb[c];
          pu[c] += u;
          puv[c] += u * v;
        }
      }
    });
    return;
  }
  // planes: task (c, block of samples); a block covers about kBlockElems elements of one channel.
  const int64_t I = sh.inner, N = sh.outer;
  const int64_t per_block = std::max<int64_t>(1, kBlockElems / I);
  const int64_t nblk = (N + per_block - 1) / per_block;
  std::vector<double> partial(static_cast<size_t>(C * nblk * 2));
  parallel_for(C * nblk, 1, [&](int64_t t0, int64_t t1) {
    alignas(64) A abuf[kChunk];
    alignas(64) A bbuf[kChunk];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c = t / nblk, blk = t % nblk;
      const double k0 = ka[c], k1 = kb[c];
      double lu[8] = {}, luv[8] = {};
      const int64_t n1 = std::min(N, (blk + 1) * per_block);
      for (int64_t n = blk * per_block; n < n1; ++n) {
        const int64_t off = (n * C + c) * I;
        for (int64_t i0 = 0; i0 < I; i0 += kChunk) {
          const int64_t m = std::min(kChunk, I - i0);
          const A* ar = load_a(off + i0, m, c, abuf);
          const A* br = a_is_b ? ar : as_compute<S, A>(b + off + i0, bbuf, m);
          int64_t i = 0;
          for (; i + 8 <= m; i += 8)
            for (int l = 0; l < 8; ++l) {
              const double u = static_cast<double>(ar[i + l]) - k0;
              const double v = static_cast<double>(br[i + l]) - k1;
              lu[l] += u;
              luv[l] += u * v;
            }
          for (; i < m; ++i) {
            const double u = static_cast<double>(ar[i]) - k0;
            lu[0] += u;
            luv[0] += u * (static_cast<double>(br[i]) - k1);
          }
        }
      }
      double s0 = 0, s1 = 0;
      for (int l = 0; l < 8; ++l) {
        s0 += lu[l];
        s1 += luv[l];
      }
      partial[t * 2] = s0;
      partial[t * 2 + 1] = s1;
    }
  });
  for (int64_t c = 0; c < C; ++c)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      su[c] += partial[(c * nblk + blk) * 2];
      suv[c] += partial[(c * nblk + blk) * 2 + 1];
    }
}

// out = act(a * alpha[c] + gamma[c] [+ res])              (kTwo = false; res when not null)
// out = a * alpha[c] + (b - kb[c]) * beta[c] + gamma[c]   (kTwo = true; kAct must be None)
// a from load_a. Elementwise per channel, any partition (no cross-element arithmetic).
template <class S, bool kTwo, NormAct kAct = NormAct::None, class LoadA>
void channel_apply(const BnShape& sh, const LoadA& load_a, const S* b, S* out, const compute_t<S>* alpha,
                   const compute_t<S>* beta, const compute_t<S>* kb, const compute_t<S>* gamma,
                   const S* res = nullptr) {
  static_assert(!kTwo || kAct == NormAct::None);
  using A = compute_t<S>;
  const int64_t C = sh.C;
  if (sh.count() == 0) return;
  if (sh.rows) {
    const int64_t tile = rows_per_tile(C);
    const std::vector<A> alt = tiled(alpha, C, tile), gat = tiled(gamma, C, tile);
    const std::vector<A> bet = kTwo ? tiled(beta, C, tile) : std::vector<A>(), kbt = kTwo ? tiled(kb, C, tile) : std::vector<A>();
    parallel_for(sh.outer, std::max<int64_t>(1, kElementwiseGrain / C), [&](int64_t r0, int64_t r1) {
      std::vector<A> abuf(static_cast<size_t>(C * tile)), bbuf(static_cast<size_t>(C * tile)),
          obuf(static_cast<size_t>(C * tile));
      for (int64_t r = r0; r < r1; r += tile) {
        const int64_t n = std::min(tile, r1 - r) * C;
        const A* ar = load_a(r * C, n, -1, abuf.data());
        A* o = std::is_same_v<S, A> ? reinterpret_cast<A*>(out + r * C) : obuf.data();
        if constexpr (kTwo) {
          const A* br = as_compute<S, A>(b + r * C, bbuf.data(), n);
          for (int64_t i = 0; i < n; ++i) o[i] = ar[i] * alt[i] + (br[i] - kbt[i]) * bet[i] + gat[i];
        } else {
          for (int64_t i = 0; i < n; ++i) o[i] = ar[i] * alt[i] + gat[i];
          if (res != nullptr) {
            const A* rr = as_compute<S, A>(res + r * C, bbuf.data(), n);
            for (int64_t i = 0; i < n; ++i) o[i] += rr[i];
          }
          act_n<kAct>(o, bbuf.data(), n);
        }
        if constexpr (!std::is_same_v<S, A>) store_n<S, A>(o, out + r * C, n);
      }
    });
    return;
  }
  const int64_t I = sh.inner;
  parallel_for(sh.outer * C, std::max<int64_t>(1, kElementwiseGrain / I), [&](int64_t p0, int64_t p1) {
    alignas(64) A abuf[kChunk];
    alignas(64) A bbuf[kChunk];
    alignas(64) A obuf[kChunk];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t c = p % C;
      const A al = alpha[c], ga = gamma[c];
      const A be = kTwo ? beta[c] : A(0), k = kTwo ? kb[c] : A(0);
      for (int64_t i0 = 0; i0 < I; i0 += kChunk) {
        const int64_t m = std::min(kChunk, I - i0);
        const int64_t off = p * I + i0;
        const A* ar = load_a(off, m, c, abuf);
        A* o = std::is_same_v<S, A> ? reinterpret_cast<A*>(out + off) : obuf;
        if constexpr (kTwo) {
          const A* br = as_compute<S, A>(b + off, bbuf, m);
          for (int64_t i = 0; i < m; ++i) o[i] = ar[i] * al + (br[i] - k) * be + ga;
        } else {
          for (int64_t i = 0; i < m; ++i) o[i] = ar[i] * al + ga;
          if (res != nullptr) {
            const A* rr = as_compute<S, A>(res + off, bbuf, m);
            for (int64_t i = 0; i < m; ++i) o[i] += rr[i];
          }
          act_n<kAct>(o, bbuf, m);
        }
        if constexpr (!std::is_same_v<S, A>) store_n<S, A>(o, out + off, m);
      }
    }
  });
}

// ---- Rows layout: fused passes (norm_paths.h) ------------------------------------------------------------
// The backward of ResNet's batch norms (channels-last, in training, activation None or ReLU, with or without the
// residual; F32, or BF16 storage computed in float) in two passes over the data that compute dz (the gradient
// before the activation) in registers: the first adds dz and dz * (x - mean) into the sums as it goes (the residual
// form also writes dz to grad_residual), the second recomputes dz (or reads it from grad_residual) and writes dx.
// Both prefetch (see prefetch_rows). The general path (channel_sums + channel_apply with a loader) writes dz into a
// block buffer and reads it back, reads x twice, converts BF16 blocks into buffers and keeps the per-channel
// coefficients tiled over 16384 values; the fused path is faster on ResNet-50 in F32 and BF16 (docs/PERFORMANCE.md).
// Same additions in the same order as channel_sums (each channel
// adds its rows one by one per statistics block, blocks in order), same arithmetic per element as the loaders and
// channel_apply, same rounding to BF16 (round to nearest even, as store_n): the same bits (test
// BatchNorm.ChannelsLastFusedPassesKeepTheGeneralPathsBits; one exception: a signalling NaN gradient that reaches
// grad_residual in BF16 comes out quiet). The forward's apply pass (fused_fwd_apply, below) likewise.
// F32 and BF16 only. F16 stays on the general path: fused, its scalar tail (channel counts not a multiple of 8)
// rounded one value in 726 differently in that test, because GCC contracted the same expression into FMAs
// differently in the two code instances (-ffp-contract=fast, GCC's default outside ISO mode), which the rounding to
// an F16 subnormal exposed.
template <class S>
inline constexpr bool kFusedStorage = std::is_same_v<S, float> || std::is_same_v<S, BFloat16>;

enum class DzFrom {
  Grad,     // dz = g (no activation)
  ReluOfX,  // dz = g where x * scale[c] + shift[c] > 0 (the forward's ReLU input, recomputed)
  ReluOfY,  // dz = g where the forward's output y > 0 (residual form)
};

template <class S>
struct FusedBwd {
  const S* g;         // incoming gradient (R, C)
  const S* x;         // the forward's input (R, C)
  const S* y;         // ReluOfY: the forward's output
  S* store;           // residual form: dz is written here (grad_residual); else null
  const float* sc;    // ReluOfX: the forward's scale and shift (C)
  const float* sh;
  int64_t R, C;
};

// W floats (W = 8 or 16), loaded from and stored to storage type S: F32, or BF16 (round to nearest even, NaN kept
// quiet, as store_n).
template <int W>
struct VecOf {
  typedef float F __attribute__((vector_size(4 * W)));
  typedef uint32_t U __attribute__((vector_size(4 * W)));
  typedef uint16_t H __attribute__((vector_size(2 * W)));
};
template <int W>
using VecF = typename VecOf<W>::F;
template <int W, class S>
inline VecF<W> loadv(const S* p) {
  static_assert(kFusedStorage<S>);
  VecF<W> v;
  if constexpr (std::is_same_v<S, float>) {
    std::memcpy(&v, p, sizeof v);
  } else {
    typename VecOf<W>::H h;
    std::memcpy(&h, p, sizeof h);
    const typename VecOf<W>::U u = __builtin_convertvector(h, typename VecOf<W>::U) << 16;
    std::memcpy(&v, &u, sizeof v);
  }
  return v;
}
template <int W, class S>
inline void storev(S* p, VecF<W> v) {
  static_assert(kFusedStorage<S>);
  if constexpr (std::is_same_v<S, float>) {
    std::memcpy(p, &v, sizeof v);
  } else {
    typename VecOf<W>::U u;
    std::memcpy(&u, &v, sizeof u);
    const typename VecOf<W>::U rounded = u + 0x7fffu + ((u >> 16) & 1u);
    const typename VecOf<W>::U r = ((u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) : rounded) >> 16;
    const typename VecOf<W>::H h = __builtin_convertvector(r, typename VecOf<W>::H);
    std::memcpy(static_cast<void*>(p), &h, sizeof h);  // BFloat16 is its 16 bits
  }
}

template <DzFrom kFrom, class S>
inline float dz_scalar(const FusedBwd<S>& a, int64_t off, int64_t c) {
  const float gi = static_cast<float>(a.g[off]);
  if constexpr (kFrom == DzFrom::ReluOfX) return static_cast<float>(a.x[off]) * a.sc[c] + a.sh[c] > 0.0f ? gi : 0.0f;
  if constexpr (kFrom == DzFrom::ReluOfY) return static_cast<float>(a.y[off]) > 0.0f ? gi : 0.0f;
  return gi;
}

// dz of W channels at off (x already loaded: xv; sc, sh: those channels' scale and shift for ReluOfX).
template <int W, DzFrom kFrom, class S>
inline VecF<W> dzv(const FusedBwd<S>& a, int64_t off, VecF<W> xv, VecF<W> sc, VecF<W> sh) {
  const VecF<W> gv = loadv<W>(a.g + off), zero = {};
  if constexpr (kFrom == DzFrom::ReluOfX) return xv * sc + sh > zero ? gv : zero;
  if constexpr (kFrom == DzFrom::ReluOfY) return loadv<W>(a.y + off) > zero ? gv : zero;
  return gv;
}

template <DzFrom kFrom, class S>
inline void prefetch_inputs(const FusedBwd<S>& a, int64_t off) {
  __builtin_prefetch(a.g + off, 0, 3);
  __builtin_prefetch(a.x + off, 0, 3);
  if constexpr (kFrom == DzFrom::ReluOfY) __builtin_prefetch(a.y + off, 0, 3);
}

// Rows [t, t + m) of one statistics block, channels from c0 in groups of 8 * kV with the sums in registers across the
// rows: pu[c] += dz, puv[c] += dz * (x - kb[c]). Returns the first channel not done.
template <DzFrom kFrom, int kV, class S>
int64_t fused_bwd_sums_groups(const FusedBwd<S>& a, int64_t t, int64_t m, int64_t c0, const double* kb, double* pu,
                              double* puv) {
  const int64_t C = a.C;
  const int64_t ahead = prefetch_rows(C) * C;
  for (; c0 + 8 * kV <= C; c0 += 8 * kV) {
    V8d su[kV], suv[kV], k[kV];
    V8f sc[kV], sh[kV];
    load_sums<kV>(pu, puv, kb, c0, su, suv, k);
    for (int j = 0; j < kV; ++j) {
      if constexpr (kFrom == DzFrom::ReluOfX) {
        sc[j] = loadv<8>(a.sc + c0 + 8 * j);
        sh[j] = loadv<8>(a.sh + c0 + 8 * j);
      } else {
        sc[j] = sh[j] = V8f{};
      }
    }
    for (int64_t r = t; r < t + m; ++r) {
      const int64_t off = r * C + c0;
      for (int j = 0; j < kV; j += 2) prefetch_inputs<kFrom>(a, off + ahead + 8 * j);
      for (int j = 0; j < kV; ++j) {
        const V8f xv = loadv<8>(a.x + off + 8 * j);
        const V8f dz = dzv<8, kFrom>(a, off + 8 * j, xv, sc[j], sh[j]);
        if (a.store != nullptr) storev<8>(a.store + off + 8 * j, dz);
        const V8d u = __builtin_convertvector(dz, V8d);
        const V8d v = __builtin_convertvector(xv, V8d) - k[j];
        su[j] += u;
        suv[j] += u * v;
      }
    }
    store_sums<kV>(pu, puv, c0, su, suv);
  }
  return c0;
}

// su[c] = sum(dz), suv[c] = sum(dz * (x - kb[c])) over fixed blocks of rows_per_block(C) rows, block partials added
// in block order (channel_sums' partition and order); the residual form also writes dz to a.store.
template <DzFrom kFrom, class S>
void fused_bwd_sums(const FusedBwd<S>& a, const double* kb, double* su, double* suv) {
  const int64_t C = a.C;
  rows_block_sums(a.R, C, su, suv, [&](int64_t t, int64_t m, double* pu, double* puv) {
    int64_t c = fused_bwd_sums_groups<kFrom, 8>(a, t, m, 0, kb, pu, puv);
    c = fused_bwd_sums_groups<kFrom, 1>(a, t, m, c, kb, pu, puv);
    for (int64_t r = t; r < t + m && c < C; ++r)
      for (int64_t cc = c; cc < C; ++cc) {
        const int64_t off = r * C + cc;
        const float dz = dz_scalar<kFrom>(a, off, cc);
        if (a.store != nullptr) a.store[off] = S(dz);
        const double u = static_cast<double>(dz);
        const double v = static_cast<double>(static_cast<float>(a.x[off])) - kb[cc];
        pu[cc] += u;
        puv[cc] += u * v;
      }
  });
}

// out = dz * alpha[c] + (x - kb[c]) * beta[c] + gamma[c], row by row (channel_apply's kTwo arithmetic), 16 channels
// per step (F32), then 8, then one.
template <DzFrom kFrom, class S>
void fused_bwd_apply(const FusedBwd<S>& a, const float* alpha, const float* beta, const float* kb, const float* gamma,
                     S* out) {
  const int64_t C = a.C;
  // W channels at row offset off, channel c.
  auto step = [&](auto width, int64_t off, int64_t c) {
    constexpr int W = decltype(width)::value;
    const VecF<W> xv = loadv<W>(a.x + off);
    VecF<W> sc{}, sh{};
    if constexpr (kFrom == DzFrom::ReluOfX) sc = loadv<W>(a.sc + c), sh = loadv<W>(a.sh + c);
    const VecF<W> dz = dzv<W, kFrom>(a, off, xv, sc, sh);
    storev<W>(out + off,
              dz * loadv<W>(alpha + c) + (xv - loadv<W>(kb + c)) * loadv<W>(beta + c) + loadv<W>(gamma + c));
  };
  parallel_for(a.R, std::max<int64_t>(1, kElementwiseGrain / C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t c = 0;
      if constexpr (std::is_same_v<S, float>) {
        for (; c + 16 <= C; c += 16) {
          prefetch_inputs<kFrom>(a, r * C + c + kPrefetchFloats);
          step(std::integral_constant<int, 16>{}, r * C + c, c);
        }
      }
      for (; c + 8 <= C; c += 8) {
        if (c % 32 == 0) prefetch_inputs<kFrom>(a, r * C + c + kPrefetchFloats);
        step(std::integral_constant<int, 8>{}, r * C + c, c);
      }
      for (; c < C; ++c) {
        const int64_t off = r * C + c;
        out[off] = S(dz_scalar<kFrom>(a, off, c) * alpha[c] + (static_cast<float>(a.x[off]) - kb[c]) * beta[c] +
                     gamma[c]);
      }
    }
  });
}

// The forward's y = act(x * scale[c] + shift[c] [+ res]) for rows, act None or ReLU: channel_apply's arithmetic (one
// multiply-add, then the residual added, then the ReLU, then the rounding to S), with prefetch.
template <bool kRes, bool kRelu, class S>
void fused_fwd_apply(const S* x, const S* res, S* y, const float* scale, const float* shift, int64_t R, int64_t C) {
  // W channels at row offset off, channel c.
  auto step = [&](auto width, int64_t off, int64_t c) {
    constexpr int W = decltype(width)::value;
    VecF<W> o = loadv<W>(x + off) * loadv<W>(scale + c) + loadv<W>(shift + c);
    if constexpr (kRes) o += loadv<W>(res + off);
    if constexpr (kRelu) o = o > VecF<W>{} ? o : VecF<W>{};
    storev<W>(y + off, o);
  };
  auto prefetch = [&](int64_t off) {
    __builtin_prefetch(x + off + kPrefetchFloats, 0, 3);
    if constexpr (kRes) __builtin_prefetch(res + off + kPrefetchFloats, 0, 3);
  };
  parallel_for(R, std::max<int64_t>(1, kElementwiseGrain / C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t c = 0;
      if constexpr (std::is_same_v<S, float>) {
        for (; c + 16 <= C; c += 16) {
          prefetch(r * C + c);
          step(std::integral_constant<int, 16>{}, r * C + c, c);
        }
      }
      for (; c + 8 <= C; c += 8) {
        if (c % 32 == 0) prefetch(r * C + c);
        step(std::integral_constant<int, 8>{}, r * C + c, c);
      }
      for (; c < C; ++c) {
        const int64_t off = r * C + c;
        float o = static_cast<float>(x[off]) * scale[c] + shift[c];
        if constexpr (kRes) o += static_cast<float>(res[off]);
        if constexpr (kRelu) o = o > 0.0f ? o : 0.0f;
        y[off] = S(o);
      }
    }
  });
}

// Runs f with the activation as a compile-time constant.
template <class F>
void with_act(NormAct act, F&& f) {
  switch (act) {
    case NormAct::None: return f(std::integral_constant<NormAct, NormAct::None>{});
    case NormAct::ReLU: return f(std::integral_constant<NormAct, NormAct::ReLU>{});
    case NormAct::SiLU: return f(std::integral_constant<NormAct, NormAct::SiLU>{});
  }
}

template <class A>
std::vector<A> cast_vec(const std::vector<double>& v) {
  return std::vector<A>(v.begin(), v.end());
}

// y = (x - mean) * invstd * w + b = x * scale + shift, coefficients folded in double. One function for the
// forward and the fused-activation backward, which must recompute the forward's pre-activation bit for bit.
template <class A>
void fold_scale_shift(const std::vector<double>& mean, const std::vector<double>& invstd, const Tensor& w,
                      const Tensor& b, std::vector<A>& scale, std::vector<A>& shift) {
  const int64_t C = static_cast<int64_t>(mean.size());
  const std::vector<double> wv = load_vec(w, C, 1.0), bv = load_vec(b, C, 0.0);
  scale.resize(static_cast<size_t>(C));
  shift.resize(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const double sc = invstd[c] * wv[c];
    scale[c] = static_cast<A>(sc);
    shift[c] = static_cast<A>(bv[c] - mean[c] * sc);
  }
}

void batch_norm_kernel(const KernelArgs& args) {
  const Tensor& x = args.in(0);
  const Tensor &w = args.in(1), &b = args.in(2), &rm = args.in(3), &rv = args.in(4);
  const Tensor& res = args.in(5);
  const Tensor &y = args.out(0), &save_mean = args.out(1), &save_invstd = args.out(2);
  const auto& at = args.attr<BatchNormAttrs>();
  const BnShape sh = bn_shape(x);
  check_same_layout(y, x, "batch_norm");
  if (res.defined()) check_same_layout(res, x, "batch_norm");
  const int64_t C = sh.C, M = sh.count();
  std::vector<double> mean(C), invstd(C);
  visit_float(x.dtype(), "batch_norm", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* xp = static_cast<const S*>(x.data_ptr());
    if (at.training) {
      AF_ASSERT(M > 0, "batch_norm: training with an empty channel");
      std::vector<double> shift(C), s1(C), s2(C);
      for (int64_t c = 0; c < C; ++c) shift[c] = to_d(xp[sh.rows ? c : c * sh.inner]);
      channel_sums<S>(sh, PlainLoad<S>{xp}, true, xp, shift.data(), shift.data(), s1.data(), s2.data());
      std::vector<double> var(C);
      for (int64_t c = 0; c < C; ++c) {
        const double m1 = s1[c] / static_cast<double>(M);
        mean[c] = shift[c] + m1;
        var[c] = std::max(0.0, s2[c] / static_cast<double>(M) - m1 * m1);
        invstd[c] = 1.0 / std::sqrt(var[c] + at.eps);
      }
      if (rm.defined()) {
        std::vector<double> r_mean = load_vec(rm, C, 0.0), r_var = load_vec(rv, C, 1.0);
        const double unbias = M > 1 ? static_cast<double>(M) / static_cast<double>(M - 1) : 1.0;
        for (int64_t c = 0; c < C; ++c) {
          r_mean[c] = (1.0 - at.momentum) * r_mean[c] + at.momentum * mean[c];
          r_var[c] = (1.0 - at.momentum) * r_var[c] + at.momentum * var[c] * unbias;
        }
        store_vec(rm, r_mean);
        store_vec(rv, r_var);
      }
    } else {
      mean = load_vec(rm, C, 0.0);
      std::vector<double> var = load_vec(rv, C, 1.0);
      for (int64_t c = 0; c < C; ++c) invstd[c] = 1.0 / std::sqrt(var[c] + at.eps);
    }
    store_vec(save_mean, mean);
    store_vec(save_invstd, invstd);
    if (at.act != NormAct::None && !res.defined()) {
      // Fold what was saved (the statistics' dtype), as the backward will to recompute bn(x). (The residual form's
      // backward reads its mask from the output instead: it folds the statistics as batch_norm does.)
      mean = load_vec(save_mean, C, 0.0);
      invstd = load_vec(save_invstd, C, 1.0);
    }
    std::vector<A> sa, sb;
    fold_scale_shift(mean, invstd, w, b, sa, sb);
    const S* rp = res.defined() ? static_cast<const S*>(res.data_ptr()) : nullptr;
    if constexpr (kFusedStorage<S>) {
      if (sh.rows && at.act != NormAct::SiLU && batch_norm_fused()) {
        S* yp = static_cast<S*>(y.data_ptr());
        const bool relu = at.act == NormAct::ReLU;
        const auto apply = rp != nullptr ? (relu ? fused_fwd_apply<true, true, S> : fused_fwd_apply<true, false, S>)
                                         : (relu ? fused_fwd_apply<false, true, S> : fused_fwd_apply<false, false, S>);
        apply(xp, rp, yp, sa.data(), sb.data(), sh.outer, C);
        return;
      }
    }
    with_act(at.act, [&](auto act) {
      channel_apply<S, false, decltype(act)::value>(sh, PlainLoad<S>{xp}, nullptr, static_cast<S*>(y.data_ptr()),
                                                    sa.data(), nullptr, nullptr, sb.data(), rp);
    });
  });
}

void batch_norm_backward_kernel(const KernelArgs& args) {
  const Tensor &g = args.in(0), &x = args.in(1), &w = args.in(2), &smean = args.in(3), &sinv = args.in(4);
  const Tensor& bias = args.in(5);  // read only with an activation (to recompute its input)
  const Tensor& yfwd = args.in(6);  // residual form: the forward's output (the activation's mask)
  const Tensor &gx = args.out(0), &gw = args.out(1), &gb = args.out(2), &gres = args.out(3);
  const bool residual = yfwd.defined();
  AF_ASSERT(residual == gres.defined() && (!residual || norm_act_takes_residual(args.attr<BatchNormAttrs>().act)),
            "batch_norm_backward: the residual form needs the forward's output and grad_residual, act None or ReLU");
  if (residual) {
    check_same_layout(yfwd, x, "batch_norm_backward");
    check_same_layout(gres, x, "batch_norm_backward");
  }
  const auto& at = args.attr<BatchNormAttrs>();
  const BnShape sh = bn_shape(x);
  check_same_layout(g, x, "batch_norm_backward");
  if (gx.defined()) check_same_layout(gx, x, "batch_norm_backward");
  const int64_t C = sh.C, M = sh.count();
  const std::vector<double> mean = load_vec(smean, C, 0.0), invstd = load_vec(sinv, C, 1.0), wv = load_vec(w, C, 1.0);
  visit_float(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* xp = static_cast<const S*>(x.data_ptr());
    const S* gp = static_cast<const S*>(g.data_ptr());
    // Channels-last in training with dx wanted (ResNet's batch norms), float compute: the two fused passes above.
    const bool fused = kFusedStorage<S> && sh.rows && at.training && gx.defined() &&
                       (at.act == NormAct::None || at.act == NormAct::ReLU) && batch_norm_fused();
    std::vector<A> sa, sb;  // the forward's scale and shift (fused activation)
    if (at.act != NormAct::None && !residual) {
      fold_scale_shift(mean, invstd, w, bias, sa, sb);
      if (sh.rows && !fused) {  // the general path's loader indexes them by position in a tile of rows
        sa = tiled(sa.data(), C, rows_per_block(C));  // the larger of the two kernels' tiles
        sb = tiled(sb.data(), C, rows_per_block(C));
      }
    }
    std::optional<FusedBwd<S>> fast;
    DzFrom from = DzFrom::Grad;
    if constexpr (kFusedStorage<S>) {
      if (fused) {
        fast = FusedBwd<S>{gp, xp, nullptr, nullptr, sa.data(), sb.data(), sh.outer, C};
        if (residual) {
          fast->store = static_cast<S*>(gres.data_ptr());
          if (at.act == NormAct::ReLU) fast->y = static_cast<const S*>(yfwd.data_ptr()), from = DzFrom::ReluOfY;
        } else if (at.act == NormAct::ReLU) {
          from = DzFrom::ReluOfX;
        }
      }
    }
    auto with_from = [](DzFrom f, auto&& fn) {
      switch (f) {
        case DzFrom::Grad: return fn(std::integral_constant<DzFrom, DzFrom::Grad>{});
        case DzFrom::ReluOfX: return fn(std::integral_constant<DzFrom, DzFrom::ReluOfX>{});
        case DzFrom::ReluOfY: return fn(std::integral_constant<DzFrom, DzFrom::ReluOfY>{});
      }
    };
    // The residual form: the kernels read dz = g * act'(.) from grad_residual, written by the first pass over
    // the data (the sums, or the only pass when no sums are needed).
    auto run = [&](auto act_c, const auto& load_g) {
      constexpr NormAct kAct = decltype(act_c)::value;
      std::vector<double> sg(C, 0.0), sgx(C, 0.0);  // sum(g), sum(g * (x - mean))
      const bool need_sums = (at.training && gx.defined()) || gw.defined() || gb.defined();
      // SiLU in training: the sums pass leaves dz in dz_store and the last pass reads it from there: grad_input
      // itself, or with 16-bit storage an F32 buffer (the values the apply pass would recompute).
      A* dz_store = nullptr;
      Tensor dz_f32;
      if constexpr (kAct == NormAct::SiLU) {
        if (need_sums && at.training && gx.defined()) {
          if constexpr (!std::is_same_v<S, A>) dz_f32 = Tensor::empty({sh.count() * sh.C}, DType::F32);
          dz_store = static_cast<A*>(dz_f32.defined() ? dz_f32.data_ptr() : gx.data_ptr());
        }
      }
      if (need_sums && fast) {  // fast is set for kFusedStorage<S> only
        if constexpr (kFusedStorage<S>)
          with_from(from, [&](auto f) { fused_bwd_sums<decltype(f)::value>(*fast, mean.data(), sg.data(), sgx.data()); });
      } else if (need_sums) {
        const std::vector<double> zero(C, 0.0);
        if constexpr (kAct == NormAct::SiLU) {
          auto load_store = load_g;
          load_store.store = dz_store;
          channel_sums<S>(sh, load_store, false, xp, zero.data(), mean.data(), sg.data(), sgx.data());
        } else {
          channel_sums<S>(sh, load_g, false, xp, zero.data(), mean.data(), sg.data(), sgx.data());
        }
      }
      if (gb.defined()) store_vec(gb, sg);
      if (gw.defined()) {
        std::vector<double> v(C);
        for (int64_t c = 0; c < C; ++c) v[c] = sgx[c] * invstd[c];
        store_vec(gw, v);
      }
      if (!gx.defined()) return;
      S* out = static_cast<S*>(gx.data_ptr());
      if (!at.training) {  // running statistics are constants: dx = g * invstd * w
        std::vector<double> alpha(C), zero(C, 0.0);
        for (int64_t c = 0; c < C; ++c) alpha[c] = invstd[c] * wv[c];
        const std::vector<A> al = cast_vec<A>(alpha), ze = cast_vec<A>(zero);
        channel_apply<S, false>(sh, load_g, nullptr, out, al.data(), nullptr, nullptr, ze.data());
        return;
      }
      // dx = k * (g - mean(g) - (x - mean) * invstd^2 * mean(g * (x - mean))), k = invstd * w
      std::vector<double> alpha(C), beta(C), gamma(C);
      for (int64_t c = 0; c < C; ++c) {
        const double k = invstd[c] * wv[c];
        const double proj = sgx[c] * invstd[c] * invstd[c] / static_cast<double>(M);
        alpha[c] = k;
        beta[c] = -k * proj;
        gamma[c] = -k * sg[c] / static_cast<double>(M);
      }
      const std::vector<A> al = cast_vec<A>(alpha), be = cast_vec<A>(beta), ga = cast_vec<A>(gamma),
                           mu = cast_vec<A>(mean);
      if constexpr (kFusedStorage<S>) {
        if (fast) {
          FusedBwd<S> b = *fast;
          if (residual) b.g = b.store, b.store = nullptr;  // dz is in grad_residual
          with_from(residual ? DzFrom::Grad : from, [&](auto f) {
            fused_bwd_apply<decltype(f)::value>(b, al.data(), be.data(), mu.data(), ga.data(), out);
          });
          return;
        }
      }
      if (dz_store != nullptr)  // reads dz and writes dx at the same index: in place (in grad_input) is safe
        channel_apply<S, true>(sh, PlainLoad<A>{dz_store}, xp, out, al.data(), be.data(), mu.data(), ga.data());
      else if (residual && need_sums)  // dz is in grad_residual already
        channel_apply<S, true>(sh, PlainLoad<S>{static_cast<const S*>(gres.data_ptr())}, xp, out, al.data(), be.data(),
                               mu.data(), ga.data());
      else
        channel_apply<S, true>(sh, load_g, xp, out, al.data(), be.data(), mu.data(), ga.data());
    };
    with_act(at.act, [&](auto act_c) {
      constexpr NormAct kAct = decltype(act_c)::value;
      if (residual) {
        if constexpr (kAct != NormAct::SiLU) {
          const MaskLoad<S, kAct> load{gp, static_cast<const S*>(yfwd.data_ptr()), static_cast<S*>(gres.data_ptr())};
          run(std::integral_constant<NormAct, NormAct::None>{}, load);
          // No gradient of x, weight or bias wanted, so no pass above read the data: dz is still to be written.
          if (!gx.defined() && !gw.defined() && !gb.defined())
            parallel_for(sh.outer * sh.C * sh.inner, kElementwiseGrain, [&](int64_t b0, int64_t b1) {
              alignas(64) A buf[kChunk];
              for (int64_t i = b0; i < b1; i += kChunk) load(i, std::min(kChunk, b1 - i), -1, buf);
            });
        }
        return;
      }
      // The incoming gradient as the kernels see it: g itself, or g * act'(x * scale + shift).
      if constexpr (kAct == NormAct::None)
        run(act_c, PlainLoad<S>{gp});
      else
        run(act_c, ActGradLoad<S, kAct>{gp, xp, sa.data(), sb.data()});
    });
  });
}

// ---- layer norm ------------------------------------------------------------------------------------

// Writes one statistic (F32 or F64 tensor, contiguous) at index i.
inline void put_stat(void* p, DType d, int64_t i, double v) {
  if (d == DType::F64)
    static_cast<double*>(p)[i] = v;
  else
    static_cast<float*>(p)[i] = static_cast<float>(v);
}
inline double get_stat(const void* p, DType d, int64_t i) {
  return d == DType::F64 ? static_cast<const double*>(p)[i] : static_cast<double>(static_cast<const float*>(p)[i]);
}

// Sum of n values in double with 8 fixed lanes (fixed order for a given n).
template <class A, class F>
inline double lane_sum(int64_t n, F&& f) {
  double l[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) l[k] += f(i + k);
  for (; i < n; ++i) l[0] += f(i);
  double s = 0;
  for (double v : l) s += v;
  return s;
}

int64_t ln_inner(const Tensor& x, int normalized_dims) {
  int64_t n = 1;
  for (int d = x.dim() - normalized_dims; d < x.dim(); ++d) n *= x.size(d);
  return n;
}

void layer_norm_kernel(const KernelArgs& args) {
  const Tensor &x = args.in(0), &w = args.in(1), &b = args.in(2);
  const Tensor &y = args.out(0), &mean_t = args.out(1), &rstd_t = args.out(2);
  const auto& at = args.attr<LayerNormAttrs>();
  AF_ASSERT(x.is_contiguous() && y.is_contiguous(), "layer_norm: operands must be contiguous");
  const int64_t N = ln_inner(x, at.normalized_dims);
  const int64_t M = N == 0 ? 0 : x.numel() / N;
  void* mp = mean_t.data_ptr();
  void* rp = rstd_t.data_ptr();
  const DType sd = mean_t.dtype();
  visit_float(x.dtype(), "layer_norm", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const std::vector<A> wv = cast_vec<A>(load_vec(w, N, 1.0)), bv = cast_vec<A>(load_vec(b, N, 0.0));
    const S* xp = static_cast<const S*>(x.data_ptr());
    S* yp = static_cast<S*>(y.data_ptr());
    parallel_for(M, std::max<int64_t>(1, kBlockElems / std::max<int64_t>(N, 1)), [&](int64_t r0, int64_t r1) {
      std::vector<A> xbuf(static_cast<size_t>(N)), obuf(static_cast<size_t>(N));
      for (int64_t r = r0; r < r1; ++r) {
        const A* xr = as_compute<S, A>(xp + r * N, xbuf.data(), N);
        // Two passes over a row that sits in cache: exact mean first, then the centred second moment.
        const double mean = lane_sum<A>(N, [&](int64_t j) { return static_cast<double>(xr[j]); }) / N;
        const double var = lane_sum<A>(N, [&](int64_t j) {
                             const double d = static_cast<double>(xr[j]) - mean;
                             return d * d;
                           }) / N;
        const double rstd = 1.0 / std::sqrt(var + at.eps);
        put_stat(mp, sd, r, mean);
        put_stat(rp, sd, r, rstd);
        const A am = static_cast<A>(mean), ar = static_cast<A>(rstd);
        A* o = std::is_same_v<S, A> ? reinterpret_cast<A*>(yp + r * N) : obuf.data();
        for (int64_t j = 0; j < N; ++j) o[j] = (xr[j] - am) * ar * wv[j] + bv[j];
        if constexpr (!std::is_same_v<S, A>) store_n<S, A>(o, yp + r * N, N);
      }
    });
  });
}

void layer_norm_backward_kernel(const KernelArgs& args) {
  const Tensor &g = args.in(0), &x = args.in(1), &mean_t = args.in(2), &rstd_t = args.in(3), &w = args.in(4);
  const Tensor &gx = args.out(0), &gw = args.out(1), &gb = args.out(2);
  const auto& at = args.attr<LayerNormAttrs>();
  AF_ASSERT(x.is_contiguous() && g.is_contiguous(), "layer_norm_backward: operands must be contiguous");
  const int64_t N = ln_inner(x, at.normalized_dims);
  const int64_t M = N == 0 ? 0 : x.numel() / N;
  const void* mp = mean_t.data_ptr();
  const void* rp = rstd_t.data_ptr();
  const DType sd = mean_t.dtype();
  const bool want_params = gw.defined() || gb.defined();
  // Weight/bias gradients are column sums over rows: fixed row blocks, partials summed in block order.
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(N, 1));
  const int64_t nblk = (M + rows_per_block - 1) / rows_per_block;
  std::vector<double> pgw, pgb;
  if (want_params) {
    pgw.assign(static_cast<size_t>(nblk * N), 0.0);
    pgb.assign(static_cast<size_t>(nblk * N), 0.0);
  }
  visit_float(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const std::vector<A> wv = cast_vec<A>(load_vec(w, N, 1.0));
    const S* xp = static_cast<const S*>(x.data_ptr());
    const S* gp = static_cast<const S*>(g.data_ptr());
    S* gxp = gx.defined() ? static_cast<S*>(gx.data_ptr()) : nullptr;
    parallel_for(nblk, 1, [&](int64_t b0, int64_t b1) {
      std::vector<A> xbuf(static_cast<size_t>(N)), gbuf(static_cast<size_t>(N)), xhat(static_cast<size_t>(N)),
          wg(static_cast<size_t>(N)), obuf(static_cast<size_t>(N));
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t r1 = std::min(M, (blk + 1) * rows_per_block);
        for (int64_t r = blk * rows_per_block; r < r1; ++r) {
          const A* xr = as_compute<S, A>(xp + r * N, xbuf.data(), N);
          const A* gr = as_compute<S, A>(gp + r * N, gbuf.data(), N);
          const A mean = static_cast<A>(get_stat(mp, sd, r)), rstd = static_cast<A>(get_stat(rp, sd, r));
          for (int64_t j = 0; j < N; ++j) {
            xhat[j] = (xr[j] - mean) * rstd;
            wg[j] = gr[j] * wv[j];
          }
          if (want_params) {
            double* pw = pgw.data() + blk * N;
            double* pb = pgb.data() + blk * N;
            for (int64_t j = 0; j < N; ++j) {
              pw[j] += static_cast<double>(gr[j]) * static_cast<double>(xhat[j]);
              pb[j] += static_cast<double>(gr[j]);
            }
          }
          if (gxp == nullptr) continue;
          // dx = rstd * (wg - mean(wg) - xhat * mean(wg * xhat))
          const double s1 = lane_sum<A>(N, [&](int64_t j) { return static_cast<double>(wg[j]); });
          const double s2 =
              lane_sum<A>(N, [&](int64_t j) { return static_cast<double>(wg[j]) * static_cast<double>(xhat[j]); });
          const A m1 = static_cast<A>(s1 / N), m2 = static_cast<A>(s2 / N);
          A* o = std::is_same_v<S, A> ? reinterpret_cast<A*>(gxp + r * N) : obuf.data();
          for (int64_t j = 0; j < N; ++j) o[j] = rstd * (wg[j] - m1 - xhat[j] * m2);
          if constexpr (!std::is_same_v<S, A>) store_n<S, A>(o, gxp + r * N, N);
        }
      }
    });
  });
  if (!want_params) return;
  std::vector<double> sw(static_cast<size_t>(N), 0.0), sb(static_cast<size_t>(N), 0.0);
  for (int64_t blk = 0; blk < nblk; ++blk)
    for (int64_t j = 0; j < N; ++j) {
      sw[j] += pgw[blk * N + j];
      sb[j] += pgb[blk * N + j];
    }
  if (gw.defined()) store_vec(gw.as_strided_raw({N}, {1}, gw.offset()), sw);
  if (gb.defined()) store_vec(gb.as_strided_raw({N}, {1}, gb.offset()), sb);
}

}  // namespace

void set_batch_norm_fused(bool on) { g_bn_fused.store(on, std::memory_order_relaxed); }
bool batch_norm_fused() { return g_bn_fused.load(std::memory_order_relaxed); }

void register_norm_cpu() {
  register_kernel(OpId::batch_norm, DeviceType::CPU, batch_norm_kernel);
  register_kernel(OpId::batch_norm_backward, DeviceType::CPU, batch_norm_backward_kernel);
  register_kernel(OpId::layer_norm, DeviceType::CPU, layer_norm_kernel);
  register_kernel(OpId::layer_norm_backward, DeviceType::CPU, layer_norm_backward_kernel);
}

}  // namespace ampforge::cpu
