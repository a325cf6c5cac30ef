// CPU kernels for embedding, embedding_backward and dropout.
//
// Contracts (ops/index.cpp has validated the operands and made them contiguous):
//   embedding           in: indices (any shape, I64 or I32), weight (V, D).  out: (*indices, D), weight's dtype.
//                       An index outside [0, V) raises InvalidArgument (checked before anything is written).
//   embedding_backward  in: grad (*indices, D), indices.  out: grad_weight (V, D), overwritten; the row
//                       attrs.padding_idx (if >= 0) stays zero. attrs.num_weights = V.
//                       Deterministic: positions are bucketed by row with a stable counting sort, then each
//                       row sums its gradients in position order (parallel over rows, no atomics).
//   dropout             in: x.  out: y (x's shape and dtype), mask (Bool, x's shape).
//                       Element i draws word i % 4 of Philox block (seed, offset + i / 4) and is kept when
//                       uniform < 1 - p; kept elements are scaled by 1 / (1 - p). Depends only on (seed,
//                       offset, i): the same numbers for any thread count (and on the GPU).
#include <cstring>
#include <vector>

#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/core/generator.h"

namespace ampforge::cpu {
namespace {

// Indices as int64 (copied only for I32).
std::vector<int64_t> indices_i64(const Tensor& idx) {
  const int64_t n = idx.numel();
  std::vector<int64_t> v(static_cast<size_t>(n));
  if (idx.dtype() == DType::I64) {
    std::memcpy(v.data(), idx.data_ptr(), static_cast<size_t>(n) * sizeof(int64_t));
  } else {
    AF_ASSERT(idx.dtype() == DType::I32, "embedding: indices dtype {}", dtype_name(idx.dtype()));
    const int32_t* p = idx.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  }
  return v;
}

void check_indices(const std::vector<int64_t>& idx, int64_t V, const char* what) {
  for (size_t i = 0; i < idx.size(); ++i)
    AF_CHECK(idx[i] >= 0 && idx[i] < V,
             "{}: index {} (at flat position {}) is out of range for a weight with {} rows; expected 0 <= index < {}",
             what, idx[i], i, V, V);
}

void embedding_kernel(const KernelArgs& a) {
  const Tensor &idx_t = a.in(0), &w = a.in(1), &out = a.out(0);
  const int64_t V = w.size(0), D = w.size(1);
  const std::vector<int64_t> idx = indices_i64(idx_t);
  check_indices(idx, V, "embedding");
  const size_t row_bytes = static_cast<size_t>(D * w.element_size());
  const char* wp = static_cast<const char*>(w.data_ptr());
  char* op = static_cast<char*>(out.data_ptr());
  parallel_for(static_cast<int64_t>(idx.size()), std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)),
               [&](int64_t i0, int64_t i1) {
                 for (int64_t i = i0; i < i1; ++i) std::memcpy(op + i * row_bytes, wp + idx[i] * row_bytes, row_bytes);
               });
}

void embedding_backward_kernel(const KernelArgs& a) {
  const Tensor &g = a.in(0), &idx_t = a.in(1), &gw = a.out(0);
  const auto& at = a.attr<EmbeddingAttrs>();
  const int64_t V = at.num_weights, D = gw.size(1);
  const std::vector<int64_t> idx = indices_i64(idx_t);
  check_indices(idx, V, "embedding_backward");
  // Stable counting sort of positions by row: start[v] .. start[v+1] lists the positions of row v in order.
  std::vector<int64_t> start(static_cast<size_t>(V + 1), 0);
  for (int64_t v : idx) ++start[v + 1];
  for (int64_t v = 0; v < V; ++v) start[v + 1] += start[v];
  std::vector<int64_t> pos(idx.size()), fill(start.begin(), start.end() - 1);
  for (size_t i = 0; i < idx.size(); ++i) pos[fill[idx[i]]++] = static_cast<int64_t>(i);
  visit_float(gw.dtype(), "embedding_backward", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const S* gp = static_cast<const S*>(g.data_ptr());
    S* op = static_cast<S*>(gw.data_ptr());
    parallel_for(V, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)), [&](int64_t v0, int64_t v1) {
      std::vector<A> acc(static_cast<size_t>(D)), buf(static_cast<size_t>(D));
      for (int64_t v = v0; v < v1; ++v) {
        std::fill(acc.begin(), acc.end(), A(0));
        if (v != at.padding_idx) {
          for (int64_t k = start[v]; k < start[v + 1]; ++k) {
            load_n<S, A>(gp + pos[k] * D, buf.data(), D);
            for (int64_t j = 0; j < D; ++j) acc[j] += buf[j];
          }
        }
        store_n<S, A>(acc.data(), op + v * D, D);
      }
    });
  });
}

void dropout_kernel(const KernelArgs& a) {
  const Tensor &x = a.in(0), &y = a.out(0), &mask = a.out(1);
  const auto& at = a.attr<DropoutAttrs>();
  const int64_t n = x.numel();
  const float keep = static_cast<float>(1.0 - at.p);
  const double scale_d = at.p < 1.0 ? 1.0 / (1.0 - at.p) : 0.0;
  bool* mp = mask.data<bool>();
  visit_float(x.dtype(), "dropout", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    const A scale = static_cast<A>(scale_d);
    const S* xp = static_cast<const S*>(x.data_ptr());
    S* yp = static_cast<S*>(y.data_ptr());
    // Tasks start at multiples of 4 (kChunk is), so each Philox block is computed once.
    const int64_t nchunks = (n + kChunk - 1) / kChunk;
    parallel_for(nchunks, std::max<int64_t>(1, kElementwiseGrain / kChunk), [&](int64_t c0, int64_t c1) {
      alignas(64) A xb[kChunk], ob[kChunk];
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i0 = c * kChunk, m = std::min(kChunk, n - i0);
        load_n<S, A>(xp + i0, xb, m);
        // Value e takes word e % 4 of block offset + e / 4 (philox4x32_blocks: the blocks in vector lanes).
        static_assert(kChunk % 4 == 0, "chunks must start on Philox block boundaries");
        uint32_t w[kChunk];
        philox4x32_blocks<kChunk / 4>(at.philox.seed, at.philox.offset + static_cast<uint64_t>(i0 / 4), w);
        for (int64_t i = 0; i < m; ++i) {
          const bool kept = uint_to_unit_float(w[i]) < keep;
          mp[i0 + i] = kept;
          ob[i] = kept ? xb[i] * scale : A(0);
        }
        store_n<S, A>(ob, yp + i0, m);
      }
    });
  });
}

}  // namespace

void register_index_cpu() {
  register_kernel(OpId::embedding, DeviceType::CPU, embedding_kernel);
  register_kernel(OpId::embedding_backward, DeviceType::CPU, embedding_backward_kernel);
  register_kernel(OpId::dropout, DeviceType::CPU, dropout_kernel);
}

}  // namespace ampforge::cpu
