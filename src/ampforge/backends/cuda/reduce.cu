// CUDA reductions: sum, mean, amax, amin, argmax, argmin, var over any set of dims, keepdim or not (the
// output arrives in keepdim form from ops/, as on the CPU). F32/F16/BF16 inputs, float accumulation.
//
// One kernel shape for every reduction (a Reducer supplies identity, add, merge, warp shuffle, output):
//   inner  the input's fastest dim is reduced (or there is one output): blockDim.x threads (a power of two,
//          >= 32) share an output and stride through its reduced elements, so a warp reads consecutive
//          addresses; warp shuffles, then one shuffle round over the warps' partials.
//   outer  the fastest dim is kept: 32 consecutive outputs per block row (coalesced), blockDim.y threads
//          split each output's reduction; partials meet in shared memory.
// Few outputs and a long reduction: the reduction is also split across blocks (grid.y); each block writes
// a partial state to scratch memory and a second kernel merges the partials of an output in split order.
// Every output is computed by a fixed tree for a given shape and device, so results are reproducible run
// to run (no atomics).
//
// Semantics as on the CPU: NaN propagates through amax/amin; argmax/argmin return the first NaN if there
// is one, else the first extremum (lowest linear index over the reduced dims, in their original order);
// mean of an empty set is NaN, var with n <= correction is NaN.
#include <algorithm>

#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

// ---- reducers -------------------------------------------------------------------------------------------

struct SumReducer {
  using State = float;
  bool mean;
  AF_DEV State identity() const { return 0.0f; }
  AF_DEV void add(State& s, float v, int64_t) const { s += v; }
  AF_DEV void merge(State& a, const State& b) const { a += b; }
  AF_DEV State shfl_down(State s, int off) const { return __shfl_down_sync(0xffffffffu, s, off); }
  template <class T>
  AF_DEV void write(T* out, int64_t*, const State& s, int64_t n) const {
    *out = from_float<T>(mean ? s / static_cast<float>(n) : s);
  }
};

struct ExtremumReducer {  // amax / amin
  using State = float;
  bool is_max;
  AF_DEV State identity() const { return is_max ? -INFINITY : INFINITY; }
  AF_DEV void add(State& s, float v, int64_t) const {
    if (s != s) return;  // NaN is sticky
    if (v != v || (is_max ? v > s : v < s)) s = v;
  }
  AF_DEV void merge(State& a, const State& b) const { add(a, b, 0); }
  AF_DEV State shfl_down(State s, int off) const { return __shfl_down_sync(0xffffffffu, s, off); }
  template <class T>
  AF_DEV void write(T* out, int64_t*, const State& s, int64_t) const {
    *out = from_float<T>(s);
  }
};

struct ArgState {
  float v;
  int64_t i;  // -1: no element yet
};

struct ArgReducer {  // argmax / argmin
  using State = ArgState;
  bool is_max;
  AF_DEV State identity() const { return {0.0f, -1}; }
  // Whether (v, i) should replace `cur`: NaN beats numbers and the earliest NaN wins; otherwise the
  // extremum wins and ties go to the lower index. Independent of the order elements arrive in.
  AF_DEV bool beats(const State& cur, float v, int64_t i) const {
    if (cur.i < 0) return true;
    const bool vn = v != v, cn = cur.v != cur.v;
    if (cn) return vn && i < cur.i;
    if (vn) return true;
    if (is_max ? v > cur.v : v < cur.v) return true;
    return v == cur.v && i < cur.i;
  }
  AF_DEV void add(State& s, float v, int64_t i) const {
    if (beats(s, v, i)) s = {v, i};
  }
  AF_DEV void merge(State& a, const State& b) const {
    if (b.i >= 0 && beats(a, b.v, b.i)) a = b;
  }
  AF_DEV State shfl_down(State s, int off) const {
    return {__shfl_down_sync(0xffffffffu, s.v, off),
            static_cast<int64_t>(__shfl_down_sync(0xffffffffu, static_cast<long long>(s.i), off))};
  }
  template <class T>
  AF_DEV void write(T*, int64_t* idx, const State& s, int64_t) const {
    *idx = s.i;
  }
};

struct VarState {
  float mean, m2;  // mean relative to shift
  int64_t n;
  float shift;     // the state's first element
};

// Welford's running mean/variance; partial states merge with Chan et al.'s formula. Each state works on
// its values minus its first element (the shift batch norm's sums use): with |mean| >> std, a float running
// mean carries an error of ulp(mean) into every centred term, and var was 30-60x the F32 tolerance away
// from the CPU's double result at mean 1e4, std 1 (host emulation of these trees); shifted, it is as close
// as for centred data. Two states' shifts differ by about the spread, so their difference is (nearly) exact.
struct VarReducer {
  using State = VarState;
  int64_t correction;
  AF_DEV State identity() const { return {0.0f, 0.0f, 0, 0.0f}; }
  AF_DEV void add(State& s, float v, int64_t) const {
    if (s.n == 0) s.shift = v;
    v -= s.shift;
    s.n += 1;
    const float d = v - s.mean;
    s.mean += d / static_cast<float>(s.n);
    s.m2 += d * (v - s.mean);
  }
  AF_DEV void merge(State& a, const State& b) const {
    if (b.n == 0) return;
    if (a.n == 0) {
      a = b;
      return;
    }
    const int64_t n = a.n + b.n;
    const float d = (b.shift - a.shift) + (b.mean - a.mean);  // difference of the true means
    const float fb = static_cast<float>(b.n) / static_cast<float>(n);
    a.mean += d * fb;
    a.m2 += b.m2 + d * d * static_cast<float>(a.n) * fb;
    a.n = n;
  }
  AF_DEV State shfl_down(State s, int off) const {
    return {__shfl_down_sync(0xffffffffu, s.mean, off), __shfl_down_sync(0xffffffffu, s.m2, off),
            static_cast<int64_t>(__shfl_down_sync(0xffffffffu, static_cast<long long>(s.n), off)),
            __shfl_down_sync(0xffffffffu, s.shift, off)};
  }
  template <class T>
  AF_DEV void write(T* out, int64_t*, const State& s, int64_t) const {
    const int64_t denom = s.n - correction;
    *out = from_float<T>(denom > 0 ? s.m2 / static_cast<float>(denom) : NAN);
  }
};

// ---- kernels ------------------------------------------------------------------------------------------------

struct RedParams {
  int64_t n_out = 0, n_red = 0;
  OffsetCalc<2> kept;  // operand 0: input, 1: output
  OffsetCalc<1> red;   // input
  const char* x = nullptr;
  char* out = nullptr;       // T* (values) or int64_t* (arg reductions)
  void* partial = nullptr;   // State[nsplit][n_out] when nsplit > 1
  int nsplit = 1;
};

// Writes the final state of output o, or its partial when the reduction is split across blocks.
template <class R, class T>
AF_DEV void emit(const RedParams& p, const R& r, int64_t o, int split, const typename R::State& s) {
  if (p.nsplit > 1) {
    static_cast<typename R::State*>(p.partial)[static_cast<int64_t>(split) * p.n_out + o] = s;
    return;
  }
  int64_t off[2];
  p.kept.get(o, off);
  r.write(reinterpret_cast<T*>(p.out) + off[1], reinterpret_cast<int64_t*>(p.out) + off[1], s, p.n_red);
}

template <class R, class T, bool kInner>
__global__ void __launch_bounds__(512) reduce_kernel(RedParams p, R r) {
  using S = typename R::State;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S* smem = reinterpret_cast<S*>(smem_raw);
  const int red_lane = kInner ? threadIdx.x : threadIdx.y;
  const int red_threads = kInner ? blockDim.x : blockDim.y;
  const int out_lane = kInner ? threadIdx.y : threadIdx.x;
  const int out_threads = kInner ? blockDim.y : blockDim.x;
  const int split = blockIdx.y;
  const int64_t red_step = static_cast<int64_t>(red_threads) * p.nsplit;
  // Grid-stride over groups of outputs; the loop bound is uniform across the block (barriers inside).
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * out_threads; base < p.n_out;
       base += static_cast<int64_t>(gridDim.x) * out_threads) {
    const int64_t o = base + out_lane;
    S acc = r.identity();
    if (o < p.n_out) {
      int64_t koff[2];
      p.kept.get(o, koff);
      const T* xo = reinterpret_cast<const T*>(p.x) + koff[0];
      for (int64_t i = static_cast<int64_t>(split) * red_threads + red_lane; i < p.n_red; i += red_step) {
        int64_t roff[1];
        p.red.get(i, roff);
        r.add(acc, to_float(xo[roff[0]]), i);
      }
    }
    if constexpr (kInner) {
      // Warp shuffles (a warp lies inside one output's lanes: blockDim.x is a multiple of 32), then the
      // warps' partials through shared memory and one more round of shuffles in the first warp.
      AF_UNROLL
      for (int off = 16; off > 0; off >>= 1) r.merge(acc, r.shfl_down(acc, off));
      const int warps = red_threads >> 5, warp = red_lane >> 5, lane = red_lane & 31;
      if (warps > 1) {
        if (lane == 0) smem[out_lane * warps + warp] = acc;
        __syncthreads();
        if (warp == 0) {
          acc = lane < warps ? smem[out_lane * warps + lane] : r.identity();
          AF_UNROLL
          for (int off = 16; off > 0; off >>= 1) r.merge(acc, r.shfl_down(acc, off));
        }
        __syncthreads();  // smem is reused by the next group
      }
      if (red_lane == 0 && o < p.n_out) emit<R, T>(p, r, o, split, acc);
    } else {
      // smem[red_lane][out_lane]; a tree over red_lane (red_threads is a power of two).
      smem[red_lane * out_threads + out_lane] = acc;
      __syncthreads();
      for (int s = red_threads >> 1; s > 0; s >>= 1) {
        if (red_lane < s) r.merge(smem[red_lane * out_threads + out_lane], smem[(red_lane + s) * out_threads + out_lane]);
        __syncthreads();
      }
      if (red_lane == 0 && o < p.n_out) emit<R, T>(p, r, o, split, smem[out_lane]);
      __syncthreads();
    }
  }
}

// Merges the split partials of each output in split order and writes the result.
template <class R, class T>
__global__ void __launch_bounds__(kThreads) reduce_finish_kernel(RedParams p, R r) {
  using S = typename R::State;
  const S* part = static_cast<const S*>(p.partial);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < p.n_out; o += step) {
    S acc = part[o];
    for (int s = 1; s < p.nsplit; ++s) r.merge(acc, part[static_cast<int64_t>(s) * p.n_out + o]);
    int64_t off[2];
    p.kept.get(o, off);
    r.write(reinterpret_cast<T*>(p.out) + off[1], reinterpret_cast<int64_t*>(p.out) + off[1], acc, p.n_red);
  }
}

int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

template <class R>
void run_reduce(const Tensor& x, const Tensor& out, const ReducePlan& plan, const R& r) {
  using S = typename R::State;
  if (plan.n_out == 0) return;
  DeviceGuard guard(out.device());
  const DeviceState& ds = device_state(out.device());
  RedParams p;
  p.n_out = plan.n_out;
  p.n_red = plan.n_red;
  p.kept = plan.kept.calc<2>();
  p.red = plan.red.calc<1>();
  p.x = static_cast<const char*>(x.data_ptr());
  p.out = static_cast<char*>(out.data_ptr());

  // Block shape: reduction threads x output threads (swapped roles for the outer layout).
  int red_threads, out_threads;
  dim3 block;
  if (plan.inner) {
    red_threads = static_cast<int>(std::clamp<int64_t>(pow2_at_least(plan.n_red), 32, 512));
    out_threads = std::max(1, 256 / red_threads);
    block = dim3(red_threads, out_threads);
  } else {
    out_threads = 32;
    red_threads = static_cast<int>(std::clamp<int64_t>(pow2_at_least(plan.n_red), 1, 16));
    block = dim3(out_threads, red_threads);
  }
  const int64_t groups = (plan.n_out + out_threads - 1) / out_threads;
  const int64_t target_blocks = static_cast<int64_t>(ds.sm_count) * 4;
  const unsigned grid_x = static_cast<unsigned>(std::min<int64_t>(groups, target_blocks * 8));
  // Split long reductions across blocks when the outputs alone cannot fill the device, keeping at least
  // 32 elements per thread so the partial states stay cheap next to the reading.
  int64_t nsplit = 1;
  if (groups < target_blocks && plan.n_red > static_cast<int64_t>(red_threads) * 64) {
    nsplit = std::min<int64_t>((target_blocks + groups - 1) / groups,
                               (plan.n_red + static_cast<int64_t>(red_threads) * 32 - 1) / (red_threads * 32));
    nsplit = std::clamp<int64_t>(nsplit, 1, 1024);
  }
  p.nsplit = static_cast<int>(nsplit);
  const int device = out.device().index;
  Scratch partial(device, nsplit > 1 ? static_cast<size_t>(nsplit * plan.n_out) * sizeof(S) : 0);
  p.partial = partial.get();
  const size_t smem = plan.inner ? static_cast<size_t>(out_threads) * std::max(1, red_threads / 32) * sizeof(S)
                                 : static_cast<size_t>(out_threads) * red_threads * sizeof(S);
  const dim3 grid(grid_x, static_cast<unsigned>(nsplit));
  visit_float(x.dtype(), "reduction", [&](auto tag) {
    using T = decltype(tag);
    if (plan.inner)
      reduce_kernel<R, T, true><<<grid, block, smem, ds.compute>>>(p, r);
    else
      reduce_kernel<R, T, false><<<grid, block, smem, ds.compute>>>(p, r);
    AF_CUDA_CHECK_LAUNCH();
    if (nsplit > 1) {
      reduce_finish_kernel<R, T><<<blocks_for(plan.n_out, kThreads, ds), kThreads, 0, ds.compute>>>(p, r);
      AF_CUDA_CHECK_LAUNCH();
    }
  });
}

enum class Kind { Sum, Mean, Max, Min, ArgMax, ArgMin, Var };

void reduce_cuda(const KernelArgs& a, Kind kind) {
  const Tensor& x = a.in(0);
  const Tensor& out = a.out(0);
  const auto& at = a.attr<ReduceAttrs>();
  const ReducePlan plan = make_reduce_plan(x, out, at.dims);
  switch (kind) {
    case Kind::Sum: run_reduce(x, out, plan, SumReducer{false}); break;
    case Kind::Mean: run_reduce(x, out, plan, SumReducer{true}); break;
    case Kind::Max: run_reduce(x, out, plan, ExtremumReducer{true}); break;
    case Kind::Min: run_reduce(x, out, plan, ExtremumReducer{false}); break;
    case Kind::ArgMax: run_reduce(x, out, plan, ArgReducer{true}); break;
    case Kind::ArgMin: run_reduce(x, out, plan, ArgReducer{false}); break;
    case Kind::Var: run_reduce(x, out, plan, VarReducer{at.correction}); break;
  }
}

}  // namespace

void register_reduce_cuda() {
  auto reg = [](OpId op, KernelFn fn) { register_kernel(op, DeviceType::CUDA, fn); };
  reg(OpId::sum, [](const KernelArgs& a) { reduce_cuda(a, Kind::Sum); });
  reg(OpId::mean, [](const KernelArgs& a) { reduce_cuda(a, Kind::Mean); });
  reg(OpId::amax, [](const KernelArgs& a) { reduce_cuda(a, Kind::Max); });
  reg(OpId::amin, [](const KernelArgs& a) { reduce_cuda(a, Kind::Min); });
  reg(OpId::argmax, [](const KernelArgs& a) { reduce_cuda(a, Kind::ArgMax); });
  reg(OpId::argmin, [](const KernelArgs& a) { reduce_cuda(a, Kind::ArgMin); });
  reg(OpId::var, [](const KernelArgs& a) { reduce_cuda(a, Kind::Var); });
}

}  // namespace ampforge::cuda
