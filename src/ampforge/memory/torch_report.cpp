// Replay, calibration and out-of-memory explanations for PyTorch snapshots (torch_report.h).
#include "ampforge/memory/torch_report.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "ampforge/memory/report.h"
#include "ampforge/memory/stats.h"
#include "ampforge/util/error.h"

namespace ampforge::memory {

namespace {

constexpr int64_t kStep = int64_t{2} << 20;  // min-budget search step: one granule
constexpr int64_t kSmallSize = int64_t{1} << 20;  // PyTorch's kSmallSize: requests up to it use the small pool

std::string b(int64_t n) { return format_bytes(n); }

// PyTorch's get_allocation_size (c10/cuda/CUDACachingAllocator.cpp): the segment cudaMalloc is asked for.
int64_t torch_segment_size(int64_t size) {
  if (size <= kSmallSize) return int64_t{2} << 20;
  if (size < (int64_t{10} << 20)) return int64_t{20} << 20;
  return (size + kStep - 1) / kStep * kStep;
}

bool runs(const Trace& t, const PolicyConfig& p, int64_t budget) {
  ReplayOptions o;
  o.budget = static_cast<uint64_t>(budget);
  return !trace_replay(t, p, o).failed;
}

// Aggregates (event, bytes) allocations per event, in order; negative entries (given back) are left out.
std::vector<std::pair<int64_t, int64_t>> per_event(const std::vector<std::pair<int64_t, int64_t>>& log, int64_t from) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& [e, n] : log) {
    if (n <= 0 || e < from) continue;
    if (!out.empty() && out.back().first == e) out.back().second += n;
    else out.emplace_back(e, n);
  }
  return out;
}

std::string site_name(const TorchSnapshot& snap, int32_t site, bool before) {
  if (site >= 0) return snap.sites[static_cast<size_t>(site)];
  return before ? "(allocated before recording began)" : "(no stack recorded)";
}

}  // namespace

std::vector<std::string> torch_policy_names() { return {"naive", "pytorch", "pytorch-expandable", "ampforge"}; }

PolicyConfig torch_policy_by_name(const std::string& name, const TorchAllocatorSettings& settings) {
  if (name == "pytorch") {
    PolicyConfig c = torch_policy(settings, settings.expandable_segments);
    c.name = "pytorch";
    return c;
  }
  if (name == "pytorch-expandable") return torch_policy(settings, true);
  if (name == "naive" || name == "ampforge") return PolicyConfig::by_name(name);
  AF_THROW(InvalidArgument, "unknown policy '{}'; expected naive, pytorch, pytorch-expandable or ampforge", name);
}

TorchReplayReport torch_replay_report(const TorchSnapshot& snap, const TorchReplayInput& in,
                                      const std::vector<std::string>& policies, uint64_t budget, int series_points) {
  TorchReplayReport r;
  r.source = snap.source;
  r.device = in.device;
  r.entries = in.entries;
  r.events = static_cast<int64_t>(in.trace.events.size());
  r.settings = snap.settings.recorded ? snap.settings.describe() : "(not recorded: PyTorch's defaults)";
  r.notes = in.notes;
  r.budget = budget;
  r.recorded_peak_reserved = in.recorded_peak_reserved;

  // Peak live and the sites holding it (requests as recorded; probes are not live memory).
  {
    const auto& ev = in.trace.events;
    std::unordered_map<uint64_t, std::pair<int64_t, int32_t>> blocks;  // id -> (bytes, site)
    int64_t live = 0;
    for (size_t i = 0; i < ev.size(); ++i) {
      const TraceEvent& e = ev[i];
      if (e.kind == TraceEvent::Alloc && (e.flags & TraceEvent::kProbe) == 0) {
        blocks[e.id] = {static_cast<int64_t>(e.bytes), in.site[i]};
        live += static_cast<int64_t>(e.bytes);
        if (live > r.peak_live) {
          r.peak_live = live;
          r.peak_live_event = static_cast<int64_t>(i);
        }
      } else if (e.kind == TraceEvent::Free) {
        live -= blocks[e.id].first;
        blocks.erase(e.id);
      }
    }
    blocks.clear();
    for (int64_t i = 0; i <= r.peak_live_event && i < static_cast<int64_t>(ev.size()); ++i) {
      const TraceEvent& e = ev[static_cast<size_t>(i)];
      if (e.kind == TraceEvent::Alloc && (e.flags & TraceEvent::kProbe) == 0) {
        // -2: allocated before recording began, with no stack.
        const int32_t site = in.site[static_cast<size_t>(i)];
        blocks[e.id] = {static_cast<int64_t>(e.bytes), site < 0 && i < in.allocs_before_recording ? -2 : site};
      } else if (e.kind == TraceEvent::Free) {
        blocks.erase(e.id);
      }
    }
    std::map<int32_t, TorchSite> by_site;
    for (const auto& [id, v] : blocks) {
      TorchSite& s = by_site[v.second];
      s.bytes += v.first;
      ++s.blocks;
    }
    for (auto& [site, s] : by_site) {
      s.site = site_name(snap, site, site == -2);
      r.top_sites.push_back(s);
    }
    std::sort(r.top_sites.begin(), r.top_sites.end(),
              [](const TorchSite& x, const TorchSite& y) { return x.bytes != y.bytes ? x.bytes > y.bytes : x.site < y.site; });
    if (r.top_sites.size() > 8) r.top_sites.resize(8);
  }

  // Calibration.
  {
    int64_t cap = 0;
    for (const TorchOom& o : in.ooms) {
      const int64_t c = o.recorded_reserved + static_cast<int64_t>(o.device_free);
      cap = cap == 0 ? c : std::min(cap, c);
    }
    std::vector<std::pair<int64_t, int64_t>> log;
    ReplayOptions o;
    o.segment_log = &log;
    o.budget = static_cast<uint64_t>(cap);
    const ReplayResult cal = trace_replay(in.trace, torch_policy_by_name("pytorch", snap.settings), o);
    r.replayed_peak_reserved = cal.peak_reserved;
    std::vector<std::pair<int64_t, int64_t>> rec;
    for (const auto& s : in.recorded_segments) rec.push_back(s);
    rec = per_event(rec, 0);
    const auto rep = per_event(log, in.allocs_before_recording);
    r.recorded_segments = static_cast<int64_t>(rec.size());
    r.replayed_segments = static_cast<int64_t>(rep.size());
    r.segments_match = rec == rep && !cal.failed;
    if (!r.segments_match) {
      const size_t n = std::min(rec.size(), rep.size());
      size_t k = 0;
      while (k < n && rec[k] == rep[k]) ++k;
      if (cal.failed)
        r.first_mismatch = fmt::format("the replay ran out of memory at event {} where the recording did not", cal.failed_line);
      else if (k < n)
        r.first_mismatch = fmt::format("segment {}: recorded {} at event {}, replayed {} at event {}", k + 1, b(rec[k].second),
                                       rec[k].first, b(rep[k].second), rep[k].first);
      else
        r.first_mismatch = fmt::format("{} segments recorded, {} replayed", rec.size(), rep.size());
    }
    if (in.freed_at_start > 0)
      r.calibration_notes.push_back(fmt::format(
          "the recording began by giving back {} of cached segments before its first allocation "
          "(torch.cuda.empty_cache()); the recorded peak is counted from there",
          b(in.freed_at_start)));
    const bool equal = r.segments_match && r.recorded_peak_reserved == r.replayed_peak_reserved;
    if (!equal && in.entries > 0 && r.recorded_segments == 0 && r.recorded_peak_reserved > 0)
      r.calibration_notes.push_back(fmt::format(
          "the recording has no segment entries: PyTorch's cache was warm when recording began ({} reserved) and "
          "served every request; the replay starts with no cache, the {} blocks allocated before placed at the start",
          b(in.recorded_reserved_start), in.allocs_before_recording));
    else if (!equal && in.allocs_before_recording > 0)
      r.calibration_notes.push_back(fmt::format(
          "{} blocks ({}) allocated before the recording are placed at the start of new segments, not in the "
          "segments they were in (the trace does not say): later requests can fit differently",
          in.allocs_before_recording, b(in.bytes_before_recording)));
  }

  // The policies.
  for (const std::string& name : policies) {
    const PolicyConfig p = torch_policy_by_name(name, snap.settings);
    TorchPolicyRun run;
    ReplayOptions o;
    o.series_points = series_points;
    run.result = trace_replay(in.trace, p, o);
    run.result.policy = name;
    if (budget > 0) run.fits = runs(in.trace, p, static_cast<int64_t>(budget));
    if (!p.cache) {
      // No cache, nothing to give back: the replay runs exactly when its peak fits (in whole steps).
      run.min_budget = (run.result.peak_reserved + kStep - 1) / kStep * kStep;
      r.runs.push_back(std::move(run));
      continue;
    }
    // Smallest budget: reserved never goes below live, and the unlimited run's peak reserved suffices.
    // Invariant: lo * kStep fails (it is below peak live), hi * kStep runs.
    int64_t lo = (run.result.peak_live - 1) / kStep;
    int64_t hi = (run.result.peak_reserved + kStep - 1) / kStep;
    if (run.result.peak_live == 0) lo = hi = 0;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (runs(in.trace, p, mid * kStep)) hi = mid;
      else lo = mid;
    }
    run.min_budget = hi * kStep;
    r.runs.push_back(std::move(run));
  }
  return r;
}

nlohmann::json torch_replay_report_json(const TorchReplayReport& r) {
  nlohmann::json j = {{"snapshot", r.source},
                      {"device", r.device},
                      {"entries", r.entries},
                      {"events", r.events},
                      {"settings", r.settings},
                      {"notes", r.notes},
                      {"budget", r.budget},
                      {"peak_live_bytes", r.peak_live},
                      {"peak_live_event", r.peak_live_event}};
  j["calibration"] = {{"recorded_peak_reserved_bytes", r.recorded_peak_reserved},
                      {"replayed_peak_reserved_bytes", r.replayed_peak_reserved},
                      {"recorded_segments", r.recorded_segments},
                      {"replayed_segments", r.replayed_segments},
                      {"segments_match", r.segments_match},
                      {"first_mismatch", r.first_mismatch},
                      {"notes", r.calibration_notes}};
  j["top_sites"] = nlohmann::json::array();
  for (const TorchSite& s : r.top_sites) j["top_sites"].push_back({{"site", s.site}, {"bytes", s.bytes}, {"blocks", s.blocks}});
  j["results"] = nlohmann::json::array();
  for (const TorchPolicyRun& run : r.runs) {
    nlohmann::json x = replay_result_to_json(run.result);
    x["reserved_minus_live_at_peak_bytes"] = run.result.peak_reserved - run.result.live_at_peak_reserved;
    x["fits_budget"] = run.fits;
    x["min_budget_bytes"] = run.min_budget;
    x["recorded_oom_requests_served"] = run.result.probes_served;
    x.erase("stats");
    j["results"].push_back(x);
  }
  return j;
}

std::string torch_replay_report_text(const TorchReplayReport& r) {
  std::string o = fmt::format("snapshot {}, device {}: {} entries, {} replayed events\n", r.source, r.device, r.entries,
                              r.events);
  o += fmt::format("allocator settings: {}\n", r.settings);
  for (const std::string& n : r.notes) o += fmt::format("note: {}\n", n);
  o += fmt::format("\n{:<19} {:>11} {:>13} {:>7} {:>14} {:>13} {:>11}{}\n", "policy", "peak live", "peak reserved",
                   "ratio", "reserved-live", "largest free", "min budget",
                   r.budget > 0 ? fmt::format("  fits {}", b(static_cast<int64_t>(r.budget))) : "");
  for (const TorchPolicyRun& run : r.runs) {
    const ReplayResult& x = run.result;
    o += fmt::format("{:<19} {:>11} {:>13} {:>7.3f} {:>14} {:>13} {:>11}{}\n", x.policy, b(x.peak_live), b(x.peak_reserved),
                     x.ratio, b(x.peak_reserved - x.live_at_peak_reserved), b(x.largest_free_at_peak), b(run.min_budget),
                     r.budget > 0 ? std::string("  ") + (run.fits ? "yes" : "no") : "");
  }
  o += "replayed with unlimited memory (a request that ran out of memory in the recording is served where the policy "
       "can); peak live: the most bytes requested at once; reserved-live and largest free: when reserved reached its "
       "peak; min budget: the least device memory (in 2 MiB steps) the replay runs in\n";
  if (r.recorded_segments == 0 && r.recorded_peak_reserved == 0)
    o += "\ncalibration: the snapshot records no segment entries and no segments, nothing to compare with\n";
  else
    o += fmt::format("\ncalibration (pytorch policy, the snapshot's settings):\n  peak reserved  recorded {}  replayed {}{}\n",
                   b(r.recorded_peak_reserved), b(r.replayed_peak_reserved),
                   r.recorded_peak_reserved == r.replayed_peak_reserved ? "  (equal)" : "  (differ)");
  if (r.recorded_segments > 0 || r.recorded_peak_reserved > 0)
    o += fmt::format("  segment allocations  recorded {}  replayed {}  {}\n", r.recorded_segments, r.replayed_segments,
                   r.segments_match ? "identical (sizes and the allocation that asked for each)"
                                    : "differ: " + r.first_mismatch);
  for (const std::string& n : r.calibration_notes) o += "  note: " + n + "\n";
  if (!r.top_sites.empty()) {
    o += fmt::format("\nallocation sites holding the peak of live memory ({} at event {}):\n", b(r.peak_live),
                     r.peak_live_event + 1);
    for (const TorchSite& s : r.top_sites)
      o += fmt::format("  {:>11}  {:>5} block{}  {}\n", b(s.bytes), s.blocks, s.blocks == 1 ? " " : "s", s.site);
  }
  return o;
}

std::string torch_replay_report_svg(const TorchReplayReport& r) {
  std::vector<ReplayPanel> panels;
  for (const TorchPolicyRun& run : r.runs)
    panels.push_back({run.result.policy, run.result.series, run.result.peak_live, run.result.peak_reserved});
  return replay_timeline_svg(fmt::format("{} (device {}): live and reserved memory per policy", r.source, r.device),
                             panels, static_cast<int64_t>(r.budget));
}

// ---- explain ------------------------------------------------------------------------------------------------
std::vector<TorchOomExplanation> torch_explain(const TorchSnapshot& snap, const TorchReplayInput& in) {
  std::vector<TorchOomExplanation> out;
  const PolicyConfig own = torch_policy_by_name("pytorch", snap.settings);
  for (const TorchOom& oom : in.ooms) {
    TorchOomExplanation x;
    x.oom = oom;
    if (oom.site >= 0) x.site = snap.sites[static_cast<size_t>(oom.site)];
    x.capacity = oom.recorded_reserved + static_cast<int64_t>(oom.device_free);
    x.small_pool = oom.size <= kSmallSize;
    x.segment_size = torch_segment_size(oom.size);
    // The state just before the request, under the device's memory.
    ReplayOptions o;
    o.budget = static_cast<uint64_t>(x.capacity);
    o.stop_before = oom.event;
    o.keep_snapshot = true;
    const ReplayResult before = trace_replay(in.trace, own, o);
    const auto& st = before.snapshot.at("stats");
    x.reserved = st.at("reserved_bytes").at("current").get<int64_t>();
    x.live = st.at("requested_bytes").at("current").get<int64_t>();
    x.cache_free = x.reserved - st.at("active_bytes").at("current").get<int64_t>();
    const uint64_t stream = in.trace.events[static_cast<size_t>(oom.event)].stream;
    int64_t pinned_segments = 0;
    for (const auto& seg : before.snapshot.at("segments")) {
      const bool small = seg.at("pool") == "small";
      const uint64_t s = seg.at("stream").get<uint64_t>();
      bool has_free = false, has_live = false;
      for (const auto& blk : seg.at("blocks")) {
        if (blk.at("state") != "free") {
          has_live = true;
          continue;
        }
        has_free = true;
        const int64_t size = blk.at("size").get<int64_t>();
        ++x.free_blocks;
        if (small != x.small_pool) x.largest_other_pool = std::max(x.largest_other_pool, size);
        else if (s != stream) x.largest_other_stream = std::max(x.largest_other_stream, size);
        else x.largest_same = std::max(x.largest_same, size);
      }
      pinned_segments += has_free && has_live;
    }
    // Does the snapshot's own policy fail here too?
    ReplayOptions upto;
    upto.budget = static_cast<uint64_t>(x.capacity);
    upto.stop_before = oom.event + 1;
    x.reproduced = trace_replay(in.trace, own, upto).probes_failed > 0;
    // Why the cache could not serve it.
    const int64_t req = oom.size;
    const int64_t ms = snap.settings.max_split_size;
    if (x.largest_same >= req) {
      if (ms >= 0 && req < ms && x.largest_same >= ms)
        x.why = fmt::format("the largest free block of its pool and stream ({}) is an oversize block (at least "
                            "max_split_size, {}); PyTorch never splits those for a request below max_split_size",
                            b(x.largest_same), b(ms));
      else if (ms >= 0 && req >= ms)
        x.why = fmt::format("the free blocks of its pool and stream that are large enough exceed the request by 20 MiB "
                            "or more, and PyTorch gives an oversize request only a block less than 20 MiB larger");
      else
        x.why = fmt::format("a free block of {} on its stream could hold it in the replay, but not in the recording "
                            "(the replay differs here; see calibration)",
                            b(x.largest_same));
    } else if (x.largest_other_stream >= req) {
      x.why = fmt::format("a free block of {} could hold it, but it belongs to another stream: PyTorch reuses a block "
                          "only on the stream that allocated it (the request's largest is {})",
                          b(x.largest_other_stream), b(x.largest_same));
    } else if (x.largest_other_pool >= req) {
      x.why = fmt::format("a free block of {} could hold it, but in the {} pool: requests of at most 1 MiB and larger "
                          "ones never share blocks (size class)",
                          b(x.largest_other_pool), x.small_pool ? "large" : "small");
    } else if (x.cache_free >= req) {
      x.why = fmt::format("the cache holds {} free, more than the request, but in {} pieces of at most {}: {} segment{} "
                          "with free space also hold live blocks, so PyTorch can neither use the pieces nor give the "
                          "segments back to CUDA (fragmentation)",
                          b(x.cache_free), x.free_blocks, b(std::max({x.largest_same, x.largest_other_stream, x.largest_other_pool})),
                          pinned_segments, pinned_segments == 1 ? "" : "s");
    } else {
      x.why = fmt::format("no free block could hold it and the cache holds only {} free: the live memory ({}) leaves too "
                          "little room",
                          b(x.cache_free), b(x.live));
    }
    x.why += fmt::format("; CUDA had {} free, less than the {} segment the request needed", b(static_cast<int64_t>(oom.device_free)),
                         b(x.segment_size));
    // Settings that might have served it, each checked by replaying under the same memory.
    struct Candidate {
      std::string name;
      PolicyConfig policy;
    };
    std::vector<Candidate> cands;
    if (!snap.settings.expandable_segments)
      cands.push_back({"expandable_segments:True", torch_policy_by_name("pytorch-expandable", snap.settings)});
    for (int64_t mb : {64, 128, 256, 512}) {
      if (ms >= 0 && mb << 20 == ms) continue;
      if ((mb << 20) >= x.capacity) break;
      TorchAllocatorSettings s = snap.settings;
      s.max_split_size = mb << 20;
      PolicyConfig p = torch_policy_by_name("pytorch", s);
      cands.push_back({fmt::format("max_split_size_mb:{}", mb), p});
    }
    cands.push_back({"the ampforge policy", PolicyConfig::ampforge()});
    for (const Candidate& c : cands) {
      TorchFixTry t;
      t.setting = c.name;
      const ReplayResult rr = trace_replay(in.trace, c.policy, upto);
      t.serves = !rr.failed && rr.probes_failed == 0;
      t.peak_reserved = trace_replay(in.trace, c.policy).peak_reserved;
      x.tries.push_back(t);
      if (t.serves && x.fix.empty()) x.fix = c.name;
    }
    out.push_back(std::move(x));
  }
  return out;
}

nlohmann::json torch_explain_json(const std::vector<TorchOomExplanation>& e) {
  nlohmann::json a = nlohmann::json::array();
  for (const TorchOomExplanation& x : e) {
    nlohmann::json tries = nlohmann::json::array();
    for (const TorchFixTry& t : x.tries)
      tries.push_back({{"setting", t.setting}, {"serves_request", t.serves}, {"run_peak_reserved_bytes", t.peak_reserved}});
    a.push_back({{"event", x.oom.event},
                 {"request_bytes", x.oom.size},
                 {"pool", x.small_pool ? "small" : "large"},
                 {"stream", x.oom.stream},
                 {"site", x.site},
                 {"cuda_free_bytes", x.oom.device_free},
                 {"recorded_reserved_bytes", x.oom.recorded_reserved},
                 {"capacity_bytes", x.capacity},
                 {"segment_needed_bytes", x.segment_size},
                 {"replay_reserved_bytes", x.reserved},
                 {"live_bytes", x.live},
                 {"cache_free_bytes", x.cache_free},
                 {"free_blocks", x.free_blocks},
                 {"largest_free_block_same_pool_and_stream", x.largest_same},
                 {"largest_free_block_other_streams", x.largest_other_stream},
                 {"largest_free_block_other_pool", x.largest_other_pool},
                 {"reproduced_by_replay", x.reproduced},
                 {"why", x.why},
                 {"tries", tries},
                 {"fix", x.fix}});
  }
  return a;
}

std::string torch_explain_text(const TorchReplayInput& in, const std::vector<TorchOomExplanation>& e) {
  if (e.empty()) return fmt::format("{}: device {} recorded no out-of-memory error\n", in.trace.source, in.device);
  std::string o;
  for (size_t k = 0; k < e.size(); ++k) {
    const TorchOomExplanation& x = e[k];
    const TraceEvent& ev = in.trace.events[static_cast<size_t>(x.oom.event)];
    o += fmt::format("out of memory {} of {} (trace entry {}, stream {}): a request of {} ({} pool){}\n", k + 1, e.size(),
                     ev.line, ev.stream, b(x.oom.size), x.small_pool ? "small" : "large",
                     x.site.empty() ? "" : " from " + x.site);
    o += fmt::format("  CUDA reported free     {}\n", b(static_cast<int64_t>(x.oom.device_free)));
    o += fmt::format("  reserved by PyTorch    {} (recorded; replay {}), so the allocator could have had {}\n",
                     b(x.oom.recorded_reserved), b(x.reserved), b(x.capacity));
    o += fmt::format("  live                   {}\n", b(x.live));
    o += fmt::format("  free in the cache      {} in {} block{}; largest: {} on its pool and stream, {} on other "
                     "streams, {} in the other pool\n",
                     b(x.cache_free), x.free_blocks, x.free_blocks == 1 ? "" : "s", b(x.largest_same),
                     b(x.largest_other_stream), b(x.largest_other_pool));
    o += fmt::format("  why                    {}\n", x.why);
    o += fmt::format("  replay with the snapshot's settings in {}: {}\n", b(x.capacity),
                     x.reproduced ? "fails here too (reproduced)" : "serves it (the replay differs from the recording)");
    o += fmt::format("  tried, each replayed in {} up to this request:\n", b(x.capacity));
    for (const TorchFixTry& t : x.tries)
      o += fmt::format("    {:<26} {}; the run's peak reserved {}\n", t.setting, t.serves ? "serves it" : "fails too",
                       b(t.peak_reserved));
    if (x.fix.empty()) {
      o += "  => no setting tried avoids it: the run needs more memory than the device had (smaller batch, activation "
           "checkpointing, mixed precision)\n";
    } else {
      const TorchFixTry& t = *std::find_if(x.tries.begin(), x.tries.end(), [&](const TorchFixTry& y) { return y.setting == x.fix; });
      if (x.fix == "the ampforge policy")
        o += fmt::format("  => the ampforge policy serves it: the run's peak reserved is {} ({} available)\n",
                         b(t.peak_reserved), t.peak_reserved <= x.capacity ? "fits in the " + b(x.capacity) : "more than the");
      else
        o += fmt::format("  => PYTORCH_CUDA_ALLOC_CONF={}: with it the run's peak reserved is {}{}\n", x.fix,
                         b(t.peak_reserved),
                         t.peak_reserved <= x.capacity ? fmt::format(": it fits in {}", b(x.capacity)) : "");
    }
    o += "\n";
  }
  return o;
}

}  // namespace ampforge::memory
