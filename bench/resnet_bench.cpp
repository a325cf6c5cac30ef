// ResNet-50 training step on the CPU (issue 13, acceptance 5): ampforge vs PyTorch 1.13 + torchvision measured
// in the same run with the same thread count (bench/peer/torch_resnet_peer.py), fp32 and bf16 autocast.
//
// The step: zero_grad, forward (under amp::Autocast(BF16) for bf16), cross-entropy, backward, optimizer step
// (SGD momentum 0.9 or AdamW, lr 1e-3), written with the plain library API (Autocast, GradScaler, optimizer),
// batch 8 of 3x224x224 synthetic images (fixed random input, channels-last as ampforge's data loader
// delivers it; PyTorch gets its faster of NCHW and channels_last), warm-up steps not timed, then the median
// and mean of N timed steps, and the median process CPU time per step (all threads; on a machine shared with
// other jobs the wall time inflates, the CPU time much less). "fp32" is true F32 on both sides (no TF32 on a
// CPU). One profiled step (our profiler: op self times, the forward/backward/optimizer split) shows where the
// time goes.
// Never pass/fail. Usage: resnet_bench [--threads N] [--steps N] [--warmup N] [--batch N] [--size N]
//                                      [--optimizer sgd|adamw] [--precision fp32,bf16] [--rounds N] [--no-peer]
//                                      [--profile]
// --rounds N: N rounds of (ampforge, PyTorch) per precision, one row each, then the median of their ratios: on a
// machine whose speed drifts within minutes (a shared VM), alternating the two and taking the median of the
// per-round ratios says more than one pair of measurements.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "ampforge/ampforge.h"
#include "ampforge/memory/global.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/profiler/profiler.h"
#include "ampforge/profiler/report.h"
#include "ampforge/util/timer.h"
#include "peer.h"


namespace af = ampforge;

namespace {

struct Args {
  int threads = af::get_num_threads(), steps = 5, warmup = 2;
  int64_t batch = 8, size = 224;
  std::string optimizer = "sgd";
  std::vector<std::string> precisions = {"fp32", "bf16"};
  bool peer = true, profile = false;
  int rounds = 1;
};

struct Timing {
  std::vector<double> seconds;
  double median = 0, mean = 0;
  double cpu_median = 0;  // process CPU seconds per step (all threads): less sensitive to a busy machine
};

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median_of(std::vector<double> s) {
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

Timing summarise(std::vector<double> s, const std::vector<double>& cpu) {
  Timing t;
  t.seconds = s;
  t.cpu_median = median_of(cpu);
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  t.median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  t.mean = std::accumulate(s.begin(), s.end(), 0.0) / static_cast<double>(n);
  return t;
}

Timing ampforge_step_times(const Args& a, af::DType precision, bool profile) {
  af::manual_seed(0);
  auto model = af::models::resnet50();
  model->train();
  std::unique_ptr<af::optim::Optimizer> opt;
  if (a.optimizer == "sgd") {
    af::optim::SGDOptions so;
    so.lr = 1e-3;
    so.momentum = 0.9;
    opt = std::make_unique<af::optim::SGD>(model->parameters(), so);
  } else {
    af::optim::AdamWOptions ao;
    ao.lr = 1e-3;
    opt = std::make_unique<af::optim::AdamW>(model->parameters(), ao);
  }
  af::amp::GradScalerOptions gso;
  gso.enabled = precision == af::DType::F16;  // BF16 has F32's range: no loss scaling (PyTorch's recipes too)
  af::amp::GradScaler scaler(gso);
  // (N, 3, S, S) channels-last, as the data loader delivers images; labels in [0, 1000).
  af::Tensor x = af::randn({a.batch, 3, a.size, a.size}).contiguous(af::MemoryFormat::ChannelsLast);
  std::vector<int64_t> labels(static_cast<size_t>(a.batch));
  for (int64_t i = 0; i < a.batch; ++i) labels[static_cast<size_t>(i)] = (i * 379) % 1000;
  const af::Tensor y = af::Tensor::from_vector(labels);
  const bool autocast = precision != af::DType::F32;
  namespace prof = af::profiler;
  auto step = [&] {
    AF_PROFILE_RANGE_KIND("step", Step);
    opt->zero_grad();
    af::Tensor loss;
    {
      AF_PROFILE_RANGE_KIND("forward", Phase);
      af::amp::Autocast ac(af::kCPU, autocast ? precision : af::DType::BF16, autocast);
      loss = af::cross_entropy((*model)(x), y);
    }
    {
      AF_PROFILE_RANGE_KIND("backward", Phase);
      scaler.scale(loss).backward();
    }
    AF_PROFILE_RANGE_KIND("optimizer", Phase);
    scaler.step(*opt);
    scaler.update();
  };
  for (int i = 0; i < a.warmup; ++i) step();
  std::vector<double> s, cpu;
  for (int i = 0; i < a.steps; ++i) {
    const double c0 = process_cpu_seconds();
    af::Stopwatch sw;
    step();
    s.push_back(sw.seconds());
    cpu.push_back(process_cpu_seconds() - c0);
  }
  if (profile) {
    prof::Session session(prof::SessionOptions{.device = false});
    session.start();
    step();
    const prof::Report r = prof::compute_report(session.stop());
    const auto& st = r.step;
    const double ms = 1e-6;
    std::printf("\n  one profiled %s step: %.0f ms = forward %.0f + backward %.0f + optimizer %.0f + other %.0f ms\n",
                std::string(af::dtype_name(precision)).c_str(), st.step_ns * ms, st.forward_ns * ms,
                st.backward_ns * ms, st.optimizer_ns * ms, st.other_ns * ms);
    std::printf("  %-28s %7s %10s %7s\n", "op (self time)", "calls", "ms", "share");
    for (size_t i = 0; i < std::min<size_t>(r.ops.size(), 12); ++i)
      std::printf("  %-28s %7lld %10.1f %6.1f%%\n", r.ops[i].name.c_str(), static_cast<long long>(r.ops[i].calls),
                  r.ops[i].self_ns * ms, r.ops[i].percent);
    std::printf("\n");
  }
  return summarise(s, cpu);
}

std::string join(const std::vector<double>& v) {
  std::string s;
  for (double x : v) {
    if (!s.empty()) s += ' ';
    s += fmt::format("{:.2f}", x);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  auto usage = [] {
    std::fprintf(stderr, "usage: resnet_bench [--threads N] [--steps N] [--warmup N] [--batch N] [--size N] "
                         "[--optimizer sgd|adamw] [--precision fp32,bf16,fp16] [--rounds N] [--no-peer] [--profile]\n"
                         "CPU only; GPUs: ampforge bench --device cuda\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const bool has_value = i + 1 < argc;
    if (f == "--no-peer") a.peer = false;
    else if (f == "--profile") a.profile = true;
    else if (!has_value) return usage();
    else if (f == "--threads") a.threads = std::atoi(argv[++i]);
    else if (f == "--steps") a.steps = std::atoi(argv[++i]);
    else if (f == "--warmup") a.warmup = std::atoi(argv[++i]);
    else if (f == "--rounds") a.rounds = std::atoi(argv[++i]);
    else if (f == "--batch") a.batch = std::atoll(argv[++i]);
    else if (f == "--size") a.size = std::atoll(argv[++i]);
    else if (f == "--optimizer") a.optimizer = argv[++i];
    else if (f == "--precision") {
      a.precisions.clear();
      std::stringstream list(argv[++i]);
      for (std::string p; std::getline(list, p, ',');) a.precisions.push_back(p);
    } else return usage();
  }
  if (a.threads < 1 || a.steps < 1 || a.warmup < 0 || a.batch < 1 || a.size < 32 || a.rounds < 1 ||
      (a.optimizer != "sgd" && a.optimizer != "adamw"))
    return usage();
  af::set_num_threads(a.threads);
  // Tensors from the caching allocator, as `ampforge train` and `ampforge bench` run (a step frees and re-allocates
  // the same sizes: hits instead of page-faulting fresh memory every step).
  af::memory::install_host_caching_allocator();
  std::printf("ResNet-50 training step on the CPU (forward + cross-entropy + backward + %s), batch %lld, %lldx%lld, %d threads, "
              "synthetic data, %d warm-up + %d timed steps (median; mean in brackets)\n",
              a.optimizer.c_str(), static_cast<long long>(a.batch), static_cast<long long>(a.size),
              static_cast<long long>(a.size), a.threads, a.warmup, a.steps);
  std::printf("%-9s %22s %22s %22s %9s\n", "precision", "ampforge s/step", "PyTorch NCHW", "PyTorch channels_last",
              "ratio");
  for (const std::string& p : a.precisions) {
    std::vector<double> ratios;
    for (int round = 0; round < a.rounds; ++round) {
      const af::DType dt = af::dtype_from_string(p);
      const Timing ours = ampforge_step_times(a, dt, a.profile && round == 0);
      std::string cells[2] = {"-", "-"}, ratio = "-", note;
      if (a.peer && p != "fp16") {
        auto peer = af::bench::run_peer(
            fmt::format("--threads {} --precision {} --batch {} --size {} --steps {} --warmup {} --optimizer {}",
                        a.threads, p, a.batch, a.size, a.steps, a.warmup, a.optimizer),
            "torch_resnet_peer.py");
        if (peer && peer->contains("best")) {
          const auto& res = (*peer)["results"];
          const char* fmts[2] = {"nchw", "channels_last"};
          for (int k = 0; k < 2; ++k)
            if (res.contains(fmts[k]))
              cells[k] = fmt::format("{:.3f} [{:.3f}]", res[fmts[k]]["median"].get<double>(),
                                     res[fmts[k]]["mean"].get<double>());
          const double best = res[(*peer)["best"].get<std::string>()]["median"].get<double>();
          ratio = fmt::format("{:.2f}x", best / ours.median);
          ratios.push_back(best / ours.median);
          const auto& b = res[(*peer)["best"].get<std::string>()];
          note = fmt::format("PyTorch {} steps: {} s; CPU {:.2f} s/step (CPU-time ratio {:.2f}x)",
                             (*peer)["best"].get<std::string>(), join(b["seconds"].get<std::vector<double>>()),
                             b["cpu_median"].get<double>(), b["cpu_median"].get<double>() / ours.cpu_median);
        } else {
          note = peer && peer->contains("error") ? (*peer)["error"].get<std::string>() : "peer not available";
        }
      }
      std::printf("%-9s %22s %22s %22s %9s\n", p.c_str(), fmt::format("{:.3f} [{:.3f}]", ours.median, ours.mean).c_str(),
                  cells[0].c_str(), cells[1].c_str(), ratio.c_str());
      std::printf("%-9s ampforge steps: %s s; %.2f images/s; CPU %.2f s/step%s%s\n", "", join(ours.seconds).c_str(),
                  static_cast<double>(a.batch) / ours.median, ours.cpu_median, note.empty() ? "" : "; ", note.c_str());
      std::fflush(stdout);
    }
    if (ratios.size() > 1) {
      std::vector<double> sorted = ratios;
      std::sort(sorted.begin(), sorted.end());
      const size_t n = sorted.size();
      const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
      std::string list;
      for (double r : ratios) list += fmt::format("{}{:.2f}x", list.empty() ? "" : ", ", r);
      std::printf("%-9s %zu rounds: ratios %s; median %.2fx\n", p.c_str(), n, list.c_str(), median);
      std::fflush(stdout);
    }
  }
  std::printf("ratio = PyTorch's best median / ampforge's median (> 1: ampforge is faster)\n");
  return 0;
}
