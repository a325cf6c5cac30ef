// The profile report: a pure function of ProfileData. Every metric is defined in docs/PROFILER.md; the
// short versions are here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ampforge/profiler/profile_data.h"

namespace ampforge::profiler {

// One row of the op or kernel table. Times in ns.
struct TimeStat {
  std::string name;
  int64_t calls = 0;
  int64_t total_ns = 0;  // inclusive durations summed
  int64_t self_ns = 0;   // ops: total minus the time of ranges nested inside them (same thread)
  int64_t min_ns = 0, max_ns = 0;
  double percent = 0;      // ops: self / wall; kernels: total / device time
  int64_t device_ns = 0;   // ops: device time of the kernels and memory operations the op launched
  std::string op;          // kernels: the op that launched most of its calls ("" when unknown)
  double mean_ns() const { return calls > 0 ? static_cast<double>(total_ns) / static_cast<double>(calls) : 0.0; }
};

struct MemoryOpStat {
  std::string kind;  // HtoD | DtoH | DtoD | HtoH | PtoP | unknown | memset
  int64_t count = 0, total_ns = 0, bytes = 0;
  double bandwidth_gbps = 0;  // bytes / total_ns (GB/s, 1e9 bytes)
  double percent = 0;         // total / device time
};

struct StepSplit {
  int64_t steps = 0;
  int64_t step_ns = 0;  // sum of the step ranges
  int64_t data_ns = 0, forward_ns = 0, backward_ns = 0, optimizer_ns = 0;
  int64_t other_ns = 0;   // step time in none of the four
  double coverage = 0;    // (data + forward + backward + optimizer) / step_ns
};

struct Report {
  int64_t wall_ns = 0;  // length of the profiled windows
  int64_t op_calls = 0, op_self_ns = 0;
  std::vector<TimeStat> ops;      // by self time, descending
  StepSplit step;
  // Device (only when device_observed).
  bool device_observed = false;
  std::string device_note;
  int64_t device_ns = 0;          // "device time": sum of kernel + memcpy + memset durations
  int64_t busy_ns = 0;            // union of device activity intervals inside the windows
  double utilisation = 0;         // busy / wall
  int64_t idle_ns = 0;            // wall - busy
  int64_t idle_data_ns = 0;       // idle while a thread waited on the data loader
  int64_t idle_sync_ns = 0;       // idle while a thread was in a synchronisation (and not waiting on data)
  int64_t idle_launch_ns = 0;     // the rest: waiting on the host to launch work (launch-bound)
  int64_t overlap_ns = 0;         // busy time during which launched work was queued behind the running work
  double overlap = 0;             // overlap / busy
  std::vector<TimeStat> kernels;  // by total, descending
  std::vector<MemoryOpStat> memory_ops;
  MemorySummary memory;
};

Report compute_report(const ProfileData& data);
// Human tables; `top` rows per table (0: all).
std::string format_report(const Report& r, size_t top = 15);
nlohmann::json report_to_json(const Report& r, size_t top = 0);

// ---- interval arithmetic used by the report (exposed for tests). Intervals are half-open [begin, end).
using Interval = std::pair<int64_t, int64_t>;
// Sorted, disjoint, non-empty intervals covering the same points.
std::vector<Interval> interval_union(std::vector<Interval> v);
// Both arguments must be normalised (interval_union's output).
std::vector<Interval> interval_intersect(const std::vector<Interval>& a, const std::vector<Interval>& b);
std::vector<Interval> interval_subtract(const std::vector<Interval>& a, const std::vector<Interval>& b);
int64_t interval_length(const std::vector<Interval>& v);

}  // namespace ampforge::profiler
