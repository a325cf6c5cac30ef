// Report arithmetic. Definitions: docs/PROFILER.md ("Metrics"). Everything here is a pure function of
// ProfileData, pinned by report_test.cpp with synthetic streams whose answers are known.
#include "ampforge/profiler/report.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ampforge::profiler {

// ---- intervals
std::vector<Interval> interval_union(std::vector<Interval> v) {
  std::erase_if(v, [](const Interval& i) { return i.second <= i.first; });
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.first <= out.back().second) out.back().second = std::max(out.back().second, i.second);
    else out.push_back(i);
  }
  return out;
}

std::vector<Interval> interval_intersect(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo < hi) out.emplace_back(lo, hi);
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return out;
}

std::vector<Interval> interval_subtract(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  size_t j = 0;
  for (Interval cur : a) {
    while (j < b.size() && b[j].second <= cur.first) ++j;
    size_t k = j;
    while (k < b.size() && b[k].first < cur.second) {
      if (b[k].first > cur.first) out.emplace_back(cur.first, b[k].first);
      cur.first = std::max(cur.first, b[k].second);
      ++k;
    }
    if (cur.first < cur.second) out.push_back(cur);
  }
  return out;
}

int64_t interval_length(const std::vector<Interval>& v) {
  int64_t n = 0;
  for (const Interval& i : v) n += i.second - i.first;
  return n;
}

namespace {

void add_sample(TimeStat& s, int64_t d) {
  if (s.calls == 0 || d < s.min_ns) s.min_ns = d;
  if (s.calls == 0 || d > s.max_ns) s.max_ns = d;
  ++s.calls;
  s.total_ns += d;
}

std::vector<Interval> windows_of(const ProfileData& d) {
  if (!d.windows.empty()) return interval_union(d.windows);
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const auto& r : d.ranges) lo = std::min(lo, r.begin_ns), hi = std::max(hi, r.end_ns);
  for (const auto& a : d.activities) lo = std::min(lo, a.begin_ns), hi = std::max(hi, a.end_ns);
  if (lo >= hi) return {};
  return {{lo, hi}};
}

}  // namespace

Report compute_report(const ProfileData& d) {
  Report r;
  const std::vector<Interval> windows = windows_of(d);
  r.wall_ns = interval_length(windows);
  r.memory = d.memory;
  r.device_observed = d.device_observed;
  r.device_note = d.device_note;

  // ---- host: nesting per thread (parent of each range), self times, the op that launched each API call.
  const size_t n = d.ranges.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const HostRange &x = d.ranges[a], &y = d.ranges[b];
    if (x.tid != y.tid) return x.tid < y.tid;
    if (x.begin_ns != y.begin_ns) return x.begin_ns < y.begin_ns;
    return x.end_ns > y.end_ns;  // the enclosing range first
  });
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::vector<int64_t> child_ns(n, 0);
  std::vector<size_t> nearest_op(n, kNone);
  std::unordered_map<uint32_t, size_t> corr_op;  // correlation id -> index of the launching op range
  std::vector<size_t> stack;
  int64_t cur_tid = std::numeric_limits<int64_t>::min();
  for (size_t idx : order) {
    const HostRange& x = d.ranges[idx];
    if (x.tid != cur_tid) stack.clear(), cur_tid = x.tid;
    while (!stack.empty() && d.ranges[stack.back()].end_ns <= x.begin_ns) stack.pop_back();
    const size_t parent = stack.empty() ? kNone : stack.back();
    if (parent != kNone) {
      const HostRange& p = d.ranges[parent];
      // API calls are part of the op's own host cost, not time spent in a nested range.
      if (x.kind != RangeKind::CudaApi) child_ns[parent] += std::min(x.end_ns, p.end_ns) - x.begin_ns;
      nearest_op[idx] = p.kind == RangeKind::Op ? parent : nearest_op[parent];
      if (p.kind == RangeKind::Step) {
        const int64_t dur = std::min(x.end_ns, p.end_ns) - x.begin_ns;
        if (x.kind == RangeKind::DataWait) r.step.data_ns += dur;
        else if (x.kind == RangeKind::Phase && x.name == "forward") r.step.forward_ns += dur;
        else if (x.kind == RangeKind::Phase && x.name == "backward") r.step.backward_ns += dur;
        else if (x.kind == RangeKind::Phase && x.name == "optimizer") r.step.optimizer_ns += dur;
      }
    }
    if (x.kind == RangeKind::CudaApi && x.correlation_id != 0 && nearest_op[idx] != kNone)
      corr_op[x.correlation_id] = nearest_op[idx];
    stack.push_back(idx);
  }

  std::unordered_map<std::string, TimeStat> ops;
  for (size_t i = 0; i < n; ++i) {
    const HostRange& x = d.ranges[i];
    if (x.kind == RangeKind::Step) {
      ++r.step.steps;
      r.step.step_ns += x.duration_ns();
    }
    if (x.kind != RangeKind::Op) continue;
    TimeStat& s = ops[x.name];
    s.name = x.name;
    add_sample(s, x.duration_ns());
    const int64_t self = std::max<int64_t>(0, x.duration_ns() - child_ns[i]);
    s.self_ns += self;
    r.op_self_ns += self;
    ++r.op_calls;
  }
  const int64_t covered = r.step.data_ns + r.step.forward_ns + r.step.backward_ns + r.step.optimizer_ns;
  r.step.other_ns = std::max<int64_t>(0, r.step.step_ns - covered);
  r.step.coverage = r.step.step_ns > 0 ? static_cast<double>(covered) / static_cast<double>(r.step.step_ns) : 0.0;

  // ---- device
  std::unordered_map<std::string, TimeStat> kernels;
  std::unordered_map<std::string, std::unordered_map<std::string, int64_t>> kernel_ops;  // kernel -> op -> calls
  std::unordered_map<std::string, MemoryOpStat> mem;
  std::vector<Interval> busy, pending;
  std::unordered_map<uint32_t, int64_t> launch_ns;  // correlation id -> begin of the API call
  for (const HostRange& x : d.ranges)
    if (x.kind == RangeKind::CudaApi && x.correlation_id != 0) launch_ns.emplace(x.correlation_id, x.begin_ns);
  for (const DeviceActivity& a : d.activities) {
    const int64_t dur = a.duration_ns();
    r.device_ns += dur;
    busy.emplace_back(a.begin_ns, a.end_ns);
    if (auto it = launch_ns.find(a.correlation_id); a.correlation_id != 0 && it != launch_ns.end())
      pending.emplace_back(it->second, a.begin_ns);  // issued, not started yet
    const auto op_it = a.correlation_id != 0 ? corr_op.find(a.correlation_id) : corr_op.end();
    if (op_it != corr_op.end()) ops[d.ranges[op_it->second].name].device_ns += dur;
    if (a.kind == ActivityKind::Kernel) {
      TimeStat& s = kernels[a.name];
      s.name = a.name;
      add_sample(s, dur);
      if (op_it != corr_op.end()) ++kernel_ops[a.name][d.ranges[op_it->second].name];
    } else {
      const std::string kind = a.kind == ActivityKind::Memset ? "memset" : copy_kind_name(a.copy);
      MemoryOpStat& m = mem[kind];
      m.kind = kind;
      ++m.count;
      m.total_ns += dur;
      m.bytes += a.bytes;
    }
  }
  if (!d.activities.empty()) r.device_observed = true;
  const std::vector<Interval> busy_u = interval_intersect(interval_union(std::move(busy)), windows);
  r.busy_ns = interval_length(busy_u);
  r.utilisation = r.wall_ns > 0 ? static_cast<double>(r.busy_ns) / static_cast<double>(r.wall_ns) : 0.0;
  if (r.device_observed) {
    std::vector<Interval> data_wait, sync;
    for (const HostRange& x : d.ranges) {
      if (x.kind == RangeKind::DataWait) data_wait.emplace_back(x.begin_ns, x.end_ns);
      if (x.kind == RangeKind::Sync) sync.emplace_back(x.begin_ns, x.end_ns);
    }
    const std::vector<Interval> idle = interval_subtract(windows, busy_u);
    const std::vector<Interval> idle_data = interval_intersect(idle, interval_union(std::move(data_wait)));
    const std::vector<Interval> idle_rest = interval_subtract(idle, idle_data);
    r.idle_ns = interval_length(idle);
    r.idle_data_ns = interval_length(idle_data);
    r.idle_sync_ns = interval_length(interval_intersect(idle_rest, interval_union(std::move(sync))));
    r.idle_launch_ns = r.idle_ns - r.idle_data_ns - r.idle_sync_ns;
    r.overlap_ns = interval_length(interval_intersect(busy_u, interval_union(std::move(pending))));
    r.overlap = r.busy_ns > 0 ? static_cast<double>(r.overlap_ns) / static_cast<double>(r.busy_ns) : 0.0;
  }

  // ---- tables
  const double wall = static_cast<double>(std::max<int64_t>(r.wall_ns, 1));
  const double dev = static_cast<double>(std::max<int64_t>(r.device_ns, 1));
  for (auto& [name, s] : ops) {
    s.percent = 100.0 * static_cast<double>(s.self_ns) / wall;
    r.ops.push_back(std::move(s));
  }
  std::sort(r.ops.begin(), r.ops.end(), [](const TimeStat& a, const TimeStat& b) {
    return a.self_ns != b.self_ns ? a.self_ns > b.self_ns : a.name < b.name;
  });
  for (auto& [name, s] : kernels) {
    s.percent = 100.0 * static_cast<double>(s.total_ns) / dev;
    int64_t best = 0;
    for (const auto& [op, calls] : kernel_ops[name])
      if (calls > best || (calls == best && op < s.op)) best = calls, s.op = op;
    r.kernels.push_back(std::move(s));
  }
  std::sort(r.kernels.begin(), r.kernels.end(), [](const TimeStat& a, const TimeStat& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  for (auto& [kind, m] : mem) {
    m.bandwidth_gbps = m.total_ns > 0 ? static_cast<double>(m.bytes) / static_cast<double>(m.total_ns) : 0.0;
    m.percent = 100.0 * static_cast<double>(m.total_ns) / dev;
    r.memory_ops.push_back(std::move(m));
  }
  std::sort(r.memory_ops.begin(), r.memory_ops.end(), [](const MemoryOpStat& a, const MemoryOpStat& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.kind < b.kind;
  });
  return r;
}

// ---- formatting
namespace {

std::string ms(int64_t ns) { return fmt::format("{:.3f}", static_cast<double>(ns) * 1e-6); }
std::string us(double ns) { return fmt::format("{:.1f}", ns * 1e-3); }
double pct(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}
std::string bytes_str(int64_t b) {
  if (b < 0) return "n/a";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}
std::string clip(const std::string& s, size_t w) { return s.size() <= w ? s : s.substr(0, w - 3) + "..."; }

nlohmann::json stat_json(const TimeStat& s, bool is_op) {
  nlohmann::json j = {{"name", s.name},       {"calls", s.calls},       {"total_ns", s.total_ns},
                      {"mean_ns", s.mean_ns()}, {"min_ns", s.min_ns},     {"max_ns", s.max_ns}};
  if (is_op) {
    j["self_ns"] = s.self_ns;
    j["percent_of_wall"] = s.percent;
    j["device_ns"] = s.device_ns;
  } else {
    j["percent_of_device_time"] = s.percent;
    j["op"] = s.op;
  }
  return j;
}

}  // namespace

std::string format_report(const Report& r, size_t top) {
  std::string o;
  auto limit = [&](size_t size) { return top == 0 ? size : std::min(size, top); };
  o += fmt::format("profile: wall {} ms (profiled window), {} op calls, op self time {} ms ({:.1f}% of wall)\n",
                   ms(r.wall_ns), r.op_calls, ms(r.op_self_ns), pct(r.op_self_ns, r.wall_ns));
  if (r.step.steps > 0) {
    const auto& s = r.step;
    o += fmt::format("\nstep time: {} steps, {} ms ({:.1f}% of wall), {:.3f} ms per step\n", s.steps, ms(s.step_ns),
                     pct(s.step_ns, r.wall_ns), static_cast<double>(s.step_ns) * 1e-6 / static_cast<double>(s.steps));
    const std::pair<const char*, int64_t> rows[] = {{"data", s.data_ns},           {"forward", s.forward_ns},
                                                    {"backward", s.backward_ns},   {"optimizer", s.optimizer_ns},
                                                    {"other", s.other_ns}};
    for (const auto& [name, v] : rows)
      o += fmt::format("  {:<10} {:>12} ms {:>6.1f}%\n", name, ms(v), pct(v, s.step_ns));
  }
  if (!r.ops.empty()) {
    o += fmt::format("\ntop ops by self time ({} of {}):\n", limit(r.ops.size()), r.ops.size());
    o += fmt::format("  {:<24} {:>8} {:>11} {:>11} {:>9} {:>9} {:>9} {:>7}{}\n", "op", "calls", "total ms",
                     "self ms", "mean us", "min us", "max us", "% wall", r.device_observed ? "   device ms" : "");
    for (size_t i = 0; i < limit(r.ops.size()); ++i) {
      const TimeStat& s = r.ops[i];
      o += fmt::format("  {:<24} {:>8} {:>11} {:>11} {:>9} {:>9} {:>9} {:>6.1f}%{}\n", clip(s.name, 24), s.calls,
                       ms(s.total_ns), ms(s.self_ns), us(s.mean_ns()), us(static_cast<double>(s.min_ns)),
                       us(static_cast<double>(s.max_ns)), s.percent,
                       r.device_observed ? fmt::format(" {:>11}", ms(s.device_ns)) : "");
    }
  }
  o += "\n";
  if (!r.device_observed) {
    o += fmt::format("device: no CUDA activity was observed{}\n",
                     r.device_note.empty() ? "" : ": " + r.device_note);
  } else {
    if (!r.device_note.empty()) o += fmt::format("device note: {}\n", r.device_note);
    o += fmt::format("device utilisation: busy {} ms of {} ms wall ({:.1f}%); device time (sum of activities) {} ms\n",
                     ms(r.busy_ns), ms(r.wall_ns), 100.0 * r.utilisation, ms(r.device_ns));
    o += fmt::format("device idle {} ms: waiting on the host (launch-bound) {} ms ({:.1f}%), waiting on data {} ms "
                     "({:.1f}%), synchronisation {} ms ({:.1f}%)\n",
                     ms(r.idle_ns), ms(r.idle_launch_ns), pct(r.idle_launch_ns, r.idle_ns), ms(r.idle_data_ns),
                     pct(r.idle_data_ns, r.idle_ns), ms(r.idle_sync_ns), pct(r.idle_sync_ns, r.idle_ns));
    o += fmt::format("CPU/GPU overlap: {:.1f}% of device-busy time had later work already issued by the host\n",
                     100.0 * r.overlap);
    if (!r.kernels.empty()) {
      o += fmt::format("\ntop kernels by total time ({} of {}):\n", limit(r.kernels.size()), r.kernels.size());
      o += fmt::format("  {:<40} {:>8} {:>11} {:>9} {:>9} {:>9} {:>8}  {}\n", "kernel", "calls", "total ms",
                       "mean us", "min us", "max us", "% device", "op");
      for (size_t i = 0; i < limit(r.kernels.size()); ++i) {
        const TimeStat& s = r.kernels[i];
        o += fmt::format("  {:<40} {:>8} {:>11} {:>9} {:>9} {:>9} {:>7.1f}%  {}\n", clip(s.name, 40), s.calls,
                         ms(s.total_ns), us(s.mean_ns()), us(static_cast<double>(s.min_ns)),
                         us(static_cast<double>(s.max_ns)), s.percent, s.op.empty() ? "-" : s.op);
      }
    }
    if (!r.memory_ops.empty()) {
      o += "\nmemory operations:\n";
      o += fmt::format("  {:<8} {:>8} {:>11} {:>12} {:>12} {:>8}\n", "kind", "count", "total ms", "bytes", "GB/s",
                       "% device");
      for (const MemoryOpStat& m : r.memory_ops)
        o += fmt::format("  {:<8} {:>8} {:>11} {:>12} {:>12.2f} {:>7.1f}%\n", m.kind, m.count, ms(m.total_ns),
                         bytes_str(m.bytes), m.bandwidth_gbps, m.percent);
    }
  }
  if (r.memory.valid)
    o += fmt::format("\nmemory ({}): peak allocated {}, peak reserved {}, fragmentation {}\n", r.memory.source,
                     bytes_str(r.memory.peak_allocated), bytes_str(r.memory.peak_reserved),
                     r.memory.fragmentation < 0 ? std::string("n/a")
                                                : fmt::format("{:.1f}%", 100.0 * r.memory.fragmentation));
  return o;
}

nlohmann::json report_to_json(const Report& r, size_t top) {
  auto limit = [&](size_t size) { return top == 0 ? size : std::min(size, top); };
  nlohmann::json j;
  j["wall_ns"] = r.wall_ns;
  j["op_calls"] = r.op_calls;
  j["op_self_ns"] = r.op_self_ns;
  j["step"] = {{"steps", r.step.steps},           {"step_ns", r.step.step_ns},
               {"data_ns", r.step.data_ns},       {"forward_ns", r.step.forward_ns},
               {"backward_ns", r.step.backward_ns}, {"optimizer_ns", r.step.optimizer_ns},
               {"other_ns", r.step.other_ns},     {"coverage", r.step.coverage}};
  j["ops"] = nlohmann::json::array();
  for (size_t i = 0; i < limit(r.ops.size()); ++i) j["ops"].push_back(stat_json(r.ops[i], true));
  nlohmann::json dev = {{"observed", r.device_observed}, {"note", r.device_note}};
  if (r.device_observed) {
    dev["device_time_ns"] = r.device_ns;
    dev["busy_ns"] = r.busy_ns;
    dev["utilisation"] = r.utilisation;
    dev["idle_ns"] = r.idle_ns;
    dev["idle_launch_bound_ns"] = r.idle_launch_ns;
    dev["idle_data_ns"] = r.idle_data_ns;
    dev["idle_sync_ns"] = r.idle_sync_ns;
    dev["overlap_ns"] = r.overlap_ns;
    dev["overlap"] = r.overlap;
    dev["kernels"] = nlohmann::json::array();
    for (size_t i = 0; i < limit(r.kernels.size()); ++i) dev["kernels"].push_back(stat_json(r.kernels[i], false));
    dev["memory_ops"] = nlohmann::json::array();
    for (const MemoryOpStat& m : r.memory_ops)
      dev["memory_ops"].push_back({{"kind", m.kind},
                                   {"count", m.count},
                                   {"total_ns", m.total_ns},
                                   {"bytes", m.bytes},
                                   {"bandwidth_gbps", m.bandwidth_gbps},
                                   {"percent_of_device_time", m.percent}});
  }
  j["device"] = dev;
  if (r.memory.valid)
    j["memory"] = {{"source", r.memory.source},
                   {"peak_allocated_bytes", r.memory.peak_allocated},
                   {"peak_reserved_bytes", r.memory.peak_reserved},
                   {"fragmentation", r.memory.fragmentation}};
  return j;
}

}  // namespace ampforge::profiler
