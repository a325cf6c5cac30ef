// oneDNN's F32 convolution kernels alone, per shape: direct on nhwc activations (what ampforge hands oneDNN)
// against Winograd on nChw16c, forward / input gradient / weight gradient, in ms and GFLOP/s (direct-
// convolution FLOPs), with the implementation oneDNN picked. The measurements behind the Winograd rule of
// backends/cpu/conv_onednn.cpp (docs/PERFORMANCE.md). Activation layout copies are not included.
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

// One 3x3 stride-1 pad-1 shape with one algorithm and activation layout.
void run(int N, int C, int H, algorithm alg, tag act) {
  const memory::dims src{N, C, H, H}, wei{C, C, 3, 3}, st{1, 1}, pad{1, 1};
  const auto dt = memory::data_type::f32;
  const memory::desc x(src, dt, act), y(src, dt, act), w(wei, dt, tag::any);
  try {
    const convolution_forward::primitive_desc f(
        convolution_forward::desc(prop_kind::forward_training, alg, x, w, memory::desc(), y, st, pad, pad), eng());
    const convolution_backward_data::primitive_desc d(convolution_backward_data::desc(alg, x, w, y, st, pad, pad),
                                                      eng(), f);
    const convolution_backward_weights::primitive_desc g(
        convolution_backward_weights::desc(alg, x, w, memory::desc(), y, st, pad, pad), eng(), f);
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
    const double gflop = 2.0 * N * C * H * H * C * 9 / 1e9;
    std::printf("%-8s %-7s b%d c%4d %3dx%-3d  fwd %6.2f ms (%3.0f GF/s)  in-grad %6.2f (%3.0f)  w-grad %6.2f (%3.0f)  [%s]\n",
                alg == algorithm::convolution_winograd ? "winograd" : "direct", act == tag::nhwc ? "nhwc" : "nChw16c",
                N, C, H, H, tf, gflop / tf * 1e3, td, gflop / td * 1e3, tw, gflop / tw * 1e3, f.impl_info_str());
  } catch (const dnnl::error& e) {
    std::printf("%-8s b%d c%4d %3dx%-3d  not available: %s\n",
                alg == algorithm::convolution_winograd ? "winograd" : "direct", N, C, H, H, e.what());
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
  std::printf("oneDNN F32 3x3 stride-1 convolutions, %d threads (mean of >= 5 runs and 0.3 s)\n", threads);
  const int shapes[][3] = {{8, 64, 56}, {8, 128, 28}, {8, 256, 14}, {8, 512, 7},  // ResNet-50, batch 8
                           {2, 16, 320}, {2, 32, 160}, {2, 64, 80}, {2, 128, 40}, {2, 256, 20}};  // YOLOv8n, batch 2
  for (const auto& s : shapes) {
    run(s[0], s[1], s[2], algorithm::convolution_direct, tag::nhwc);
    run(s[0], s[1], s[2], algorithm::convolution_winograd, tag::nChw16c);
  }
  return 0;
}
