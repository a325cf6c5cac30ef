// CUDA fused attention (flash-style) and its deterministic backward. Contract: core/attrs.h (AttentionAttrs);
// ops/attention.cpp made q, k, v, grad_out and out contiguous (N, T, D) and passes the mask as a strided
// (N1, N2, Tq, Tk) Bool view (zero strides for broadcast dims), read here through its strides.
//
// Head dims D, Dv up to kMaxHead = 128 (ops::attention_applies sends larger ones to the composite; the kernels
// refuse them). Storage F32/F16/BF16, all arithmetic in float (plain FMA code, no tensor cores); 16-bit results
// are rounded once. Blocks are 128 threads = 4 warps; every tile is staged in shared memory as float (< 48 KiB
// static shared memory per kernel, so no opt-in attribute is needed).
//
// Forward, one block per (n, 16 query rows): each warp owns 4 query rows, lane t is key k0 + t of the current
// 32-key tile. Per tile: K and V staged in shared memory; each lane computes its key's 4 scores; per row the
// warp reduces the tile max / sum with shuffles and rescales the running (max, sum, accumulator) -- the online
// softmax; the row's probabilities go through a per-warp shared row to the P V product, where lane t owns
// output columns t, t + 32, t + 64, t + 96. The (Tq, Tk) scores are never stored. Causal blocks stop at the
// last key their rows can see. Output acc / sum (0 / 0 = NaN for a fully masked row, as the composite) and
// lse = max + log(sum) (-inf for a fully masked row) per row.
//
// Backward, no atomics, every sum in one fixed order (bit-identical run to run):
//   delta kernel   one warp per query row: delta_i = dO_i . O_i (float scratch, N * Tq).
//   dq kernel      one block per (n, 8 query rows), looping over 32-key tiles: P = exp(s - lse) recomputed
//                  from q, k and the saved lse, dS = P (dO . v - delta) (0 where masked), dq = scale dS K.
//   dk/dv kernel   one block per (n, 8 keys), looping over 32-query tiles: lane t is query i0 + t; dv = P^T dO,
//                  dk = scale dS^T Q. Causal query tiles entirely above the block's keys are skipped; a fully
//                  masked row there (lse = -inf) still makes dv NaN, as the composite's NaN probabilities do.
#include <algorithm>
#include <cstdint>

#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

constexpr int kMaxHead = 128;           // largest D and Dv
constexpr int kTile = 32;               // keys (forward, dq) or queries (dk/dv) per tile: one per lane
constexpr int kWarps = 4;               // warps per block
constexpr int kBlock = 32 * kWarps;     // threads per block
constexpr int kCols = kMaxHead / 32;    // output columns per lane
constexpr int kFwdRows = 4;             // forward: query rows per warp
constexpr int kBwdRows = 2;             // backward: query rows (dq) or keys (dk/dv) per warp
constexpr int kFwdQ = kFwdRows * kWarps;  // 16 query rows per forward block
constexpr int kBwdQ = kBwdRows * kWarps;  // 8 query rows (dq) or keys (dk/dv) per backward block

struct MaskArg {
  const uint8_t* p = nullptr;  // null: no mask
  int64_t n2 = 1, s0 = 0, s1 = 0, si = 0, sj = 0;
};

struct Problem {
  int64_t N = 0, Tq = 0, Tk = 0;
  int D = 0, Dv = 0;
  float scale = 1.0f;
  bool causal = false;
  MaskArg mask;
};

// Whether query i attends key j (both in range).
AF_DEV bool attends(const Problem& p, int64_t n, int64_t i, int64_t j) {
  if (p.causal && j > i) return false;
  if (p.mask.p == nullptr) return true;
  const MaskArg& m = p.mask;
  return m.p[(n / m.n2) * m.s0 + (n % m.n2) * m.s1 + i * m.si + j * m.sj] != 0;
}

// Last key (exclusive) that rows [r0, r0 + rows) can attend.
AF_DEV int64_t key_end(const Problem& p, int64_t r0, int rows) {
  return p.causal ? (p.Tk < r0 + rows ? p.Tk : r0 + rows) : p.Tk;
}

// Stages rows [r0, r0 + rows) of a (T, width) slice into shared memory as float, with row stride `stride`;
// rows at or past T are zero.
template <class T>
AF_DEV void stage(float* dst, int stride, const T* src, int64_t r0, int rows, int64_t T_, int width) {
  for (int idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
    const int r = idx / width, c = idx % width;
    dst[r * stride + c] = r0 + r < T_ ? to_float(src[(r0 + r) * width + c]) : 0.0f;
  }
}

// ---- forward ----------------------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kBlock)
    attention_fwd_kernel(Problem p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         T* __restrict__ out, float* __restrict__ lse) {
  __shared__ float qs[kFwdQ * kMaxHead];
  __shared__ float ks[kTile * (kMaxHead + 1)];
  __shared__ float vs[kTile * kMaxHead];
  __shared__ float ps[kFwdQ * (kTile + 1)];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = p.D, Dv = p.Dv, kstride = D + 1;
  const int64_t tiles = (p.Tq + kFwdQ - 1) / kFwdQ;
  const int64_t n = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * kFwdQ;
  const T* qn = q + n * p.Tq * D;
  const T* kn = k + n * p.Tk * D;
  const T* vn = v + n * p.Tk * Dv;
  stage(qs, D, qn, q0, kFwdQ, p.Tq, D);

  float m[kFwdRows], l[kFwdRows], acc[kFwdRows][kCols];
#pragma unroll
  for (int r = 0; r < kFwdRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int u = 0; u < kCols; ++u) acc[r][u] = 0.0f;
  }
  const int64_t kend = key_end(p, q0, kFwdQ);
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();  // the previous tile's K, V are no longer read (and qs is staged, first time)
    stage(ks, kstride, kn, k0, kTile, p.Tk, D);
    stage(vs, Dv, vn, k0, kTile, p.Tk, Dv);
    __syncthreads();
    const int64_t j = k0 + lane;
#pragma unroll
    for (int r = 0; r < kFwdRows; ++r) {
      const int row = warp * kFwdRows + r;
      const int64_t i = q0 + row;
      float s = -INFINITY;
      if (i < p.Tq && j < p.Tk && attends(p, n, i, j)) {
        const float* qr = qs + row * D;
        const float* kr = ks + lane * kstride;
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot = fmaf(qr[d], kr[d], dot);
        s = dot * p.scale;
      }
      const float mnew = nan_max(m[r], warp_max(s));
      float alpha = 1.0f, pr = 0.0f;
      if (mnew != -INFINITY) {  // every key so far masked: nothing to add, nothing to rescale
        alpha = expf(m[r] - mnew);
        pr = expf(s - mnew);
      }
      l[r] = l[r] * alpha + warp_sum(pr);
#pragma unroll
      for (int u = 0; u < kCols; ++u) acc[r][u] *= alpha;
      m[r] = mnew;
      ps[row * (kTile + 1) + lane] = pr;
    }
    __syncwarp();  // this warp's probability rows are written (only this warp reads them)
    for (int t = 0; t < kTile; ++t) {
      const float* vr = vs + t * Dv;
#pragma unroll
      for (int r = 0; r < kFwdRows; ++r) {
        const float pr = ps[(warp * kFwdRows + r) * (kTile + 1) + t];
#pragma unroll
        for (int u = 0; u < kCols; ++u) {
          const int c = lane + 32 * u;
          if (c < Dv) acc[r][u] = fmaf(pr, vr[c], acc[r][u]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kFwdRows; ++r) {
    const int64_t i = q0 + warp * kFwdRows + r;
    if (i >= p.Tq) continue;
    T* orow = out + (n * p.Tq + i) * Dv;
#pragma unroll
    for (int u = 0; u < kCols; ++u) {
      const int c = lane + 32 * u;
      if (c < Dv) orow[c] = from_float<T>(acc[r][u] / l[r]);  // 0 / 0 = NaN for a fully masked row
    }
    if (lane == 0) lse[n * p.Tq + i] = m[r] + logf(l[r]);  // -inf + log(0) = -inf when fully masked
  }
}

// ---- backward ---------------------------------------------------------------------------------------------

// delta_i = dO_i . O_i, one warp per row.
template <class T>
__global__ void __launch_bounds__(kBlock)
    attention_delta_kernel(int64_t rows, int Dv, const T* __restrict__ go, const T* __restrict__ o,
                           float* __restrict__ delta) {
  const int lane = threadIdx.x & 31;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); row < rows; row += step) {
    float s = 0.0f;
    for (int c = lane; c < Dv; c += 32) s = fmaf(to_float(go[row * Dv + c]), to_float(o[row * Dv + c]), s);
    s = warp_sum(s);
    if (lane == 0) delta[row] = s;
  }
}

// dq: one block per (n, 8 query rows); each warp owns 2 rows, lane t is key k0 + t of the tile.
template <class T>
__global__ void __launch_bounds__(kBlock)
    attention_dq_kernel(Problem p, const T* __restrict__ go, const T* __restrict__ q, const T* __restrict__ k,
                        const T* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ delta,
                        T* __restrict__ dq) {
  __shared__ float qs[kBwdQ * kMaxHead];
  __shared__ float gs[kBwdQ * kMaxHead];
  __shared__ float ks[kTile * (kMaxHead + 1)];
  __shared__ float vs[kTile * (kMaxHead + 1)];
  __shared__ float dss[kBwdQ * (kTile + 1)];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = p.D, Dv = p.Dv;
  const int64_t tiles = (p.Tq + kBwdQ - 1) / kBwdQ;
  const int64_t n = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * kBwdQ;
  stage(qs, D, q + n * p.Tq * D, q0, kBwdQ, p.Tq, D);
  stage(gs, Dv, go + n * p.Tq * Dv, q0, kBwdQ, p.Tq, Dv);
  const T* kn = k + n * p.Tk * D;
  const T* vn = v + n * p.Tk * Dv;

  float li[kBwdRows], di[kBwdRows], acc[kBwdRows][kCols];
#pragma unroll
  for (int r = 0; r < kBwdRows; ++r) {
    const int64_t i = q0 + warp * kBwdRows + r;
    li[r] = i < p.Tq ? lse[n * p.Tq + i] : 0.0f;
    di[r] = i < p.Tq ? delta[n * p.Tq + i] : 0.0f;
#pragma unroll
    for (int u = 0; u < kCols; ++u) acc[r][u] = 0.0f;
  }
  const int64_t kend = key_end(p, q0, kBwdQ);
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();
    stage(ks, D + 1, kn, k0, kTile, p.Tk, D);
    stage(vs, Dv + 1, vn, k0, kTile, p.Tk, Dv);
    __syncthreads();
    const int64_t j = k0 + lane;
#pragma unroll
    for (int r = 0; r < kBwdRows; ++r) {
      const int row = warp * kBwdRows + r;
      const int64_t i = q0 + row;
      float ds = 0.0f;  // 0 where masked (the composite's where() passes no gradient there)
      if (i < p.Tq && j < p.Tk && attends(p, n, i, j)) {
        const float* qr = qs + row * D;
        const float* kr = ks + lane * (D + 1);
        float s = 0.0f;
        for (int d = 0; d < D; ++d) s = fmaf(qr[d], kr[d], s);
        const float* gr = gs + row * Dv;
        const float* vr = vs + lane * (Dv + 1);
        float dp = 0.0f;
        for (int c = 0; c < Dv; ++c) dp = fmaf(gr[c], vr[c], dp);
        ds = expf(s * p.scale - li[r]) * (dp - di[r]);
      }
      dss[row * (kTile + 1) + lane] = ds;
    }
    __syncwarp();
    for (int t = 0; t < kTile; ++t) {
      const float* kr = ks + t * (D + 1);
#pragma unroll
      for (int r = 0; r < kBwdRows; ++r) {
        const float ds = dss[(warp * kBwdRows + r) * (kTile + 1) + t];
#pragma unroll
        for (int u = 0; u < kCols; ++u) {
          const int c = lane + 32 * u;
          if (c < D) acc[r][u] = fmaf(ds, kr[c], acc[r][u]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kBwdRows; ++r) {
    const int64_t i = q0 + warp * kBwdRows + r;
    if (i >= p.Tq) continue;
#pragma unroll
    for (int u = 0; u < kCols; ++u) {
      const int c = lane + 32 * u;
      if (c < D) dq[(n * p.Tq + i) * D + c] = from_float<T>(acc[r][u] * p.scale);
    }
  }
}

// dk, dv: one block per (n, 8 keys); each warp owns 2 keys, lane t is query i0 + t of the tile.
template <class T>
__global__ void __launch_bounds__(kBlock)
    attention_dkdv_kernel(Problem p, const T* __restrict__ go, const T* __restrict__ q, const T* __restrict__ k,
                          const T* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ delta,
                          T* __restrict__ dk, T* __restrict__ dv) {
  __shared__ float ks[kBwdQ * kMaxHead];
  __shared__ float vs[kBwdQ * kMaxHead];
  __shared__ float qs[kTile * (kMaxHead + 1)];
  __shared__ float gs[kTile * (kMaxHead + 1)];
  __shared__ float pss[kBwdQ * (kTile + 1)];
  __shared__ float dss[kBwdQ * (kTile + 1)];
  __shared__ float ls[kTile], ds_delta[kTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = p.D, Dv = p.Dv;
  const int64_t tiles = (p.Tk + kBwdQ - 1) / kBwdQ;
  const int64_t n = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * kBwdQ;
  stage(ks, D, k + n * p.Tk * D, j0, kBwdQ, p.Tk, D);
  stage(vs, Dv, v + n * p.Tk * Dv, j0, kBwdQ, p.Tk, Dv);
  const T* qn = q + n * p.Tq * D;
  const T* gn = go + n * p.Tq * Dv;
  const float* ln = lse + n * p.Tq;
  const float* dn = delta + n * p.Tq;

  float ak[kBwdRows][kCols], av[kBwdRows][kCols];
#pragma unroll
  for (int r = 0; r < kBwdRows; ++r)
#pragma unroll
    for (int u = 0; u < kCols; ++u) ak[r][u] = av[r][u] = 0.0f;
  bool nan_dv = false;  // a fully masked row (lse = -inf) in a skipped tile: its NaN probabilities reach every dv
  for (int64_t i0 = 0; i0 < p.Tq; i0 += kTile) {
    if (p.causal && i0 + kTile - 1 < j0) {  // every row of the tile is before every key of the block
      const int64_t i = i0 + lane;
      const bool bad = i < p.Tq && !(ln[i] > -INFINITY);
      nan_dv = nan_dv || __any_sync(0xffffffffu, bad);
      continue;  // uniform across the block: the condition depends on i0 and j0 only
    }
    __syncthreads();
    stage(qs, D + 1, qn, i0, kTile, p.Tq, D);
    stage(gs, Dv + 1, gn, i0, kTile, p.Tq, Dv);
    if (threadIdx.x < kTile) {
      const int64_t i = i0 + threadIdx.x;
      ls[threadIdx.x] = i < p.Tq ? ln[i] : 0.0f;
      ds_delta[threadIdx.x] = i < p.Tq ? dn[i] : 0.0f;
    }
    __syncthreads();
    const int64_t i = i0 + lane;
#pragma unroll
    for (int r = 0; r < kBwdRows; ++r) {
      const int key = warp * kBwdRows + r;
      const int64_t j = j0 + key;
      float pr = 0.0f, ds = 0.0f;
      if (i < p.Tq && j < p.Tk) {
        const float li = ls[lane];
        if (attends(p, n, i, j)) {
          const float* qr = qs + lane * (D + 1);
          const float* kr = ks + key * D;
          float s = 0.0f;
          for (int d = 0; d < D; ++d) s = fmaf(qr[d], kr[d], s);
          const float* gr = gs + lane * (Dv + 1);
          const float* vr = vs + key * Dv;
          float dp = 0.0f;
          for (int c = 0; c < Dv; ++c) dp = fmaf(gr[c], vr[c], dp);
          pr = expf(s * p.scale - li);
          ds = pr * (dp - ds_delta[lane]);
        } else if (!(li > -INFINITY)) {
          pr = NAN;  // exp(-inf - lse) with lse = -inf: the composite's NaN probability
        }
      }
      pss[key * (kTile + 1) + lane] = pr;
      dss[key * (kTile + 1) + lane] = ds;
    }
    __syncwarp();
    for (int t = 0; t < kTile; ++t) {
      const float* qr = qs + t * (D + 1);
      const float* gr = gs + t * (Dv + 1);
#pragma unroll
      for (int r = 0; r < kBwdRows; ++r) {
        const int key = warp * kBwdRows + r;
        const float pr = pss[key * (kTile + 1) + t], ds = dss[key * (kTile + 1) + t];
#pragma unroll
        for (int u = 0; u < kCols; ++u) {
          const int c = lane + 32 * u;
          if (c < Dv) av[r][u] = fmaf(pr, gr[c], av[r][u]);
          if (c < D) ak[r][u] = fmaf(ds, qr[c], ak[r][u]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kBwdRows; ++r) {
    const int64_t j = j0 + warp * kBwdRows + r;
    if (j >= p.Tk) continue;
#pragma unroll
    for (int u = 0; u < kCols; ++u) {
      const int c = lane + 32 * u;
      if (c < D) dk[(n * p.Tk + j) * D + c] = from_float<T>(ak[r][u] * p.scale);
      if (c < Dv) dv[(n * p.Tk + j) * Dv + c] = from_float<T>(nan_dv ? NAN : av[r][u]);
    }
  }
}

// ---- host side --------------------------------------------------------------------------------------------

Problem make_problem(const KernelArgs& a, const Tensor& q, const Tensor& k, const Tensor& v, size_t mask_index,
                     const char* what) {
  Problem p;
  p.N = q.size(0);
  p.Tq = q.size(1);
  p.Tk = k.size(1);
  const int64_t D = q.size(2), Dv = v.size(2);
  if (D > kMaxHead || Dv > kMaxHead)
    AF_THROW(NotImplemented, "{}: CUDA supports head dims up to {}, got D = {} and Dv = {} (the composite "
             "scaled_dot_product_attention handles larger ones)", what, kMaxHead, D, Dv);
  p.D = static_cast<int>(D);
  p.Dv = static_cast<int>(Dv);
  const AttentionAttrs& at = a.attr<AttentionAttrs>();
  p.scale = static_cast<float>(at.scale);
  p.causal = at.causal;
  if (a.inputs.size() > mask_index) {
    const Tensor& m = a.in(mask_index);
    p.mask.p = static_cast<const uint8_t*>(m.data_ptr());
    p.mask.n2 = m.size(1);
    p.mask.s0 = m.stride(0);
    p.mask.s1 = m.stride(1);
    p.mask.si = m.stride(2);
    p.mask.sj = m.stride(3);
  }
  return p;
}

unsigned grid_for(int64_t blocks, const char* what) {
  AF_CHECK(blocks <= 0x7fffffff, "{}: too many blocks ({}) for one launch", what, blocks);
  return static_cast<unsigned>(blocks);
}

void attention_cuda(const KernelArgs& a) {
  const char* what = "attention";
  const Tensor &q = a.in(0), &k = a.in(1), &v = a.in(2), &out = a.out(0), &lse = a.out(1);
  visit_float(q.dtype(), what, [](auto) {});
  const Problem p = make_problem(a, q, k, v, 3, what);
  if (out.numel() == 0) return;
  DeviceGuard guard(q.device());
  const DeviceState& s = device_state(q.device());
  const unsigned blocks = grid_for(p.N * ((p.Tq + kFwdQ - 1) / kFwdQ), what);
  visit_float(q.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    attention_fwd_kernel<T><<<blocks, kBlock, 0, s.compute>>>(
        p, static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
        static_cast<const T*>(v.data_ptr()), static_cast<T*>(out.data_ptr()), static_cast<float*>(lse.data_ptr()));
    AF_CUDA_CHECK_LAUNCH();
  });
}

void attention_backward_cuda(const KernelArgs& a) {
  const char* what = "attention_backward";
  const Tensor &go = a.in(0), &q = a.in(1), &k = a.in(2), &v = a.in(3), &o = a.in(4), &lse = a.in(5);
  const Tensor &dq = a.out(0), &dk = a.out(1), &dv = a.out(2);
  visit_float(q.dtype(), what, [](auto) {});
  const Problem p = make_problem(a, q, k, v, 6, what);
  if (p.N == 0 || p.Tq == 0 || p.Tk == 0) return;
  const int dev = q.device().index;
  DeviceGuard guard(q.device());
  const DeviceState& s = device_state(q.device());
  Scratch delta(dev, static_cast<size_t>(p.N * p.Tq) * sizeof(float));
  float* dp = delta.as<float>();
  const float* lp = static_cast<const float*>(lse.data_ptr());
  const unsigned qblocks = grid_for(p.N * ((p.Tq + kBwdQ - 1) / kBwdQ), what);
  const unsigned kblocks = grid_for(p.N * ((p.Tk + kBwdQ - 1) / kBwdQ), what);
  const int64_t rows = p.N * p.Tq;
  const unsigned dblocks = static_cast<unsigned>(
      std::min<int64_t>((rows + kWarps - 1) / kWarps, static_cast<int64_t>(s.sm_count) * 32));
  visit_float(q.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    const T* gp = static_cast<const T*>(go.data_ptr());
    const T* qp = static_cast<const T*>(q.data_ptr());
    const T* kp = static_cast<const T*>(k.data_ptr());
    const T* vp = static_cast<const T*>(v.data_ptr());
    attention_delta_kernel<T><<<dblocks, kBlock, 0, s.compute>>>(rows, p.Dv, gp, static_cast<const T*>(o.data_ptr()),
                                                                  dp);
    AF_CUDA_CHECK_LAUNCH();
    attention_dq_kernel<T><<<qblocks, kBlock, 0, s.compute>>>(p, gp, qp, kp, vp, lp, dp,
                                                               static_cast<T*>(dq.data_ptr()));
    AF_CUDA_CHECK_LAUNCH();
    attention_dkdv_kernel<T><<<kblocks, kBlock, 0, s.compute>>>(p, gp, qp, kp, vp, lp, dp,
                                                                 static_cast<T*>(dk.data_ptr()),
                                                                 static_cast<T*>(dv.data_ptr()));
    AF_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void register_attention_cuda() {
  register_kernel(OpId::attention, DeviceType::CUDA, attention_cuda);
  register_kernel(OpId::attention_backward, DeviceType::CUDA, attention_backward_cuda);
}

}  // namespace ampforge::cuda
