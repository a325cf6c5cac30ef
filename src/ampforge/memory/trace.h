// Memory traces: every allocation and free of a run, to replay under different policies.
//
// Format (text, one event per line; '#' starts a comment line; blank lines are ignored):
//   # ampforge-memtrace v1      the first line, exactly
//   a <id> <bytes> <stream>     allocation; id is unique among live blocks
//   f <id>                      free
//   s                           step boundary (optional)
//   e                           empty_cache: the program gave the allocator's cached memory back
//                               (torch.cuda.empty_cache()); every policy's cache is emptied there
// Numbers are unsigned decimal integers. Limits: bytes <= 2^44 (16 TiB), stream <= 65535.
// Parsing is strict: anything else is an InvalidArgument error naming the file and line.
#pragma once

#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/stats.h"

namespace ampforge::memory {

struct TraceEvent {
  enum Kind : uint8_t { Alloc, Free, Step, EmptyCache };
  // kProbe (allocations only; never in a memtrace file): a request that failed in the recording (a PyTorch
  // snapshot's oom entry). Replayed to see whether the policy serves it: an out-of-memory error is counted
  // (ReplayResult::probes_failed) and the replay goes on; when served, it is freed at once.
  enum Flags : uint8_t { kProbe = 1 };
  Kind kind = Alloc;
  uint64_t id = 0;
  uint64_t bytes = 0;
  uint64_t stream = 0;
  int64_t line = 0;  // line number in the source (1-based); 0 for generated traces
  uint8_t flags = 0;
};

struct Trace {
  std::string source;  // file name, for messages
  std::vector<TraceEvent> events;
};

inline constexpr uint64_t kTraceMaxBytes = uint64_t{1} << 44;
inline constexpr uint64_t kTraceMaxStream = 65535;

Trace trace_parse(std::istream& in, const std::string& source);
Trace trace_read(const std::string& path);
void trace_write(const Trace& trace, std::ostream& out, const std::string& comment = "");
void trace_write_file(const Trace& trace, const std::string& path, const std::string& comment = "");

struct ReplayOptions {
  uint64_t budget = 0;              // bytes of device memory; 0: unlimited
  size_t granule = kHostGranule;    // mapping granularity of the simulated device
  bool keep_snapshot = false;       // fill ReplayResult::snapshot (state at the end, with the timeline)
  int64_t stop_before = -1;         // >= 0: stop before this event index (the snapshot is taken there)
  int series_points = 0;            // > 0: fill ReplayResult::series with about this many points
  // Non-null: every segment the provider hands out (plain segments; mapped granules of expandable ones), as
  // (index of the event being replayed, bytes), in order; negative bytes for those given back.
  std::vector<std::pair<int64_t, int64_t>>* segment_log = nullptr;
};

// One point of a replay's timeline: the highest live and reserved bytes over events (from, to].
struct ReplayPoint {
  int64_t event = 0;
  int64_t live = 0;
  int64_t reserved = 0;
};

struct ReplayResult {
  std::string policy;
  AllocatorStats stats;
  int64_t peak_live = 0;      // highest sum of live requested bytes: what an ideal allocator needs
  int64_t peak_reserved = 0;
  double ratio = 0.0;         // peak_reserved / peak_live
  int64_t events = 0;         // events replayed
  bool failed = false;        // an allocation ran out of the budget
  int64_t failed_line = 0;    // its line in the trace (its event index + 1 for generated traces)
  uint64_t failed_bytes = 0;
  std::string oom_report;
  nlohmann::json snapshot;
  // At the moment reserved first reached its peak: live (requested) bytes and the largest free block.
  int64_t live_at_peak_reserved = 0;
  int64_t largest_free_at_peak = 0;
  int64_t probes_failed = 0;  // kProbe allocations the policy could not serve either
  int64_t probes_served = 0;
  std::vector<ReplayPoint> series;
};

// Replays the trace on a simulated device (no memory is touched) under `policy`. A trace is assumed
// valid (trace_parse checked it); an out-of-memory error stops the replay and is reported in the result
// (except for kProbe allocations, which are counted and passed over).
ReplayResult trace_replay(const Trace& trace, const PolicyConfig& policy, const ReplayOptions& options = {});
nlohmann::json replay_result_to_json(const ReplayResult& r);

}  // namespace ampforge::memory
