// CPU elementwise kernels: fill, copy/cast, arange, random, unary, binary, comparisons, where, and the
// elementwise backward kernels. All arithmetic on 16-bit floats runs in float (chunks converted in L1).
#include <cmath>
#include <cstring>

#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/backends/cpu/vec_math.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/core/generator.h"

namespace ampforge::cpu {
namespace {

// ---- helpers -------------------------------------------------------------------------------------

template <class F>
void unary_float(const KernelArgs& a, const char* what, F f) {
  visit_float(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    map_kernel<S, S, A, 1>(a.out(0), {&a.in(0)}, [&](A* o, const A* const* in, int64_t n) {
      const A* x = in[0];
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
    });
  });
}

// Transcendental unary ops: f(o, x, t, n) computes o[0, n) from x[0, n) with whole-array calls into
// vec_math.h, using t (n scratch values) for intermediates; called on pieces of at most kChunk. o may be x.
template <class F>
void unary_vec(const KernelArgs& a, const char* what, F f) {
  visit_float(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    map_kernel<S, S, A, 1>(a.out(0), {&a.in(0)}, [&](A* o, const A* const* in, int64_t n) {
      alignas(64) A t[kChunk];
      for (int64_t c = 0; c < n; c += kChunk) f(o + c, in[0] + c, t, std::min(kChunk, n - c));
    });
  });
}

// The same for backward kernels: f(o, g, x, t, n) with g the incoming gradient.
template <class F>
void binary_vec(const KernelArgs& a, const char* what, F f) {
  visit_float(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    map_kernel<S, S, A, 2>(a.out(0), {&a.in(0), &a.in(1)}, [&](A* o, const A* const* in, int64_t n) {
      alignas(64) A t[kChunk];
      for (int64_t c = 0; c < n; c += kChunk) f(o + c, in[0] + c, in[1] + c, t, std::min(kChunk, n - c));
    });
  });
}

template <class F>
void unary_arith(const KernelArgs& a, const char* what, F f) {
  visit_arith(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    map_kernel<S, S, A, 1>(a.out(0), {&a.in(0)}, [&](A* o, const A* const* in, int64_t n) {
      const A* x = in[0];
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<A>(f(x[i]));
    });
  });
}

// ---- mixed 16-bit / F32 operands (dispatch.h: declare_mixed_float_inputs) ----------------------------
// ops/ passes F16/BF16 operands of an F32 result (or of a comparison computed in F32) as they are; each
// chunk of each operand is converted into an L1 buffer here, so no full-size F32 copy is ever made.

bool mixed_inputs(const KernelArgs& a) {
  const DType o = a.out(0).dtype() == DType::Bool ? promote_types(a.in(0).dtype(), a.in(1).dtype()) : a.out(0).dtype();
  return a.in(0).dtype() != o || a.in(1).dtype() != o;
}

void load_as_float(DType d, const char* p, int64_t bs, int64_t n, float* out) {
  switch (d) {
    case DType::F32: load_strided<float, float>(p, bs, n, out); return;
    case DType::F16: load_strided<Half, float>(p, bs, n, out); return;
    case DType::BF16: load_strided<BFloat16, float>(p, bs, n, out); return;
    default: AF_ASSERT(false, "mixed-dtype operand of dtype {} (only F16/BF16/F32 are declared)", dtype_name(d));
  }
}

// out = f(x, y) in float; out is F32, or Bool for comparisons.
template <class F>
void binary_mixed(const KernelArgs& a, F f) {
  const Tensor& out = a.out(0);
  const bool to_bool = out.dtype() == DType::Bool;
  AF_ASSERT(to_bool || out.dtype() == DType::F32, "mixed-dtype binary op with a {} result", dtype_name(out.dtype()));
  const DType da = a.in(0).dtype(), db = a.in(1).dtype();
  ElementwiseIter it = make_elementwise_iter(out, {&a.in(0), &a.in(1)});
  for_each_run(it, [&](char** ptrs, const int64_t* bs, int64_t n) {
    alignas(64) float x[kChunk], y[kChunk], o[kChunk];
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t m = std::min(kChunk, n - c);
      load_as_float(da, ptrs[1] + c * bs[1], bs[1], m, x);
      load_as_float(db, ptrs[2] + c * bs[2], bs[2], m, y);
      if (to_bool) {
        for (int64_t i = 0; i < m; ++i) *reinterpret_cast<bool*>(ptrs[0] + (c + i) * bs[0]) = f(x[i], y[i]);
      } else {
        for (int64_t i = 0; i < m; ++i) o[i] = static_cast<float>(f(x[i], y[i]));
        store_strided<float, float>(o, ptrs[0] + c * bs[0], bs[0], m);
      }
    }
  });
}

template <class F>
void binary_arith(const KernelArgs& a, const char* what, F f) {
  if (mixed_inputs(a)) return binary_mixed(a, f);
  visit_arith(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    map_kernel<S, S, A, 2>(a.out(0), {&a.in(0), &a.in(1)}, [&](A* o, const A* const* in, int64_t n) {
      const A* x = in[0];
      const A* y = in[1];
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<A>(f(x[i], y[i]));
    });
  });
}

template <class F>
void binary_float(const KernelArgs& a, const char* what, F f) {
  if (mixed_inputs(a)) return binary_mixed(a, f);
  visit_float(a.out(0).dtype(), what, [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    map_kernel<S, S, A, 2>(a.out(0), {&a.in(0), &a.in(1)}, [&](A* o, const A* const* in, int64_t n) {
      const A* x = in[0];
      const A* y = in[1];
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    });
  });
}

// Comparisons: inputs of one arithmetic (or Bool) dtype, output Bool.
template <class F>
void compare(const KernelArgs& a, const char* what, F f) {
  if (mixed_inputs(a)) return binary_mixed(a, f);
  auto run = [&](auto tag) {
    using S = decltype(tag);
    using A = std::conditional_t<std::is_same_v<S, bool>, uint8_t, compute_t<S>>;
    using SIn = std::conditional_t<std::is_same_v<S, bool>, uint8_t, S>;
    // Output computed as A (0/1) then stored as bool.
    map_kernel<SIn, bool, A, 2>(a.out(0), {&a.in(0), &a.in(1)}, [&](A* o, const A* const* in, int64_t n) {
      const A* x = in[0];
      const A* y = in[1];
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]) ? A(1) : A(0);
    });
  };
  if (a.in(0).dtype() == DType::Bool)
    run(bool{});
  else
    visit_arith(a.in(0).dtype(), what, run);
}

// ---- creation ------------------------------------------------------------------------------------

void fill_kernel(const KernelArgs& a) {
  const double v = a.attr<FillAttrs>().value;
  const Tensor& out = a.out(0);
  visit_dtype(out.dtype(), [&](auto tag) {
    using S = decltype(tag);
    S value;
    if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
      value = S(static_cast<float>(v));
    else
      value = static_cast<S>(v);
    ElementwiseIter it = make_elementwise_iter(out, {});
    for_each_run(it, [&](char** p, const int64_t* bs, int64_t n) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(p[0] + i * bs[0], &value, sizeof(S));
    });
  });
}

// A strided run of n elements of T (bs[0], bs[1]: byte strides of out and in; in's may be 0, a broadcast).
template <class T>
void copy_run_strided(char** p, const int64_t* bs, int64_t n) {
  char* o = p[0];
  const char* x = p[1];
  if (bs[1] == 0) {
    T v;
    std::memcpy(&v, x, sizeof(T));
    if (bs[0] == static_cast<int64_t>(sizeof(T))) {
      T* op = reinterpret_cast<T*>(o);
      for (int64_t i = 0; i < n; ++i) op[i] = v;
    } else {
      for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * bs[0], &v, sizeof(T));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, x + i * bs[1], sizeof(T));
    std::memcpy(o + i * bs[0], &v, sizeof(T));
  }
}

// 32x32 tiles over (t, last): out is contiguous along `last`, in along `t` (see copy_transposed).
template <class T>
void transpose_tiles(const ElementwiseIter& it, int t) {
  constexpr int64_t kTile = 32;
  const int nd = it.ndim, last = nd - 1;
  const int64_t rows = it.shape[t], cols = it.shape[last];
  const int64_t o_row = it.strides[0][t] / static_cast<int64_t>(sizeof(T));
  const int64_t i_col = it.strides[1][last] / static_cast<int64_t>(sizeof(T));
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  int64_t outer = 1;
  for (int d = 0; d < last; ++d)
    if (d != t) outer *= it.shape[d];
  const int64_t tiles = outer * row_tiles * col_tiles;
  parallel_for(tiles, std::max<int64_t>(1, kElementwiseGrain / (kTile * kTile)), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t ct = k % col_tiles, rt = (k / col_tiles) % row_tiles;
      int64_t rem = k / (col_tiles * row_tiles);
      char* ob = it.base[0];
      const char* ib = it.base[1];
      for (int d = last - 1; d >= 0; --d) {
        if (d == t) continue;
        const int64_t i = rem % it.shape[d];
        rem /= it.shape[d];
        ob += i * it.strides[0][d];
        ib += i * it.strides[1][d];
      }
      T* o = reinterpret_cast<T*>(ob);
      const T* x = reinterpret_cast<const T*>(ib);
      const int64_t r0 = rt * kTile, r1 = std::min(rows, r0 + kTile);
      const int64_t c0 = ct * kTile, c1 = std::min(cols, c0 + kTile);
      // Through an L1 tile, every pass with a unit stride: a strided inner loop is vectorised into
      // scatters or gathers, which are slow (6x slower than this on AMD Zen 5: 1.80 vs 0.31 ms for (2,80,8400)).
      alignas(64) T buf[kTile][kTile];
      const int64_t nr = r1 - r0, nc = c1 - c0;
      for (int64_t c = 0; c < nc; ++c) {
        const T* xr = x + (c0 + c) * i_col + r0;
        for (int64_t r = 0; r < nr; ++r) buf[r][c] = xr[r];
      }
      for (int64_t r = 0; r < nr; ++r) {
        T* orow = o + (r0 + r) * o_row + c0;
        for (int64_t c = 0; c < nc; ++c) orow[c] = buf[r][c];
      }
    }
  });
}

// A same-dtype copy whose out is contiguous along its innermost dim while in is strided there and contiguous
// along another dim t: a transpose (YOLOv8's (B, C, A) <-> (B, A, C) head and loss layouts, NCHW <-> NHWC).
// Runs along out's inner dim would read one cache line per element; tiles read and write whole lines.
// Returns false (nothing done) when the copy is not of this form or too small to matter.
bool copy_transposed(const ElementwiseIter& it, int64_t es) {
  const int nd = it.ndim, last = nd - 1;
  if (nd < 2 || (es != 2 && es != 4 && es != 8) || it.numel < 4096) return false;
  if (it.strides[0][last] != es || it.strides[1][last] == es || it.strides[1][last] % es != 0) return false;
  int t = -1;
  for (int d = 0; d < last; ++d)
    if (it.strides[1][d] == es && it.shape[d] > 1) t = d;
  if (t < 0 || it.shape[t] < 8 || it.shape[last] < 8 || it.strides[0][t] % es != 0) return false;
  switch (es) {
    case 2: transpose_tiles<uint16_t>(it, t); break;
    case 4: transpose_tiles<uint32_t>(it, t); break;
    default: transpose_tiles<uint64_t>(it, t); break;
  }
  return true;
}

// F32 <-> F16/BF16 (autocast's casts, the master-weight copies): runs contiguous on both sides go straight through
// the bulk converters (core/convert.h), not through map_kernel's float buffers (a load, a copy and a store per
// chunk); other runs are converted in L1 chunks.
template <class SI, class SO>
void convert_runs(const Tensor& out, const Tensor& in) {
  const ElementwiseIter it = make_elementwise_iter(out, {&in});
  for_each_run(it, [](char** p, const int64_t* bs, int64_t n) {
    if (bs[0] == static_cast<int64_t>(sizeof(SO)) && bs[1] == static_cast<int64_t>(sizeof(SI))) {
      if constexpr (std::is_same_v<SI, float>)
        store_n<SO, float>(reinterpret_cast<const float*>(p[1]), reinterpret_cast<SO*>(p[0]), n);
      else
        load_n<SI, float>(reinterpret_cast<const SI*>(p[1]), reinterpret_cast<float*>(p[0]), n);
      return;
    }
    alignas(64) float buf[kChunk];
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t m = std::min(kChunk, n - c);
      load_strided<SI, float>(p[1] + c * bs[1], bs[1], m, buf);
      store_strided<SO, float>(buf, p[0] + c * bs[0], bs[0], m);
    }
  });
}

// copy: out <- in with broadcasting and dtype conversion (Bool output stores x != 0).
void copy_kernel(const KernelArgs& a) {
  const Tensor& out = a.out(0);
  const Tensor& in = a.in(0);
  if (in.dtype() == out.dtype()) {
    const int64_t es = in.element_size();
    const ElementwiseIter it = make_elementwise_iter(out, {&in});
    if (copy_transposed(it, es)) return;
    for_each_run(it, [&](char** p, const int64_t* bs, int64_t n) {
      if (bs[0] == es && bs[1] == es) {
        std::memcpy(p[0], p[1], static_cast<size_t>(n * es));
        return;
      }
      switch (es) {  // typed moves, not a memcpy call per element (strided views, broadcasts)
        case 1: copy_run_strided<uint8_t>(p, bs, n); break;
        case 2: copy_run_strided<uint16_t>(p, bs, n); break;
        case 4: copy_run_strided<uint32_t>(p, bs, n); break;
        case 8: copy_run_strided<uint64_t>(p, bs, n); break;
        default:
          for (int64_t i = 0; i < n; ++i) std::memcpy(p[0] + i * bs[0], p[1] + i * bs[1], static_cast<size_t>(es));
      }
    });
    return;
  }
  if (convert_float16_pair(out, in)) return;
  visit_dtype(in.dtype(), [&](auto itag) {
    visit_dtype(out.dtype(), [&](auto otag) {
      using SI = decltype(itag);
      using SO = decltype(otag);
      constexpr bool wide = std::is_same_v<SI, double> || std::is_same_v<SO, double> ||
                            std::is_same_v<SI, int64_t> || std::is_same_v<SO, int64_t> ||
                            std::is_same_v<SI, int32_t> || std::is_same_v<SO, int32_t>;
      using A = std::conditional_t<wide, double, float>;
      map_kernel<SI, SO, A, 1>(out, {&in}, [](A* o, const A* const* x, int64_t n) { std::memcpy(o, x[0], n * sizeof(A)); });
    });
  });
}

void arange_kernel(const KernelArgs& a) {
  const auto& at = a.attr<ArangeAttrs>();
  const Tensor& out = a.out(0);
  visit_dtype(out.dtype(), [&](auto tag) {
    using S = decltype(tag);
    if constexpr (std::is_same_v<S, bool>) {
      AF_THROW(InvalidArgument, "arange: Bool output is not supported");
    } else {
      S* p = out.data<S>();
      const int64_t n = out.numel();
      for (int64_t i = 0; i < n; ++i) {
        const double v = at.start + static_cast<double>(i) * at.step;
        if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
          p[i] = S(static_cast<float>(v));
        else
          p[i] = static_cast<S>(v);
      }
    }
  });
}

// Random numbers: element i uses Philox counter (offset + i/4), word i%4 (uniform), or counter
// (offset + i/2) with a Box-Muller pair (normal). Independent of threads and devices.
void rand_uniform_kernel(const KernelArgs& a) {
  const auto& at = a.attr<RandAttrs>();
  const Tensor& out = a.out(0);
  AF_ASSERT(out.is_contiguous(), "rand_uniform: output must be contiguous");
  const float lo = static_cast<float>(at.a), span = static_cast<float>(at.b - at.a);
  visit_float(out.dtype(), "rand", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    S* p = static_cast<S*>(out.data_ptr());
    parallel_for((out.numel() + 3) / 4, 4096, [&](int64_t b, int64_t e) {
      A buf[4];
      for (int64_t c = b; c < e; ++c) {
        auto w = philox4x32(at.philox.seed, at.philox.offset + static_cast<uint64_t>(c));
        const int64_t m = std::min<int64_t>(4, out.numel() - c * 4);
        for (int j = 0; j < m; ++j) buf[j] = static_cast<A>(lo + span * uint_to_unit_float(w[j]));
        store_n<S, A>(buf, p + c * 4, m);
      }
    });
  });
}

void rand_normal_kernel(const KernelArgs& a) {
  const auto& at = a.attr<RandAttrs>();
  const Tensor& out = a.out(0);
  AF_ASSERT(out.is_contiguous(), "rand_normal: output must be contiguous");
  const double mean = at.a, stdv = at.b;
  visit_float(out.dtype(), "randn", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    S* p = static_cast<S*>(out.data_ptr());
    parallel_for((out.numel() + 1) / 2, 4096, [&](int64_t b, int64_t e) {
      A buf[2];
      for (int64_t c = b; c < e; ++c) {
        auto w = philox4x32(at.philox.seed, at.philox.offset + static_cast<uint64_t>(c));
        // u1 in (0, 1] so log(u1) is finite.
        const double u1 = (static_cast<double>(w[0] >> 8) + 1.0) * (1.0 / 16777216.0);
        const double u2 = static_cast<double>(w[1] >> 8) * (1.0 / 16777216.0);
        const double r = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
        buf[0] = static_cast<A>(mean + stdv * r * std::cos(th));
        buf[1] = static_cast<A>(mean + stdv * r * std::sin(th));
        const int64_t m = std::min<int64_t>(2, out.numel() - c * 2);
        store_n<S, A>(buf, p + c * 2, m);
      }
    });
  });
}

// ---- math ----------------------------------------------------------------------------------------

// Array forms (see unary_vec): o may alias x; t is scratch of n values.
constexpr double kSqrtHalf = 0.70710678118654752440, kSqrt2OverPi = 0.79788456080286535588,
                 kInvSqrt2Pi = 0.39894228040143267794, kGeluTanhC = 0.044715;

template <class A>
void sigmoid_n(A* o, const A* x, A*, int64_t n) {  // 1 / (1 + exp(-x))
  vmath::sigmoid(x, o, n);
}
template <class A>
void gelu_erf_n(A* o, const A* x, A*, int64_t n) {  // x * Phi(x)
  vmath::gelu_erf(x, o, n);
}
template <class A>
void gelu_tanh_n(A* o, const A* x, A* t, int64_t n) {
  for (int64_t i = 0; i < n; ++i) t[i] = A(kSqrt2OverPi) * (x[i] + A(kGeluTanhC) * x[i] * x[i] * x[i]);
  vmath::tanh(t, t, n);
  for (int64_t i = 0; i < n; ++i) o[i] = A(0.5) * x[i] * (A(1) + t[i]);
}

void where_kernel(const KernelArgs& a) {
  const Tensor& out = a.out(0);
  visit_dtype(out.dtype(), [&](auto tag) {
    using S = decltype(tag);
    ElementwiseIter it = make_elementwise_iter(out, {&a.in(0), &a.in(1), &a.in(2)});
    for_each_run(it, [&](char** p, const int64_t* bs, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const bool c = *reinterpret_cast<const bool*>(p[1] + i * bs[1]);
        std::memcpy(p[0] + i * bs[0], c ? p[2] + i * bs[2] : p[3] + i * bs[3], sizeof(S));
      }
    });
  });
}

}  // namespace

// loops.h. The four pairs run on convert_runs.
bool convert_float16_pair(const Tensor& out, const Tensor& in) {
  const DType di = in.dtype(), d = out.dtype();
  if (di == DType::F32 && d == DType::BF16) convert_runs<float, BFloat16>(out, in);
  else if (di == DType::F32 && d == DType::F16) convert_runs<float, Half>(out, in);
  else if (di == DType::BF16 && d == DType::F32) convert_runs<BFloat16, float>(out, in);
  else if (di == DType::F16 && d == DType::F32) convert_runs<Half, float>(out, in);
  else return false;
  return true;
}

void register_elementwise_cpu() {
  auto reg = [](OpId op, KernelFn fn) { register_kernel(op, DeviceType::CPU, fn); };
  reg(OpId::fill, fill_kernel);
  reg(OpId::copy, copy_kernel);
  reg(OpId::arange, arange_kernel);
  reg(OpId::rand_uniform, rand_uniform_kernel);
  reg(OpId::rand_normal, rand_normal_kernel);

  reg(OpId::neg, [](const KernelArgs& a) { unary_arith(a, "neg", [](auto x) { return -x; }); });
  reg(OpId::abs, [](const KernelArgs& a) { unary_arith(a, "abs", [](auto x) { return x < 0 ? -x : x; }); });
  reg(OpId::sign, [](const KernelArgs& a) {
    unary_arith(a, "sign", [](auto x) { return static_cast<decltype(x)>((x > 0) - (x < 0)); });
  });
  reg(OpId::exp, [](const KernelArgs& a) {
    unary_vec(a, "exp", [](auto* o, const auto* x, auto*, int64_t n) { vmath::exp(x, o, n); });
  });
  reg(OpId::log, [](const KernelArgs& a) {
    unary_vec(a, "log", [](auto* o, const auto* x, auto*, int64_t n) { vmath::log(x, o, n); });
  });
  reg(OpId::sqrt, [](const KernelArgs& a) { unary_float(a, "sqrt", [](auto x) { return std::sqrt(x); }); });
  reg(OpId::rsqrt, [](const KernelArgs& a) {
    unary_float(a, "rsqrt", [](auto x) { return decltype(x)(1) / std::sqrt(x); });
  });
  reg(OpId::relu, [](const KernelArgs& a) {
    unary_float(a, "relu", [](auto x) { return x > decltype(x)(0) ? x : decltype(x)(0); });
  });
  reg(OpId::gelu, [](const KernelArgs& a) {
    if (a.attr<GeluAttrs>().approximate == GeluApprox::Tanh)
      unary_vec(a, "gelu", [](auto* o, const auto* x, auto* t, int64_t n) { gelu_tanh_n(o, x, t, n); });
    else
      unary_vec(a, "gelu", [](auto* o, const auto* x, auto* t, int64_t n) { gelu_erf_n(o, x, t, n); });
  });
  reg(OpId::silu, [](const KernelArgs& a) {
    unary_vec(a, "silu", [](auto* o, const auto* x, auto* t, int64_t n) {
      sigmoid_n(t, x, t, n);
      for (int64_t i = 0; i < n; ++i) o[i] = x[i] * t[i];
    });
  });
  reg(OpId::sigmoid, [](const KernelArgs& a) {
    unary_vec(a, "sigmoid", [](auto* o, const auto* x, auto* t, int64_t n) { sigmoid_n(o, x, t, n); });
  });
  reg(OpId::tanh, [](const KernelArgs& a) {
    unary_vec(a, "tanh", [](auto* o, const auto* x, auto*, int64_t n) { vmath::tanh(x, o, n); });
  });
  // atan: std::atan per element (CIoU's aspect-ratio term; not hot enough for a vector path).
  reg(OpId::atan, [](const KernelArgs& a) { unary_float(a, "atan", [](auto x) { return std::atan(x); }); });
  reg(OpId::add_scalar, [](const KernelArgs& a) {
    const double s = a.attr<ScalarAttrs>().scalar;
    unary_arith(a, "add", [s](auto x) { return static_cast<decltype(x)>(x + static_cast<decltype(x)>(s)); });
  });
  reg(OpId::mul_scalar, [](const KernelArgs& a) {
    const double s = a.attr<ScalarAttrs>().scalar;
    unary_arith(a, "mul", [s](auto x) { return static_cast<decltype(x)>(x * static_cast<decltype(x)>(s)); });
  });
  reg(OpId::pow_scalar, [](const KernelArgs& a) {
    const double s = a.attr<ScalarAttrs>().scalar;
    if (s == 2.0)
      unary_float(a, "pow", [](auto x) { return x * x; });
    else
      unary_float(a, "pow", [s](auto x) { return std::pow(x, static_cast<decltype(x)>(s)); });
  });
  reg(OpId::clamp, [](const KernelArgs& a) {
    const auto at = a.attr<ClampAttrs>();
    unary_arith(a, "clamp", [at](auto x) {
      using A = decltype(x);
      if (at.has_min && x < static_cast<A>(at.min)) x = static_cast<A>(at.min);
      if (at.has_max && x > static_cast<A>(at.max)) x = static_cast<A>(at.max);
      return x;
    });
  });

  reg(OpId::add, [](const KernelArgs& a) { binary_arith(a, "add", [](auto x, auto y) { return x + y; }); });
  reg(OpId::sub, [](const KernelArgs& a) { binary_arith(a, "sub", [](auto x, auto y) { return x - y; }); });
  reg(OpId::mul, [](const KernelArgs& a) { binary_arith(a, "mul", [](auto x, auto y) { return x * y; }); });
  reg(OpId::div, [](const KernelArgs& a) { binary_float(a, "div", [](auto x, auto y) { return x / y; }); });
  reg(OpId::pow, [](const KernelArgs& a) { binary_float(a, "pow", [](auto x, auto y) { return std::pow(x, y); }); });
  // NaN propagates, as in PyTorch's maximum/minimum.
  reg(OpId::maximum, [](const KernelArgs& a) {
    binary_arith(a, "maximum", [](auto x, auto y) { return (x != x || x > y) ? x : y; });
  });
  reg(OpId::minimum, [](const KernelArgs& a) {
    binary_arith(a, "minimum", [](auto x, auto y) { return (x != x || x < y) ? x : y; });
  });
  for (OpId op : {OpId::add, OpId::sub, OpId::mul, OpId::div, OpId::pow, OpId::maximum, OpId::minimum, OpId::eq,
                  OpId::ne, OpId::lt, OpId::le, OpId::gt, OpId::ge})
    declare_mixed_float_inputs(op, DeviceType::CPU);
  reg(OpId::eq, [](const KernelArgs& a) { compare(a, "eq", [](auto x, auto y) { return x == y; }); });
  reg(OpId::ne, [](const KernelArgs& a) { compare(a, "ne", [](auto x, auto y) { return x != y; }); });
  reg(OpId::lt, [](const KernelArgs& a) { compare(a, "lt", [](auto x, auto y) { return x < y; }); });
  reg(OpId::le, [](const KernelArgs& a) { compare(a, "le", [](auto x, auto y) { return x <= y; }); });
  reg(OpId::gt, [](const KernelArgs& a) { compare(a, "gt", [](auto x, auto y) { return x > y; }); });
  reg(OpId::ge, [](const KernelArgs& a) { compare(a, "ge", [](auto x, auto y) { return x >= y; }); });
  reg(OpId::where, where_kernel);

  // Backward kernels: inputs (grad_out, saved), output grad_in.
  reg(OpId::relu_backward, [](const KernelArgs& a) {
    binary_float(a, "relu_backward", [](auto g, auto y) { return y > decltype(y)(0) ? g : decltype(g)(0); });
  });
  reg(OpId::gelu_backward, [](const KernelArgs& a) {
    if (a.attr<GeluAttrs>().approximate == GeluApprox::Tanh) {
      binary_vec(a, "gelu_backward", [](auto* o, const auto* g, const auto* x, auto* t, int64_t n) {
        using A = std::remove_cvref_t<decltype(*t)>;
        const A k = A(kSqrt2OverPi), c = A(kGeluTanhC);
        for (int64_t i = 0; i < n; ++i) t[i] = k * (x[i] + c * x[i] * x[i] * x[i]);
        vmath::tanh(t, t, n);
        for (int64_t i = 0; i < n; ++i)
          o[i] = g[i] * (A(0.5) * (A(1) + t[i]) + A(0.5) * x[i] * (A(1) - t[i] * t[i]) * k *
                                                     (A(1) + A(3) * c * x[i] * x[i]));
      });
    } else {
      binary_vec(a, "gelu_backward", [](auto* o, const auto* g, const auto* x, auto* t, int64_t n) {
        using A = std::remove_cvref_t<decltype(*t)>;
        // d/dx x Phi(x) = Phi(x) + x phi(x); o holds phi's exponent, t the erf.
        alignas(64) A p[kChunk];
        for (int64_t i = 0; i < n; ++i) {
          t[i] = x[i] * A(kSqrtHalf);
          p[i] = A(-0.5) * x[i] * x[i];
        }
        vmath::erf(t, t, n);
        vmath::exp(p, p, n);
        for (int64_t i = 0; i < n; ++i)
          o[i] = g[i] * (A(0.5) * (A(1) + t[i]) + x[i] * p[i] * A(kInvSqrt2Pi));
      });
    }
  });
  reg(OpId::silu_backward, [](const KernelArgs& a) {
    binary_vec(a, "silu_backward", [](auto* o, const auto* g, const auto* x, auto* t, int64_t n) {
      using A = std::remove_cvref_t<decltype(*t)>;
      sigmoid_n(t, x, t, n);
      for (int64_t i = 0; i < n; ++i) o[i] = g[i] * t[i] * (A(1) + x[i] * (A(1) - t[i]));
    });
  });
  reg(OpId::sigmoid_backward, [](const KernelArgs& a) {
    binary_float(a, "sigmoid_backward", [](auto g, auto y) { return g * y * (decltype(y)(1) - y); });
  });
  reg(OpId::tanh_backward, [](const KernelArgs& a) {
    binary_float(a, "tanh_backward", [](auto g, auto y) { return g * (decltype(y)(1) - y * y); });
  });
  reg(OpId::clamp_backward, [](const KernelArgs& a) {
    const auto at = a.attr<ClampAttrs>();
    binary_float(a, "clamp_backward", [at](auto g, auto x) {
      using A = decltype(x);
      const bool pass = (!at.has_min || x >= static_cast<A>(at.min)) && (!at.has_max || x <= static_cast<A>(at.max));
      return pass ? g : A(0);
    });
  });
}

}  // namespace ampforge::cpu
