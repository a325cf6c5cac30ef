// Training throughput of the small Fashion-MNIST CNN (batch 128, AdamW), ampforge vs PyTorch measured in
// the same run with the same thread count, in FP32 and mixed precision (BF16, FP16). Prints samples/s and
// ratios; never pass/fail. Usage: train_bench [--threads N] [--steps N] [--batch N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ampforge/ampforge.h"
#include "ampforge/util/timer.h"
#include "peer.h"

namespace af = ampforge;

namespace {

double ampforge_samples_per_sec(af::DType precision, int steps, int64_t batch) {
  af::manual_seed(0);
  auto model = af::models::small_cnn();
  af::optim::AdamW opt(model->parameters(), {});
  af::amp::GradScalerOptions so;
  so.enabled = precision == af::DType::F16;
  af::amp::GradScaler scaler(so);
  af::Tensor x = af::randn({batch, 1, 28, 28}).contiguous(af::MemoryFormat::ChannelsLast);
  af::Tensor y = af::Tensor::from_vector<int64_t>([&] {
    std::vector<int64_t> v(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) v[i] = (i * 7) % 10;
    return v;
  }());
  auto step = [&] {
    opt.zero_grad();
    af::Tensor loss;
    {
      af::amp::Autocast ac(af::kCPU, precision == af::DType::F32 ? af::DType::BF16 : precision, precision != af::DType::F32);
      loss = af::cross_entropy((*model)(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  for (int i = 0; i < 3; ++i) step();
  af::Stopwatch sw;
  for (int i = 0; i < steps; ++i) step();
  return static_cast<double>(steps * batch) / sw.seconds();
}

}  // namespace

int main(int argc, char** argv) {
  int threads = af::get_num_threads(), steps = 20;
  int64_t batch = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: train_bench [--threads N] [--steps N] [--batch N]   (CPU only; GPUs: ampforge bench --device cuda)\n");
      return 2;
    }
  }
  af::set_num_threads(threads);
  std::printf("small CNN training on the CPU, batch %lld, AdamW, %d threads, %d timed steps (CPU only: GPUs are measured "
              "by `ampforge bench --device cuda`)\n",
              static_cast<long long>(batch), threads, steps);
  std::printf("%-10s %18s %18s %10s\n", "precision", "ampforge samples/s", "PyTorch samples/s", "ratio");
  double af32 = 0;
  for (const char* p : {"fp32", "bf16", "fp16"}) {
    const af::DType dt = af::dtype_from_string(p);
    const double ours = ampforge_samples_per_sec(dt, steps, batch);
    if (dt == af::DType::F32) af32 = ours;
    auto peer = af::bench::run_peer(std::string("train --threads ") + std::to_string(threads) + " --precision " + p +
                                    " --steps " + std::to_string(std::max(steps / 2, 5)) + " --batch " + std::to_string(batch));
    if (peer && peer->contains("samples_per_sec")) {
      const double theirs = (*peer)["samples_per_sec"].get<double>();
      std::printf("%-10s %18.1f %18.1f %9.2fx\n", p, ours, theirs, ours / theirs);
    } else {
      std::string why = peer && peer->contains("error") ? (*peer)["error"].get<std::string>() : "peer not available";
      std::printf("%-10s %18.1f %18s %10s   (%s)\n", p, ours, "-", "-", why.substr(0, 60).c_str());
    }
    if (dt != af::DType::F32) std::printf("%-10s ampforge %s / its own fp32: %.2fx\n", "", p, ours / af32);
  }
  return 0;
}
