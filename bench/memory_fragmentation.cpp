// The fragmentation table: synthetic traces that fragment caching allocators (memory/synthetic.h),
// replayed on a simulated device under each policy. Prints peak live (the ideal), peak reserved and
// their ratio for naive / pytorch / ampforge, plus provider calls (the cost naive pays for its ratio).
//
//   memory_fragmentation [--scale S] [--steps N] [--seeds A-B] [--write-traces DIR] [TRACE...]
// TRACE files (ampforge-memtrace v1, e.g. recorded from a training run) are added to the table.
// --write-traces writes the generated traces (how tests/data/memtrace/ was made, with --scale 0.05).
// --seeds A-B: instead of the table, each synthetic trace with seeds A to B under the ampforge policy: the ratio per
// seed, mean, max and how many exceed 1.05 (the sweep docs/MEMORY.md, "Random mixes and the 1.05 bound", quotes).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ampforge/memory/stats.h"
#include "ampforge/memory/synthetic.h"
#include "ampforge/memory/trace.h"
#include "ampforge/util/error.h"
#include "ampforge/util/timer.h"

using namespace ampforge;
using namespace ampforge::memory;

int main(int argc, char** argv) {
  SyntheticOptions opt;
  std::string write_dir;
  std::vector<std::string> files;
  int seed_first = 0, seed_last = -1;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        AF_CHECK(i + 1 < argc, "{} needs a value", a);
        return argv[++i];
      };
      if (a == "--scale") opt.scale = std::stod(value());
      else if (a == "--steps") opt.steps = std::stoi(value());
      else if (a == "--write-traces") write_dir = value();
      else if (a == "--seeds") {
        const std::string v = value();
        const size_t dash = v.find('-');
        AF_CHECK(dash != std::string::npos && dash > 0, "--seeds: expected A-B (e.g. 1-8), got '{}'", v);
        seed_first = std::stoi(v.substr(0, dash));
        seed_last = std::stoi(v.substr(dash + 1));
        AF_CHECK(seed_first >= 1 && seed_last >= seed_first, "--seeds: expected 1 <= A <= B, got '{}'", v);
      } else if (a == "--help" || a == "-h") {
        std::printf("usage: memory_fragmentation [--scale S] [--steps N] [--seeds A-B] [--write-traces DIR] [TRACE...]\n");
        return 0;
      } else files.push_back(a);
    }
    if (seed_last >= seed_first) {
      std::printf("ampforge policy, scale %g, seeds %d-%d: peak reserved / peak live\n", opt.scale, seed_first, seed_last);
      std::printf("%-11s %7s %7s %7s %11s  %s\n", "trace", "mean", "max", ">1.05", "prov.calls", "per seed");
      for (const std::string& name : synthetic_trace_names()) {
        double sum = 0, max = 0;
        int over = 0;
        long long calls = 0;
        std::string per;
        for (int seed = seed_first; seed <= seed_last; ++seed) {
          SyntheticOptions o = opt;
          o.seed = static_cast<uint64_t>(seed);
          const ReplayResult r = trace_replay(synthetic_trace(name, o), PolicyConfig::ampforge());
          sum += r.ratio;
          max = std::max(max, r.ratio);
          over += r.ratio > 1.05;
          calls += r.stats.provider_calls;
          char cell[16];
          std::snprintf(cell, sizeof cell, " %.3f", r.ratio);
          per += cell;
        }
        const int n = seed_last - seed_first + 1;
        std::printf("%-11s %7.3f %7.3f %4d/%-2d %11lld %s\n", name.c_str(), sum / n, max, over, n, calls, per.c_str());
      }
      return 0;
    }
    std::vector<Trace> traces;
    for (const std::string& name : synthetic_trace_names()) {
      traces.push_back(synthetic_trace(name, opt));
      if (!write_dir.empty()) {
        const std::string path = write_dir + "/" + name + ".txt";
        trace_write_file(traces.back(), path,
                         "synthetic trace '" + name + "' from bench/memory_fragmentation (scale " +
                             std::to_string(opt.scale) + ", steps " + std::to_string(opt.steps) + ")");
        std::printf("wrote %s\n", path.c_str());
      }
    }
    for (const std::string& f : files) traces.push_back(trace_read(f));

    std::printf("%-34s %-9s %12s %14s %8s %10s %9s %9s\n", "trace", "policy", "peak live", "peak reserved",
                "ratio", "prov.calls", "frag@peak", "replay ms");
    for (const Trace& t : traces) {
      for (const char* p : {"naive", "pytorch", "ampforge"}) {
        Stopwatch sw;
        const ReplayResult r = trace_replay(t, PolicyConfig::by_name(p));
        const double ms = sw.seconds() * 1e3;
        std::string name = t.source;
        if (name.size() > 34) name = "..." + name.substr(name.size() - 31);
        std::printf("%-34s %-9s %12s %14s %8.3f %10lld %9.3f %9.1f\n", name.c_str(), p,
                    format_bytes(r.peak_live).c_str(), format_bytes(r.peak_reserved).c_str(), r.ratio,
                    static_cast<long long>(r.stats.provider_calls), r.stats.fragmentation_at_peak, ms);
      }
    }
    std::printf("ratio = peak reserved / peak live (1.000 is ideal); ampforge target <= 1.05\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memory_fragmentation: %s\n", e.what());
    return 2;
  }
  return 0;
}
