#include "ampforge/memory/trace.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "ampforge/memory/budgeted_provider.h"
#include "ampforge/memory/host_provider.h"
#include "ampforge/util/error.h"
#include "ampforge/util/file.h"

namespace ampforge::memory {

namespace {

constexpr const char* kHeader = "# ampforge-memtrace v1";

// Splits on spaces and tabs.
std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

Trace trace_parse(std::istream& in, const std::string& source) {
  Trace t;
  t.source = source;
  std::unordered_set<uint64_t> live;
  std::string line;
  int64_t n = 0;
  bool header = false;
  auto fail = [&](const std::string& msg) { AF_THROW(InvalidArgument, "{}:{}: {}", source, n, msg); };
  auto number = [&](std::string_view f, const char* what, uint64_t max) {
    uint64_t v = 0;
    const bool digits = !f.empty() && f.find_first_not_of("0123456789") == std::string_view::npos;
    if (!digits) fail(fmt::format("{} '{}' is not an unsigned decimal integer", what, excerpt_for_message(f)));
    const auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
    if (ec != std::errc() || p != f.data() + f.size() || v > max)
      fail(fmt::format("{} {} is out of range (at most {})", what, excerpt_for_message(f), max));
    return v;
  };
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!header) {
      if (line != kHeader)
        fail(fmt::format("expected the header line '{}', found '{}' (is this an ampforge memory trace?)", kHeader,
                         excerpt_for_message(line)));
      header = true;
      continue;
    }
    const auto f = fields(line);
    if (f.empty() || f[0][0] == '#') continue;
    TraceEvent e;
    e.line = n;
    if (f[0] == "a") {
      if (f.size() != 4) fail(fmt::format("'a' takes 3 fields (a <id> <bytes> <stream>), found {}", f.size() - 1));
      e.kind = TraceEvent::Alloc;
      e.id = number(f[1], "id", UINT64_MAX);
      e.bytes = number(f[2], "size", kTraceMaxBytes);
      e.stream = number(f[3], "stream", kTraceMaxStream);
      if (!live.insert(e.id).second) fail(fmt::format("allocation id {} is already live (freed ids may be reused, live ones not)", e.id));
    } else if (f[0] == "f") {
      if (f.size() != 2) fail(fmt::format("'f' takes 1 field (f <id>), found {}", f.size() - 1));
      e.kind = TraceEvent::Free;
      e.id = number(f[1], "id", UINT64_MAX);
      if (live.erase(e.id) == 0) fail(fmt::format("free of id {}, which is not live", e.id));
    } else if (f[0] == "s") {
      if (f.size() != 1) fail("'s' takes no fields");
      e.kind = TraceEvent::Step;
    } else if (f[0] == "e") {
      if (f.size() != 1) fail("'e' takes no fields");
      e.kind = TraceEvent::EmptyCache;
    } else {
      fail(fmt::format("unknown event '{}'; expected a (allocation), f (free), s (step) or e (empty_cache)",
                       excerpt_for_message(f[0])));
    }
    t.events.push_back(e);
  }
  if (!header) AF_THROW(InvalidArgument, "{}: empty file; expected the header line '{}'", source, kHeader);
  return t;
}

Trace trace_read(const std::string& path) {
  check_readable_file(path, "memory trace");
  std::ifstream in(path);
  if (!in) AF_THROW(Io, "cannot open the memory trace '{}': {}", path, std::strerror(errno));
  return trace_parse(in, path);
}

void trace_write(const Trace& trace, std::ostream& out, const std::string& comment) {
  out << kHeader << "\n";
  if (!comment.empty()) {
    std::istringstream c(comment);
    std::string l;
    while (std::getline(c, l)) out << "# " << l << "\n";
  }
  for (const TraceEvent& e : trace.events) {
    switch (e.kind) {
      case TraceEvent::Alloc: out << "a " << e.id << ' ' << e.bytes << ' ' << e.stream << '\n'; break;
      case TraceEvent::Free: out << "f " << e.id << '\n'; break;
      case TraceEvent::Step: out << "s\n"; break;
      case TraceEvent::EmptyCache: out << "e\n"; break;
    }
  }
}

void trace_write_file(const Trace& trace, const std::string& path, const std::string& comment) {
  std::ostringstream out;
  trace_write(trace, out, comment);
  write_file_atomically(path, out.str(), "memory trace");
}

namespace {

// Passes every call to `inner` and notes the memory it hands out and takes back (ReplayOptions::segment_log).
class LoggingProvider final : public Provider {
 public:
  LoggingProvider(Provider& inner, std::vector<std::pair<int64_t, int64_t>>& log) : inner_(inner), log_(log) {}
  int64_t event = 0;

  const char* name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  size_t granularity() const override { return inner_.granularity(); }
  size_t capacity() const override { return inner_.capacity(); }
  void* allocate(size_t bytes) override {
    void* p = inner_.allocate(bytes);
    if (p != nullptr) log_.emplace_back(event, static_cast<int64_t>(bytes));
    return p;
  }
  void deallocate(void* ptr, size_t bytes) noexcept override {
    log_.emplace_back(event, -static_cast<int64_t>(bytes));
    inner_.deallocate(ptr, bytes);
  }
  bool supports_virtual() const override { return inner_.supports_virtual(); }
  void* reserve(size_t bytes) override { return inner_.reserve(bytes); }
  void unreserve(void* base, size_t bytes) noexcept override { inner_.unreserve(base, bytes); }
  std::optional<uint64_t> create_physical() override { return inner_.create_physical(); }
  void release_physical(uint64_t handle) noexcept override { inner_.release_physical(handle); }
  void map(void* addr, uint64_t handle) override {
    inner_.map(addr, handle);
    log_.emplace_back(event, static_cast<int64_t>(inner_.granularity()));
  }
  void unmap(void* addr) noexcept override {
    log_.emplace_back(event, -static_cast<int64_t>(inner_.granularity()));
    inner_.unmap(addr);
  }

 private:
  Provider& inner_;
  std::vector<std::pair<int64_t, int64_t>>& log_;
};

}  // namespace

ReplayResult trace_replay(const Trace& trace, const PolicyConfig& policy, const ReplayOptions& options) {
  SimulatedProvider device(options.granule);
  std::vector<std::pair<int64_t, int64_t>> unused_log;
  LoggingProvider logging(device, options.segment_log != nullptr ? *options.segment_log : unused_log);
  Provider& base = options.segment_log != nullptr ? static_cast<Provider&>(logging) : static_cast<Provider&>(device);
  BudgetedProvider budgeted(base, options.budget);
  Provider& provider = options.budget > 0 ? static_cast<Provider&>(budgeted) : base;
  CachingAllocator alloc(provider, policy);
  ReplayResult r;
  r.policy = policy.name;
  bool has_steps = false;
  int64_t allocs = 0;
  for (const TraceEvent& e : trace.events) {
    has_steps |= e.kind == TraceEvent::Step;
    allocs += e.kind == TraceEvent::Alloc;
  }
  // Without step lines, sample the timeline about 200 times over the run.
  const int64_t sample_every = std::max<int64_t>(1, allocs / 200);
  const int64_t n_events = static_cast<int64_t>(trace.events.size());
  const int64_t bucket =
      options.series_points > 0 ? std::max<int64_t>(1, (n_events + options.series_points - 1) / options.series_points) : 0;
  ReplayPoint pt;
  std::unordered_map<uint64_t, std::pair<void*, uint64_t>> live;  // id -> (pointer, requested bytes)
  live.reserve(1024);
  int64_t index = 0, live_bytes = 0, reserved_best = 0;
  for (const TraceEvent& e : trace.events) {
    if (options.stop_before >= 0 && index >= options.stop_before) break;
    ++index;
    logging.event = index - 1;
    if (e.kind == TraceEvent::Alloc) {
      void* p = nullptr;
      try {
        p = alloc.allocate_on(e.bytes, e.stream);
      } catch (const Error& err) {
        if (err.kind() != ErrorKind::OutOfMemory) throw;
        if ((e.flags & TraceEvent::kProbe) != 0) {
          ++r.probes_failed;
          r.events = index;
          continue;
        }
        r.failed = true;
        r.failed_line = e.line > 0 ? e.line : index;
        r.failed_bytes = e.bytes;
        r.oom_report = err.what();
        break;
      }
      const CachingAllocator::Usage u = alloc.usage();
      if (u.reserved > reserved_best) {
        reserved_best = u.reserved;
        r.live_at_peak_reserved = u.requested;
        r.largest_free_at_peak = alloc.largest_free_block();
      }
      if ((e.flags & TraceEvent::kProbe) != 0) {
        ++r.probes_served;
        alloc.free(p);
      } else {
        live[e.id] = {p, e.bytes};
        live_bytes += static_cast<int64_t>(e.bytes);
      }
      if (!has_steps && index % sample_every == 0) alloc.step();
      if (bucket > 0) {
        pt.live = std::max(pt.live, u.requested);
        pt.reserved = std::max(pt.reserved, u.reserved);
      }
    } else if (e.kind == TraceEvent::Free) {
      auto it = live.find(e.id);
      AF_CHECK(it != live.end(), "{}: event {}: free of id {} which is not live (the trace was not validated)",
               trace.source, index, e.id);
      alloc.free(it->second.first);
      live_bytes -= static_cast<int64_t>(it->second.second);
      live.erase(it);
    } else if (e.kind == TraceEvent::EmptyCache) {
      alloc.empty_cache();
    } else {
      alloc.step();
    }
    if (bucket > 0 && (index % bucket == 0 || index == n_events)) {
      const CachingAllocator::Usage u = alloc.usage();
      pt.event = index;
      pt.live = std::max(pt.live, live_bytes);
      pt.reserved = std::max(pt.reserved, u.reserved);
      r.series.push_back(pt);
      pt = ReplayPoint{index, live_bytes, u.reserved};
    }
    r.events = index;
  }
  r.stats = alloc.stats();
  // Requested bytes: a served probe counts as live for its moment (the reserved memory it took is in the peak too).
  r.peak_live = r.stats.requested.peak;
  r.peak_reserved = r.stats.reserved.peak;
  r.ratio = r.peak_live > 0 ? static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_live) : 0.0;
  if (options.keep_snapshot) r.snapshot = alloc.snapshot();
  for (auto& kv : live) alloc.free(kv.second.first);
  return r;
}

nlohmann::json replay_result_to_json(const ReplayResult& r) {
  nlohmann::json j = {{"policy", r.policy},
                      {"peak_live_bytes", r.peak_live},
                      {"peak_reserved_bytes", r.peak_reserved},
                      {"peak_reserved_over_peak_live", r.ratio},
                      {"provider_calls", r.stats.provider_calls},
                      {"allocations", r.stats.num_allocs},
                      {"cache_hits", r.stats.cache_hits},
                      {"fragmentation_at_peak", r.stats.fragmentation_at_peak},
                      {"events_replayed", r.events},
                      {"stats", stats_to_json(r.stats)},
                      {"failed", r.failed},
                      {"live_at_peak_reserved_bytes", r.live_at_peak_reserved},
                      {"largest_free_block_at_peak_bytes", r.largest_free_at_peak}};
  if (r.failed) {
    j["failed_line"] = r.failed_line;
    j["failed_bytes"] = r.failed_bytes;
    j["oom_report"] = r.oom_report;
  }
  return j;
}

}  // namespace ampforge::memory
