// BERT masked-LM training step on the CPU (issue 14, acceptance 4): ampforge vs PyTorch 1.13 running the same
// reference model (bench/peer/torch_bert_peer.py, which imports scripts/gen_bert_golden.py's torch.nn
// re-statement of Hugging Face's BertForMaskedLM) in the same run with the same thread count, fp32 and bf16.
//
// The step: zero_grad, forward (under amp::Autocast(BF16) for bf16) in training mode (dropout 0.1, so attention
// takes the composite path with dropout on the probabilities on both sides), masked-LM cross-entropy with the
// head at the masked positions only (--head masked, the default: NVIDIA's recipe) or at every position
// (--head full, Hugging Face's), backward, AdamW lr 1e-4. Batch 4 x 128 synthetic token ids, 15% of positions
// masked (fixed masks; the peer draws its own with the same rate). Warm-up steps are not timed, then the median
// and mean of N timed steps and the median process CPU time per step (less sensitive to a shared machine).
// "fp32" is true F32 on both sides (no TF32 on a CPU). Never pass/fail.
// Usage: bert_bench [--threads N] [--steps N] [--warmup N] [--batch N] [--seq N] [--config base|mini|tiny]
//                   [--head masked|full] [--precision fp32,bf16] [--no-peer]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "ampforge/ampforge.h"
#include "ampforge/memory/global.h"
#include "ampforge/models/bert.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/util/timer.h"
#include "peer.h"

namespace af = ampforge;

namespace {

struct Args {
  int threads = af::get_num_threads(), steps = 5, warmup = 2;
  int64_t batch = 4, seq = 128;
  std::string config = "base", head = "masked";
  std::vector<std::string> precisions = {"fp32", "bf16"};
  bool peer = true;
};

struct Timing {
  std::vector<double> seconds;
  double median = 0, mean = 0, cpu_median = 0;
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

Timing ampforge_step_times(const Args& a, af::DType precision) {
  af::manual_seed(0);
  af::models::BertConfig c = af::models::bert_config("bert-" + a.config);
  c.mlm_masked_positions_only = a.head == "masked";
  auto model = std::make_shared<af::models::BertForMaskedLM>(c);
  model->train();
  af::optim::AdamWOptions ao;
  ao.lr = 1e-4;
  af::optim::AdamW opt(model->parameters(), ao);
  // Synthetic ids in [5, V) framed by [CLS] 101 / [SEP] 102; 15% of the inner positions masked ([MASK] 103).
  const int64_t n = a.batch * a.seq;
  std::vector<int64_t> ids(static_cast<size_t>(n)), labels(static_cast<size_t>(n), -100);
  for (int64_t i = 0; i < n; ++i) {
    const auto w = af::philox4x32(1, static_cast<uint64_t>(i));
    const int64_t t = i % a.seq;
    ids[static_cast<size_t>(i)] = t == 0 ? 101 : t == a.seq - 1 ? 102 : 5 + static_cast<int64_t>(w[0] % (c.vocab_size - 5));
    if (t > 0 && t < a.seq - 1 && w[1] < static_cast<uint32_t>(0.15 * 4294967296.0)) {
      labels[static_cast<size_t>(i)] = ids[static_cast<size_t>(i)];
      ids[static_cast<size_t>(i)] = 103;
    }
  }
  const af::Tensor x = af::Tensor::from_vector(ids, {a.batch, a.seq}), y = af::Tensor::from_vector(labels, {a.batch, a.seq});
  const af::Tensor mask = af::ops::ones({a.batch, a.seq}, af::DType::Bool);
  const bool autocast = precision != af::DType::F32;
  auto step = [&] {
    opt.zero_grad();
    af::Tensor loss;
    {
      af::amp::Autocast ac(af::kCPU, autocast ? precision : af::DType::BF16, autocast);
      loss = model->mlm_loss(x, mask, y);
    }
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < a.warmup; ++i) step();
  Timing t;
  std::vector<double> cpu;
  for (int i = 0; i < a.steps; ++i) {
    const double c0 = process_cpu_seconds();
    af::Stopwatch sw;
    step();
    t.seconds.push_back(sw.seconds());
    cpu.push_back(process_cpu_seconds() - c0);
  }
  t.median = median_of(t.seconds);
  t.mean = std::accumulate(t.seconds.begin(), t.seconds.end(), 0.0) / static_cast<double>(t.seconds.size());
  t.cpu_median = median_of(cpu);
  return t;
}

std::string join(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += fmt::format("{}{:.2f}", s.empty() ? "" : " ", x);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  auto usage = [] {
    std::fprintf(stderr, "usage: bert_bench [--threads N] [--steps N] [--warmup N] [--batch N] [--seq N] "
                         "[--config base|mini|tiny] [--head masked|full] [--precision fp32,bf16] [--no-peer]\n"
                         "CPU only; GPUs: ampforge bench --device cuda\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--no-peer") a.peer = false;
    else if (i + 1 >= argc) return usage();
    else if (f == "--threads") a.threads = std::atoi(argv[++i]);
    else if (f == "--steps") a.steps = std::atoi(argv[++i]);
    else if (f == "--warmup") a.warmup = std::atoi(argv[++i]);
    else if (f == "--batch") a.batch = std::atoll(argv[++i]);
    else if (f == "--seq") a.seq = std::atoll(argv[++i]);
    else if (f == "--config") a.config = argv[++i];
    else if (f == "--head") a.head = argv[++i];
    else if (f == "--precision") {
      a.precisions.clear();
      std::stringstream list(argv[++i]);
      for (std::string p; std::getline(list, p, ',');) a.precisions.push_back(p);
    } else return usage();
  }
  if (a.threads < 1 || a.steps < 1 || a.warmup < 0 || a.batch < 1 || a.seq < 3 || a.seq > 512 ||
      (a.head != "masked" && a.head != "full") || (a.config != "base" && a.config != "mini" && a.config != "tiny"))
    return usage();
  af::set_num_threads(a.threads);
  // Tensors from the caching allocator, as `ampforge train` and `ampforge bench` run (a step frees and re-allocates
  // the same sizes: hits instead of page-faulting fresh memory every step).
  af::memory::install_host_caching_allocator();
  std::printf("BERT-%s masked-LM training step on the CPU (forward + loss + backward + AdamW, dropout 0.1, head at %s), "
              "batch %lld x %lld tokens, %d threads, synthetic ids, %d warm-up + %d timed steps (median; mean)\n",
              a.config.c_str(), a.head == "masked" ? "the masked positions" : "every position",
              static_cast<long long>(a.batch), static_cast<long long>(a.seq), a.threads, a.warmup, a.steps);
  std::printf("%-9s %22s %22s %9s\n", "precision", "ampforge s/step", "PyTorch s/step", "ratio");
  for (const std::string& p : a.precisions) {
    const Timing ours = ampforge_step_times(a, af::dtype_from_string(p));
    std::string cell = "-", ratio = "-", note;
    if (a.peer && p != "fp16") {
      auto peer = af::bench::run_peer(fmt::format("--threads {} --precision {} --config {} --batch {} --seq {} "
                                                  "--steps {} --warmup {} --head {}",
                                                  a.threads, p, a.config, a.batch, a.seq, a.steps, a.warmup, a.head),
                                      "torch_bert_peer.py");
      if (peer && peer->contains("result")) {
        const auto& r = (*peer)["result"];
        cell = fmt::format("{:.3f} [{:.3f}]", r["median"].get<double>(), r["mean"].get<double>());
        ratio = fmt::format("{:.2f}x", r["median"].get<double>() / ours.median);
        note = fmt::format("PyTorch steps: {} s; CPU {:.2f} s/step (CPU-time ratio {:.2f}x)",
                           join(r["seconds"].get<std::vector<double>>()), r["cpu_median"].get<double>(),
                           r["cpu_median"].get<double>() / ours.cpu_median);
      } else {
        note = peer && peer->contains("error") ? (*peer)["error"].get<std::string>() : "peer not available";
      }
    }
    std::printf("%-9s %22s %22s %9s\n", p.c_str(), fmt::format("{:.3f} [{:.3f}]", ours.median, ours.mean).c_str(),
                cell.c_str(), ratio.c_str());
    std::printf("%-9s ampforge steps: %s s; %.1f sequences/s; CPU %.2f s/step%s%s\n", "", join(ours.seconds).c_str(),
                static_cast<double>(a.batch) / ours.median, ours.cpu_median, note.empty() ? "" : "; ", note.c_str());
    std::fflush(stdout);
  }
  std::printf("ratio = PyTorch's median / ampforge's median (> 1: ampforge is faster)\n");
  return 0;
}
