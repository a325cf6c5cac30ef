// CUDA matmul and linear through cuBLASLt.
//
// Contracts (ops/linalg.cpp, as for the CPU kernels):
//   matmul  in: A (B, M, K), B (B, K, N) with any strides (a batch stride of 0 broadcasts); out: (B, M, N)
//           contiguous, the inputs' dtype.
//   linear  in: x (M, K), W (N, K)[, bias (N)]; out (M, N) contiguous = x @ W^T (+ bias).
// Precision: F32 computes in F32 (CUBLAS_COMPUTE_32F) unless TF32 is allowed (cuda::set_allow_tf32,
// AMPFORGE_ALLOW_TF32=1; off by default as in PyTorch >= 1.12); F16/BF16 multiply on tensor cores and
// accumulate in F32, rounding the output once (split-K algorithms too: their partial sums are kept in F32,
// CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; unlike PyTorch's default, no reduced-precision reduction).
//
// Layout: cuBLASLt is column-major. A row-major (M, N) result C = A @ B is the column-major (N, M) matrix
// C^T = B^T @ A^T, so B goes first. A row-major operand with unit column stride is, in memory, the
// column-major transpose (op N on the swapped product); one with unit row stride is column-major itself
// (op T). An operand with neither unit stride is first copied to a contiguous scratch tensor.
// Strided batches map to CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET (0 for a broadcast operand).
// Bias (linear): added by cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS) when the bias is packed (unit stride)
// and M, N > 1: the bias is the column-major result's row vector (length N), read with the output's dtype
// (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE; F16/BF16 biases stay 16-bit) and added to the F32 accumulator before
// the output is rounded: one rounding, as on the CPU, and no extra pass over the output. Otherwise (a strided
// bias, K = 0, one-row or one-column products, or no epilogue algorithm for the problem: the heuristic
// finds none or the launch is refused) the fallback: the output is first filled with the broadcast bias and
// the GEMM accumulates into it (beta = 1), also rounded once. One-row/one-column products stay on the
// fallback (PyTorch restricts its use of this epilogue the same way); for them the fill is cheap anyway.
// No algorithm: when the heuristic offers none for the operands as given (views at odd addresses or with
// unusual leading dimensions or batch strides), the product is computed once more from contiguous copies
// of A and B (fresh allocations: 512-byte aligned, packed) into a packed, aligned output that is then
// copied into the real one; only when that finds nothing either does the op fail (NotImplemented).
// Handles and the workspace: created per device before any CUDA graph capture (prepare_blas, called by
// Graph::capture_begin; cublasLtCreate and a new allocation must not be captured), the workspace from the
// device's main caching allocator, kept for the process.
#include <cublasLt.h>

#include <atomic>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/plan.h"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/backends/cuda/runtime.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/memory/caching_allocator.h"

namespace ampforge::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's recommendation for Hopper; ample for Ada

// Per-device cuBLASLt state: a handle, a workspace that lives as long as the process, and the algorithms
// picked by the heuristic for each problem seen (the heuristic costs tens of microseconds).
struct LtKey {
  std::array<int64_t, 18> v{};
  bool operator==(const LtKey& o) const { return v == o.v; }
};
struct LtKeyHash {
  size_t operator()(const LtKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};

struct LtState {
  std::once_flag once;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mu;
  std::unordered_map<LtKey, cublasLtMatmulAlgo_t, LtKeyHash> algos;
};

// Test hooks (cuda.h): heuristic calls still to be answered "no algorithm", and retries with copies so far.
std::atomic<int> g_forced_no_algorithm{0};
std::atomic<int64_t> g_aligned_retries{0};

LtState& lt_state(int device) {
  static auto* states = new std::vector<LtState>(static_cast<size_t>(device_count()));
  AF_ASSERT(device >= 0 && static_cast<size_t>(device) < states->size(), "no cuBLASLt state for device {}", device);
  LtState& st = (*states)[static_cast<size_t>(device)];
  std::call_once(st.once, [&] {
    AF_CHECK(!is_capturing(), "cuBLASLt on CUDA device {}: the handle would be created inside a CUDA graph capture; "
             "Graph::capture_begin prepares it (this is a bug in the caller's order of calls)", device);
    DeviceGuard guard(device);
    AF_CUBLAS_CHECK(cublasLtCreate(&st.handle));
    // From the main allocator on the compute stream, whatever routing this thread has (a graph pool, the copy
    // stream): kept for the process, and only this device's compute stream uses it.
    DeviceState& ds = device_state(device);
    st.workspace = ds.allocator->allocate_on(kWorkspaceBytes, reinterpret_cast<memory::StreamId>(ds.compute));
  });
  return st;
}

// Descriptor owners (destroyed at scope exit; destruction failures are ignored: they cannot happen for
// valid descriptors and a destructor must not throw).
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() {
    if (l) cublasLtMatrixLayoutDestroy(l);
  }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
};

// An operand as cuBLASLt receives it: storage description (plan.h's GemmOperand), pointer, batch stride.
struct ColMajor {
  const void* ptr = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t batch_stride = 0;
  bool trans = false;
};

std::optional<ColMajor> transposed_operand(const void* ptr, int64_t R, int64_t C, int64_t rs, int64_t cs) {
  const std::optional<GemmOperand> g = gemm_operand(R, C, rs, cs);
  if (!g) return std::nullopt;
  ColMajor m;
  m.ptr = ptr;
  m.rows = g->rows;
  m.cols = g->cols;
  m.ld = g->ld;
  m.trans = g->trans;
  return m;
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: AF_THROW(NotImplemented, "matmul on CUDA: dtype {} is not supported (F32, F16 and BF16 are)", dtype_name(d));
  }
}

// Largest power of two (<= 256) dividing the address, the leading dimension and the batch stride in bytes:
// the alignment cuBLASLt may assume when it picks a kernel.
uint32_t alignment_of(const void* ptr, int64_t ld, int64_t batch_stride, int64_t batch, int64_t esize) {
  uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | static_cast<uint64_t>(ld * esize) | 256u;
  if (batch > 1 && batch_stride != 0) bits |= static_cast<uint64_t>(batch_stride * esize);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// out (batch x M x N, contiguous) = alpha * op(A) @ op(B) + beta * out [+ bias], where A_rm (M x K) and
// B_rm (K x N) are logical row-major operands given by pointer, strides and batch stride, and `bias` (nullptr:
// none) is a packed vector of N elements of dtype dt added by the epilogue to every row of out.
// Returns Done, or, having written nothing: NoEpilogue when a bias was given and cuBLASLt has no algorithm
// for the epilogue (the caller adds the bias itself), NoAlgorithm when the heuristic has none for the
// problem as given (the caller retries with aligned copies). Every other failure throws.
struct Operand {
  const void* ptr;
  int64_t rs, cs, bs;
};

enum class Gemm { Done, NoEpilogue, NoAlgorithm };

Gemm gemm(Device dev, DType dt, int64_t batch, int64_t M, int64_t N, int64_t K, const Operand& a, const Operand& b,
          void* out, float beta, const void* bias = nullptr) {
  const int device = dev.index;
  DeviceGuard guard(dev);
  const DeviceState& ds = device_state(dev);
  LtState& lt = lt_state(device);
  const int64_t es = dtype_size(dt);
  // C^T (N x M) = B^T (N x K) @ A^T (K x M)
  const auto first = transposed_operand(b.ptr, K, N, b.rs, b.cs);
  const auto second = transposed_operand(a.ptr, M, K, a.rs, a.cs);
  AF_ASSERT(first && second, "gemm: operands need a unit stride (callers make them contiguous)");
  ColMajor mb = *first, ma = *second;
  mb.batch_stride = b.bs;
  ma.batch_stride = a.bs;
  const cudaDataType_t ct = cuda_type(dt);
  const bool tf32 = dt == DType::F32 && allow_tf32();
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;

  MatmulDesc op;
  AF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.d, compute, CUDA_R_32F));
  const cublasOperation_t ta = mb.trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = ma.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  AF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  AF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bias != nullptr) {
    // The bias runs along the column-major result's rows (its length is the first GEMM dimension, N).
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = static_cast<int32_t>(ct);
    AF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    AF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    AF_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }

  auto make_layout = [&](Layout& l, uint64_t rows, uint64_t cols, int64_t ld, int64_t bstride) {
    AF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l.l, ct, rows, cols, ld));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      AF_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      AF_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bstride, sizeof(bstride)));
    }
  };
  Layout la, lb, lc;
  make_layout(la, static_cast<uint64_t>(mb.rows), static_cast<uint64_t>(mb.cols), mb.ld, mb.batch_stride);
  make_layout(lb, static_cast<uint64_t>(ma.rows), static_cast<uint64_t>(ma.cols), ma.ld, ma.batch_stride);
  make_layout(lc, static_cast<uint64_t>(N), static_cast<uint64_t>(M), std::max<int64_t>(N, 1), M * N);

  const uint32_t align_a = alignment_of(mb.ptr, mb.ld, mb.batch_stride, batch, es);
  const uint32_t align_b = alignment_of(ma.ptr, ma.ld, ma.batch_stride, batch, es);
  const uint32_t align_c = alignment_of(out, N, M * N, batch, es);

  LtKey key;
  // The heuristic reads the bias pointer's alignment (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER): in the key.
  const int64_t align_bias = bias != nullptr ? alignment_of(bias, 0, 0, 1, es) : 0;
  key.v = {static_cast<int64_t>(dt), tf32, ta, tb, M, N, K, batch, mb.ld, ma.ld, mb.batch_stride != 0,
           ma.batch_stride != 0, align_a, align_b, align_c, beta != 0.0f, bias != nullptr, align_bias};
  cublasLtMatmulAlgo_t algo;
  bool have = false;
  {
    std::lock_guard<std::mutex> lock(lt.mu);
    auto it = lt.algos.find(key);
    if (it != lt.algos.end()) {
      algo = it->second;
      have = true;
    }
  }
  if (!have) {
    Preference pref;
    AF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
    const uint64_t ws = kWorkspaceBytes;
    AF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    AF_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    AF_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    AF_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
    AF_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
    if (dt != DType::F32) {
      // Split-K only with F32 partial sums (COMPUTE_TYPE; unsplit algorithms, scheme NONE = 0, always pass): the
      // INPLACE and OUTPUT_TYPE schemes add the partial products in the 16-bit output type, rounding more than once.
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      AF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                           &schemes, sizeof(schemes)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(lt.handle, op.d, la.l, lb.l, lc.l, lc.l, pref.p, 1, &result, &found);
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0 && g_forced_no_algorithm.load(std::memory_order_relaxed) > 0 &&
        g_forced_no_algorithm.fetch_sub(1, std::memory_order_relaxed) > 0)
      found = 0;  // test hook: as if the heuristic had found nothing
    const bool none = hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && found == 0);
    if (none) return bias != nullptr ? Gemm::NoEpilogue : Gemm::NoAlgorithm;
    AF_CUBLAS_CHECK(hs);
    algo = result.algo;
    std::lock_guard<std::mutex> lock(lt.mu);
    lt.algos.emplace(key, algo);
  }
  const float alpha = 1.0f;
  const cublasStatus_t st = cublasLtMatmul(lt.handle, op.d, &alpha, mb.ptr, la.l, ma.ptr, lb.l, &beta, out, lc.l, out,
                                           lc.l, &algo, lt.workspace, kWorkspaceBytes, ds.compute);
  // A refusal is reported before anything runs: with a bias the caller can still take the fallback.
  if (bias != nullptr && st == CUBLAS_STATUS_NOT_SUPPORTED) return Gemm::NoEpilogue;
  AF_CUBLAS_CHECK(st);
  return Gemm::Done;
}

// A usable operand for a logical row-major (R x C) matrix view of t (batch dim 0 when 3-D): t itself when
// one of its strides is a unit stride with a valid leading dimension, else a contiguous copy (`keep`).
Operand operand_of(const Tensor& t, int64_t R, int64_t C, int64_t rs, int64_t cs, int64_t bs, Tensor& keep) {
  if (transposed_operand(t.data_ptr(), R, C, rs, cs)) return {t.data_ptr(), rs, cs, bs};
  keep = Tensor::empty(t.shape(), t.dtype(), t.device());
  copy_on_device(keep, t);
  const bool batched = t.dim() == 3;
  return {keep.data_ptr(), C, 1, batched && bs != 0 ? R * C : 0};
}

// A packed copy of t, in a fresh (512-byte aligned) allocation.
Tensor packed_copy(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  copy_on_device(c, t);
  return c;
}

[[noreturn]] void no_algorithm(DType dt, int64_t batch, int64_t M, int64_t N, int64_t K) {
  AF_THROW(NotImplemented,
           "matmul on CUDA: cuBLASLt has no algorithm for {} ({} x {} x {}, batch {}), not even with packed, aligned "
           "copies of the operands",
           dtype_name(dt), M, N, K, batch);
}

// `out` (packed, batch x M x N) = A @ B, with the retry of the file comment. `prefill` (may be empty) writes
// what the product accumulates into (beta = 1): linear's broadcast bias.
void gemm_with_retry(const Tensor& out, int64_t batch, int64_t M, int64_t N, int64_t K, const Operand& a,
                     const Operand& b, const std::function<Operand(Tensor&)>& packed_a,
                     const std::function<Operand(Tensor&)>& packed_b, const std::function<void(const Tensor&)>& prefill) {
  const float beta = prefill ? 1.0f : 0.0f;
  if (prefill) prefill(out);
  if (gemm(out.device(), out.dtype(), batch, M, N, K, a, b, out.data_ptr(), beta) == Gemm::Done) return;
  g_aligned_retries.fetch_add(1, std::memory_order_relaxed);
  Tensor ka, kb;
  const Operand ra = packed_a(ka), rb = packed_b(kb);
  // The output: computed in place when its address is 256-byte aligned (every fresh allocation is), else in
  // a fresh tensor copied into it.
  const bool aligned_out = reinterpret_cast<uintptr_t>(out.data_ptr()) % 256 == 0;
  Tensor o = aligned_out ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
  if (prefill && !aligned_out) prefill(o);
  if (gemm(out.device(), out.dtype(), batch, M, N, K, ra, rb, o.data_ptr(), beta) != Gemm::Done)
    no_algorithm(out.dtype(), batch, M, N, K);
  if (!aligned_out) copy_on_device(out, o);
}

void matmul_cuda(const KernelArgs& a) {
  const Tensor &A = a.in(0), &B = a.in(1), &out = a.out(0);
  const int64_t batch = out.size(0), M = out.size(1), N = out.size(2), K = A.size(2);
  if (out.numel() == 0) return;
  if (K == 0) {
    fill_on_device(out, 0.0);
    return;
  }
  Tensor ka, kb;
  const Operand oa = operand_of(A, M, K, A.stride(1), A.stride(2), A.size(0) == 1 ? 0 : A.stride(0), ka);
  const Operand ob = operand_of(B, K, N, B.stride(1), B.stride(2), B.size(0) == 1 ? 0 : B.stride(0), kb);
  // Packed copies: row-major (R x C) per batch, batch stride R * C (0 for a broadcast batch of one).
  auto packed = [](const Tensor& t, int64_t R, int64_t C) {
    return [&t, R, C](Tensor& keep) {
      keep = packed_copy(t);
      return Operand{keep.data_ptr(), C, 1, t.size(0) == 1 ? 0 : R * C};
    };
  };
  gemm_with_retry(out, batch, M, N, K, oa, ob, packed(A, M, K), packed(B, K, N), {});
}

// Whether linear's bias can go through the cuBLASLt epilogue (header comment): packed, the output's dtype,
// and a product that is neither one row nor one column.
bool bias_epilogue_applies(const Tensor& bias, const Tensor& out, int64_t M, int64_t N, int64_t K) {
  return K > 0 && M > 1 && N > 1 && bias.stride(0) == 1 && bias.dtype() == out.dtype() && bias.size(0) == N;
}

void linear_cuda(const KernelArgs& a) {
  const Tensor &x = a.in(0), &W = a.in(1), &out = a.out(0);
  const Tensor* bias = a.inputs.size() > 2 && a.in(2).defined() ? &a.in(2) : nullptr;
  const int64_t M = x.size(0), K = x.size(1), N = W.size(0);
  if (out.numel() == 0) return;
  if (K == 0) {
    if (bias != nullptr)
      copy_on_device(out, *bias);  // broadcast over rows
    else
      fill_on_device(out, 0.0);
    return;
  }
  Tensor kx, kw;
  const Operand ox = operand_of(x, M, K, x.stride(0), x.stride(1), 0, kx);
  // W^T as a logical (K x N) row-major matrix: strides swapped.
  Operand ow = operand_of(W, K, N, W.stride(1), W.stride(0), 0, kw);
  if (kw.defined()) ow = Operand{kw.data_ptr(), 1, K, 0};  // the copy holds W (N x K) row-major: W^T is (1, K)
  if (bias != nullptr && bias_epilogue_applies(*bias, out, M, N, K) &&
      gemm(out.device(), out.dtype(), 1, M, N, K, ox, ow, out.data_ptr(), 0.0f, bias->data_ptr()) == Gemm::Done)
    return;
  std::function<void(const Tensor&)> prefill;
  if (bias != nullptr)  // broadcast over rows; the GEMM adds into it (beta = 1)
    prefill = [bias](const Tensor& o) { copy_on_device(o, *bias); };
  auto packed_x = [&x](Tensor& keep) {
    keep = packed_copy(x);
    return Operand{keep.data_ptr(), x.size(1), 1, 0};
  };
  auto packed_w = [&W, K](Tensor& keep) {  // W (N x K) packed row-major: W^T is (K x N) with strides (1, K)
    keep = packed_copy(W);
    return Operand{keep.data_ptr(), 1, K, 0};
  };
  gemm_with_retry(out, 1, M, N, K, ox, ow, packed_x, packed_w, prefill);
}

}  // namespace

void prepare_blas(int device) { lt_state(device); }

void set_gemm_no_algorithm_for_testing(int calls) { g_forced_no_algorithm.store(calls, std::memory_order_relaxed); }
int64_t gemm_aligned_retries() { return g_aligned_retries.load(std::memory_order_relaxed); }

void register_blas_cuda() {
  register_kernel(OpId::matmul, DeviceType::CUDA, matmul_cuda);
  register_kernel(OpId::linear, DeviceType::CUDA, linear_cuda);
}

}  // namespace ampforge::cuda
