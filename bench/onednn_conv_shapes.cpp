// oneDNN's F32 convolution kernels alone, per shape: direct on nhwc activations (what ampforge hands oneDNN),
// direct on nChw16c and Winograd on nChw16c, forward / input gradient / weight gradient, in ms and GFLOP/s (direct-
// convolution FLOPs), with the weight gradient's implementation. The measurements behind the algorithm rules of
// backends/cpu/conv_onednn.cpp (docs/PERFORMANCE.md). The activation layout copies the nChw16c variants need are
// timed apart (one line per shape).
//
// Usage: onednn_conv_shapes [--threads N]   (ResNet-50's 3x3 shapes at batch 8, YOLOv8n's at batch 2)
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

namespace {

using namespace dnnl;
using tag = memory::format_tag;

engine& eng() {
  static engine e(engine::kind::cpu, 0);
  return e;
}

// Mean milliseconds per execution over at least 5 runs and 0.3 s, after one untimed run.
double time_ms(primitive& p, const std::unordered_map<int, memory>& args) {
  stream s(eng());
  p.execute(s, args);
  s.wait();
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double el = 0;
  while (reps < 5 || el < 0.3) {
    p.execute(s, args);
    s.wait();
    ++reps;
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return el / reps * 1e3;
}

memory filled(const memory::desc& d) {
  memory m(d, eng());
  auto* p = static_cast<float*>(m.get_data_handle());
  for (size_t i = 0; i < d.get_size() / sizeof(float); ++i) p[i] = static_cast<float>(i % 7) * 0.1f;
  return m;
}

// Milliseconds of one layout copy of an activation (nhwc -> nChw16c), what the blocked variants add per tensor.
double copy_ms(const memory::dims& dims) {
  const auto dt = memory::data_type::f32;
  const memory from = filled(memory::desc(dims, dt, tag::nhwc)), to(memory::desc(dims, dt, tag::nChw16c), eng());
  reorder r(from, to);
  return time_ms(r, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
}

struct Shape {
  int N, C, Co, H, k, s;
};

// One shape (k x k, stride s, padding k / 2) with one algorithm and activation layout.
void run(const Shape& sh, algorithm alg, tag act) {
  const int pad = sh.k / 2, Ho = (sh.H + 2 * pad - sh.k) / sh.s + 1;
  const memory::dims src{sh.N, sh.C, sh.H, sh.H}, dst{sh.N, sh.Co, Ho, Ho}, wei{sh.Co, sh.C, sh.k, sh.k},
      st{sh.s, sh.s}, pd{pad, pad};
  const auto dt = memory::data_type::f32;
  const memory::desc x(src, dt, act), y(dst, dt, act), w(wei, dt, tag::any);
  const char* name = alg == algorithm::convolution_winograd ? "winograd" : "direct";
  try {
    const convolution_forward::primitive_desc f(
        convolution_forward::desc(prop_kind::forward_training, alg, x, w, memory::desc(), y, st, pd, pd), eng());
    const convolution_backward_data::primitive_desc d(convolution_backward_data::desc(alg, x, w, y, st, pd, pd),
                                                      eng(), f);
    const convolution_backward_weights::primitive_desc g(
        convolution_backward_weights::desc(alg, x, w, memory::desc(), y, st, pd, pd), eng(), f);
    convolution_forward fp(f);
    convolution_backward_data dp(d);
    convolution_backward_weights gp(g);
    const double tf = time_ms(fp, {{DNNL_ARG_SRC, filled(f.src_desc())},
                                   {DNNL_ARG_WEIGHTS, filled(f.weights_desc())},
                                   {DNNL_ARG_DST, filled(f.dst_desc())}});
    const double td = time_ms(dp, {{DNNL_ARG_DIFF_SRC, filled(d.diff_src_desc())},
                                   {DNNL_ARG_WEIGHTS, filled(d.weights_desc())},
                                   {DNNL_ARG_DIFF_DST, filled(d.diff_dst_desc())}});
    const double tw = time_ms(gp, {{DNNL_ARG_SRC, filled(g.src_desc())},
                                   {DNNL_ARG_DIFF_WEIGHTS, filled(g.diff_weights_desc())},
                                   {DNNL_ARG_DIFF_DST, filled(g.diff_dst_desc())}});
    const double gflop = 2.0 * sh.N * sh.C * sh.Co * Ho * Ho * sh.k * sh.k / 1e9;
    std::printf("%-8s %-7s b%d %4d->%-4d %3d->%-3d k%d s%d  fwd %6.2f ms (%3.0f GF/s)  in-grad %6.2f (%3.0f)  w-grad %6.2f "
                "(%3.0f)  [%s]\n",
                name, act == tag::nhwc ? "nhwc" : "nChw16c", sh.N, sh.C, sh.Co, sh.H, Ho, sh.k, sh.s, tf,
                gflop / tf * 1e3, td, gflop / td * 1e3, tw, gflop / tw * 1e3, g.impl_info_str());
    if (act == tag::nhwc)
      std::printf("%-8s copies  nhwc -> nChw16c: input %.2f ms, output %.2f ms\n", "", copy_ms(src), copy_ms(dst));
  } catch (const dnnl::error& e) {
    std::printf("%-8s b%d %4d->%-4d %3dx%-3d k%d s%d  not available: %s\n", name, sh.N, sh.C, sh.Co, sh.H, sh.H, sh.k,
                sh.s, e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: onednn_conv_shapes [--threads N]\n");
      return 2;
    }
  }
  omp_set_num_threads(threads);
  std::printf("oneDNN F32 convolutions, %d threads (mean of >= 5 runs and 0.3 s); [the weight gradient's kernel]\n",
              threads);
  const Shape shapes[] = {
      // ResNet-50, batch 8: the 3x3 convolutions of each stage, stride 1 and the stride-2 first ones
      {8, 64, 64, 56, 3, 1}, {8, 128, 128, 28, 3, 1}, {8, 256, 256, 14, 3, 1}, {8, 512, 512, 7, 3, 1},
      {8, 128, 128, 56, 3, 2}, {8, 256, 256, 28, 3, 2}, {8, 512, 512, 14, 3, 2},
      // YOLOv8n at 640, batch 2: the C2f bottlenecks' 3x3 (stride 1), the downsampling 3x3 (stride 2), the head's
      {2, 16, 16, 160, 3, 1}, {2, 32, 32, 80, 3, 1}, {2, 64, 64, 40, 3, 1}, {2, 128, 128, 20, 3, 1},
      {2, 16, 32, 320, 3, 2}, {2, 32, 64, 160, 3, 2}, {2, 64, 128, 80, 3, 2}, {2, 128, 256, 40, 3, 2},
      {2, 64, 64, 80, 3, 2}, {2, 128, 128, 40, 3, 2}, {2, 64, 64, 80, 3, 1}, {2, 80, 80, 80, 3, 1}};
  for (const Shape& s : shapes) {
    run(s, algorithm::convolution_direct, tag::nhwc);
    run(s, algorithm::convolution_direct, tag::nChw16c);
    if (s.k == 3 && s.s == 1) run(s, algorithm::convolution_winograd, tag::nChw16c);
  }
  return 0;
}
