// Micro-benchmarks of single ops against PyTorch in the same run with the same thread count: GEMM,
// conv2d forward and forward+backward (the small CNN's second conv, and a ResNet-style 3x3 conv),
// batch norm + ReLU/SiLU forward+backward, elementwise ops and a reduction. Prints times and ratios (PyTorch time / ampforge time: > 1 means
// ampforge is faster); never pass/fail. Usage: ops_bench [--threads N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>

#include "ampforge/ampforge.h"
#include "ampforge/memory/global.h"
#include "ampforge/util/timer.h"
#include "ampforge/ops/ops.h"
#include "peer.h"

namespace af = ampforge;

namespace {
double timeit(const std::function<void()>& fn, double min_time = 0.5, int min_reps = 3) {
  fn();
  int reps = 0;
  af::Stopwatch sw;
  for (;;) {
    fn();
    ++reps;
    if (reps >= min_reps && sw.seconds() >= min_time) return sw.seconds() / reps;
  }
}
}  // namespace

int main(int argc, char** argv) {
  int threads = af::get_num_threads();
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: ops_bench [--threads N]   (CPU only; GPUs: ampforge bench --device cuda)\n");
      return 2;
    }
  }
  af::set_num_threads(threads);
  af::manual_seed(0);
  // As `ampforge train` runs: tensors come from the host caching allocator, so an op's output reuses the
  // block the previous iteration freed (still in cache), as PyTorch's CPU allocator gets from malloc.
  af::memory::install_host_caching_allocator();
  std::map<std::string, double> ours;
  for (int64_t n : {256, 512, 1024}) {
    af::Tensor a = af::randn({n, n}), b = af::randn({n, n});
    ours["gemm_" + std::to_string(n)] = timeit([&] { af::ops::matmul(a, b); });
  }
  struct ConvCase {
    const char* name;
    int64_t N, C, H, W, K;
  };
  // conv_yolo80: YOLOv8n's 80-channel head convolutions at 80x80 (batch 2), on Winograd with nChw16c copies.
  for (ConvCase c : {ConvCase{"conv_cnn2", 128, 32, 14, 14, 64}, ConvCase{"conv_resnet", 16, 64, 28, 28, 64},
                     ConvCase{"conv_yolo80", 2, 80, 80, 80, 80}}) {
    // ampforge runs its natural layout (channels-last); PyTorch its default (NCHW).
    af::Tensor x = af::randn({c.N, c.C, c.H, c.W}).contiguous(af::MemoryFormat::ChannelsLast).requires_grad_();
    af::Tensor w = af::randn({c.K, c.C, 3, 3}).requires_grad_();
    af::Conv2dAttrs at;
    at.padding[0] = at.padding[1] = 1;
    {
      af::autograd::NoGradGuard ng;
      ours[std::string(c.name) + "_fwd"] = timeit([&] { af::conv2d(x, w, af::Tensor(), at); });
    }
    ours[std::string(c.name) + "_fwdbwd"] = timeit([&] {
      af::Tensor y = af::conv2d(x, w, af::Tensor(), at);
      af::autograd::grad({y}, {x, w}, {af::ops::ones_like(y)});
    });
  }
  // Batch norm + activation, forward and backward, channels-last, as conv blocks run it: ResNet-50's layer1
  // (ReLU) and YOLOv8n's second stage at 640 (SiLU). "_pair" is ampforge's two separate ops, for reference.
  struct BnActCase {
    const char* name;
    int64_t N, C, H, W;
    af::NormAct act;
  };
  for (BnActCase c : {BnActCase{"bn_relu", 8, 64, 56, 56, af::NormAct::ReLU},
                      BnActCase{"bn_silu", 2, 32, 160, 160, af::NormAct::SiLU}}) {
    af::Tensor x = af::randn({c.N, c.C, c.H, c.W}).contiguous(af::MemoryFormat::ChannelsLast).requires_grad_();
    af::Tensor w = af::ones({c.C}).requires_grad_(), b = af::zeros({c.C}).requires_grad_();
    af::Tensor g = af::randn({c.N, c.C, c.H, c.W}).contiguous(af::MemoryFormat::ChannelsLast);
    for (bool fused : {true, false})
      ours[std::string(c.name) + (fused ? "_fwdbwd" : "_pair_fwdbwd")] = timeit([&] {
        af::Tensor y = fused ? af::batch_norm_act(x, w, b, af::Tensor(), af::Tensor(), true, 0.1, 1e-5, c.act)
                             : af::batch_norm(x, w, b, af::Tensor(), af::Tensor(), true, 0.1, 1e-5);
        if (!fused) y = c.act == af::NormAct::ReLU ? af::relu(y) : af::silu(y);
        af::autograd::grad({y}, {x, w, b}, {g});
      });
  }
  {  // ResNet-50 layer1's block end: relu(bn3(x) + identity), fused and as three ops
    const int64_t N = 8, C = 256, H = 56, W = 56;
    af::Tensor x = af::randn({N, C, H, W}).contiguous(af::MemoryFormat::ChannelsLast).requires_grad_();
    af::Tensor r = af::randn({N, C, H, W}).contiguous(af::MemoryFormat::ChannelsLast).requires_grad_();
    af::Tensor w = af::ones({C}).requires_grad_(), b = af::zeros({C}).requires_grad_();
    af::Tensor g = af::randn({N, C, H, W}).contiguous(af::MemoryFormat::ChannelsLast);
    for (bool fused : {true, false})
      ours[fused ? "bn_add_relu_fwdbwd" : "bn_add_relu_ops_fwdbwd"] = timeit([&] {
        af::Tensor y = fused ? af::batch_norm_add_act(x, r, w, b, af::Tensor(), af::Tensor(), true, 0.1, 1e-5,
                                                      af::NormAct::ReLU)
                             : af::relu(af::add(af::batch_norm(x, w, b, af::Tensor(), af::Tensor(), true, 0.1, 1e-5), r));
        af::autograd::grad({y}, {x, r, w, b}, {g});
      });
  }
  const int64_t n = 1 << 22;
  af::Tensor x = af::randn({n}), y = af::randn({n});
  ours["add_4M"] = timeit([&] { af::ops::add(x, y); });
  ours["mul_4M"] = timeit([&] { af::ops::mul(x, y); });
  ours["relu_4M"] = timeit([&] { af::ops::unary(af::OpId::relu, x); });
  ours["gelu_4M"] = timeit([&] { af::ops::gelu(x, af::GeluApprox::None); });
  ours["sum_4M"] = timeit([&] { af::ops::sum(x); });

  auto peer = af::bench::run_peer("ops --threads " + std::to_string(threads));
  std::printf("ops on the CPU, %d threads (ratio = PyTorch time / ampforge time; > 1: ampforge faster); %s\n", threads,
              "CPU only: GPUs are measured by `ampforge bench --device cuda`");
  std::printf("%-20s %14s %14s %8s\n", "op", "ampforge ms", "PyTorch ms", "ratio");
  for (auto& [name, t] : ours) {
    if (peer && (*peer)["seconds"].contains(name)) {
      const double p = (*peer)["seconds"][name].get<double>();
      std::printf("%-20s %14.3f %14.3f %7.2fx\n", name.c_str(), t * 1e3, p * 1e3, p / t);
    } else {
      std::printf("%-20s %14.3f %14s %8s\n", name.c_str(), t * 1e3, "-", "-");
    }
  }
  return 0;
}
