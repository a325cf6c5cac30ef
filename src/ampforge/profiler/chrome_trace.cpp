#include "ampforge/profiler/chrome_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "ampforge/util/error.h"
#include "ampforge/util/file.h"

namespace ampforge::profiler {

nlohmann::json chrome_trace(const ProfileData& d) {
  int64_t t0 = std::numeric_limits<int64_t>::max();
  for (const auto& w : d.windows) t0 = std::min(t0, w.first);
  for (const auto& r : d.ranges) t0 = std::min(t0, r.begin_ns);
  for (const auto& a : d.activities) t0 = std::min(t0, a.begin_ns);
  if (t0 == std::numeric_limits<int64_t>::max()) t0 = 0;
  auto us = [t0](int64_t ns) { return static_cast<double>(ns - t0) * 1e-3; };

  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", kTraceHostPid}, {"tid", 0}, {"args", {{"name", "host"}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", kTraceHostPid}, {"tid", 0},
                {"args", {{"sort_index", 0}}}});
  std::set<int64_t> tids;
  for (const auto& r : d.ranges) tids.insert(r.tid);
  for (int64_t tid : tids) {
    auto it = d.thread_names.find(tid);
    const std::string name = it != d.thread_names.end() ? it->second + " (" + std::to_string(tid) + ")"
                                                        : "thread " + std::to_string(tid);
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", kTraceHostPid}, {"tid", tid}, {"args", {{"name", name}}}});
  }
  std::set<std::pair<int32_t, int64_t>> streams;
  for (const auto& a : d.activities) streams.emplace(a.device, a.stream);
  std::set<int32_t> devices;
  for (const auto& [dev, stream] : streams) {
    if (devices.insert(dev).second) {
      ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", kTraceDevicePidBase + dev}, {"tid", 0},
                    {"args", {{"name", "device " + std::to_string(dev)}}}});
      ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", kTraceDevicePidBase + dev}, {"tid", 0},
                    {"args", {{"sort_index", 1 + dev}}}});
    }
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", kTraceDevicePidBase + dev}, {"tid", stream},
                  {"args", {{"name", "stream " + std::to_string(stream)}}}});
  }

  // Host ranges, enclosing ranges first at equal timestamps so viewers nest them as recorded.
  std::vector<const HostRange*> ranges;
  ranges.reserve(d.ranges.size());
  for (const auto& r : d.ranges) ranges.push_back(&r);
  std::stable_sort(ranges.begin(), ranges.end(), [](const HostRange* a, const HostRange* b) {
    if (a->tid != b->tid) return a->tid < b->tid;
    if (a->begin_ns != b->begin_ns) return a->begin_ns < b->begin_ns;
    return a->end_ns > b->end_ns;
  });
  std::unordered_map<uint32_t, const HostRange*> launches;
  for (const HostRange* r : ranges) {
    nlohmann::json e = {{"ph", "X"},          {"name", r->name},       {"cat", range_kind_name(r->kind)},
                        {"pid", kTraceHostPid}, {"tid", r->tid},        {"ts", us(r->begin_ns)},
                        {"dur", static_cast<double>(r->duration_ns()) * 1e-3}};
    if (r->correlation_id != 0) {
      e["args"] = {{"correlation", r->correlation_id}};
      if (r->kind == RangeKind::CudaApi) launches.emplace(r->correlation_id, r);
    }
    ev.push_back(std::move(e));
  }

  for (const DeviceActivity& a : d.activities) {
    const int pid = kTraceDevicePidBase + a.device;
    std::string name = a.kind == ActivityKind::Kernel   ? a.name
                       : a.kind == ActivityKind::Memcpy ? std::string("Memcpy ") + copy_kind_name(a.copy)
                                                        : std::string("Memset");
    nlohmann::json args = {{"correlation", a.correlation_id}};
    if (a.kind != ActivityKind::Kernel) args["bytes"] = a.bytes;
    ev.push_back({{"ph", "X"},
                  {"name", std::move(name)},
                  {"cat", activity_kind_name(a.kind)},
                  {"pid", pid},
                  {"tid", a.stream},
                  {"ts", us(a.begin_ns)},
                  {"dur", static_cast<double>(a.duration_ns()) * 1e-3},
                  {"args", std::move(args)}});
    auto it = a.correlation_id != 0 ? launches.find(a.correlation_id) : launches.end();
    if (it != launches.end()) {
      const HostRange* l = it->second;
      // The start binds to the launching API call's slice, the end to the activity's slice ("bp": "e").
      ev.push_back({{"ph", "s"}, {"name", "launch"}, {"cat", "launch"}, {"id", a.correlation_id},
                    {"pid", kTraceHostPid}, {"tid", l->tid}, {"ts", us(l->begin_ns)}});
      ev.push_back({{"ph", "f"}, {"bp", "e"}, {"name", "launch"}, {"cat", "launch"}, {"id", a.correlation_id},
                    {"pid", pid}, {"tid", a.stream}, {"ts", us(a.begin_ns)}});
    }
  }

  for (const CounterSample& c : d.counters)
    ev.push_back({{"ph", "C"}, {"name", "memory " + c.name}, {"pid", kTraceHostPid}, {"tid", 0},
                  {"ts", us(c.ts_ns)}, {"args", {{"bytes", c.value}}}});

  return {{"traceEvents", std::move(ev)}, {"displayTimeUnit", "ms"},
          {"otherData", {{"producer", "ampforge profiler"}, {"clock", "steady_clock (CLOCK_MONOTONIC)"},
                         {"origin_ns", t0}}}};
}

void write_chrome_trace(const ProfileData& data, const std::string& path) {
  write_file_atomically(path, chrome_trace(data).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + '\n',
                        "trace");
}

}  // namespace ampforge::profiler
