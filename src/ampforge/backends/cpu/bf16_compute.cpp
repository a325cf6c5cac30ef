// See bf16_compute.h.
#include "ampforge/backends/cpu/bf16_compute.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ampforge/core/half.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"
#include "ampforge/util/thread_pool.h"

#ifdef AMPFORGE_HAVE_ONEDNN
#include "ampforge/backends/cpu/onednn_runtime.h"
#endif

namespace ampforge::cpu {
namespace {

enum class Asked { Auto, Native, F32 };

Asked asked() {
  const std::optional<std::string> v = env_get("AMPFORGE_CPU_BF16");
  if (!v || v->empty() || *v == "auto") return Asked::Auto;
  if (*v == "native") return Asked::Native;
  if (*v == "f32") return Asked::F32;
  AF_THROW(InvalidArgument, "AMPFORGE_CPU_BF16={}: expected auto, native or f32", *v);
}

// The outcome of `auto` for one kind: fixed for the process once known.
struct Choice {
  Bf16Compute compute = Bf16Compute::F32;
  bool measured = false;
  double native_ms = 0, f32_ms = 0;
  const char* reason = "";  // when not measured
};

#ifdef AMPFORGE_HAVE_ONEDNN
namespace dn = dnnl;
using tag = dn::memory::format_tag;
using dt = dn::memory::data_type;

// Small values of both signs, no zeros or subnormals (which some kernels treat specially).
template <class T>
void fill_as(void* data, size_t bytes) {
  auto* p = static_cast<T*>(data);
  for (size_t i = 0; i < bytes / sizeof(T); ++i) p[i] = T(0.01f * static_cast<float>(static_cast<int>(i % 13) - 6) + 0.003f);
}

void fill(const dn::memory& m) {
  const dn::memory::desc d = m.get_desc();
  if (d.data_type() == dt::f32) fill_as<float>(m.get_data_handle(), d.get_size());
  else fill_as<BFloat16>(m.get_data_handle(), d.get_size());
}

dn::memory make(const dn::memory::desc& d) {
  dn::memory m(d, onednn::engine());
  fill(m);
  return m;
}

// Best of kReps runs of each way, alternating (a machine whose speed drifts moves both alike), after one warm-up run
// of each (first runs fault in pages and fill the caches).
template <class A, class B>
void time_both(A&& native, B&& f32, Choice& c) {
  using Clock = std::chrono::steady_clock;
  constexpr int kReps = 5;
  dn::stream& s = onednn::thread_stream();
  native(s);
  f32(s);
  s.wait();
  double bn = std::numeric_limits<double>::infinity(), bf = bn;
  for (int r = 0; r < kReps; ++r) {
    auto t0 = Clock::now();
    native(s);
    s.wait();
    auto t1 = Clock::now();
    f32(s);
    s.wait();
    auto t2 = Clock::now();
    bn = std::min(bn, std::chrono::duration<double, std::milli>(t1 - t0).count());
    bf = std::min(bf, std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  c.measured = true;
  c.native_ms = bn;
  c.f32_ms = bf;
  c.compute = bn <= bf ? Bf16Compute::Native : Bf16Compute::F32;
}

// (256 x 768) @ (768 x 768), row-major, as matmul_onednn.cpp hands BERT-base's projections to oneDNN. The F32 way:
// operands converted, F32 product, result rounded (blas.cpp's conversion path runs its products on oneDNN's SGEMM,
// the same kernels as the F32 matmul primitive).
void measure_matmul(Choice& c) {
  const dn::memory::dim M = 256, N = 768, K = 768;
  auto d = [](dn::memory::dims dims, dt t) { return dn::memory::desc(dims, t, tag::ab); };
  dn::engine& e = onednn::engine();
  dn::memory a16 = make(d({M, K}, dt::bf16)), b16 = make(d({K, N}, dt::bf16)), c16 = make(d({M, N}, dt::bf16));
  dn::memory a32 = make(d({M, K}, dt::f32)), b32 = make(d({K, N}, dt::f32)), c32 = make(d({M, N}, dt::f32));
  const dn::matmul mm16(dn::matmul::primitive_desc(dn::matmul::desc(a16.get_desc(), b16.get_desc(), c16.get_desc()), e));
  const dn::matmul mm32(dn::matmul::primitive_desc(dn::matmul::desc(a32.get_desc(), b32.get_desc(), c32.get_desc()), e));
  const dn::reorder ra(a16, a32), rb(b16, b32), rc(c32, c16);
  time_both(
      [&](dn::stream& s) { mm16.execute(s, {{DNNL_ARG_SRC, a16}, {DNNL_ARG_WEIGHTS, b16}, {DNNL_ARG_DST, c16}}); },
      [&](dn::stream& s) {
        ra.execute(s, a16, a32);
        rb.execute(s, b16, b32);
        mm32.execute(s, {{DNNL_ARG_SRC, a32}, {DNNL_ARG_WEIGHTS, b32}, {DNNL_ARG_DST, c32}});
        rc.execute(s, c32, c16);
      },
      c);
}

// 3x3, 64 -> 64 channels, 2 x 56 x 56, stride 1, padding 1, forward: a mid-network convolution of ResNet-50 and
// YOLOv8. Native: BF16 direct kernels on nhwc activations and the weights reordered to the kernel's layout (as
// conv_onednn.cpp runs it). F32: activations converted into the layout of the F32 kernel conv_onednn.cpp's auto rule
// picks for this shape (Winograd, blocked), weights likewise, result converted back to BF16 nhwc.
void measure_conv(Choice& c) {
  const dn::memory::dims src{2, 64, 56, 56}, wei{64, 64, 3, 3}, dst{2, 64, 56, 56}, strides{1, 1}, pad{1, 1};
  dn::engine& e = onednn::engine();
  dn::memory x16 = make({src, dt::bf16, tag::nhwc}), w16 = make({wei, dt::bf16, tag::oihw});
  dn::memory y16 = make({dst, dt::bf16, tag::nhwc});

  const dn::convolution_forward::desc dn16(dn::prop_kind::forward_training, dn::algorithm::convolution_direct,
                                           x16.get_desc(), {wei, dt::bf16, tag::any}, y16.get_desc(), strides, pad, pad);
  const dn::convolution_forward::primitive_desc pd16(dn16, e);
  dn::memory wb16 = make(pd16.weights_desc());
  const dn::convolution_forward conv16(pd16);
  const dn::reorder rw16(w16, wb16);

  auto pd32_for = [&](dn::algorithm alg) {
    const dn::convolution_forward::desc d(dn::prop_kind::forward_training, alg, {src, dt::f32, tag::any},
                                          {wei, dt::f32, tag::any}, {dst, dt::f32, tag::any}, strides, pad, pad);
    return dn::convolution_forward::primitive_desc(d, e, /*allow_empty=*/true);
  };
  dn::convolution_forward::primitive_desc pd32 = pd32_for(dn::algorithm::convolution_winograd);
  if (!pd32) pd32 = pd32_for(dn::algorithm::convolution_direct);
  dn::memory x32 = make(pd32.src_desc()), w32 = make(pd32.weights_desc()), y32 = make(pd32.dst_desc());
  const dn::convolution_forward conv32(pd32);
  const dn::reorder rx(x16, x32), rw(w16, w32), ry(y32, y16);
  time_both(
      [&](dn::stream& s) {
        rw16.execute(s, w16, wb16);
        conv16.execute(s, {{DNNL_ARG_SRC, x16}, {DNNL_ARG_WEIGHTS, wb16}, {DNNL_ARG_DST, y16}});
      },
      [&](dn::stream& s) {
        rx.execute(s, x16, x32);
        rw.execute(s, w16, w32);
        conv32.execute(s, {{DNNL_ARG_SRC, x32}, {DNNL_ARG_WEIGHTS, w32}, {DNNL_ARG_DST, y32}});
        ry.execute(s, y32, y16);
      },
      c);
}
#endif

Choice decide(Bf16Kind kind) {
  Choice c;
#ifdef AMPFORGE_HAVE_ONEDNN
  if (!onednn::native_bf16()) {
    c.reason = "no AVX512_BF16";
    return c;
  }
  if (onednn::amx()) {
    c.compute = Bf16Compute::Native;
    c.reason = "AMX";
    return c;
  }
  // On one thread: what is compared is the kernels' speed per core, and one thread keeps it when other processes
  // load the machine; a team's timings then are not (the F32 way's four parallel regions wait at four barriers for
  // descheduled threads, the native way's one or two: on 2 vCPUs shared with another test process, that alone
  // flipped the choice). Our pool's workers sleep meanwhile (as around every oneDNN call).
  onednn::set_threads_for_call(/*parallel=*/false);
  PoolIdleScope idle;
  try {
    kind == Bf16Kind::Matmul ? measure_matmul(c) : measure_conv(c);
  } catch (const dn::error&) {  // a CPU on which oneDNN has no such kernel: the F32 way, which always exists
    c = Choice{};
    c.reason = "oneDNN has no BF16 kernel for it here";
  }
#else
  (void)kind;
  c.reason = "this build has no oneDNN";
#endif
  return c;
}

const Choice& choice(Bf16Kind kind) {
  static std::once_flag once[2];
  static Choice made[2];
  const int i = kind == Bf16Kind::Matmul ? 0 : 1;
  std::call_once(once[i], [&] { made[i] = decide(kind); });
  return made[i];
}

}  // namespace

Bf16Compute cpu_bf16_compute(Bf16Kind kind) {
  switch (asked()) {
    case Asked::Native: return Bf16Compute::Native;
    case Asked::F32: return Bf16Compute::F32;
    case Asked::Auto: break;
  }
  return choice(kind).compute;
}

std::string cpu_bf16_summary(Bf16Kind kind) {
  const Asked a = asked();
  if (a != Asked::Auto)
    return a == Asked::Native ? "native (AMPFORGE_CPU_BF16=native)" : "F32 copies (AMPFORGE_CPU_BF16=f32)";
  const Choice& c = choice(kind);
  const char* way = c.compute == Bf16Compute::Native ? "native" : "F32 copies";
  if (!c.measured) return std::string(way) + " (" + c.reason + ")";
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s (measured: native %.2f ms, F32 %.2f ms)", way, c.native_ms, c.f32_ms);
  return buf;
}

}  // namespace ampforge::cpu
