// Elementwise iteration on the CPU: broadcast operands to the output shape, order dimensions by the
// output's memory layout (so channels-last tensors stream in memory order), merge dimensions that are
// contiguous in every operand, then hand 1-D inner runs to a callback, in parallel.
//
// Operand 0 is the output; inputs follow. Input strides of broadcast dimensions are 0.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "ampforge/core/convert.h"
#include "ampforge/core/tensor.h"
#include "ampforge/util/thread_pool.h"

namespace ampforge::cpu {

inline constexpr int kMaxOperands = 4;
// Elements per parallel task: large enough that the pool's hand-off cost is noise.
inline constexpr int64_t kElementwiseGrain = 32768;
// Elements converted at a time between 16-bit storage and float compute (fits in L1 with a few operands).
inline constexpr int64_t kChunk = 256;
// F32 outputs of at least this size are written with non-temporal (streaming) stores: they cannot stay in
// the caches anyway (half the 32 MiB L3 of the machines we run on, shared with the inputs), so a normal
// store would first read each output line from memory (read-for-ownership) and evict input lines that the
// next call needs. Smaller outputs keep normal stores: the next op of a training step reads them from cache.
inline constexpr int64_t kStreamingStoreBytes = int64_t{16} << 20;

// Writes n floats from an L1 buffer to `dst` (32-byte aligned) with streaming stores. The caller issues
// one store fence after the last call (stream_fence).
inline void stream_store_f32(float* dst, const float* src, int64_t n) {
#if defined(__AVX__)
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
#else
  std::copy(src, src + n, dst);
#endif
}
inline void stream_fence() {
#if defined(__AVX__)
  _mm_sfence();
#endif
}

struct ElementwiseIter {
  int ndim = 0;
  int nops = 0;
  int64_t numel = 0;
  std::array<int64_t, kMaxDims> shape{};                                   // outermost first
  std::array<std::array<int64_t, kMaxDims>, kMaxOperands> strides{};       // bytes
  std::array<char*, kMaxOperands> base{};
};

// Builds the iteration plan. `out` defines the shape; every input must broadcast to it.
ElementwiseIter make_elementwise_iter(const Tensor& out, std::initializer_list<const Tensor*> inputs);

// Calls fn(char* ptrs[nops], const int64_t* inner_strides_bytes, int64_t n) for inner runs covering the
// tensor, split over the thread pool in ranges of linear index (static partition).
template <class F>
void for_each_run(const ElementwiseIter& it, F&& fn, int64_t grain = kElementwiseGrain) {
  if (it.numel == 0) return;
  const int nd = it.ndim, nops = it.nops;
  auto body = [&](int64_t begin, int64_t end) {
    std::array<int64_t, kMaxDims> idx{};
    int64_t rem = begin;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rem % it.shape[d];
      rem /= it.shape[d];
    }
    std::array<char*, kMaxOperands> ptrs{};
    std::array<int64_t, kMaxOperands> inner{};
    for (int k = 0; k < nops; ++k) {
      char* p = it.base[k];
      for (int d = 0; d < nd; ++d) p += idx[d] * it.strides[k][d];
      ptrs[k] = p;
      inner[k] = it.strides[k][nd - 1];
    }
    int64_t pos = begin;
    while (pos < end) {
      const int64_t run = std::min(it.shape[nd - 1] - idx[nd - 1], end - pos);
      fn(ptrs.data(), inner.data(), run);
      pos += run;
      // advance idx by `run` along the inner dim, carrying outward
      idx[nd - 1] += run;
      for (int k = 0; k < nops; ++k) ptrs[k] += run * inner[k];
      for (int d = nd - 1; d > 0 && idx[d] == it.shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
        for (int k = 0; k < nops; ++k) ptrs[k] += it.strides[k][d - 1] - it.shape[d] * it.strides[k][d];
      }
    }
  };
  parallel_for(it.numel, grain, body);
}

// Loads n elements of T (byte stride `bs`; 0 broadcasts one value) into a compute-type buffer.
template <class T, class A>
inline void load_strided(const char* p, int64_t bs, int64_t n, A* out) {
  if (bs == static_cast<int64_t>(sizeof(T))) {
    load_n<T, A>(reinterpret_cast<const T*>(p), out, n);
  } else if (bs == 0) {
    A v;
    load_n<T, A>(reinterpret_cast<const T*>(p), &v, 1);
    std::fill(out, out + n, v);
  } else {
    for (int64_t i = 0; i < n; ++i) load_n<T, A>(reinterpret_cast<const T*>(p + i * bs), out + i, 1);
  }
}

template <class T, class A>
inline void store_strided(const A* in, char* p, int64_t bs, int64_t n) {
  if (bs == static_cast<int64_t>(sizeof(T))) {
    store_n<T, A>(in, reinterpret_cast<T*>(p), n);
  } else {
    for (int64_t i = 0; i < n; ++i) store_n<T, A>(in + i, reinterpret_cast<T*>(p + i * bs), 1);
  }
}

// map: out = f(in_0, ..., in_{N-1}) elementwise. TIn is the storage type of every input, TOut of the
// output, A the compute type. `vf(A* out, const A* const* in, int64_t n)` works on contiguous buffers,
// so its loop vectorises; when storage and compute types agree and operands are contiguous, it runs on
// the tensors' memory directly (no copies).
template <class TIn, class TOut, class A, int N, class VF>
void map_kernel(const Tensor& out, std::initializer_list<const Tensor*> inputs, VF&& vf,
                int64_t grain = kElementwiseGrain) {
  ElementwiseIter it = make_elementwise_iter(out, inputs);
  const bool streaming = std::is_same_v<TOut, float> && std::is_same_v<A, float> && out.nbytes() >= kStreamingStoreBytes;
  for_each_run(
      it,
      [&](char** ptrs, const int64_t* bs, int64_t n) {
        bool direct = std::is_same_v<TOut, A> && bs[0] == static_cast<int64_t>(sizeof(TOut));
        if constexpr (std::is_same_v<TIn, A>) {
          for (int k = 1; k <= N; ++k) direct = direct && bs[k] == static_cast<int64_t>(sizeof(TIn));
        } else {
          direct = false;
        }
        if (direct) {
          const A* in[N > 0 ? N : 1];
          for (int k = 0; k < N; ++k) in[k] = reinterpret_cast<const A*>(ptrs[k + 1]);
          A* o = reinterpret_cast<A*>(ptrs[0]);
          if constexpr (std::is_same_v<A, float>) {
            if (streaming) {
              // Up to the first 32-byte boundary with normal stores, then chunks computed into L1 and
              // streamed out (the op's loop stays the same vectorised loop).
              const auto mis = static_cast<int64_t>((reinterpret_cast<uintptr_t>(o) / sizeof(float)) % 8);
              const int64_t head = std::min<int64_t>(n, mis == 0 ? 0 : 8 - mis);
              if (head > 0) vf(o, in, head);
              alignas(64) A obuf[kChunk];
              const A* cin[N > 0 ? N : 1];
              for (int64_t c = head; c < n; c += kChunk) {
                const int64_t m = std::min(kChunk, n - c);
                for (int k = 0; k < N; ++k) cin[k] = in[k] + c;
                vf(obuf, cin, m);
                stream_store_f32(o + c, obuf, m);
              }
              stream_fence();
              return;
            }
          }
          vf(o, in, n);
          return;
        }
        alignas(64) A obuf[kChunk];
        alignas(64) A ibuf[N > 0 ? N : 1][kChunk];
        const A* in[N > 0 ? N : 1];
        for (int k = 0; k < N; ++k) in[k] = ibuf[k];
        for (int64_t c = 0; c < n; c += kChunk) {
          const int64_t m = std::min(kChunk, n - c);
          for (int k = 0; k < N; ++k) load_strided<TIn, A>(ptrs[k + 1] + c * bs[k + 1], bs[k + 1], m, ibuf[k]);
          vf(obuf, in, m);
          store_strided<TOut, A>(obuf, ptrs[0] + c * bs[0], bs[0], m);
        }
      },
      grain);
}

// out <- in for the four F32 <-> F16/BF16 pairs, any strides on either side (elementwise.cpp: the copy kernel's
// conversion path, for kernels that stage 16-bit operands in F32); false, nothing done, for any other pair of dtypes.
bool convert_float16_pair(const Tensor& out, const Tensor& in);

// Calls f(T{}) for the floating storage types the CPU kernels support.
template <class F>
void visit_float(DType d, const char* what, F&& f) {
  switch (d) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    case DType::F16: f(Half{}); return;
    case DType::BF16: f(BFloat16{}); return;
    default: AF_THROW(InvalidArgument, "{}: expected a floating-point tensor, got {}", what, dtype_name(d));
  }
}

// Calls f(T{}) for every arithmetic dtype (floats and integers, not Bool).
template <class F>
void visit_arith(DType d, const char* what, F&& f) {
  switch (d) {
    case DType::I32: f(int32_t{}); return;
    case DType::I64: f(int64_t{}); return;
    case DType::U8: f(uint8_t{}); return;
    default: visit_float(d, what, f);
  }
}

}  // namespace ampforge::cpu
