// Profiler overhead on a training step of the small CNN (batch 128, AdamW, synthetic input), measured in
// one run with three variants interleaved round by round (so machine noise hits all three alike):
//   plain      the step with no profiler ranges at all
//   off        the same step with the trainer's ranges (step, data, forward, backward, optimizer, sync),
//              no session: each range is one relaxed atomic load and a branch
//   on         the instrumented step inside a recording session (every op dispatch is a range too)
// Prints median and minimum step times and the overheads; also the cost of one range off / on. Never pass/fail.
// Usage: profiler_overhead [--steps N] [--rounds N] [--batch N] [--threads N]  (rounds x steps steps each)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ampforge/ampforge.h"
#include "ampforge/profiler/profiler.h"
#include "ampforge/util/timer.h"

namespace af = ampforge;
namespace prof = ampforge::profiler;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5, rounds = 4, threads = af::get_num_threads();
  int64_t batch = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: profiler_overhead [--steps N] [--rounds N] [--batch N] [--threads N]\n"
                           "(CPU only: the profiler's cost on CPU training steps)\n");
      return 2;
    }
  }
  af::set_num_threads(threads);
  af::manual_seed(0);
  auto model = af::models::small_cnn();
  af::optim::AdamW opt(model->parameters(), {});
  af::Tensor x = af::randn({batch, 1, 28, 28}).contiguous(af::MemoryFormat::ChannelsLast);
  af::Tensor y = af::Tensor::from_vector<int64_t>([&] {
    std::vector<int64_t> v(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) v[static_cast<size_t>(i)] = (i * 7) % 10;
    return v;
  }());

  double sink = 0;
  auto plain_step = [&] {
    opt.zero_grad();
    af::Tensor loss = af::cross_entropy((*model)(x), y);
    sink += loss.item();
    loss.backward();
    opt.step();
  };
  auto instrumented_step = [&] {  // the ranges the trainer adds, in the same places
    prof::Range step("step", prof::RangeKind::Step);
    { prof::Range data("data", prof::RangeKind::DataWait); }
    {
      prof::Range o("optimizer", prof::RangeKind::Phase);
      opt.zero_grad();
    }
    af::Tensor loss;
    {
      prof::Range f("forward", prof::RangeKind::Phase);
      loss = af::cross_entropy((*model)(x), y);
    }
    {
      prof::Range s("loss.item", prof::RangeKind::Sync);
      sink += loss.item();
    }
    {
      prof::Range b("backward", prof::RangeKind::Phase);
      loss.backward();
    }
    prof::Range o("optimizer", prof::RangeKind::Phase);
    opt.step();
  };
  auto timed = [&](auto&& fn, std::vector<double>& out) {
    const int64_t t = af::now_ns();
    fn();
    out.push_back(static_cast<double>(af::now_ns() - t) * 1e-6);
  };

  for (int i = 0; i < 3; ++i) plain_step();  // warm-up: allocations, thread pool, caches
  // Variants alternate step by step, so load from other processes and thermal drift hit all three alike.
  std::vector<double> plain, off, on;
  size_t ranges = 0;
  {
    prof::Session session(prof::SessionOptions{.device = false});
    for (int i = 0; i < rounds * steps; ++i) {
      timed(plain_step, plain);
      timed(instrumented_step, off);
      session.start();
      timed(instrumented_step, on);
      session.pause();
    }
    ranges = session.stop().ranges.size();
  }

  // Cost of one range: a tight loop with no session, then with one recording.
  constexpr int kOff = 10'000'000, kOn = 200'000;
  int64_t t = af::now_ns();
  for (int i = 0; i < kOff; ++i) {
    prof::Range rr("off");
  }
  const double ns_off = static_cast<double>(af::now_ns() - t) / kOff;
  double ns_on = 0;
  {
    prof::Session s2(prof::SessionOptions{.device = false});
    s2.start();
    t = af::now_ns();
    for (int i = 0; i < kOn; ++i) {
      prof::Range rr("on");
    }
    ns_on = static_cast<double>(af::now_ns() - t) / kOn;
    s2.stop();
  }

  const double mp = median(plain), moff = median(off), mon = median(on);
  const double np = *std::min_element(plain.begin(), plain.end()), noff = *std::min_element(off.begin(), off.end()),
               non = *std::min_element(on.begin(), on.end());
  const double per_step = static_cast<double>(ranges) / static_cast<double>(rounds * steps);
  std::printf("profiler overhead: small CNN, batch %lld, AdamW, %d threads, %d steps per variant (alternating)\n",
              static_cast<long long>(batch), threads, rounds * steps);
  std::printf("  %-34s %10s %10s\n", "", "median ms", "min ms");
  std::printf("  %-34s %10.3f %10.3f\n", "plain (no ranges)", mp, np);
  std::printf("  %-34s %10.3f %10.3f   off vs plain: %+.2f%% (median) %+.2f%% (min)\n",
              "profiling off (ranges, no session)", moff, noff, 100.0 * (moff - mp) / mp, 100.0 * (noff - np) / np);
  std::printf("  %-34s %10.3f %10.3f   on vs off:    %+.2f%% (median) %+.2f%% (min)\n",
              "profiling on (session recording)", mon, non, 100.0 * (mon - moff) / moff, 100.0 * (non - noff) / noff);
  std::printf("  ranges recorded per step: %.0f; one range costs %.2f ns off, %.1f ns on\n", per_step, ns_off, ns_on);
  std::printf("  predicted on-overhead from range cost: %.4f%% of a step\n", 100.0 * per_step * ns_on * 1e-6 / moff);
  return sink == 12345.678 ? 1 : 0;  // keeps the loss reads alive
}
