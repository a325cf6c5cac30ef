// F32 SGEMM and BF16 matmul / linear on oneDNN (see matmul_onednn.h for why and when).
//
// Primitive cache (onednn_runtime.h): a primitive descriptor is created once per problem (shapes, strides, bias,
// thread count) and kept for the process, declined problems included; BERT-base's training step holds ~30 entries. The operands are described to oneDNN as they lie (strided memory descriptors), so the
// transposed views of the backward pass (gy^T @ x, gy @ W) run without copies; oneDNN packs what its kernels need
// into the user scratchpad (a per-thread slot, thread_scratch.h).
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/backends/cpu/bf16_compute.h"
#include "ampforge/backends/cpu/thread_scratch.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "ampforge/util/env.h"
#include "ampforge/util/error.h"
#include "ampforge/util/thread_pool.h"

#ifdef AMPFORGE_HAVE_ONEDNN
#include "ampforge/backends/cpu/onednn_runtime.h"
#endif

namespace ampforge::cpu {

namespace {
std::atomic<int64_t> g_executions{0}, g_sgemm_executions{0};
std::mutex g_last_impl_mutex;
std::string g_last_impl;

[[maybe_unused]] void set_last_impl(const std::string& s) {  // unused in a build without oneDNN
  std::lock_guard<std::mutex> lk(g_last_impl_mutex);
  g_last_impl = s;
}

constexpr bool kBuilt =
#ifdef AMPFORGE_HAVE_ONEDNN
    true;
#else
    false;
#endif
}  // namespace

CpuMatmulPath cpu_matmul_path() {
  const std::optional<std::string> v = env_get("AMPFORGE_CPU_MATMUL");
  if (!v || v->empty() || *v == "auto") return kBuilt ? CpuMatmulPath::OneDnn : CpuMatmulPath::Blas;
  if (*v == "blas") return CpuMatmulPath::Blas;
  if (*v == "onednn") {
    AF_CHECK(kBuilt,
             "AMPFORGE_CPU_MATMUL=onednn, but this build has no oneDNN (configure with libdnnl-dev installed, "
             "-DAMPFORGE_ONEDNN=ON); unset it or use blas");
    return CpuMatmulPath::OneDnn;
  }
  AF_THROW(InvalidArgument, "AMPFORGE_CPU_MATMUL={}: expected auto, blas or onednn", *v);
}

bool onednn_f32_gemm_active() { return cpu_matmul_path() == CpuMatmulPath::OneDnn && kBuilt; }

std::string cpu_gemm_summary() {
#ifdef AMPFORGE_HAVE_ONEDNN
  if (onednn_f32_gemm_active())
    return "F32 on " + onednn::describe() + " SGEMM; BF16: " +
           (onednn::native_bf16() ? cpu_bf16_summary(Bf16Kind::Matmul) : "F32 copies (no AVX512_BF16)");
#endif
  return "OpenBLAS (BF16 via F32 copies)";
}

bool onednn_bf16_matmul_active() {
#ifdef AMPFORGE_HAVE_ONEDNN
  return cpu_matmul_path() == CpuMatmulPath::OneDnn && onednn::native_bf16() &&
         cpu_bf16_compute(Bf16Kind::Matmul) == Bf16Compute::Native;
#else
  (void)cpu_matmul_path();  // still rejects a bad value
  return false;
#endif
}

namespace {
// Whether a product with this output is oneDNN's to try (reads AMPFORGE_CPU_MATMUL only for BF16 outputs).
bool takes(const Tensor& out) {
  return out.dtype() == DType::BF16 && out.numel() != 0 && onednn_bf16_matmul_active();
}
}  // namespace

int64_t onednn_matmul_executions() { return g_executions.load(std::memory_order_relaxed); }
int64_t onednn_sgemm_executions() { return g_sgemm_executions.load(std::memory_order_relaxed); }

std::string onednn_matmul_last_impl() {
  std::lock_guard<std::mutex> lk(g_last_impl_mutex);
  return g_last_impl;
}

#ifndef AMPFORGE_HAVE_ONEDNN

// takes() is still asked: AMPFORGE_CPU_MATMUL=onednn (or a value that is none of the three) is an error here too.
bool onednn_matmul(const Tensor&, const Tensor&, const Tensor& out) { return takes(out); }
bool onednn_linear(const Tensor&, const Tensor&, const Tensor*, const Tensor& out) { return takes(out); }
bool onednn_sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float, float*,
                  int64_t, bool) {
  return onednn_f32_gemm_active();  // false; still rejects a bad AMPFORGE_CPU_MATMUL
}

#else

namespace {

namespace dn = dnnl;
using md = dn::memory::desc;

// A strided operand: dims and strides in elements, outermost first.
struct Operand {
  std::vector<int64_t> dims, strides;
};

// The strides oneDNN is given: a dimension of size 1 is never stepped along, so its stride is set to what a dense
// layout would have (tensors carry arbitrary strides there, 0 included); a zero stride on a longer dimension is a
// broadcast oneDNN cannot describe except on the batch dimension, where the caller turns it into size 1. false:
// such a zero stride remains.
bool normalise(Operand& o) {
  int64_t dense = 1;
  for (size_t i = o.dims.size(); i-- > 0;) {
    if (o.dims[i] == 1) o.strides[i] = dense;
    if (o.strides[i] == 0) return false;
    dense *= o.dims[i];
  }
  return true;
}

// One problem: the three (or four) operands as oneDNN sees them. src (Bt, M, K) or (M, K), weights (K, N) likewise,
// dst contiguous, bias (1, N) or none.
struct Problem {
  Operand src, wei, dst, bias;
  bool has_bias = false;
  int threads = 1;

  std::vector<int64_t> key() const {
    std::vector<int64_t> k{threads, has_bias, static_cast<int64_t>(src.dims.size())};
    for (const Operand* o : {&src, &wei, &dst, &bias}) {
      k.insert(k.end(), o->dims.begin(), o->dims.end());
      k.insert(k.end(), o->strides.begin(), o->strides.end());
    }
    return k;
  }
};

struct Prim {
  bool usable = false;
  std::string impl;
  dn::matmul mm;
  md src, wei, dst, bias, scratch;
};

md desc(const Operand& o) {
  return md(dn::memory::dims(o.dims.begin(), o.dims.end()), dn::memory::data_type::bf16,
            dn::memory::dims(o.strides.begin(), o.strides.end()));
}

std::shared_ptr<const Prim> create(const Problem& p) {
  auto r = std::make_shared<Prim>();
  r->src = desc(p.src);
  r->wei = desc(p.wei);
  r->dst = desc(p.dst);
  if (p.has_bias) r->bias = desc(p.bias);
  dn::primitive_attr attr;
  attr.set_scratchpad_mode(dn::scratchpad_mode::user);
  const dn::matmul::desc d = p.has_bias ? dn::matmul::desc(r->src, r->wei, r->bias, r->dst)
                                        : dn::matmul::desc(r->src, r->wei, r->dst);
  const dn::matmul::primitive_desc pd(d, attr, onednn::engine(), /*allow_empty=*/true);
  if (!pd) {
    r->impl = "none";
    return r;
  }
  r->impl = pd.impl_info_str();
  // The reference kernel is a loop over every output and term, an order of magnitude slower than SGEMM on
  // converted operands.
  if (r->impl.rfind("ref", 0) == 0) return r;
  r->scratch = pd.scratchpad_desc();
  r->mm = dn::matmul(pd);
  r->usable = true;
  return r;
}

// A problem oneDNN rejects stays on the conversion path.
std::shared_ptr<const Prim> lookup(const Problem& p) {
  static onednn::PrimitiveCache<Prim> cache;
  return cache.get(p.key(), [&] { return create(p); });
}

bool run(Problem& p, const void* src, const void* wei, const void* bias, void* dst) {
  p.threads = onednn::set_threads_for_call();
  if (!normalise(p.src) || !normalise(p.wei) || !normalise(p.dst) || (p.has_bias && !normalise(p.bias))) {
    set_last_impl("declined: a broadcast (zero) stride");
    return false;
  }
  const std::shared_ptr<const Prim> prim = lookup(p);
  set_last_impl(prim->usable ? prim->impl : "declined: " + prim->impl);
  if (!prim->usable) return false;
  dn::engine& eng = onednn::engine();
  dn::stream& stream = onednn::thread_stream();
  std::unordered_map<int, dn::memory> args{{DNNL_ARG_SRC, dn::memory(prim->src, eng, const_cast<void*>(src))},
                                           {DNNL_ARG_WEIGHTS, dn::memory(prim->wei, eng, const_cast<void*>(wei))},
                                           {DNNL_ARG_DST, dn::memory(prim->dst, eng, dst)}};
  if (p.has_bias) args.emplace(DNNL_ARG_BIAS, dn::memory(prim->bias, eng, const_cast<void*>(bias)));
  if (const size_t n = prim->scratch.get_size(); n != 0)
    args.emplace(DNNL_ARG_SCRATCHPAD, dn::memory(prim->scratch, eng, thread_scratch(kScratch0, n)));
  {
    const PoolIdleScope idle;  // our workers sleep while the OpenMP team runs
    prim->mm.execute(stream, args);
    stream.wait();
  }
  g_executions.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

bool onednn_matmul(const Tensor& A, const Tensor& B, const Tensor& out) {
  if (!takes(out) || A.size(2) == 0) return false;
  AF_ASSERT(A.dtype() == DType::BF16 && B.dtype() == DType::BF16 && out.is_contiguous(),
            "onednn_matmul: expects BF16 operands and a contiguous output");
  const int64_t Bt = out.size(0), M = out.size(1), N = out.size(2), K = A.size(2);
  Problem p;
  // A batch stride of 0 is one matrix for every batch entry: oneDNN broadcasts a batch dimension of size 1.
  const int64_t bta = A.stride(0) == 0 ? 1 : Bt, btb = B.stride(0) == 0 ? 1 : Bt;
  p.src = {{bta, M, K}, {A.stride(0), A.stride(1), A.stride(2)}};
  p.wei = {{btb, K, N}, {B.stride(0), B.stride(1), B.stride(2)}};
  p.dst = {{Bt, M, N}, {M * N, N, 1}};
  return run(p, A.data_ptr(), B.data_ptr(), nullptr, out.data_ptr());
}

bool onednn_linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) {
  if (!takes(out) || x.size(1) == 0) return false;
  AF_ASSERT(x.dtype() == DType::BF16 && w.dtype() == DType::BF16 && (!bias || bias->dtype() == DType::BF16) &&
                out.is_contiguous(),
            "onednn_linear: expects BF16 operands and a contiguous output");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  Problem p;
  p.src = {{M, K}, {x.stride(0), x.stride(1)}};
  p.wei = {{K, N}, {w.stride(1), w.stride(0)}};  // w^T
  p.dst = {{M, N}, {N, 1}};
  // A bias with a stride other than 1 comes out wrong from oneDNN 2.6's kernels (they read it as dense; found by
  // matmul_onednn_test's strided-bias case), so only a dense one is handed over. Parameters are dense.
  if (bias && bias->stride(0) != 1 && N > 1) {
    set_last_impl("declined: a strided bias");
    return false;
  }
  p.has_bias = bias != nullptr;
  if (bias) p.bias = {{1, N}, {N, 1}};
  return run(p, x.data_ptr(), w.data_ptr(), bias ? bias->data_ptr() : nullptr, out.data_ptr());
}

bool onednn_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc, bool parallel) {
  if (!onednn_f32_gemm_active()) return false;
  const int threads = onednn::set_threads_for_call(parallel);
  try {
    std::optional<PoolIdleScope> idle;  // our workers sleep while an OpenMP team of more than this thread runs
    if (threads > 1) idle.emplace();
    dn::sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } catch (const dn::error&) {  // arguments oneDNN rejects (it checks them before touching C): OpenBLAS runs it
    return false;
  }
  g_sgemm_executions.fetch_add(1, std::memory_order_relaxed);
  return true;
}

#endif  // AMPFORGE_HAVE_ONEDNN

}  // namespace ampforge::cpu
