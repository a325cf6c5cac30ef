// CUDA embedding and embedding_backward. Contracts are the CPU kernels' (backends/cpu/index.cpp):
//   embedding           in: indices (any shape, I64 or I32, contiguous), weight (V, D) contiguous.
//                       out: (*indices, D), weight's dtype: row i is weight[indices[i]].
//   embedding_backward  in: grad (*indices, D) contiguous, indices.  out: grad_weight (V, D), overwritten;
//                       the row attrs.padding_idx (if >= 0) stays zero. attrs.num_weights = V.
//
// Forward: one thread per output element, copying the element's bits (any dtype: the CPU copies rows
// with memcpy).
//
// Backward, deterministic without atomics (the CPU's scheme, bucketing positions by row and summing each
// row's gradients in position order, done with a sort):
//   1. keys[i] = indices[i] (V for an invalid index), values[i] = i;
//   2. cub::DeviceRadixSort::SortPairs over the bits that V needs. The sort is stable, so each row's
//      positions come out in ascending order;
//   3. one thread per sorted position marks where each row's run begins and ends (row_begin/row_end,
//      zero for rows that no index names);
//   4. one thread per (row, column) of grad_weight sums grad[pos][column] over the row's run in order, in
//      float, and rounds once; the padding row is written as zeros.
// O(n log V + V*D) work; the result does not depend on the launch configuration, so it is bit-identical
// run to run, and in F32 it equals the CPU's (same additions in the same order).
//
// An index outside [0, V) cannot raise at the call as on the CPU (the indices live on the device): the
// forward writes a zero row for it, the backward drops it, and the device's error word is set, which the
// next synchronising call (a copy to the CPU, cuda::synchronize) turns into an InvalidArgument error.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ampforge/backends/cuda/kernels.cuh"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

#define AF_GRID_STRIDE(e, total)                                                                        \
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < (total);             \
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Sets the error bit for an invalid index (read-modify-write keeps other kernels' bits; not atomic, as
// softmax.cu's flag_bad_target: every writer of this bit writes the same value).
AF_DEV void flag_bad_index(int* error_word) {
  volatile int* w = error_word;
  *w = *w | kErrIndexOutOfRange;
}

// Row and column of flat element e of a (rows, D) matrix, with 32-bit division when `narrow`.
AF_DEV void row_col(int64_t e, int64_t D, bool narrow, int64_t& r, int64_t& d) {
  if (narrow) {
    const uint32_t q = static_cast<uint32_t>(e) / static_cast<uint32_t>(D);
    r = q;
    d = e - static_cast<int64_t>(q) * D;
  } else {
    r = e / D;
    d = e - r * D;
  }
}

// Calls f(type tag) with the index type of the indices tensor.
template <class F>
void visit_index(DType d, const char* what, F&& f) {
  switch (d) {
    case DType::I64: f(int64_t{}); return;
    case DType::I32: f(int32_t{}); return;
    default: AF_THROW(InvalidArgument, "{}: expected integer indices (i64 or i32), got dtype {}", what, dtype_name(d));
  }
}


// ---- forward ------------------------------------------------------------------------------------------

template <class U, class Idx>
__global__ void __launch_bounds__(kThreads) embedding_kernel(int64_t total, int64_t D, int64_t V, bool narrow,
                                                             const Idx* idx, const U* w, U* out, int* error_word) {
  AF_GRID_STRIDE(e, total) {
    int64_t i, d;
    row_col(e, D, narrow, i, d);
    const int64_t v = static_cast<int64_t>(idx[i]);
    if (v >= 0 && v < V) {
      out[e] = w[v * D + d];
    } else {
      out[e] = U(0);
      if (d == 0) flag_bad_index(error_word);
    }
  }
}

// inputs: indices, weight (V, D); outputs: (*indices, D).
void embedding_cuda(const KernelArgs& a) {
  const Tensor &idx = a.in(0), &w = a.in(1), &out = a.out(0);
  AF_ASSERT(idx.is_contiguous() && w.is_contiguous() && out.is_contiguous(), "embedding: operands must be contiguous");
  const int64_t V = w.size(0), D = w.size(1), total = out.numel();
  if (total == 0) return;
  DeviceGuard guard(out.device());
  const DeviceState& s = device_state(out.device());
  const bool narrow = total < (int64_t{1} << 31);
  visit_index(idx.dtype(), "embedding", [&](auto itag) {
    using Idx = decltype(itag);
    visit_width(w.element_size(), [&](auto utag) {
      using U = decltype(utag);
      embedding_kernel<U, Idx><<<blocks_for(total, kThreads, s), kThreads, 0, s.compute>>>(
          total, D, V, narrow, static_cast<const Idx*>(idx.data_ptr()), static_cast<const U*>(w.data_ptr()),
          static_cast<U*>(out.data_ptr()), s.error_word_dev);
      AF_CUDA_CHECK_LAUNCH();
    });
  });
}

// ---- backward -----------------------------------------------------------------------------------------

// Sort input: key = the row (V for an invalid index, which sorts after every row and is never summed),
// value = the position.
template <class Idx>
__global__ void __launch_bounds__(kThreads)
    embedding_keys_kernel(int64_t n, int64_t V, const Idx* idx, uint32_t* keys, uint32_t* pos, int* error_word) {
  AF_GRID_STRIDE(i, n) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    const bool ok = v >= 0 && v < V;
    if (!ok) flag_bad_index(error_word);
    keys[i] = static_cast<uint32_t>(ok ? v : V);
    pos[i] = static_cast<uint32_t>(i);
  }
}

// Run boundaries of the sorted keys: row_begin[k] .. row_end[k] are the sorted slots of key k (both zero,
// from a memset, for keys that do not occur). Slots V (invalid indices) are written but never read.
__global__ void __launch_bounds__(kThreads)
    embedding_runs_kernel(int64_t n, const uint32_t* keys, uint32_t* row_begin, uint32_t* row_end) {
  AF_GRID_STRIDE(k, n) {
    const uint32_t key = keys[k];
    if (k == 0 || keys[k - 1] != key) row_begin[key] = static_cast<uint32_t>(k);
    if (k == n - 1 || keys[k + 1] != key) row_end[key] = static_cast<uint32_t>(k + 1);
  }
}

// grad_weight[v, d] = sum over the run of row v, in position order, of grad[pos, d].
template <class T>
__global__ void __launch_bounds__(kThreads)
    embedding_sum_kernel(int64_t total, int64_t D, bool narrow, int64_t padding_idx, const uint32_t* row_begin,
                         const uint32_t* row_end, const uint32_t* pos, const T* g, T* gw) {
  AF_GRID_STRIDE(e, total) {
    int64_t v, d;
    row_col(e, D, narrow, v, d);
    float acc = 0.0f;
    if (v != padding_idx) {
      const uint32_t k1 = row_end[v];
      for (uint32_t k = row_begin[v]; k < k1; ++k) acc += to_float(g[static_cast<int64_t>(pos[k]) * D + d]);
    }
    gw[e] = from_float<T>(acc);
  }
}

// inputs: grad (*indices, D), indices; outputs: grad_weight (V, D).
void embedding_backward_cuda(const KernelArgs& a) {
  const Tensor &g = a.in(0), &idx = a.in(1), &gw = a.out(0);
  const auto& at = a.attr<EmbeddingAttrs>();
  AF_ASSERT(g.is_contiguous() && idx.is_contiguous() && gw.is_contiguous(),
            "embedding_backward: operands must be contiguous");
  const int64_t V = at.num_weights, D = gw.size(1), n = idx.numel();
  visit_float(gw.dtype(), "embedding_backward", [](auto) {});  // unsupported dtypes fail before any work
  if (gw.numel() == 0) return;
  constexpr int64_t kMax = std::numeric_limits<uint32_t>::max() - 1;
  AF_CHECK(V < kMax && n < kMax, "embedding_backward: CUDA supports fewer than {} rows and indices, got {} and {}",
           kMax, V, n);
  const int dev = gw.device().index;
  DeviceGuard guard(gw.device());
  const DeviceState& s = device_state(gw.device());
  // Run boundaries for keys 0..V (V: invalid indices), zero where a row has no index.
  Scratch bounds(dev, static_cast<size_t>(2 * (V + 1)) * sizeof(uint32_t));
  uint32_t* row_begin = bounds.as<uint32_t>();
  uint32_t* row_end = row_begin + (V + 1);
  AF_CUDA_CHECK(cudaMemsetAsync(row_begin, 0, static_cast<size_t>(2 * (V + 1)) * sizeof(uint32_t), s.compute));
  // keys_in, pos_in, keys_out, pos_out: n each.
  Scratch pairs(dev, static_cast<size_t>(4 * n) * sizeof(uint32_t));
  uint32_t* keys_in = pairs.as<uint32_t>();
  uint32_t* pos_in = keys_in == nullptr ? nullptr : keys_in + n;
  uint32_t* keys_out = keys_in == nullptr ? nullptr : keys_in + 2 * n;
  uint32_t* pos_out = keys_in == nullptr ? nullptr : keys_in + 3 * n;
  if (n > 0) {
    visit_index(idx.dtype(), "embedding_backward", [&](auto itag) {
      using Idx = decltype(itag);
      embedding_keys_kernel<Idx><<<blocks_for(n, kThreads, s), kThreads, 0, s.compute>>>(
          n, V, static_cast<const Idx*>(idx.data_ptr()), keys_in, pos_in, s.error_word_dev);
      AF_CUDA_CHECK_LAUNCH();
    });
    // Keys are at most V: sort only the bits that V needs.
    int end_bit = 1;
    while (end_bit < 32 && (static_cast<uint64_t>(V) >> end_bit) != 0) ++end_bit;
    const int items = static_cast<int>(n);
    AF_CHECK(static_cast<int64_t>(items) == n, "embedding_backward: too many indices for one sort ({})", n);
    size_t temp_bytes = 0;
    AF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in, pos_out, items, 0,
                                                  end_bit, s.compute));
    Scratch temp(dev, std::max<size_t>(temp_bytes, 1));
    AF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys_in, keys_out, pos_in, pos_out, items,
                                                  0, end_bit, s.compute));
    embedding_runs_kernel<<<blocks_for(n, kThreads, s), kThreads, 0, s.compute>>>(n, keys_out, row_begin, row_end);
    AF_CUDA_CHECK_LAUNCH();
  }
  const int64_t total = gw.numel();
  const bool narrow = total < (int64_t{1} << 31);
  visit_float(gw.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    embedding_sum_kernel<T><<<blocks_for(total, kThreads, s), kThreads, 0, s.compute>>>(
        total, D, narrow, at.padding_idx, row_begin, row_end, pos_out, static_cast<const T*>(g.data_ptr()),
        static_cast<T*>(gw.data_ptr()));
    AF_CUDA_CHECK_LAUNCH();
  });
}

#undef AF_GRID_STRIDE

}  // namespace

void register_embedding_cuda() {
  register_kernel(OpId::embedding, DeviceType::CUDA, embedding_cuda);
  register_kernel(OpId::embedding_backward, DeviceType::CUDA, embedding_backward_cuda);
}

}  // namespace ampforge::cuda
