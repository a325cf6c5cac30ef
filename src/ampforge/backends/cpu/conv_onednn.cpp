// CPU convolution on oneDNN (see conv_onednn.h for the interface).
//
// Why oneDNN: im2col + OpenBLAS spends about half of a ResNet-50 training step building and packing column
// matrices, and runs BF16 as F32 (converted on the way in and out). oneDNN's convolutions are direct
// kernels generated for the running CPU (AVX-512, AVX512_BF16, AMX), read NHWC activations as they are and
// accumulate BF16 in F32 on the BF16 instructions. It is the library PyTorch's CPU convolutions run on
// (Debian's PyTorch 1.13 links the same libdnnl 2.6), so the two engines now compare like for like.
//
// Layouts: activations are described to oneDNN as they are (nhwc for channels-last tensors, nchw for
// contiguous ones: no copy either way). Weights are OIHW tensors of any strides (channels-last weights
// included); the primitive is created with format_tag::any for them, which lets oneDNN pick the blocked
// layout its fast kernels need (a plain layout would leave only its GEMM-based or reference kernels), and
// a reorder primitive converts per call: OIHW -> blocked before the forward and input-gradient
// convolutions, blocked -> OIHW after the weight gradient. Weights are small next to the activations
// (ResNet-50 at batch 8: 100 MB of F32 weights against ~2.5 GB of activations read and written per step),
// so the reorders cost ~1% of a step; caching reordered weights across calls would need to know when the
// optimizer changed them, which a kernel does not.
//
// Algorithm ("auto", AMPFORGE_CPU_CONV_ALGO unset): direct convolution, except
//  - 3x3 stride-1 F32 convolutions with >= 64 input and output channels on >= 14x14 outputs, or >= 32 channels on
//    >= 56x56, run on oneDNN's Winograd kernels (F(4x4, 3x3): 2.25x fewer multiplications). bench/onednn_conv_shapes
//    measures the kernels alone (docs/PERFORMANCE.md): about 1.4-2x faster per direction for ResNet-50's 64-256
//    channels at 56x56-14x14 and YOLOv8n's 32-128 channels at 80x80-20x20, slower at 7x7 (hence the 14x14 bound)
//    and at 16 channels (the layout copies below eat the gain). Winograd rounds differently from a direct sum (its
//    transforms add and subtract scaled inputs before the products): results agree with the direct kernels within
//    the F32 tolerance table (tests), as cuDNN's Winograd algorithms, which PyTorch's cudnn.benchmark picks on
//    GPUs, do;
//  - weight gradients of strided convolutions with >= 32 channels run on the direct kernels for nChw16c
//    (blocked_weight_grad_fits);
//  - both gradients of 1x1 unpadded F32 convolutions on channels-last activations are GEMMs (run_pointwise_gemm);
//    BF16 ones at stride 1 are oneDNN BF16 matrix products (run_pointwise_bf16_matmul).
// "direct" turns them all off. oneDNN's Winograd and blocked kernels read and write the blocked nChw16c layout
// only, so these primitives copy the activations in (nhwc/nchw -> nChw16c) and the result out, around the call
// (0.1-0.3 ms per copy of ResNet-50's 14x14-28x28 activations at batch 8).
// AMPFORGE_CPU_CONV_ALGO=benchmark replaces that rule by a measurement, as cuDNN's benchmark mode does: the
// first call of each problem times direct kernels on the tensors' layout, direct kernels on nChw16c copies and
// Winograd, and the process keeps the fastest. Why not by default: on the 2-vCPU VMs this was written on, one
// timing of a 0.5 ms call moves by 20-40% from run to run, so choices (and with them the rounding) changed
// between runs while the steps measured no faster beyond that noise (YOLOv8n b2 640: oneDNN time per step 156 ->
// 147 ms in one pair of runs); some problems gain a lot (YOLOv8n's 64->64 stride-2 3x3 weight gradient: 3.1 ms
// on nhwc, 0.63 ms on nChw16c), others were mis-chosen on a noisy timing.
//
// Primitive cache: creating a primitive descriptor walks oneDNN's implementation list and JIT-compiles
// kernels (0.1-10 ms each), against ~1 ms for a typical execution. Each problem (direction, dtype, shapes,
// strides, padding, dilation, groups, layouts, weight strides, bias, thread count) is created once and kept
// in a map for the process; a training step of ResNet-50 holds ~150 entries. Problems that oneDNN cannot
// run well are cached too, as "unusable", so the fallback decision is made once.
//
// Threads and memory: the calling thread's OpenMP team runs each primitive, with our pool's workers asleep, and the
// transient buffers of a call (scratchpad, reordered weights, blocked activations; e.g. the F32 partial weight
// gradients of BF16 convolutions) are per-thread buffers reused from call to call: thread_scratch.h says why.
#include "ampforge/backends/cpu/conv_onednn.h"
#include "ampforge/backends/cpu/bf16_compute.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/backends/cpu/thread_scratch.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
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
std::atomic<int64_t> g_executions{0};
std::mutex g_last_impl_mutex;
std::string g_last_impl;

[[maybe_unused]] void set_last_impl(const std::string& s) {  // unused in a build without oneDNN
  std::lock_guard<std::mutex> lk(g_last_impl_mutex);
  g_last_impl = s;
}
}  // namespace

bool onednn_built() {
#ifdef AMPFORGE_HAVE_ONEDNN
  return true;
#else
  return false;
#endif
}

CpuConvPath cpu_conv_path() {
  const std::optional<std::string> v = env_get("AMPFORGE_CPU_CONV");
  if (!v || v->empty()) return onednn_built() ? CpuConvPath::OneDnn : CpuConvPath::Im2col;
  if (*v == "im2col") return CpuConvPath::Im2col;
  if (*v == "onednn") {
    AF_CHECK(onednn_built(),
             "AMPFORGE_CPU_CONV=onednn, but this build has no oneDNN (configure with libdnnl-dev installed, "
             "-DAMPFORGE_ONEDNN=ON); unset it or use im2col");
    return CpuConvPath::OneDnn;
  }
  AF_THROW(InvalidArgument, "AMPFORGE_CPU_CONV={}: expected im2col or onednn", *v);
}

CpuConvAlgo cpu_conv_algo() {
  const std::optional<std::string> v = env_get("AMPFORGE_CPU_CONV_ALGO");
  if (!v || v->empty() || *v == "auto") return CpuConvAlgo::Auto;
  if (*v == "direct") return CpuConvAlgo::Direct;
  if (*v == "benchmark") return CpuConvAlgo::Benchmark;
  AF_THROW(InvalidArgument, "AMPFORGE_CPU_CONV_ALGO={}: expected auto, direct or benchmark", *v);
}

std::string cpu_conv_summary() {
#ifdef AMPFORGE_HAVE_ONEDNN
  if (cpu_conv_path() == CpuConvPath::OneDnn)
    return onednn::describe() + "; BF16: " + cpu_bf16_summary(Bf16Kind::Conv);
#endif
  return "im2col (16-bit operands staged in F32)";
}

int64_t onednn_conv_executions() { return g_executions.load(std::memory_order_relaxed); }
int64_t onednn_scratch_bytes() { return thread_scratch_bytes(); }
int64_t onednn_scratch_grows() { return thread_scratch_grows(); }

#ifndef AMPFORGE_HAVE_ONEDNN
int64_t onednn_benchmarked_problems() { return 0; }
#endif

std::string onednn_last_impl() {
  std::lock_guard<std::mutex> lk(g_last_impl_mutex);
  return g_last_impl;
}

#ifndef AMPFORGE_HAVE_ONEDNN

bool onednn_conv2d_forward(const Tensor&, const Tensor&, const Tensor*, const Tensor&, const Conv2dAttrs&) {
  return false;
}
bool onednn_conv2d_backward_input(const Tensor&, const Tensor&, const Tensor&, const Conv2dAttrs&) { return false; }
bool onednn_conv2d_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Conv2dAttrs&) { return false; }
const OneDnnConvOffer& onednn_conv_offer() {
  static const OneDnnConvOffer none;
  return none;
}

#else

namespace {

namespace dn = dnnl;
using md = dn::memory::desc;
using tag = dn::memory::format_tag;

dn::engine& cpu_engine() { return onednn::engine(); }

enum class Dir : int64_t { Forward, BackwardInput, BackwardWeight };

// How a problem runs: direct kernels on the tensors' own layout, direct kernels on activations copied to and
// from the blocked nChw16c layout, or Winograd kernels (nChw16c only).
enum class Variant : int64_t { Direct, Blocked, Winograd };

// An activation tensor's layout as oneDNN sees it: channels-last (or both, through size-1 dims) -> nhwc.
tag image_tag(const Tensor& t) {
  if (t.is_contiguous(MemoryFormat::ChannelsLast)) return tag::nhwc;
  AF_ASSERT(t.is_contiguous(), "conv2d (oneDNN): tensor of shape {} strides {} is neither contiguous nor channels-last",
            t.shape().str(), t.strides().str());
  return tag::nchw;
}

std::optional<dn::memory::data_type> onednn_dtype(DType d) {
  switch (d) {
    case DType::F32: return dn::memory::data_type::f32;
    case DType::BF16: return dn::memory::data_type::bf16;
    case DType::F16: return dn::memory::data_type::f16;  // no CPU convolution in oneDNN 2.6: found unusable
    default: return std::nullopt;                          // F64: not a oneDNN type
  }
}

// One convolution problem: what the cache key and the primitive are built from. "image" is x (forward,
// weight gradient) or gx (input gradient), "out" is y or gy.
struct Problem {
  Dir dir;
  DType dtype;
  const Tensor* image;
  const Tensor* out;
  const Tensor* weight;  // weight (forward, input gradient) or weight gradient
  const Tensor* bias;    // forward only; may be null
  const Conv2dAttrs* a;
  int threads;
  Variant variant;  // Blocked / Winograd fall back to Direct where oneDNN has no such kernel (or copy) for it

  // Everything but the variant: the key of a benchmark-mode choice.
  std::vector<int64_t> problem_key() const {
    std::vector<int64_t> k{static_cast<int64_t>(dir), static_cast<int64_t>(dtype), threads};
    for (const Tensor* t : {image, out, weight}) k.insert(k.end(), t->shape().begin(), t->shape().end());
    k.insert(k.end(), weight->strides().begin(), weight->strides().end());
    k.push_back(image_tag(*image) == tag::nhwc);
    k.push_back(image_tag(*out) == tag::nhwc);
    k.push_back(bias ? bias->stride(0) : 0);
    for (int i = 0; i < 2; ++i) k.insert(k.end(), {a->stride[i], a->padding[i], a->dilation[i]});
    k.push_back(a->groups);
    return k;
  }
  std::vector<int64_t> key() const {
    std::vector<int64_t> k = problem_key();
    k.push_back(static_cast<int64_t>(variant));
    return k;
  }
};

// Channels the blocked layout holds without padding: one group, multiples of 16, at least 16.
bool blocked_fits(const Problem& p) {
  const int64_t Co = p.weight->size(0), C = p.weight->size(1);
  return p.a->groups == 1 && C >= 16 && Co >= 16 && C % 16 == 0 && Co % 16 == 0;
}

// Problems oneDNN's Winograd kernels take: F32, 3x3, stride 1, no dilation, channels blocked_fits.
bool winograd_possible(const Problem& p) {
  const Conv2dAttrs& a = *p.a;
  const Tensor& w = *p.weight;
  return p.dtype == DType::F32 && blocked_fits(p) && w.size(2) == 3 && w.size(3) == 3 && a.stride[0] == 1 &&
         a.stride[1] == 1 && a.dilation[0] == 1 && a.dilation[1] == 1;
}

// Where the Winograd kernels pay by the "auto" rule (the measurements in the file comment): >= 64 channels in
// and out on outputs of >= 14x14, or >= 32 channels on outputs of >= 56x56 (YOLOv8's 32 channels at 80x80: 0.52 /
// 0.57 / 0.55 ms direct against 0.29 / 0.32 / 0.38 on Winograd, plus ~0.09 ms per layout copy).
bool winograd_fits(const Problem& p) {
  const int64_t ch = std::min(p.weight->size(0), p.weight->size(1)), pixels = p.out->size(2) * p.out->size(3);
  return winograd_possible(p) && ((ch >= 64 && pixels >= 14 * 14) || (ch >= 32 && pixels >= 56 * 56));
}

// The weight gradient of a strided convolution with >= 32 channels runs faster on nChw16c copies of the activations
// (oneDNN's blocked-layout kernel), copies included; at 16 channels slower (bench/onednn_conv_shapes; the measurements
// are in docs/PERFORMANCE.md, 2026-12-03).
bool blocked_weight_grad_fits(const Problem& p) {
  const Conv2dAttrs& a = *p.a;
  return p.dir == Dir::BackwardWeight && p.dtype == DType::F32 && blocked_fits(p) && (a.stride[0] > 1 || a.stride[1] > 1) &&
         (p.weight->size(2) > 1 || p.weight->size(3) > 1) && std::min(p.weight->size(0), p.weight->size(1)) >= 32;
}

// The variant the "auto" rule picks.
Variant auto_variant(const Problem& p) {
  if (winograd_fits(p)) return Variant::Winograd;
  if (blocked_weight_grad_fits(p)) return Variant::Blocked;
  return Variant::Direct;
}

// A created problem: the convolution and the weight reorder around it, with the descriptors execution
// needs. usable == false: oneDNN offers nothing better than its reference kernel (or nothing at all).
// Winograd primitives also copy the activations between the tensors' layout and nChw16c (act_reorder).
struct Prim {
  bool usable = false;
  std::string impl;
  dn::primitive conv;
  md image_md, out_md, bias_md, weight_user_md, weight_prim_md, scratch_md;
  bool reorder = false;  // weight_prim_md differs from weight_user_md
  dn::primitive weight_reorder;
  bool act_reorder = false;
  // The image / output lies in nhwc: its copies to and from nChw16c are ours (blocked_copy), not the reorders.
  bool image_nhwc = false, out_nhwc = false;
  md image_prim_md, out_prim_md;          // the layouts the convolution reads/writes (blocked)
  dn::primitive image_reorder, out_reorder;  // in the direction the data flows (see run())
};

md image_md(const Tensor& t, dn::memory::data_type dt) {
  return md({t.size(0), t.size(1), t.size(2), t.size(3)}, dt, image_tag(t));
}

// The weight tensor (Co, Cg, KH, KW) as it lies in memory, grouped as (G, Co/G, Cg, KH, KW) when groups > 1.
md weight_user_md(const Tensor& w, int64_t groups, dn::memory::data_type dt) {
  const int64_t Co = w.size(0), Cg = w.size(1), KH = w.size(2), KW = w.size(3);
  const int64_t s0 = w.stride(0), s1 = w.stride(1), s2 = w.stride(2), s3 = w.stride(3);
  if (groups == 1) return md({Co, Cg, KH, KW}, dt, dn::memory::dims{s0, s1, s2, s3});
  return md({groups, Co / groups, Cg, KH, KW}, dt, dn::memory::dims{Co / groups * s0, s0, s1, s2, s3});
}

md weight_any_md(const Tensor& w, int64_t groups, dn::memory::data_type dt) {
  const int64_t Co = w.size(0), Cg = w.size(1), KH = w.size(2), KW = w.size(3);
  if (groups == 1) return md({Co, Cg, KH, KW}, dt, tag::any);
  return md({groups, Co / groups, Cg, KH, KW}, dt, tag::any);
}

std::shared_ptr<const Prim> create(const Problem& p) {
  auto r = std::make_shared<Prim>();
  const auto dt = *onednn_dtype(p.dtype);
  const Conv2dAttrs& a = *p.a;
  // oneDNN's dilation counts the gaps (PyTorch's minus one). Right padding = left padding: oneDNN then
  // computes the output size as floor((in + 2p - eff) / s) + 1, PyTorch's formula, which the consistency
  // check of the descriptor compares with the output we pass.
  const dn::memory::dims strides{a.stride[0], a.stride[1]}, dil{a.dilation[0] - 1, a.dilation[1] - 1},
      pad{a.padding[0], a.padding[1]};
  r->image_md = image_md(*p.image, dt);
  r->out_md = image_md(*p.out, dt);
  r->weight_user_md = weight_user_md(*p.weight, a.groups, dt);
  const md w_any = weight_any_md(*p.weight, a.groups, dt);
  if (p.bias) r->bias_md = md({p.bias->size(0)}, dt, dn::memory::dims{p.bias->stride(0)});
  dn::primitive_attr attr;
  attr.set_scratchpad_mode(dn::scratchpad_mode::user);
  // The descriptors of one algorithm, with the activations in image_prim / out_prim; false when oneDNN has
  // no implementation for it.
  dn::primitive_desc_base pd;
  md weight_prim;
  auto make = [&](dn::algorithm alg, const md& image_prim, const md& out_prim) {
    // The forward descriptor: the primitive itself for Dir::Forward, the hint the backward ones require.
    const dn::convolution_forward::desc fwd_desc(dn::prop_kind::forward_training, alg, image_prim, w_any, r->bias_md,
                                                 out_prim, strides, dil, pad, pad);
    const dn::convolution_forward::primitive_desc fwd_pd(fwd_desc, attr, cpu_engine(), /*allow_empty=*/true);
    if (!fwd_pd) return false;
    switch (p.dir) {
      case Dir::Forward: {
        pd = fwd_pd;
        weight_prim = fwd_pd.weights_desc();
        r->conv = dn::convolution_forward(fwd_pd);
        return true;
      }
      case Dir::BackwardInput: {
        const dn::convolution_backward_data::desc d(alg, image_prim, w_any, out_prim, strides, dil, pad, pad);
        const dn::convolution_backward_data::primitive_desc bpd(d, attr, cpu_engine(), fwd_pd, true);
        if (!bpd) return false;
        pd = bpd;
        weight_prim = bpd.weights_desc();
        r->conv = dn::convolution_backward_data(bpd);
        return true;
      }
      case Dir::BackwardWeight: {
        const dn::convolution_backward_weights::desc d(alg, image_prim, w_any, md(), out_prim, strides, dil, pad, pad);
        const dn::convolution_backward_weights::primitive_desc bpd(d, attr, cpu_engine(), fwd_pd, true);
        if (!bpd) return false;
        pd = bpd;
        weight_prim = bpd.diff_weights_desc();
        r->conv = dn::convolution_backward_weights(bpd);
        return true;
      }
    }
    return false;
  };
  dn::primitive_attr rattr;
  rattr.set_scratchpad_mode(dn::scratchpad_mode::user);
  // A layout copy; none when it would need a scratchpad (none of these copies does: execute() passes none).
  auto reorder = [&](const md& from, const md& to) -> std::optional<dn::reorder> {
    const dn::reorder::primitive_desc rpd(cpu_engine(), from, cpu_engine(), to, rattr);
    if (rpd.scratchpad_desc().get_size() != 0) return std::nullopt;
    return dn::reorder(rpd);
  };
  bool made = false;
  if (p.variant != Variant::Direct) {
    const md image_blk(r->image_md.dims(), dt, tag::nChw16c), out_blk(r->out_md.dims(), dt, tag::nChw16c);
    // The image flows into the forward and weight-gradient convolutions and out of the input-gradient one; the
    // output (or its gradient) the other way round. Without both copies, or without a Winograd kernel for the
    // problem, the direct kernels run it on the tensors' own layout.
    std::optional<dn::reorder> ri = p.dir == Dir::BackwardInput ? reorder(image_blk, r->image_md)
                                                                : reorder(r->image_md, image_blk);
    std::optional<dn::reorder> ro = p.dir == Dir::Forward ? reorder(out_blk, r->out_md) : reorder(r->out_md, out_blk);
    const dn::algorithm alg =
        p.variant == Variant::Winograd ? dn::algorithm::convolution_winograd : dn::algorithm::convolution_direct;
    if (ri && ro && make(alg, image_blk, out_blk)) {
      made = true;
      r->act_reorder = true;
      r->image_nhwc = image_tag(*p.image) == tag::nhwc;
      r->out_nhwc = image_tag(*p.out) == tag::nhwc;
      r->image_prim_md = image_blk;
      r->out_prim_md = out_blk;
      r->image_reorder = *ri;
      r->out_reorder = *ro;
    }
  }
  if (!made && !make(dn::algorithm::convolution_direct, r->image_md, r->out_md)) {
    r->impl = "no implementation";
    return r;
  }
  r->impl = pd.impl_info_str();
  if (r->act_reorder && p.variant == Variant::Blocked) r->impl += " on nChw16c";
  // The reference kernels are loops over every output and tap: slower than im2col + BLAS by an order of
  // magnitude. oneDNN's gemm-based kernels ("x64:gemm:jit", what 2.6 offers for plain NCHW activations) are
  // an im2col of its own, measured slower than ours (YOLOv8n 640 b2 fp32 step: 1057 ms with them, 909 ms on
  // im2col). Such problems stay on im2col.
  if (r->impl.rfind("ref", 0) == 0 || r->impl.find("gemm:") != std::string::npos) return r;
  r->scratch_md = pd.scratchpad_desc();
  r->weight_prim_md = weight_prim;
  r->reorder = weight_prim != r->weight_user_md;
  if (r->reorder) {
    std::optional<dn::reorder> rw = p.dir != Dir::BackwardWeight ? reorder(r->weight_user_md, weight_prim)
                                                                 : reorder(weight_prim, r->weight_user_md);
    if (!rw) {
      r->impl += " (its weight copy needs a scratchpad)";
      return r;
    }
    r->weight_reorder = *rw;
  }
  r->usable = true;
  return r;
}

// A problem oneDNN rejects (e.g. a dtype this build has no kernel for) stays on im2col.
constexpr size_t kMaxCached = onednn::PrimitiveCache<Prim>::kMaxEntries;

std::shared_ptr<const Prim> lookup(const Problem& p) {
  static onednn::PrimitiveCache<Prim> cache;
  return cache.get(p.key(), [&] { return create(p); });
}

// What a thread keeps in its slots (thread_scratch.h) is bounded by the largest convolution it ran, per slot: 71 MiB
// after ResNet-50 b8 224 fp32 and bf16 steps (scratchpad 44, weights 9, image 12, output 6), 30 MiB after YOLOv8n b2
// 640 (onednn_scratch_bytes() reports it; outside the caching allocator's statistics, next to its ~0.9 GiB peak for
// that ResNet-50 step).
// This file's uses of the per-thread scratch slots (thread_scratch.h).
constexpr ScratchSlot kScratch = kScratch0, kWeights = kScratch1, kImage = kScratch2, kOut = kScratch3;

// nhwc <-> nChw16c copy of an activation whose channels are a multiple of 16 (blocked_fits): one 16-channel run
// per pixel and channel block, tiles of 64 pixels (at most 64 x C elements read or written per tile, in L1).
// oneDNN's reorder for these took 0.5-0.6 ms for YOLOv8n's 80-channel activations at 40x40 and 80x80 (2-4 MB: 3-8
// GB/s), a tenth of its speed on 64 channels.
template <class T>
void blocked_copy_t(const T* src, T* dst, int64_t N, int64_t C, int64_t HW, bool to_blocked) {
  constexpr int64_t kTile = 64;
  const int64_t tiles = (HW + kTile - 1) / kTile;
  parallel_for(N * tiles, 1, [src, dst, C, HW, tiles, to_blocked](int64_t t0, int64_t t1) {
    const int64_t CB = C / 16;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / tiles, p0 = (t % tiles) * kTile, p1 = std::min(HW, p0 + kTile);
      for (int64_t cb = 0; cb < CB; ++cb) {
        const T* s = src + (to_blocked ? (n * HW + p0) * C + cb * 16 : ((n * CB + cb) * HW + p0) * 16);
        T* d = dst + (to_blocked ? ((n * CB + cb) * HW + p0) * 16 : (n * HW + p0) * C + cb * 16);
        const int64_t ss = to_blocked ? C : 16, ds = to_blocked ? 16 : C;
        for (int64_t px = p0; px < p1; ++px, s += ss, d += ds) {
          T run[16];
          for (int i = 0; i < 16; ++i) run[i] = s[i];
          for (int i = 0; i < 16; ++i) d[i] = run[i];
        }
      }
    }
  });
}

void blocked_copy(const md& user, const void* src, void* dst, bool to_blocked) {
  const dn::memory::dims d = user.dims();
  const int64_t HW = d[2] * d[3];
  if (user.data_type() == dn::memory::data_type::f32) {
    blocked_copy_t(static_cast<const float*>(src), static_cast<float*>(dst), d[0], d[1], HW, to_blocked);
  } else {
    AF_ASSERT(user.data_type() == dn::memory::data_type::bf16, "blocked_copy: unexpected data type");
    blocked_copy_t(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), d[0], d[1], HW, to_blocked);
  }
}

// Runs a usable primitive for p (whose tensors it reads and writes).
void execute(const Prim& prim, const Problem& p) {
  dn::engine& eng = cpu_engine();
  dn::stream& stream = onednn::thread_stream();
  void* const scratch = thread_scratch(kScratch, prim.scratch_md.get_size());
  void* const wtmp = thread_scratch(kWeights, prim.reorder ? prim.weight_prim_md.get_size() : 0);
  dn::memory image_user(prim.image_md, eng, p.image->data_ptr());
  dn::memory out_user(prim.out_md, eng, p.out->data_ptr());
  void* const image_tmp = thread_scratch(kImage, prim.act_reorder ? prim.image_prim_md.get_size() : 0);
  void* const out_tmp = thread_scratch(kOut, prim.act_reorder ? prim.out_prim_md.get_size() : 0);
  dn::memory image = prim.act_reorder ? dn::memory(prim.image_prim_md, eng, image_tmp) : image_user;
  dn::memory out = prim.act_reorder ? dn::memory(prim.out_prim_md, eng, out_tmp) : out_user;
  dn::memory wuser(prim.weight_user_md, eng, p.weight->data_ptr());
  dn::memory wprim = prim.reorder ? dn::memory(prim.weight_prim_md, eng, wtmp) : wuser;

  std::unordered_map<int, dn::memory> args;
  if (prim.scratch_md.get_size() != 0) args.emplace(DNNL_ARG_SCRATCHPAD, dn::memory(prim.scratch_md, eng, scratch));
  switch (p.dir) {
    case Dir::Forward:
      args.insert({{DNNL_ARG_SRC, image}, {DNNL_ARG_WEIGHTS, wprim}, {DNNL_ARG_DST, out}});
      if (p.bias) args.emplace(DNNL_ARG_BIAS, dn::memory(prim.bias_md, eng, p.bias->data_ptr()));
      break;
    case Dir::BackwardInput:
      args.insert({{DNNL_ARG_DIFF_DST, out}, {DNNL_ARG_WEIGHTS, wprim}, {DNNL_ARG_DIFF_SRC, image}});
      break;
    case Dir::BackwardWeight:
      args.insert({{DNNL_ARG_SRC, image}, {DNNL_ARG_DIFF_DST, out}, {DNNL_ARG_DIFF_WEIGHTS, wprim}});
      break;
  }
  const bool weight_out = p.dir == Dir::BackwardWeight;
  const bool image_in = p.dir != Dir::BackwardInput, out_in = p.dir != Dir::Forward;
  // Our copies run on parallel_for, outside the idle scope; oneDNN's CPU stream executes in order, synchronously.
  if (prim.act_reorder) {
    if (image_in && prim.image_nhwc) blocked_copy(prim.image_md, p.image->data_ptr(), image_tmp, true);
    if (out_in && prim.out_nhwc) blocked_copy(prim.out_md, p.out->data_ptr(), out_tmp, true);
  }
  {
    const PoolIdleScope idle;  // our workers sleep while the OpenMP team runs
    if (prim.act_reorder) {
      if (image_in && !prim.image_nhwc)
        prim.image_reorder.execute(stream, {{DNNL_ARG_FROM, image_user}, {DNNL_ARG_TO, image}});
      if (out_in && !prim.out_nhwc) prim.out_reorder.execute(stream, {{DNNL_ARG_FROM, out_user}, {DNNL_ARG_TO, out}});
    }
    if (prim.reorder && !weight_out) prim.weight_reorder.execute(stream, {{DNNL_ARG_FROM, wuser}, {DNNL_ARG_TO, wprim}});
    prim.conv.execute(stream, args);
    if (prim.reorder && weight_out) prim.weight_reorder.execute(stream, {{DNNL_ARG_FROM, wprim}, {DNNL_ARG_TO, wuser}});
    if (prim.act_reorder) {
      if (!image_in && !prim.image_nhwc)
        prim.image_reorder.execute(stream, {{DNNL_ARG_FROM, image}, {DNNL_ARG_TO, image_user}});
      if (!out_in && !prim.out_nhwc) prim.out_reorder.execute(stream, {{DNNL_ARG_FROM, out}, {DNNL_ARG_TO, out_user}});
    }
    stream.wait();
  }
  if (prim.act_reorder) {
    if (!image_in && prim.image_nhwc) blocked_copy(prim.image_md, image_tmp, p.image->data_ptr(), false);
    if (!out_in && prim.out_nhwc) blocked_copy(prim.out_md, out_tmp, p.out->data_ptr(), false);
  }
}

// Benchmark mode: the variant each problem measured fastest on its first call, for the process.
std::atomic<int64_t> g_benchmarked{0};

// The candidates of p, fastest first by measurement: each usable variant runs once to warm up (kernel pages,
// scratch) and then twice timed; the best of those two counts. The tensors are the call's own: every
// direction overwrites its output, so the runs leave the result of the last one, and the caller runs the
// chosen one again. Direct is kept unless another is 5% faster: a tie should not depend on timing noise.
std::shared_ptr<const Prim> benchmark(const Problem& p) {
  static std::mutex mutex;
  static std::map<std::vector<int64_t>, std::shared_ptr<const Prim>> chosen;
  const std::vector<int64_t> key = p.problem_key();
  {
    std::lock_guard<std::mutex> lk(mutex);
    auto it = chosen.find(key);
    if (it != chosen.end()) return it->second;
  }
  std::vector<Variant> variants{Variant::Direct};
  if (blocked_fits(p)) variants.push_back(Variant::Blocked);
  if (winograd_possible(p)) variants.push_back(Variant::Winograd);
  std::shared_ptr<const Prim> best;
  double best_s = 0;
  for (Variant v : variants) {
    Problem q = p;
    q.variant = v;
    std::shared_ptr<const Prim> prim = lookup(q);
    // A variant oneDNN runs another way (Winograd without a Winograd kernel) is the same as one tried before.
    if (!prim->usable || (best && prim->impl == best->impl && prim->act_reorder == best->act_reorder)) continue;
    execute(*prim, q);
    double s = 0;
    for (int i = 0; i < 2; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      execute(*prim, q);
      const double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      s = i == 0 ? d : std::min(s, d);
    }
    if (!best || s < best_s * 0.95) {
      best = prim;
      best_s = s;
    }
  }
  if (!best) best = lookup(p);  // none usable: the unusable entry, so the caller falls back to im2col
  g_benchmarked.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(mutex);
  if (chosen.size() >= kMaxCached) chosen.clear();
  return chosen.emplace(key, best).first->second;
}

// The gradients of a 1x1, unpadded, ungrouped F32 convolution on channels-last activations are matrix products of
// the tensors as they lie: with M = N*Ho*Wo output pixels, gy is (M, Co), the weight (Co, C), and xs (M, C) the
// input pixels the kernel reads (x itself at stride 1, every s-th row and column of x at stride s):
//   input gradient   gx at those pixels (M, C) = gy (M, Co) @ w (Co, C), zero elsewhere
//   weight gradient  gw (Co, C)                = gy^T (Co, M) @ xs (M, C)
// oneDNN's GEMM (dnnl::sgemm, AVX-512 kernels generated for the CPU, on the same OpenMP team) runs them without the
// convolution primitive's weight reorders, and faster than its 1x1 backward kernels, most of all on YOLOv8's few
// channels over many pixels (b2: 192 -> 64 channels at 80x80, input + weight gradient 3.9 ms as convolution
// primitives in a step against 1.5 ms for the GEMMs alone; ResNet-50 b8's 64 -> 256 at 56x56 weight gradient 3.5-3.9
// against 2.9 ms; docs/PERFORMANCE.md). At stride s, xs is gathered into a buffer first and the
// input gradient's rows are scattered from one (both M x C, a fraction 1/s^2 of x). The forward stays on the
// convolution primitive, which was as fast or faster (64 -> 256 at 56x56: 1.8 against 2.0 ms). false: not such a
// problem.
// A gradient (either direction) of a 1x1, unpadded, ungrouped convolution on channels-last activations: a matrix
// product of the tensors as they lie (run_pointwise_gemm, run_pointwise_bf16_matmul).
bool pointwise_gradient(const Problem& p) {
  const Conv2dAttrs& a = *p.a;
  const Tensor& w = *p.weight;
  return p.dir != Dir::Forward && a.groups == 1 && w.size(2) == 1 && w.size(3) == 1 && a.padding[0] == 0 &&
         a.padding[1] == 0 && p.image->is_contiguous(MemoryFormat::ChannelsLast) &&
         p.out->is_contiguous(MemoryFormat::ChannelsLast);
}

bool run_pointwise_gemm(const Problem& p) {
  if (p.dtype != DType::F32 || !pointwise_gradient(p)) return false;
  const Conv2dAttrs& a = *p.a;
  const Tensor& w = *p.weight;
  const Tensor &img = *p.image, &out = *p.out;
  const int64_t Co = w.size(0), C = w.size(1);
  const int64_t N = img.size(0), H = img.size(2), W = img.size(3), Ho = out.size(2), Wo = out.size(3);
  const int64_t sh = a.stride[0], sw = a.stride[1], M = N * Ho * Wo;
  const bool strided = sh != 1 || sw != 1;
  // The weight as a row-major (Co, C) matrix, or its transpose; other strides go to the convolution primitive.
  const bool w_rows = w.stride(1) == 1 || C == 1, w_cols = !w_rows && (w.stride(0) == 1 || Co == 1);
  if (!w_rows && !w_cols) return false;
  const int64_t ldw = w_rows ? std::max<int64_t>(w.stride(0), C) : std::max<int64_t>(w.stride(1), Co);
  const float* gy = static_cast<const float*>(out.data_ptr());
  float* const xs_buf = strided ? static_cast<float*>(thread_scratch(kImage, static_cast<size_t>(M * C) * sizeof(float)))
                                : nullptr;
  // Row r = (n, ho, wo) of xs is pixel (n, ho * sh, wo * sw) of the image.
  auto pixel = [&](int64_t r) {
    const int64_t wo = r % Wo, ho = (r / Wo) % Ho, n = r / (Wo * Ho);
    return ((n * H + ho * sh) * W + wo * sw) * C;
  };
  if (p.dir == Dir::BackwardInput) {
    float* gx = static_cast<float*>(img.data_ptr());
    float* dst = strided ? xs_buf : gx;
    {
      const PoolIdleScope idle;  // our workers sleep while the OpenMP team runs
      dn::sgemm('N', w_rows ? 'N' : 'T', M, C, Co, 1.0f, gy, Co, static_cast<const float*>(w.data_ptr()), ldw, 0.0f,
                dst, C);
    }
    if (strided) {
      parallel_for(N * H, 1, [&](int64_t r0, int64_t r1) {
        std::memset(gx + r0 * W * C, 0, static_cast<size_t>((r1 - r0) * W * C) * sizeof(float));
      });
      parallel_for(M, 64, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) std::memcpy(gx + pixel(r), xs_buf + r * C, static_cast<size_t>(C) * sizeof(float));
      });
    }
  } else {
    const float* x = static_cast<const float*>(img.data_ptr());
    if (strided) {
      parallel_for(M, 64, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) std::memcpy(xs_buf + r * C, x + pixel(r), static_cast<size_t>(C) * sizeof(float));
      });
      x = xs_buf;
    }
    float* gw = static_cast<float*>(w.data_ptr());
    // The product's row count is the smaller of Co and C: sgemm runs these long-K products up to ~1.4x faster that way
    // round (64 -> 256 at 56x56, M = 25088: 2.5-2.7 ms as gw^T = xs^T @ gy against 3.4-3.6 ms as gw = gy^T @ xs;
    // 256 -> 64: 2.6-3.4 against 3.6-4.1 the other way round; bench program, min of 10, two runs; in a ResNet-50 b8
    // step all 1x1 weight-gradient products took 91.7 / 95.7 / 102.5 ms against 101.7 / 158.3 / 99.5, three
    // alternations, timers around the products). When that is not the weight's own orientation, the product goes
    // to a buffer and is transposed into place (Co x C values).
    const bool rows_are_co = Co <= C;
    float* const dst = rows_are_co == w_rows
                           ? gw
                           : static_cast<float*>(thread_scratch(kOut, static_cast<size_t>(Co * C) * sizeof(float)));
    const int64_t ld_dst = dst == gw ? ldw : (rows_are_co ? C : Co);
    {
      const PoolIdleScope idle;
      if (rows_are_co)  // gw (Co, C) = gy^T @ xs
        dn::sgemm('T', 'N', Co, C, M, 1.0f, gy, Co, x, C, 0.0f, dst, ld_dst);
      else  // gw^T (C, Co) = xs^T @ gy
        dn::sgemm('T', 'N', C, Co, M, 1.0f, x, C, gy, Co, 0.0f, dst, ld_dst);
    }
    if (dst != gw) {  // dst is (rows, cols) row-major; gw wants its transpose at stride ldw
      const int64_t rows = rows_are_co ? Co : C, cols = rows_are_co ? C : Co;
      parallel_for(cols, 16, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = 0; r < rows; ++r) gw[c * ldw + r] = dst[r * cols + c];
      });
    }
  }
  return true;
}

// The BF16 gradients of a 1x1, stride-1, unpadded, ungrouped convolution on channels-last activations, as oneDNN BF16
// matrix products of the tensors as they lie (the products of run_pointwise_gemm, with M = N*H*W):
//   input gradient   gx (M, C)  = gy (M, Co) @ w (Co, C)
//   weight gradient  gw (Co, C) = gy^T (Co, M) @ x (M, C)
// oneDNN 2.6's BF16 matmul (brgemm, on AMX where the CPU has it) runs these long-K products faster than its BF16 1x1
// backward-weights kernel (ResNet-50 b8 224 bf16 step, docs/PERFORMANCE.md). The forward stays on the convolution
// primitive. false: not such a problem, or no native BF16 matmul here (onednn_matmul declines: then the convolution
// primitive runs it, as on CPUs where bf16_compute.h chose the F32 way).
bool run_pointwise_bf16_matmul(const Problem& p) {
  const Tensor& w = *p.weight;
  const Tensor &img = *p.image, &out = *p.out;
  if (p.dtype != DType::BF16 || !pointwise_gradient(p) || p.a->stride[0] != 1 || p.a->stride[1] != 1 ||
      !w.is_contiguous())
    return false;
  const int64_t Co = w.size(0), C = w.size(1), M = img.size(0) * img.size(2) * img.size(3);
  const Tensor x_m = img.as_strided_raw(Shape{1, M, C}, Strides{0, C, 1}, img.offset());
  const Tensor w_m = w.as_strided_raw(Shape{1, Co, C}, Strides{0, C, 1}, w.offset());
  if (p.dir == Dir::BackwardInput)
    return onednn_matmul(out.as_strided_raw(Shape{1, M, Co}, Strides{0, Co, 1}, out.offset()), w_m, x_m);
  return onednn_matmul(out.as_strided_raw(Shape{1, Co, M}, Strides{0, 1, Co}, out.offset()), x_m, w_m);
}

bool run(const Problem& p) {
  if (!onednn_dtype(p.dtype) || p.image->size(0) == 0) return false;
  const int threads = onednn::set_threads_for_call();
  Problem q = p;
  q.threads = threads;
  const CpuConvAlgo algo = cpu_conv_algo();
  q.variant = algo == CpuConvAlgo::Auto ? auto_variant(p) : Variant::Direct;
  if (algo != CpuConvAlgo::Direct) {
    std::string impl;
    if (run_pointwise_gemm(q))
      impl = "sgemm (1x1 as a matrix product)";
    else if (run_pointwise_bf16_matmul(q))
      impl = "BF16 matmul (1x1 as a matrix product): " + onednn_matmul_last_impl();
    if (!impl.empty()) {
      set_last_impl(impl);
      g_executions.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  const std::shared_ptr<const Prim> prim = algo == CpuConvAlgo::Benchmark ? benchmark(q) : lookup(q);
  set_last_impl(prim->usable ? prim->impl : "declined: " + prim->impl);
  if (!prim->usable) return false;
  execute(*prim, q);
  g_executions.fetch_add(1, std::memory_order_relaxed);  // calls answered, not benchmark mode's trial runs
  return true;
}

}  // namespace

int64_t onednn_benchmarked_problems() { return g_benchmarked.load(std::memory_order_relaxed); }

const OneDnnConvOffer& onednn_conv_offer() {
  static const OneDnnConvOffer offer = [] {
    OneDnnConvOffer o;
    o.isa = onednn::isa_name();
    // A forward descriptor of a 3x3 stride-1 convolution with 64 channels on 16x16 (the shape of the Winograd rule);
    // whether oneDNN has a kernel for it that is neither its reference nor a gemm-based one.
    auto offers = [](dn::memory::data_type dt, dn::algorithm alg, tag act) {
      const md x({2, 64, 16, 16}, dt, act), y({2, 64, 16, 16}, dt, act), w({64, 64, 3, 3}, dt, tag::any);
      try {
        const dn::convolution_forward::desc desc(dn::prop_kind::forward_training, alg, x, w, md(), y, {1, 1}, {0, 0},
                                                 {1, 1}, {1, 1});
        const dn::convolution_forward::primitive_desc pd(desc, dn::primitive_attr(), cpu_engine(), true);
        if (!pd) return false;
        const std::string impl = pd.impl_info_str();
        return impl.rfind("ref", 0) != 0 && impl.find("gemm:") == std::string::npos;
      } catch (const dn::error&) {
        return false;
      }
    };
    o.bf16 = offers(dn::memory::data_type::bf16, dn::algorithm::convolution_direct, tag::nhwc);
    o.winograd = offers(dn::memory::data_type::f32, dn::algorithm::convolution_winograd, tag::nChw16c);
    return o;
  }();
  return offer;
}

bool onednn_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y,
                           const Conv2dAttrs& a) {
  return run(Problem{Dir::Forward, y.dtype(), &x, &y, &w, bias, &a, 0, Variant::Direct});
}

bool onednn_conv2d_backward_input(const Tensor& gy, const Tensor& w, const Tensor& gx, const Conv2dAttrs& a) {
  return run(Problem{Dir::BackwardInput, gx.dtype(), &gx, &gy, &w, nullptr, &a, 0, Variant::Direct});
}

bool onednn_conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Tensor& gw, const Conv2dAttrs& a) {
  return run(Problem{Dir::BackwardWeight, gw.dtype(), &x, &gy, &gw, nullptr, &a, 0, Variant::Direct});
}

#endif  // AMPFORGE_HAVE_ONEDNN

}  // namespace ampforge::cpu
