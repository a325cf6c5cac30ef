// PyTorch memory snapshots -> ampforge traces (torch_snapshot.h says what is read and how it is rebuilt).
#include "ampforge/memory/torch_snapshot.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "ampforge/memory/pickle.h"
#include "ampforge/memory/stats.h"
#include "ampforge/util/error.h"
#include "ampforge/util/file.h"

namespace ampforge::memory {

namespace {

// PyTorch's kLargeBuffer (c10/cuda/CUDACachingAllocator.cpp): large-pool pages of expandable segments, and how
// much larger than an oversize request an oversize block may be.
constexpr size_t kTorchLargeBuffer = size_t{20} << 20;

// Where a value sits, for messages; formatted only when there is an error (a snapshot has ~10^5 entries).
struct Loc {
  enum Kind : uint8_t { Text, Device, Entry, Segment, Blocks, Block };
  Kind kind = Text;
  const char* text = "";
  size_t x = 0, y = 0;
  Loc(const char* t) : text(t) {}  // NOLINT: implicit from a literal
  Loc(Kind k, size_t a, size_t b = 0) : kind(k), x(a), y(b) {}
  std::string str() const {
    switch (kind) {
      case Text: return text;
      case Device: return fmt::format("device_traces[{}]", x);
      case Entry: return fmt::format("device_traces[{}][{}]", x, y);
      case Segment: return fmt::format("segments[{}]", x);
      case Blocks: return fmt::format("segments[{}].blocks", x);
      case Block: return fmt::format("segments[{}].blocks[{}]", x, y);
    }
    return text;
  }
};

class Reader {
 public:
  Reader(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const Loc& loc, const std::string& what) const {
    const std::string where = loc.str();
    AF_THROW(InvalidArgument, "{}: {}{}{}", source_, where, where.empty() ? "" : ": ", what);
  }
  const PyValue& need(const PyValue& d, const char* key, const Loc& where) const {
    const PyValue* v = d.get(key);
    if (v == nullptr) fail(where, fmt::format("the key '{}' is missing", key));
    return *v;
  }
  int64_t integer(const PyValue& v, const char* key, const Loc& where) const {
    if (v.kind == PyValue::Bool) return v.i;
    if (v.kind != PyValue::Int || v.big) fail(where, fmt::format("'{}' is a {}, expected an integer", key, v.type_name()));
    return v.i;
  }
  uint64_t address(const PyValue& v, const char* key, const Loc& where) const {
    if (v.kind != PyValue::Int) fail(where, fmt::format("'{}' is a {}, expected an integer", key, v.type_name()));
    if (!v.big && v.i < 0) fail(where, fmt::format("'{}' is negative ({})", key, v.i));
    return v.u();
  }
  // Streams are cudaStream_t values stored as int64: keep the bits.
  uint64_t stream(const PyValue& v, const Loc& where) const {
    if (v.kind != PyValue::Int) fail(where, fmt::format("'stream' is a {}, expected an integer", v.type_name()));
    return v.u();
  }
  int64_t size(const PyValue& v, const char* key, const Loc& where) const {
    const int64_t n = integer(v, key, where);
    if (n < 0) fail(where, fmt::format("'{}' is negative ({})", key, n));
    if (n > kTorchMaxSize)
      fail(where, fmt::format("'{}' is {} bytes, more than any device holds (at most 2^50); a damaged file?", key, n));
    return n;
  }
  const PyValue& list(const PyValue& v, const Loc& where) const {
    if (!v.is_list()) fail(where, fmt::format("a {} where a list was expected", v.type_name()));
    return v;
  }
  const PyValue& dict(const PyValue& v, const Loc& where) const {
    if (!v.is_dict()) fail(where, fmt::format("a {} where a dict was expected", v.type_name()));
    return v;
  }

  // The line that allocated, as its author would name it: the innermost frame of the first kind present among
  //   1. the user's Python (a .py file outside PyTorch and outside site-packages / dist-packages),
  //   2. other libraries' Python (einops, transformers, ...),
  //   3. the autograd node whose backward allocated (backward runs on the engine's threads: C++ frames only),
  //   4. C++ outside PyTorch, the interpreter and the C runtime (an extension's own kernels),
  // and PyTorch's own frames only when there is nothing else (the allocator's own last). Snapshots recorded with
  // context="all" start every stack with the allocator's and the dispatcher's C++ frames (torch::unwind,
  // gather_with_cpp, CUDACachingAllocator.cpp, at::empty_strided, ...): those say nothing about where the memory went.
  static int frame_kind(const std::string& file, const std::string& name) {
    auto has = [&](const char* part) { return file.find(part) != std::string::npos; };
    const bool python = file.size() > 3 && file.compare(file.size() - 3, 3, ".py") == 0;
    const bool torch = has("/torch/") || has("\\torch\\") || has("/torch\\") || has("\\torch/");
    if (!autograd_node(name).empty() || name.rfind("torch::autograd::Engine::evaluate_function", 0) == 0) return 3;
    for (const char* machinery : {"torch::unwind::", "CapturedTraceback", "gather_with_cpp", "CachingAllocator"})
      if (name.find(machinery) != std::string::npos) return 6;
    if (has("torchinductor_")) return 2;  // torch.compile's generated code: the user's line further out is the site
    if (file.empty() || file == "??" || file.rfind("<", 0) == 0 || torch || has("libstdc++")) return 5;
    if (python) return has("site-packages") || has("dist-packages") ? 2 : 1;
    for (const char* ours : {"at::", "THP", "pybind11::", "_Py", "Py", "__libc", "_start", "start_thread", "__clone",
                             "execute_native_thread_routine"})
      if (name.rfind(ours, 0) == 0) return 5;
    // Namespaces anywhere in the name: return types and template arguments come first in C++ frame names.
    for (const char* ours : {"torch::", "c10::", "c10d::", " at::", "<at::", "(at::"})
      if (name.find(ours) != std::string::npos) return 5;
    return 4;
  }
  // "torch::autograd::generated::ConvolutionBackward0::apply(...)" -> "ConvolutionBackward0" (AccumulateGrad,
  // CopyBackwards, ... alike); "" for anything else.
  static std::string autograd_node(const std::string& name) {
    const size_t apply = name.find("::apply(");
    if (apply == std::string::npos || name.rfind("torch::autograd::", 0) != 0) return {};
    const size_t start = name.rfind("::", apply - 1);
    std::string node = name.substr(start == std::string::npos ? 0 : start + 2, apply - (start + 2));
    return node;
  }
  int32_t site(const PyValue* frames, TorchSnapshot& snap) {
    if (frames == nullptr || !frames->is_list() || frames->items.empty()) return -1;
    const PyValue* pick = nullptr;
    int pick_kind = 7;
    for (const PyRef& f : frames->items) {
      if (!f->is_dict()) continue;
      const PyValue* file = f->get("filename");
      if (file == nullptr || !file->is_str()) continue;
      const PyValue* fname = f->get("name");
      const int kind = frame_kind(file->s, fname != nullptr && fname->is_str() ? fname->s : std::string());
      if (kind < pick_kind) {
        pick = f.get();
        pick_kind = kind;
        if (kind == 1) break;
      }
    }
    if (pick == nullptr) return -1;
    const PyValue* line = pick->get("line");
    const PyValue* name = pick->get("name");
    const std::string function = name != nullptr && name->is_str() ? name->s : std::string("?");
    const std::string node = pick_kind == 3 ? autograd_node(function) : std::string();
    std::string text = pick_kind == 3 ? (node.empty() ? std::string("autograd engine (backward)")
                                                      : fmt::format("{} (autograd backward)", node))
                                      : fmt::format("{}:{} {}", pick->get("filename")->s,
                                                    line != nullptr && line->is_int() ? line->i : 0, function);
    // Printed to terminals: control and non-ASCII bytes as \xNN, at most 300 characters.
    text = excerpt_for_message(text, 300);
    const auto [it, added] = sites_.emplace(text, static_cast<int32_t>(snap.sites.size()));
    if (added) snap.sites.push_back(text);
    return it->second;
  }

 private:
  const std::string& source_;
  std::unordered_map<std::string, int32_t> sites_;
};

bool action_from(const std::string& s, TorchTraceEntry::Action& a) {
  using A = TorchTraceEntry;
  static const std::pair<const char*, A::Action> table[] = {
      {"alloc", A::Alloc},           {"free_requested", A::FreeRequested}, {"free_completed", A::FreeCompleted},
      {"free", A::FreeCompleted},    {"segment_alloc", A::SegmentAlloc},   {"segment_free", A::SegmentFree},
      {"segment_map", A::SegmentMap}, {"segment_unmap", A::SegmentUnmap},  {"snapshot", A::Snapshot},
      {"oom", A::Oom}};
  for (const auto& [name, act] : table)
    if (s == name) {
      a = act;
      return true;
    }
  return false;
}

}  // namespace

std::string TorchAllocatorSettings::describe() const {
  std::string s = fmt::format("expandable_segments:{}", expandable_segments ? "True" : "False");
  if (max_split_size >= 0) s += fmt::format(",max_split_size_mb:{}", max_split_size >> 20);
  bool any = false;
  for (uint16_t d : roundup_power2_divisions) any |= d > 1;
  if (any) {
    s += ",roundup_power2_divisions:[";
    for (size_t k = 0; k < roundup_power2_divisions.size(); ++k)
      s += fmt::format("{}{}:{}", k ? "," : "", size_t{1} << k, roundup_power2_divisions[k]);
    s += "]";
  }
  return s;
}

TorchSnapshot torch_snapshot_parse(std::string_view bytes, const std::string& source) {
  if (!looks_like_pickle(bytes))
    AF_THROW(InvalidArgument,
             "{}: not a PyTorch memory snapshot: a pickle of protocol 2 to 5 starts with the bytes 80 02..05, this file "
             "starts with '{}'",
             source, excerpt_for_message(bytes.substr(0, 8)));
  const PyRef root = pickle_load(bytes, source);
  Reader rd(source);
  TorchSnapshot snap;
  snap.source = source;
  if (!root->is_dict())
    rd.fail("", fmt::format("the pickle holds a {}, but a memory snapshot is a dict (what "
                            "torch.cuda.memory._snapshot() returns)",
                            root->type_name()));
  const PyValue* traces = root->get("device_traces");
  if (traces == nullptr)
    rd.fail("", "no 'device_traces': the snapshot has no allocation history. Record one with "
                "torch.cuda.memory._record_memory_history() before the run (docs/MEMORY.md)");
  rd.list(*traces, "device_traces");

  // ---- settings ----
  if (const PyValue* st = root->get("allocator_settings"); st != nullptr && st->is_dict()) {
    TorchAllocatorSettings& s = snap.settings;
    s.recorded = true;
    if (const PyValue* v = st->get("max_split_size"); v != nullptr && v->is_int()) {
      // PyTorch stores SIZE_MAX as int64: -1. Anything else is bytes.
      s.max_split_size = v->big || v->i < 0 ? -1 : v->i;
    }
    if (const PyValue* v = st->get("expandable_segments"); v != nullptr)
      s.expandable_segments = (v->kind == PyValue::Bool || v->kind == PyValue::Int) && v->i != 0;
    if (const PyValue* v = st->get("garbage_collection_threshold"); v != nullptr && v->kind == PyValue::Float)
      s.garbage_collection_threshold = v->f;
    if (const PyValue* v = st->get("PYTORCH_CUDA_ALLOC_CONF"); v != nullptr && v->is_str()) s.conf = v->s.substr(0, 500);
    if (const PyValue* v = st->get("roundup_power2_divisions"); v != nullptr && v->is_dict()) {
      for (size_t k = 0; k + 1 < v->items.size(); k += 2) {
        const PyValue& key = *v->items[k];
        const PyValue& val = *v->items[k + 1];
        // Keys are "1", "2", "4", ... (MiB at the interval's start), values the divisions.
        if (!key.is_str() || !val.is_int()) rd.fail("allocator_settings.roundup_power2_divisions", "expected str: int");
        uint64_t mib = 0;
        for (char c : key.s) {
          if (c < '0' || c > '9' || mib > (uint64_t{1} << 40)) rd.fail("allocator_settings.roundup_power2_divisions",
                                                                      fmt::format("key '{}' is not a number of MiB", excerpt_for_message(key.s)));
          mib = mib * 10 + static_cast<uint64_t>(c - '0');
        }
        if (mib == 0 || (mib & (mib - 1)) != 0 || mib > (uint64_t{1} << 15))
          rd.fail("allocator_settings.roundup_power2_divisions",
                  fmt::format("key '{}' is not a power of two from 1 to 32768", excerpt_for_message(key.s)));
        if (val.big || val.i < 0 || val.i > 65535)
          rd.fail("allocator_settings.roundup_power2_divisions", fmt::format("divisions {} out of range", val.i));
        size_t idx = 0;
        while ((uint64_t{1} << idx) < mib) ++idx;
        s.roundup_power2_divisions[idx] = static_cast<uint16_t>(val.i);
      }
    }
  }
  if (const PyValue* v = root->get("trace_alloc_overflowed"); v != nullptr)
    snap.overflowed = (v->kind == PyValue::Bool || v->kind == PyValue::Int) && v->i != 0;
  if (const PyValue* v = root->get("trace_alloc_max_entries"); v != nullptr && v->is_int() && !v->big)
    snap.max_entries = v->i;

  // ---- segments ----
  if (const PyValue* segs = root->get("segments"); segs != nullptr) {
    rd.list(*segs, "segments");
    for (size_t i = 0; i < segs->items.size(); ++i) {
      const Loc w(Loc::Segment, i);
      const PyValue& sd = rd.dict(*segs->items[i], w);
      TorchSegment s;
      if (const PyValue* d = sd.get("device")) s.device = static_cast<int>(std::clamp<int64_t>(rd.integer(*d, "device", w), -1, 1 << 20));
      s.address = rd.address(rd.need(sd, "address", w), "address", w);
      s.total_size = rd.size(rd.need(sd, "total_size", w), "total_size", w);
      if (const PyValue* v = sd.get("stream")) s.stream = rd.stream(*v, w);
      if (const PyValue* v = sd.get("segment_type"); v != nullptr && v->is_str()) s.large = v->s != "small";
      if (const PyValue* v = sd.get("is_expandable"); v != nullptr) s.expandable = v->i != 0 && v->kind != PyValue::None;
      const PyValue& blocks = rd.list(rd.need(sd, "blocks", w), Loc(Loc::Blocks, i));
      uint64_t offset = s.address;
      for (size_t j = 0; j < blocks.items.size(); ++j) {
        const Loc wb(Loc::Block, i, j);
        const PyValue& bd = rd.dict(*blocks.items[j], wb);
        TorchBlock b;
        b.size = rd.size(rd.need(bd, "size", wb), "size", wb);
        // Older snapshots list blocks without addresses: they tile the segment in order (as MemoryViz assumes).
        b.address = bd.get("address") != nullptr ? rd.address(*bd.get("address"), "address", wb) : offset;
        offset = b.address + static_cast<uint64_t>(b.size);
        b.requested_size = bd.get("requested_size") != nullptr ? rd.size(*bd.get("requested_size"), "requested_size", wb) : b.size;
        const PyValue& st = rd.need(bd, "state", wb);
        if (!st.is_str()) rd.fail(wb, "'state' is not a string");
        if (st.s == "active_allocated") b.state = TorchBlock::Allocated;
        else if (st.s == "active_pending_free" || st.s == "active_awaiting_free") b.state = TorchBlock::PendingFree;
        else if (st.s == "inactive") b.state = TorchBlock::Inactive;
        else rd.fail(wb, fmt::format("unknown block state '{}'", excerpt_for_message(st.s)));
        b.site = rd.site(bd.get("frames"), snap);
        s.blocks.push_back(b);
      }
      snap.segments.push_back(std::move(s));
    }
  }

  // ---- traces ----
  for (size_t dev = 0; dev < traces->items.size(); ++dev) {
    const PyValue& tl = rd.list(*traces->items[dev], Loc(Loc::Device, dev));
    std::vector<TorchTraceEntry> out;
    out.reserve(tl.items.size());
    for (size_t k = 0; k < tl.items.size(); ++k) {
      const Loc w(Loc::Entry, dev, k);
      const PyValue& e = rd.dict(*tl.items[k], w);
      TorchTraceEntry t;
      const PyValue& act = rd.need(e, "action", w);
      if (!act.is_str()) rd.fail(w, fmt::format("'action' is a {}, expected a string", act.type_name()));
      if (!action_from(act.s, t.action)) {
        ++snap.ignored_entries;
        continue;
      }
      if (t.action == TorchTraceEntry::Oom) {
        if (const PyValue* v = e.get("device_free")) t.addr = static_cast<uint64_t>(rd.size(*v, "device_free", w));
      } else if (t.action != TorchTraceEntry::Snapshot) {
        t.addr = rd.address(rd.need(e, "addr", w), "addr", w);
      }
      t.size = rd.size(rd.need(e, "size", w), "size", w);
      if (const PyValue* v = e.get("stream")) t.stream = rd.stream(*v, w);
      if (const PyValue* v = e.get("time_us"); v != nullptr && v->is_int()) {
        t.time_us = v->i;
        snap.has_time = true;
      }
      t.site = rd.site(e.get("frames"), snap);
      out.push_back(t);
    }
    snap.device_traces.push_back(std::move(out));
  }
  return snap;
}

TorchSnapshot torch_snapshot_read(const std::string& path) {
  check_readable_file(path, "memory snapshot");
  std::ifstream in(path, std::ios::binary);
  if (!in) AF_THROW(Io, "cannot open the memory snapshot '{}': {}", path, std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) AF_THROW(Io, "reading the memory snapshot '{}' failed: {}", path, std::strerror(errno));
  return torch_snapshot_parse(bytes, path);
}

namespace {

// "device 1 (5123 entries), device 3 (12 entries)": the devices that recorded something.
std::string devices_with_entries(const TorchSnapshot& snap) {
  std::string out;
  for (size_t d = 0; d < snap.device_traces.size(); ++d) {
    if (snap.device_traces[d].empty()) continue;
    out += fmt::format("{}device {} ({} entr{})", out.empty() ? "" : ", ", d, snap.device_traces[d].size(),
                       snap.device_traces[d].size() == 1 ? "y" : "ies");
  }
  return out;
}

[[noreturn]] void fail_no_history(const TorchSnapshot& snap, const std::string& what) {
  int64_t reserved = 0, allocated = 0;
  std::set<int> devices;
  for (const TorchSegment& s : snap.segments) {
    devices.insert(s.device);
    reserved += s.total_size;
    for (const TorchBlock& b : s.blocks)
      if (b.state != TorchBlock::Inactive) allocated += b.size;
  }
  std::string state;
  if (!snap.segments.empty()) {
    std::string ids;
    for (int d : devices) ids += fmt::format("{}{}", ids.empty() ? "" : ", ", d);
    state = fmt::format("; it shows only the state when it was taken: {} segment{} on device{} {}, {} reserved, {} allocated",
                        snap.segments.size(), snap.segments.size() == 1 ? "" : "s", devices.size() == 1 ? "" : "s", ids,
                        format_bytes(reserved), format_bytes(allocated));
  }
  AF_THROW(InvalidArgument,
           "{}: {}, so there is no allocation history to replay{}. Record one with torch.cuda.memory._record_memory_history("
           "max_entries=100000) before the work and torch.cuda.memory._dump_snapshot(\"snap.pickle\") after it "
           "(docs/MEMORY.md)",
           snap.source, what, state);
}

}  // namespace

int torch_default_device(const TorchSnapshot& snap) {
  for (size_t d = 0; d < snap.device_traces.size(); ++d)
    if (!snap.device_traces[d].empty()) return static_cast<int>(d);
  fail_no_history(snap, snap.device_traces.empty() ? "the snapshot has no device traces" : "no device recorded a trace entry");
}

TorchReplayInput torch_trace_build(const TorchSnapshot& snap, int device) {
  AF_CHECK(device >= 0 && static_cast<size_t>(device) < snap.device_traces.size(),
           "{}: device {} is not in the snapshot: it has traces for {} device{}{}", snap.source, device,
           snap.device_traces.size(), snap.device_traces.size() == 1 ? "" : "s",
           snap.device_traces.empty() ? "" : fmt::format(" (0 to {})", snap.device_traces.size() - 1));
  const auto& entries = snap.device_traces[static_cast<size_t>(device)];
  if (entries.empty()) {
    const std::string others = devices_with_entries(snap);
    AF_CHECK(others.empty(), "{}: device {} recorded no trace entries; these did: {} (--device N)", snap.source, device,
             others);
    fail_no_history(snap, "no device recorded a trace entry");
  }
  TorchReplayInput in;
  in.device = device;
  in.entries = static_cast<int64_t>(entries.size());
  std::unordered_map<uint64_t, uint64_t> stream_index;
  stream_index[0] = 0;
  in.streams.push_back(0);
  auto dense = [&](uint64_t raw) {
    const auto [it, added] = stream_index.emplace(raw, in.streams.size());
    if (added) in.streams.push_back(raw);
    return it->second;
  };
  struct Slot {
    uint64_t id = 0;
    bool live = false;
  };
  std::unordered_map<uint64_t, Slot> slots;  // address -> the block last allocated there
  slots.reserve(entries.size() / 2 + 16);
  std::vector<TraceEvent> pre, body;
  std::vector<int32_t> pre_site, body_site;
  body.reserve(entries.size());
  body_site.reserve(entries.size());
  uint64_t next_id = 1;
  int64_t reserved = 0, peak = 0;
  std::vector<std::pair<int64_t, int64_t>> segs;  // (body index, bytes)
  auto where = [&](size_t k) { return fmt::format("{}: device_traces[{}][{}]", snap.source, device, k); };
  // Segment frees outside an out-of-memory error are the program emptying the cache (torch.cuda.empty_cache(), or
  // PyTorch freeing its cache to retry a cudaMalloc that then succeeded): each run of them becomes one EmptyCache
  // event, so every policy's cache is emptied where PyTorch's was. A run right before an `oom` entry is the retry
  // that failed: the replay's own policies retry (or not) by their rules.
  int64_t free_run = 0;
  auto end_free_run = [&](bool oom) {
    if (free_run > 0 && !oom) {
      TraceEvent t;
      t.kind = TraceEvent::EmptyCache;
      body.push_back(t);
      body_site.push_back(-1);
      in.empty_cache_frees += free_run;
      ++in.empty_cache_calls;
    }
    free_run = 0;
  };
  // A recording that starts by emptying the cache (empty_cache() right after _record_memory_history()) starts at
  // a reserved level no replay can know (the cached free memory is not in the trace): its peak is counted from the
  // first entry after those frees.
  bool leading = true;
  for (size_t k = 0; k < entries.size(); ++k) {
    const TorchTraceEntry& e = entries[k];
    if (e.action != TorchTraceEntry::SegmentFree && e.action != TorchTraceEntry::SegmentUnmap &&
        e.action != TorchTraceEntry::Snapshot) {
      end_free_run(e.action == TorchTraceEntry::Oom);
      if (leading && in.freed_at_start > 0) peak = reserved;
      leading = false;
    }
    switch (e.action) {
      case TorchTraceEntry::Alloc: {
        Slot& s = slots[e.addr];
        AF_CHECK(!s.live, "{}: alloc at address 0x{:x}, which is already allocated (no free was recorded for it)",
                 where(k), e.addr);
        AF_CHECK(static_cast<uint64_t>(e.size) <= kTraceMaxBytes, "{}: alloc of {} bytes (at most 2^44 are replayed)",
                 where(k), e.size);
        s = {next_id++, true};
        TraceEvent t;
        t.kind = TraceEvent::Alloc;
        t.id = s.id;
        t.bytes = static_cast<uint64_t>(e.size);
        t.stream = dense(e.stream);
        t.line = static_cast<int64_t>(k) + 1;
        body.push_back(t);
        body_site.push_back(e.site);
        break;
      }
      case TorchTraceEntry::FreeRequested:
      case TorchTraceEntry::FreeCompleted: {
        auto it = slots.find(e.addr);
        if (it == slots.end()) {
          // Allocated before the first entry: its allocation goes at the start.
          AF_CHECK(static_cast<uint64_t>(e.size) <= kTraceMaxBytes, "{}: free of {} bytes (at most 2^44 are replayed)",
                   where(k), e.size);
          it = slots.emplace(e.addr, Slot{next_id++, true}).first;
          TraceEvent t;
          t.kind = TraceEvent::Alloc;
          t.id = it->second.id;
          t.bytes = static_cast<uint64_t>(e.size);
          t.stream = dense(e.stream);
          pre.push_back(t);
          pre_site.push_back(e.site);
          in.bytes_before_recording += e.size;
        } else if (!it->second.live) {
          AF_CHECK(false,
                   "{}: {} of address 0x{:x}, which is not allocated: its block was freed already at an earlier entry "
                   "and nothing was allocated there since",
                   where(k), e.action == TorchTraceEntry::FreeRequested ? "free_requested" : "free_completed", e.addr);
        }
        if (e.action == TorchTraceEntry::FreeCompleted) {
          TraceEvent t;
          t.kind = TraceEvent::Free;
          t.id = it->second.id;
          t.line = static_cast<int64_t>(k) + 1;
          body.push_back(t);
          body_site.push_back(-1);
          it->second.live = false;
        }
        break;
      }
      case TorchTraceEntry::SegmentAlloc:
      case TorchTraceEntry::SegmentMap:
        reserved += e.size;
        peak = std::max(peak, reserved);
        segs.emplace_back(static_cast<int64_t>(body.size()), e.size);
        break;
      case TorchTraceEntry::SegmentFree:
      case TorchTraceEntry::SegmentUnmap:
        reserved -= e.size;
        ++free_run;
        if (leading) in.freed_at_start += e.size;
        break;
      case TorchTraceEntry::Oom: {
        TorchOom o;
        o.event = static_cast<int64_t>(body.size());
        o.size = e.size;
        o.device_free = e.addr;
        o.stream = e.stream;
        o.recorded_reserved = reserved;  // made absolute below
        o.site = e.site;
        in.ooms.push_back(o);
        TraceEvent t;
        t.kind = TraceEvent::Alloc;
        t.flags = TraceEvent::kProbe;
        t.id = next_id++;
        t.bytes = std::min<uint64_t>(static_cast<uint64_t>(e.size), kTraceMaxBytes);
        t.stream = dense(e.stream);
        t.line = static_cast<int64_t>(k) + 1;
        body.push_back(t);
        body_site.push_back(e.site);
        break;
      }
      case TorchTraceEntry::Snapshot: break;
    }
  }
  end_free_run(false);
  if (leading && in.freed_at_start > 0) peak = reserved;
  // Blocks alive at the end with no recorded allocation.
  int64_t final_reserved = 0;
  bool any_segment = false;
  for (const TorchSegment& s : snap.segments) {
    if (s.device != device) continue;
    any_segment = true;
    final_reserved += s.total_size;
    for (const TorchBlock& b : s.blocks) {
      if (b.state == TorchBlock::Inactive) continue;
      auto it = slots.find(b.address);
      if (it != slots.end() && it->second.live) continue;
      AF_CHECK(static_cast<uint64_t>(b.requested_size) <= kTraceMaxBytes, "{}: a block of {} bytes (at most 2^44)",
               snap.source, b.requested_size);
      TraceEvent t;
      t.kind = TraceEvent::Alloc;
      t.id = next_id++;
      t.bytes = static_cast<uint64_t>(b.requested_size);
      t.stream = dense(s.stream);
      pre.push_back(t);
      pre_site.push_back(b.site);
      in.bytes_before_recording += b.requested_size;
      slots[b.address] = {t.id, true};
    }
  }
  // Reserved memory before the first entry: what the segments hold at the end minus what the entries added.
  in.recorded_reserved_start = any_segment ? std::max<int64_t>(0, final_reserved - reserved) : 0;
  in.recorded_peak_reserved = in.recorded_reserved_start + peak;
  in.recorded_reserved_end = in.recorded_reserved_start + reserved;
  const int64_t shift = static_cast<int64_t>(pre.size());
  in.allocs_before_recording = shift;
  for (auto& [idx, bytes] : segs) in.recorded_segments.emplace_back(idx + shift, bytes);
  for (TorchOom& o : in.ooms) {
    o.event += shift;
    o.recorded_reserved += in.recorded_reserved_start;
  }
  in.trace.source = snap.source;
  in.trace.events = std::move(pre);
  in.trace.events.insert(in.trace.events.end(), body.begin(), body.end());
  in.site = std::move(pre_site);
  in.site.insert(in.site.end(), body_site.begin(), body_site.end());
  in.wrapped = snap.overflowed || (snap.max_entries > 0 && in.entries >= snap.max_entries);
  if (in.wrapped)
    in.notes.push_back(fmt::format(
        "the ring buffer wrapped (max_entries {}): the oldest entries were dropped; {} blocks ({}) whose "
        "allocation was lost are placed at the start",
        snap.max_entries, in.allocs_before_recording, format_bytes(in.bytes_before_recording)));
  else if (in.allocs_before_recording > 0)
    in.notes.push_back(fmt::format(
        "{} blocks ({}) were allocated before the first entry (recording began after them, or the ring buffer "
        "dropped their allocation): placed at the start, as PyTorch's viewer does",
        in.allocs_before_recording, format_bytes(in.bytes_before_recording)));
  if (snap.ignored_entries > 0)
    in.notes.push_back(fmt::format("{} entries of actions this reader does not know were skipped", snap.ignored_entries));
  int recording_devices = 0;
  for (const auto& t : snap.device_traces) recording_devices += !t.empty();
  if (recording_devices > 1)
    in.notes.push_back(fmt::format("this is device {}; the devices that recorded entries are {} (--device N for another)",
                                   device, devices_with_entries(snap)));
  if (in.empty_cache_frees > 0)
    in.notes.push_back(fmt::format("{} segments were given back outside an out-of-memory retry "
                                   "(torch.cuda.empty_cache()), at {} point{}: the replay empties every policy's cache there",
                                   in.empty_cache_frees, in.empty_cache_calls, in.empty_cache_calls == 1 ? "" : "s"));
  return in;
}

PolicyConfig torch_policy(const TorchAllocatorSettings& s, bool expandable) {
  PolicyConfig c = PolicyConfig::pytorch();
  if (s.max_split_size >= 0) c.max_split_size = static_cast<size_t>(s.max_split_size);
  c.roundup_power2_divisions = s.roundup_power2_divisions;
  if (expandable) {
    c.name = "pytorch-expandable";
    c.expandable_segments = true;
    c.move_idle_granules = false;
    c.large_page = kTorchLargeBuffer;
  }
  return c;
}

}  // namespace ampforge::memory
