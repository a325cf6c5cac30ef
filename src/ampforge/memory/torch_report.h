// What `ampforge memory replay snap.pickle` and `ampforge memory explain snap.pickle` compute from a PyTorch
// memory snapshot (memory/torch_snapshot.h): the trace replayed under each policy on a simulated device, the
// calibration of the `pytorch` policy against the recording, the allocation sites holding the peak, and, at each
// recorded out-of-memory, why PyTorch's cache could not serve the request and which setting would have (each
// answer checked by replaying with it). docs/MEMORY.md ("PyTorch snapshots") defines every figure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/memory/torch_snapshot.h"
#include "ampforge/memory/trace.h"

namespace ampforge::memory {

// The policies a snapshot is replayed under, in report order: naive, pytorch (the snapshot's own settings),
// pytorch-expandable (the same with expandable_segments:True), ampforge.
std::vector<std::string> torch_policy_names();
PolicyConfig torch_policy_by_name(const std::string& name, const TorchAllocatorSettings& settings);

struct TorchPolicyRun {
  ReplayResult result;     // unlimited memory (a recorded oom's request is a probe: counted, passed over)
  bool fits = true;        // the replay under the budget ran every recorded allocation (no budget: true)
  int64_t min_budget = 0;  // the smallest multiple of 2 MiB under which it does (the next one down fails)
};

struct TorchSite {
  std::string site;  // "file:line function", or what stands for it
  int64_t bytes = 0;  // live requested bytes at the peak
  int64_t blocks = 0;
};

struct TorchReplayReport {
  std::string source;
  int device = 0;
  int64_t entries = 0, events = 0;
  std::string settings;  // TorchAllocatorSettings::describe(), "(not recorded: PyTorch's defaults)" when absent
  std::vector<std::string> notes;
  int64_t peak_live = 0;
  int64_t peak_live_event = 0;  // index in the trace where live first reached its peak
  std::vector<TorchSite> top_sites;
  // Calibration: the recording's reserved memory against the pytorch policy under the snapshot's settings (under
  // the device's memory when the recording ran out of it: reserved + what CUDA reported free at its first oom).
  int64_t recorded_peak_reserved = 0;
  int64_t replayed_peak_reserved = 0;
  int64_t recorded_segments = 0, replayed_segments = 0;  // segment allocations (or page mappings) compared
  bool segments_match = false;
  std::string first_mismatch;  // where they differ first, when they do
  // What in the recording the replay cannot know, when it bears on the comparison (a warm cache, blocks from
  // before the recording, cached memory given back before the first allocation).
  std::vector<std::string> calibration_notes;
  uint64_t budget = 0;
  std::vector<TorchPolicyRun> runs;
};

// `policies`: names from torch_policy_names(). series_points > 0 keeps a timeline per policy (for the SVG).
TorchReplayReport torch_replay_report(const TorchSnapshot& snap, const TorchReplayInput& in,
                                      const std::vector<std::string>& policies, uint64_t budget,
                                      int series_points = 0);
nlohmann::json torch_replay_report_json(const TorchReplayReport& r);
std::string torch_replay_report_text(const TorchReplayReport& r);
std::string torch_replay_report_svg(const TorchReplayReport& r);

struct TorchFixTry {
  std::string setting;       // "expandable_segments:True", "max_split_size_mb:256", "the ampforge policy"
  bool serves = false;       // the failed request is served under the device's memory at that point
  int64_t peak_reserved = 0;  // the whole run's peak reserved under this setting (unlimited memory)
};

struct TorchOomExplanation {
  TorchOom oom;
  std::string site;           // where the failed request came from ("file:line function"), "" without a stack
  int64_t capacity = 0;       // recorded reserved + device_free: what PyTorch's allocator could have had
  int64_t segment_size = 0;   // what cudaMalloc was asked for (PyTorch's get_allocation_size of the request)
  bool small_pool = false;
  bool reproduced = false;    // the pytorch policy with the snapshot's settings also fails there
  int64_t reserved = 0, live = 0, cache_free = 0;  // the replay's state just before the request
  int64_t free_blocks = 0;
  int64_t largest_same = 0;         // largest free block of the request's pool and stream
  int64_t largest_other_stream = 0;  // ... of its pool, on other streams
  int64_t largest_other_pool = 0;    // ... of the other pool
  std::string why;
  std::vector<TorchFixTry> tries;
  std::string fix;  // the first try that serves it, "" when none does
};

std::vector<TorchOomExplanation> torch_explain(const TorchSnapshot& snap, const TorchReplayInput& in);
nlohmann::json torch_explain_json(const std::vector<TorchOomExplanation>& e);
std::string torch_explain_text(const TorchReplayInput& in, const std::vector<TorchOomExplanation>& e);

}  // namespace ampforge::memory
