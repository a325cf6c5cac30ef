// Test helper: checks that a Chrome trace's complete ("X") events nest correctly on every (pid, tid) track
// and sums op self-times, so the synthetic and the real-run tests apply the same rules.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ampforge::profiler::testing {

struct TraceCheck {
  std::string error;           // "" when every track nests
  size_t complete_events = 0;  // "X" events seen
  int64_t op_self_ns = 0;      // sum over "op" events of (duration - directly nested non-API events)
  std::map<std::pair<int64_t, int64_t>, size_t> per_track;  // (pid, tid) -> X events
};

inline TraceCheck check_trace(const nlohmann::json& trace) {
  TraceCheck out;
  struct Ev {
    int64_t b, e;
    bool op, api;
  };
  std::map<std::pair<int64_t, int64_t>, std::vector<Ev>> tracks;
  for (const auto& ev : trace.at("traceEvents")) {
    if (ev.at("ph") != "X") continue;
    // Whole nanoseconds: the exporter writes microseconds with three decimals of precision.
    const int64_t b = std::llround(ev.at("ts").get<double>() * 1000.0);
    const int64_t e = b + std::llround(ev.at("dur").get<double>() * 1000.0);
    tracks[{ev.at("pid").get<int64_t>(), ev.at("tid").get<int64_t>()}].push_back({b, e, ev.at("cat") == "op", ev.at("cat") == "cuda_api"});
    ++out.complete_events;
  }
  for (auto& [track, evs] : tracks) {
    out.per_track[track] = evs.size();
    std::stable_sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) { return a.b != b.b ? a.b < b.b : a.e > b.e; });
    std::vector<size_t> stack;
    std::vector<int64_t> child(evs.size(), 0);
    for (size_t i = 0; i < evs.size(); ++i) {
      while (!stack.empty() && evs[stack.back()].e <= evs[i].b) stack.pop_back();
      if (!stack.empty()) {
        // Allow 1 ns of rounding at the end; anything more is a range that straddles its parent's end.
        if (evs[i].e > evs[stack.back()].e + 1 && out.error.empty())
          out.error = "track (" + std::to_string(track.first) + ", " + std::to_string(track.second) +
                      "): an event at " + std::to_string(evs[i].b) + " ns ends after its enclosing event";
        if (!evs[i].api) child[stack.back()] += evs[i].e - evs[i].b;  // API calls are the op's own cost
      }
      stack.push_back(i);
    }
    for (size_t i = 0; i < evs.size(); ++i)
      if (evs[i].op) out.op_self_ns += std::max<int64_t>(0, evs[i].e - evs[i].b - child[i]);
  }
  return out;
}

}  // namespace ampforge::profiler::testing
