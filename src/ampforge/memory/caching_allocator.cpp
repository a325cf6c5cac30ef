// The caching policy (rules in caching_allocator.h, reasoning in docs/MEMORY.md).
// Invariants kept by every member that holds mu_:
//   - a block is in exactly one state: allocated (in live_), pending (in pending_), or free (in its pool's
//     free set); address neighbours are never both free (frees coalesce);
//   - expandable segments: granule.live counts the allocated or pending blocks touching the granule; a
//     granule with live > 0 is mapped; a mapped granule with live == 0 is in idle_ (and nowhere else);
//   - stats_.reserved.current == bytes of plain segments + granule size * mapped granules;
//   - a granule is unmapped only after quiesce() of the stream of its segment in the same call (work
//     queued before its blocks were freed may still touch it; the driver's unmap does not wait).
#include "ampforge/memory/caching_allocator.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "ampforge/util/error.h"
#include "ampforge/util/file.h"
#include "ampforge/util/log.h"

namespace ampforge::memory {

namespace {
thread_local StreamId t_stream = kDefaultStream;
constexpr size_t kMaxRequest = size_t{1} << 60;
size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }
}  // namespace

// ---- configuration ----------------------------------------------------------------------------------
PolicyConfig PolicyConfig::ampforge() {
  PolicyConfig c;
  c.name = "ampforge";
  return c;
}

PolicyConfig PolicyConfig::pytorch() {
  PolicyConfig c;
  c.name = "pytorch";
  c.expandable_segments = false;
  c.hold_recent = 0;
  c.torch_rules = true;
  return c;
}

PolicyConfig PolicyConfig::pytorch_expandable() {
  PolicyConfig c = pytorch();
  c.name = "pytorch-expandable";
  c.expandable_segments = true;
  c.move_idle_granules = false;
  c.large_page = size_t{20} << 20;  // kLargeBuffer; the small pool's pages are 2 MiB, one host granule
  return c;
}

PolicyConfig PolicyConfig::naive() {
  PolicyConfig c;
  c.name = "naive";
  c.cache = false;
  c.hold_recent = 0;
  c.expandable_segments = false;
  c.exact_segments = true;
  return c;
}

PolicyConfig PolicyConfig::by_name(const std::string& name) {
  if (name == "ampforge") return ampforge();
  if (name == "pytorch") return pytorch();
  if (name == "naive") return naive();
  if (name == "pytorch-expandable") return pytorch_expandable();
  AF_THROW(InvalidArgument, "unknown allocator policy '{}'; expected naive, pytorch, pytorch-expandable or ampforge",
           name);
}

StreamId current_stream() { return t_stream; }
StreamGuard::StreamGuard(StreamId s) : previous_(t_stream) { t_stream = s; }
StreamGuard::~StreamGuard() { t_stream = previous_; }

// ---- construction -----------------------------------------------------------------------------------
CachingAllocator::CachingAllocator(Provider& provider, PolicyConfig config, StreamEvents* events)
    : provider_(provider), config_(std::move(config)), events_(events ? events : &host_events_) {
  AF_CHECK(config_.round_bytes >= 64 && (config_.round_bytes & (config_.round_bytes - 1)) == 0,
           "allocator round_bytes must be a power of two >= 64, got {}", config_.round_bytes);
  granule_ = provider_.granularity();
  expandable_ = config_.cache && config_.expandable_segments && provider_.supports_virtual();
  // Address space is cheap: a range of twice the device's memory rarely runs out, and when it does (holes
  // in the address space) another range is reserved.
  const size_t cap = provider_.capacity();
  capacity_ = cap;
  range_bytes_ = config_.virtual_range != 0 ? round_up(config_.virtual_range, granule_)
                 : cap != 0                  ? round_up(std::max(2 * cap, size_t{1} << 30), granule_)
                                             : size_t{64} << 30;
}

CachingAllocator::~CachingAllocator() {
  if (trace_ != nullptr) std::fclose(trace_);
  for (Pending& p : pending_)
    for (uint64_t t : p.tokens) events_->release(t);
  begin_call();
  for (auto& s : segments_) {
    if (s->expandable) {
      if (s->mapped > 0) {
        try {
          // Kernels queued on this stream may still use the memory: unmapping under them would fault.
          if (!quiesce(s->stream))
            log(LogLevel::Warn, "allocator '{}' destroyed while its stream is being captured into a CUDA graph; "
                "unmapping without waiting for it", name());
        } catch (const std::exception& e) {
          log(LogLevel::Warn, "allocator '{}': waiting for stream work before unmapping failed: {}", name(), e.what());
        }
      }
      for (size_t i = 0; i < s->granules.size(); ++i) {
        if (!s->granules[i].mapped) continue;
        provider_.unmap(reinterpret_cast<void*>(granule_addr(*s, i)));
        provider_.release_physical(s->granules[i].handle);
      }
      provider_.unreserve(reinterpret_cast<void*>(s->base), s->size);
    } else {
      provider_.deallocate(reinterpret_cast<void*>(s->base), s->size);
    }
  }
}

size_t CachingAllocator::round(size_t n) const {
  if (n < config_.round_bytes) return config_.round_bytes;
  // PyTorch's round_size with roundup_power2_divisions (PolicyConfig): the interval of n's power of two,
  // counted from 1 MiB and clamped to the 16 intervals; `d` equal steps between 2^k and 2^(k+1).
  int log2n = 63 - __builtin_clzll(static_cast<unsigned long long>(n));
  const size_t d = config_.roundup_power2_divisions[static_cast<size_t>(std::clamp(log2n - 20, 0, 15))];
  if (d > 1 && n > config_.round_bytes * d) {
    if ((n & (n - 1)) == 0) return n;
    const size_t floor2 = size_t{1} << log2n;
    const size_t step = floor2 >> (63 - __builtin_clzll(static_cast<unsigned long long>(d)));
    if (step == 0) return floor2 << 1;
    const size_t down = n & ~(step - 1);
    return down == n ? n : down + step;
  }
  return round_up(n, config_.round_bytes);
}

CachingAllocator::Block* CachingAllocator::new_block() {
  if (!spare_blocks_.empty()) {
    Block* b = spare_blocks_.back();
    spare_blocks_.pop_back();
    return b;
  }
  return &block_store_.emplace_back();
}

void CachingAllocator::delete_block(Block* b) {
  b->uses.clear();
  *b = Block{};
  spare_blocks_.push_back(b);
}

// ---- allocation -------------------------------------------------------------------------------------
void* CachingAllocator::allocate(size_t nbytes, Device device) {
  AF_ASSERT(device == provider_.device(), "allocator '{}' (for {}) asked for {} memory", name(),
            provider_.device().str(), device.str());
  return allocate_on(nbytes, t_stream);
}

void CachingAllocator::deallocate(void* ptr, size_t, Device) noexcept { free(ptr); }

void* CachingAllocator::allocate_on(size_t nbytes, StreamId stream) {
  std::unique_lock<std::mutex> lock(mu_);
  begin_call();
  // Larger than the whole device (or than any memory): fail at once, without emptying the cache for nothing.
  if (nbytes > kMaxRequest || (capacity_ != 0 && round(nbytes) > capacity_)) {
    flush_held();
    ++stats_.num_ooms;
    std::string report = oom_report_locked(nbytes, stream);
    lock.unlock();
    AF_THROW(OutOfMemory, "{}", report);
  }
  if (!deferred_.empty()) process_deferred();
  if (!pending_.empty()) process_events(false);
  const size_t size = round(nbytes);
  const int64_t calls_before = stats_.provider_calls;
  Block* b = held_.empty() ? nullptr : take_held(size, stream);
  if (b == nullptr) {
    flush_held();  // PolicyConfig::hold_recent: a request that is not an exact reuse sees the pools as they are
    b = try_allocate(size, stream);
  }
  if (b == nullptr) {
    ++stats_.num_retries;
    wait_unlocked(lock, /*pending=*/true);
    process_events(false);  // events recorded before the waits have completed
    release_cached();
    b = try_allocate(size, stream);
  }
  if (b == nullptr) {
    ++stats_.num_ooms;
    std::string report = oom_report_locked(nbytes, stream);
    lock.unlock();
    AF_THROW(OutOfMemory, "{}", report);
  }
  b->allocated = true;
  b->requested = nbytes;
  b->id = next_id_++;
  ++mutations_;
  live_.insert(b->addr, b);
  ++stats_.num_allocs;
  stats_.requested.add(static_cast<int64_t>(nbytes));
  stats_.allocated.add(static_cast<int64_t>(b->size));
  stats_.active.add(static_cast<int64_t>(b->size));
  if (stats_.provider_calls == calls_before) {
    ++stats_.cache_hits;
  } else if (stats_.reserved.current == stats_.reserved.peak) {
    stats_.fragmentation_at_peak = fragmentation_locked();
  }
  step_peak_allocated_ = std::max(step_peak_allocated_, stats_.allocated.current);
  step_peak_reserved_ = std::max(step_peak_reserved_, stats_.reserved.current);
  if (trace_ != nullptr) trace_alloc(b);
  return reinterpret_cast<void*>(b->addr);
}

CachingAllocator::Block* CachingAllocator::try_allocate(size_t size, StreamId stream) {
  const bool small = size <= config_.small_max;
  Fit f = config_.cache ? find_free(small, stream, size) : Fit{};
  // Rule 2's small requests in the large pool's range (expandable segments, ampforge rules).
  if (expandable_ && small && config_.cache && !config_.torch_rules &&
      (f.block == nullptr || untouched_granules(f.block, f.addr(size), size) > 0)) {
    const Fit g = find_free(false, stream, size);
    if (g.block != nullptr && untouched_granules(g.block, g.addr(size), size) == 0 &&
        unmapped_granules(*g.block->segment, g.addr(size), size, 1) == 0)
      f = g;
  }
  Block* b = f.block;
  if (b != nullptr) {
    pool(b->segment->small).erase(b);
    if (f.tail) b = split_tail(b, size);
  } else {
    b = expandable_ ? new_expandable_range(size, small, stream) : new_plain_segment(size, small, stream);
    if (b == nullptr) return nullptr;
  }
  split(b, size);
  if (expandable_ && !map_block(b, stream)) {
    free_block(b);
    return nullptr;
  }
  return b;
}

CachingAllocator::Fit CachingAllocator::find_free(bool small, StreamId stream, size_t size) {
  FreeSet& set = pool(small);
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return {};
  constexpr int kCandidates = 8;
  if (expandable_ && !config_.torch_rules) {
    // Reserved memory at a peak is the granules that live blocks touch: what a placement costs is the granules
    // it touches that no live block does yet (a free block's interior granules; its edge granules when no live
    // neighbour shares them). Placing the request at the start or at the end of a free block lets it share the
    // edge granule of either neighbour; with best fit alone (always the start) small blocks would each start a
    // granule of their own while the unused ends of their neighbours' granules stayed empty. Then the fewest
    // unmapped granules: address space is plentiful, map/unmap calls are not (each is a driver call on a GPU).
    // Then the better fit. Only the few best-fitting blocks are looked at: the request is served in bounded
    // time, and looking further did not lower the peaks of the test traces (docs/MEMORY.md, "Random mixes and
    // the 1.05 bound").
    Fit best;
    size_t best_new = SIZE_MAX, best_unmapped = SIZE_MAX;
    for (int n = 0; n < kCandidates && it != set.end() && (*it)->stream == stream; ++n, ++it) {
      Block* c = *it;
      for (int tail = 0; tail < (c->size > size ? 2 : 1); ++tail) {
        const Fit fit{c, tail == 1};
        const uintptr_t addr = fit.addr(size);
        const size_t fresh = untouched_granules(c, addr, size);
        if (fresh > best_new) continue;
        const size_t unmapped =
            unmapped_granules(*c->segment, addr, size, fresh < best_new ? SIZE_MAX : best_unmapped);
        if (fresh == best_new && unmapped >= best_unmapped) continue;
        best = fit;
        best_new = fresh;
        best_unmapped = unmapped;
      }
      if (best_new == 0 && best_unmapped == 0) break;  // nothing to map, nothing new touched: a cache hit
    }
    return best;
  }
  Block* b = *it;
  if (expandable_) {
    // PyTorch's expandable segments: among the few best-fitting blocks, the one that needs the fewest granules
    // mapped.
    Block* best = nullptr;
    size_t best_need = SIZE_MAX;
    for (int n = 0; n < kCandidates && it != set.end() && (*it)->stream == stream; ++n, ++it) {
      Block* c = *it;
      const size_t need = unmapped_granules(*c->segment, c->addr, size, best_need);
      if (need < best_need) {
        best = c;
        best_need = need;
        if (need == 0) break;
      }
    }
    if (best == nullptr) return {};
    // PyTorch's oversize rules look at a block's mapped size; the free end of a range, mostly unmapped address
    // space, is where PyTorch would map new pages instead, which it may always do.
    if (unmapped_granules(*best->segment, best->addr, best->size, 1) > 0) return {best};
    b = best;
  }
  if (config_.torch_rules) {
    // get_free_block: no oversize block for a request below max_split_size; an oversize request takes an
    // oversize block only when less than oversize_slack larger.
    if (size < config_.max_split_size && b->size >= config_.max_split_size) return {};
    if (size >= config_.max_split_size && b->size >= size + config_.oversize_slack) return {};
    return {b};
  }
  if (config_.max_split_size != SIZE_MAX) {
    // b is the smallest block that fits. Oversize blocks (never split) serve only oversize requests,
    // and only when they waste at most 1/8 of the request.
    if (size <= config_.max_split_size && b->size > config_.max_split_size) return {};
    if (size > config_.max_split_size && b->size - size > size / 8) return {};
  }
  return {b};
}

CachingAllocator::Block* CachingAllocator::new_plain_segment(size_t size, bool small, StreamId stream) {
  size_t seg_size;
  if (config_.exact_segments) seg_size = size;
  else if (small) seg_size = config_.small_segment;
  else if (size < config_.medium_max) seg_size = config_.medium_segment;
  else seg_size = round_up(size, config_.large_round);
  ++stats_.provider_calls;
  void* p = provider_.allocate(seg_size);
  if (p == nullptr) return nullptr;
  stats_.reserved.add(static_cast<int64_t>(seg_size));
  auto seg = std::make_unique<Segment>();
  seg->base = reinterpret_cast<uintptr_t>(p);
  seg->size = seg_size;
  seg->small = small;
  seg->stream = stream;
  seg->index = segments_.size();
  Block* b = new_block();
  b->addr = seg->base;
  b->size = seg_size;
  b->segment = seg.get();
  b->stream = stream;
  seg->first = b;
  segments_.push_back(std::move(seg));
  return b;
}

CachingAllocator::Block* CachingAllocator::new_expandable_range(size_t size, bool small, StreamId stream) {
  // Pages: the large pool's mapping unit (PolicyConfig::large_page), a whole number of granules.
  const size_t page = !small && config_.large_page > granule_ ? config_.large_page / granule_ : 1;
  const size_t unit = page * granule_;
  const size_t need = round_up(size, unit);
  size_t bytes = round_up(std::max(range_bytes_, need), unit);
  void* p = nullptr;
  // Reserving can fail when the address space is tight (sanitizers, 32-bit limits): halve down to the need.
  while (true) {
    ++stats_.provider_calls;
    p = provider_.reserve(bytes);
    if (p != nullptr || bytes == need) break;
    bytes = std::max(need, round_up(bytes / 2, unit));
  }
  if (p == nullptr) return nullptr;
  auto seg = std::make_unique<Segment>();
  seg->base = reinterpret_cast<uintptr_t>(p);
  seg->size = bytes;
  seg->small = small;
  seg->expandable = true;
  seg->stream = stream;
  seg->granules.resize(bytes / granule_);
  seg->page = page;
  seg->index = segments_.size();
  Block* b = new_block();
  b->addr = seg->base;
  b->size = bytes;
  b->segment = seg.get();
  b->stream = stream;
  seg->first = b;
  segments_.push_back(std::move(seg));
  return b;
}

void CachingAllocator::split(Block* b, size_t size) {
  const size_t remaining = b->size - size;
  bool do_split;
  if (!config_.cache) do_split = false;
  else if (expandable_ || b->segment->small) do_split = remaining >= config_.round_bytes;
  else if (config_.torch_rules) do_split = remaining > config_.small_max && size < config_.max_split_size;
  else do_split = remaining > config_.small_max && b->size <= config_.max_split_size;
  if (!do_split) return;
  Block* r = new_block();
  r->addr = b->addr + size;
  r->size = remaining;
  r->segment = b->segment;
  r->stream = b->stream;
  r->prev = b;
  r->next = b->next;
  if (b->next != nullptr) b->next->prev = r;
  b->next = r;
  b->size = size;
  pool(b->segment->small).insert(r);
}

CachingAllocator::Block* CachingAllocator::split_tail(Block* b, size_t size) {
  if (b->size == size) return b;
  Block* r = new_block();
  r->addr = b->addr + b->size - size;
  r->size = size;
  r->segment = b->segment;
  r->stream = b->stream;
  r->prev = b;
  r->next = b->next;
  if (b->next != nullptr) b->next->prev = r;
  b->next = r;
  b->size -= size;
  pool(b->segment->small).insert(b);
  return r;
}

// ---- expandable segments: granules ------------------------------------------------------------------
bool CachingAllocator::map_block(Block* b, StreamId stream) {
  Segment& s = *b->segment;
  const auto [first, last] = granules_of(s, b->addr, b->size);
  // The granules already mapped here first: were an idle one of them still in idle_ when an unmapped one
  // is filled, acquire_granule could move it away (a wait for its stream, an unmap and a map) and the
  // block would then need a new physical granule for its old place.
  for (size_t i = first; i <= last; ++i) {
    Granule& g = s.granules[i];
    if (!g.mapped) continue;
    if (g.live == 0) remove_idle(s, i);
    ++g.live;
  }
  for (size_t i = first; i <= last; ++i) {
    Granule& g = s.granules[i];
    if (g.mapped) continue;
    if (!acquire_granule(s, i, stream)) {
      // Undo: every mapped granule of the span holds one reference of this block (the first loop or an
      // acquisition here); i and the ones after it that are not mapped hold none.
      for (size_t j = first; j <= last; ++j)
        if (s.granules[j].mapped && --s.granules[j].live == 0) make_idle(s, j);
      return false;
    }
    ++g.live;
  }
  return true;
}

void CachingAllocator::unmap_block_refs(Block* b) {
  Segment& s = *b->segment;
  const auto [first, last] = granules_of(s, b->addr, b->size);
  for (size_t i = first; i <= last; ++i)
    if (--s.granules[i].live == 0) make_idle(s, i);
}

bool CachingAllocator::acquire_granule(Segment& s, size_t index, StreamId stream) {
  Granule& g = s.granules[index];
  uint64_t handle;
  // Move an idle granule here. Prefer one of the same stream among the most recently idled. The granule is
  // unmapped from its old address, which kernels queued on its segment's stream before its blocks were
  // freed may still touch: that stream is waited for first (quiesce, once per call). Granules of a stream
  // that is being captured into a CUDA graph cannot be waited for and stay where they are.
  size_t pick = SIZE_MAX;
  if (!idle_.empty() && config_.move_idle_granules) {
    for (size_t k = idle_.size(), n = 0; k-- > 0 && n < 8; ++n)
      if (idle_[k].segment->stream == stream) {
        pick = k;
        break;
      }
    if (pick == SIZE_MAX) pick = idle_.size() - 1;
    if (!quiesce(idle_[pick].segment->stream)) {
      pick = SIZE_MAX;
      for (size_t k = idle_.size(); k-- > 0;)
        if (quiesce(idle_[k].segment->stream)) {
          pick = k;
          break;
        }
    }
  }
  if (pick != SIZE_MAX) {
    const IdleRef ref = idle_[pick];
    Segment& os = *ref.segment;
    remove_idle(os, ref.index);
    Granule& og = os.granules[ref.index];
    ++stats_.provider_calls;
    provider_.unmap(reinterpret_cast<void*>(granule_addr(os, ref.index)));
    og.mapped = false;
    --os.mapped;
    handle = og.handle;
  } else {
    ++stats_.provider_calls;
    auto h = provider_.create_physical();
    if (!h) return false;
    handle = *h;
    stats_.reserved.add(static_cast<int64_t>(granule_));
  }
  ++stats_.provider_calls;
  provider_.map(reinterpret_cast<void*>(granule_addr(s, index)), handle);
  g.handle = handle;
  g.mapped = true;
  ++s.mapped;
  return true;
}

void CachingAllocator::make_idle(Segment& s, size_t index) {
  s.granules[index].idle_pos = idle_.size();
  idle_.push_back({&s, index});
}

void CachingAllocator::remove_idle(Segment& s, size_t index) {
  const size_t pos = s.granules[index].idle_pos;
  const IdleRef last = idle_.back();
  idle_[pos] = last;
  last.segment->granules[last.index].idle_pos = pos;
  idle_.pop_back();
  s.granules[index].idle_pos = SIZE_MAX;
}

// ---- free -------------------------------------------------------------------------------------------
void CachingAllocator::free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  Block** found = live_.find(reinterpret_cast<uintptr_t>(ptr));
  if (found == nullptr) {
    log(LogLevel::Error, "allocator '{}': free of {} which it did not allocate (ignored; this is a bug)", name(),
        ptr);
    return;
  }
  Block* b = *found;
  live_.erase(b->addr);
  ++mutations_;
  ++stats_.num_frees;
  stats_.requested.sub(static_cast<int64_t>(b->requested));
  stats_.allocated.sub(static_cast<int64_t>(b->size));
  b->allocated = false;
  if (trace_ != nullptr && b->traced) std::fprintf(trace_, "f %llu\n", static_cast<unsigned long long>(b->id));
  if (!b->uses.empty()) {
    retire_used_block(b);
    return;
  }
  if (config_.cache && config_.hold_recent > 0) {
    stats_.active.sub(static_cast<int64_t>(b->size));
    b->held = true;
    held_.push_back(b);
    if (held_.size() > static_cast<size_t>(config_.hold_recent)) release_held(0);
    return;
  }
  finish_free(b);
}

size_t CachingAllocator::unmapped_granules(const Segment& s, uintptr_t addr, size_t size, size_t stop) const {
  if (!s.expandable) return 0;
  const auto [first, last] = granules_of(s, addr, size);
  size_t n = 0;
  for (size_t i = first; i <= last && n < stop; ++i) n += !s.granules[i].mapped;
  return n;
}

size_t CachingAllocator::untouched_granules(const Block* free, uintptr_t addr, size_t size) const {
  // The granules inside a free block other than its first and last are touched by no other block.
  const Segment& s = *free->segment;
  const auto [first, last] = granules_of(s, addr, size);
  size_t n = last - first + 1;
  if (s.granules[first].live > 0) --n;
  if (last != first && s.granules[last].live > 0) --n;
  return n;
}

// The most recently held block of exactly `size` on `stream`, taken out of held_; null if none.
CachingAllocator::Block* CachingAllocator::take_held(size_t size, StreamId stream) {
  for (size_t i = held_.size(); i-- > 0;) {
    Block* b = held_[i];
    if (b->size != size || b->stream != stream) continue;
    held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
    b->held = false;
    return b;  // granule references were kept, so nothing to map
  }
  return nullptr;
}

// Gives held_[index] to the free pools: drops its granule references and coalesces it.
void CachingAllocator::release_held(size_t index) {
  Block* b = held_[index];
  held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(index));
  b->held = false;
  if (b->segment->expandable) unmap_block_refs(b);
  free_block(b);
}

void CachingAllocator::flush_held() {
  while (!held_.empty()) release_held(held_.size() - 1);
}

void CachingAllocator::wait_unlocked(std::unique_lock<std::mutex>& lock, bool pending) {
  if (events_ == &host_events_) return;  // host work is synchronous
  std::vector<StreamId> streams;
  auto add = [&](StreamId s) {
    if (std::find(streams.begin(), streams.end(), s) == streams.end() && !events_->is_capturing(s)) streams.push_back(s);
  };
  if (pending)
    for (const Pending& p : pending_)
      for (StreamId s : p.block->uses) add(s);
  for (const IdleRef& r : idle_) add(r.segment->stream);
  for (const Block* b : held_)
    if (b->segment->expandable) add(b->segment->stream);
  if (streams.empty()) return;
  const uint64_t before = mutations_;
  stats_.host_waits += static_cast<int64_t>(streams.size());
  lock.unlock();
  // Streams, not the pending blocks' events: another thread may complete and release those events while
  // this one waits, and a stream outlives every wait. (If a wait throws, the lock stays released and the
  // exception leaves allocate_on / empty_cache, whose unique_lock then has nothing to unlock.)
  for (StreamId s : streams) events_->synchronize_stream(s);
  lock.lock();
  if (mutations_ != before) {
    // Another thread freed (after queueing work on the block) or allocated meanwhile: a stream waited for
    // earlier in this call (quiesce) or by another call (which also shares synced_) may have new work on
    // memory that is idle now. Forget them all; release_cached() waits again where it unmaps.
    synced_.clear();
    return;
  }
  for (StreamId s : streams)
    if (std::find(synced_.begin(), synced_.end(), s) == synced_.end()) synced_.push_back(s);
}

void CachingAllocator::retire_used_block(Block* b) {
  b->pending = true;  // active until every use has finished
  // An event recorded on a stream that is being captured would be a node of the graph: it would mark no
  // eager work, and querying it says nothing about this memory. Wait until the capture has ended.
  for (StreamId s : b->uses)
    if (events_->is_capturing(s)) {
      deferred_.push_back(b);
      return;
    }
  Pending p{b, {}};
  try {
    for (StreamId s : b->uses) p.tokens.push_back(events_->record(s));
    pending_.push_back(std::move(p));
    return;
  } catch (const std::exception& e) {
    for (uint64_t t : p.tokens) events_->release(t);
    log(LogLevel::Warn, "allocator '{}': could not record a stream event ({}); waiting for the streams instead",
        name(), e.what());
  }
  // Without events there is no way to know later when the other streams are done: wait for them now.
  try {
    for (StreamId s : b->uses) {
      if (events_ != &host_events_) ++stats_.host_waits;
      events_->synchronize_stream(s);
    }
  } catch (const std::exception& e) {
    // Nothing says the streams are done: keep the block out of use and try again at the next call.
    log(LogLevel::Error, "allocator '{}': waiting for the streams that used a freed block failed ({}); the block "
        "stays unused until a later attempt succeeds", name(), e.what());
    deferred_.push_back(b);
    return;
  }
  finish_free(b);
}

// Blocks whose events were deferred: retried now (a capture may have ended, an event may be recordable).
void CachingAllocator::process_deferred() {
  std::vector<Block*> todo;
  todo.swap(deferred_);
  for (Block* b : todo) retire_used_block(b);
}

bool CachingAllocator::quiesce(StreamId stream) {
  if (events_ == &host_events_) return true;  // host work is synchronous
  if (std::find(synced_.begin(), synced_.end(), stream) != synced_.end()) return true;
  if (events_->is_capturing(stream)) return false;
  ++stats_.host_waits;
  events_->synchronize_stream(stream);
  synced_.push_back(stream);
  return true;
}

void CachingAllocator::wait_token(uint64_t token) {
  if (events_ != &host_events_) ++stats_.host_waits;
  events_->synchronize(token);
}

void CachingAllocator::finish_free(Block* b) {
  stats_.active.sub(static_cast<int64_t>(b->size));
  b->pending = false;
  b->uses.clear();
  if (!config_.cache) {
    release_segment(b->segment);
    return;
  }
  if (b->segment->expandable) unmap_block_refs(b);
  free_block(b);
}

void CachingAllocator::free_block(Block* b) {
  b->allocated = false;
  FreeSet& set = pool(b->segment->small);
  if (Block* p = b->prev; p != nullptr && !p->allocated && !p->pending && !p->held) {
    set.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete_block(b);
    b = p;
  }
  if (Block* n = b->next; n != nullptr && !n->allocated && !n->pending && !n->held) {
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete_block(n);
  }
  set.insert(b);
}

void CachingAllocator::process_events(bool wait) {
  for (size_t i = 0; i < pending_.size();) {
    bool done = true;
    for (uint64_t t : pending_[i].tokens) {
      if (wait) {
        wait_token(t);
      } else if (!events_->query(t)) {
        done = false;
        break;
      }
    }
    if (!done) {
      ++i;
      continue;
    }
    for (uint64_t t : pending_[i].tokens) events_->release(t);
    Block* b = pending_[i].block;
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
    finish_free(b);
  }
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.find(reinterpret_cast<uintptr_t>(ptr)) != nullptr;
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Block** found = live_.find(reinterpret_cast<uintptr_t>(ptr));
  AF_CHECK(found != nullptr, "record_stream: {} is not a live allocation of allocator '{}'", ptr, name());
  Block* b = *found;
  if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end())
    b->uses.push_back(stream);
}

// ---- giving memory back -----------------------------------------------------------------------------
void CachingAllocator::release_segment(Segment* s) {
  for (Block* b = s->first; b != nullptr;) {
    Block* next = b->next;
    if (!b->allocated && !b->pending && config_.cache) pool(s->small).erase(b);
    delete_block(b);
    b = next;
  }
  if (s->expandable) {
    if (s->mapped > 0) {
      // Not reached by the policy today (release_cached releases ranges with nothing mapped, and the naive
      // preset has no expandable segments), but no caller may unmap under queued work.
      bool waited = false;
      try {
        waited = quiesce(s->stream);
      } catch (const std::exception& e) {
        log(LogLevel::Warn, "allocator '{}': waiting for stream work before unmapping failed: {}", name(), e.what());
      }
      if (!waited) log(LogLevel::Warn, "allocator '{}': unmapping a segment without waiting for its stream", name());
    }
    for (size_t i = 0; i < s->granules.size(); ++i) {
      Granule& g = s->granules[i];
      if (!g.mapped) continue;
      if (g.idle_pos != SIZE_MAX) remove_idle(*s, i);
      stats_.provider_calls += 2;
      provider_.unmap(reinterpret_cast<void*>(granule_addr(*s, i)));
      provider_.release_physical(g.handle);
      stats_.reserved.sub(static_cast<int64_t>(granule_));
    }
    ++stats_.provider_calls;
    provider_.unreserve(reinterpret_cast<void*>(s->base), s->size);
  } else {
    ++stats_.provider_calls;
    provider_.deallocate(reinterpret_cast<void*>(s->base), s->size);
    stats_.reserved.sub(static_cast<int64_t>(s->size));
  }
  const size_t idx = s->index;
  segments_[idx] = std::move(segments_.back());
  segments_[idx]->index = idx;
  segments_.pop_back();  // destroys *s (the moved-from slot held it when idx was the last)
}

void CachingAllocator::release_cached() {
  flush_held();
  // Idle granules: unmap and release; they stop counting as reserved. Each granule's stream is waited for
  // first (once per stream); granules of a stream that is being captured stay mapped.
  for (size_t k = idle_.size(); k-- > 0;) {
    const IdleRef ref = idle_[k];
    Segment& s = *ref.segment;
    if (!quiesce(s.stream)) continue;
    Granule& g = s.granules[ref.index];
    remove_idle(s, ref.index);  // moves the last entry (already visited) to k
    stats_.provider_calls += 2;
    provider_.unmap(reinterpret_cast<void*>(granule_addr(s, ref.index)));
    provider_.release_physical(g.handle);
    g.mapped = false;
    --s.mapped;
    stats_.reserved.sub(static_cast<int64_t>(granule_));
  }
  // Segments (plain or expandable) that hold nothing at all.
  for (size_t i = segments_.size(); i-- > 0;) {
    Segment* s = segments_[i].get();
    Block* b = s->first;
    if (b->next == nullptr && !b->allocated && !b->pending && s->mapped == 0) release_segment(s);
  }
}

void CachingAllocator::empty_cache() {
  std::unique_lock<std::mutex> lock(mu_);
  begin_call();
  if (!deferred_.empty()) process_deferred();
  process_events(false);
  wait_unlocked(lock, /*pending=*/false);
  release_cached();
}

// ---- figures ----------------------------------------------------------------------------------------
// Counted as if the held blocks had been given back (flush_held), without giving them back: free runs are
// maximal runs of free and held blocks (what coalescing would make), and a granule that only held blocks
// touch counts as idle.
int64_t CachingAllocator::largest_free_block_locked() const {
  // Granule -> references held blocks keep on it. A map: a held block of a TiB spans half a million granules.
  std::unordered_map<const Granule*, uint32_t> held_refs;
  for (const Block* b : held_) {
    if (!b->segment->expandable) continue;
    const auto [first, last] = granules_of(*b->segment, b->addr, b->size);
    for (size_t i = first; i <= last; ++i) ++held_refs[&b->segment->granules[i]];
  }
  auto live = [&](const Segment& s, size_t i) {
    const Granule* g = &s.granules[i];
    const auto it = held_refs.find(g);
    return it == held_refs.end() ? g->live : g->live - it->second;
  };
  size_t idle = idle_.size();
  for (const auto& [g, n] : held_refs) idle += g->live == n;
  const size_t idle_bytes = idle * granule_;
  size_t best = 0;
  for (const auto& seg : segments_) {
    const Segment& s = *seg;
    for (const Block* b = s.first; b != nullptr;) {
      if (b->allocated || b->pending) {
        b = b->next;
        continue;
      }
      const uintptr_t start = b->addr;
      uintptr_t end = b->addr + b->size;
      for (b = b->next; b != nullptr && !b->allocated && !b->pending; b = b->next) end = b->addr + b->size;
      const size_t size = end - start;
      if (!s.expandable) {
        best = std::max(best, size);
        continue;
      }
      if (!config_.move_idle_granules) {
        // Pages stay where they are mapped: the longest mapped stretch of this free range.
        const size_t g0 = (start - s.base) / granule_, g1 = (end - 1 - s.base) / granule_;
        uintptr_t run = 0;
        for (size_t i = g0; i <= g1; ++i) {
          const uintptr_t lo = std::max(start, granule_addr(s, i)), hi = std::min(end, granule_addr(s, i + 1));
          if (!s.granules[i].mapped) {
            run = 0;
            continue;
          }
          run += hi - lo;
          best = std::max(best, static_cast<size_t>(run));
        }
        continue;
      }
      // What this free range can hold without new physical memory: its bytes inside granules that live
      // neighbours keep mapped (at most the two edge granules), plus as many idle granules as fit.
      const auto [first, last] = granules_of(s, start, size);
      size_t edge = 0;
      if (live(s, first) > 0) edge += std::min(end, granule_addr(s, first + 1)) - start;
      if (last != first && live(s, last) > 0) edge += end - granule_addr(s, last);
      best = std::max(best, edge + std::min(size - edge, idle_bytes));
    }
  }
  return static_cast<int64_t>(best);
}

double CachingAllocator::fragmentation_locked() const {
  const int64_t reserved_free = stats_.reserved.current - stats_.active.current;
  if (reserved_free <= 0) return 0.0;
  const double f = 1.0 - static_cast<double>(largest_free_block_locked()) / static_cast<double>(reserved_free);
  return std::clamp(f, 0.0, 1.0);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats s = stats_;
  s.largest_free_block = largest_free_block_locked();
  s.fragmentation = fragmentation_locked();
  return s;
}

CachingAllocator::Usage CachingAllocator::usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {stats_.requested.current, stats_.allocated.current, stats_.reserved.current};
}

int64_t CachingAllocator::largest_free_block() const {
  std::lock_guard<std::mutex> lock(mu_);
  return largest_free_block_locked();
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  flush_held();
  for (StatCounter* c : {&stats_.requested, &stats_.allocated, &stats_.active, &stats_.reserved}) c->reset_peak();
  stats_.fragmentation_at_peak = fragmentation_locked();
}

// ---- timeline and trace -----------------------------------------------------------------------------
void CachingAllocator::step() {
  std::lock_guard<std::mutex> lock(mu_);
  timeline_.push_back({step_, stats_.allocated.current, stats_.reserved.current,
                       std::max(step_peak_allocated_, stats_.allocated.current),
                       std::max(step_peak_reserved_, stats_.reserved.current)});
  ++step_;
  step_peak_allocated_ = stats_.allocated.current;
  step_peak_reserved_ = stats_.reserved.current;
  if (trace_ != nullptr) std::fputs("s\n", trace_);
}

std::vector<TimelinePoint> CachingAllocator::timeline() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timeline_;
}

void CachingAllocator::trace_start(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  AF_CHECK(trace_ == nullptr, "allocator '{}' is already recording a trace; call trace_stop() first", name());
  trace_ = std::fopen(path.c_str(), "w");
  if (trace_ == nullptr) AF_THROW(Io, "cannot write the memory trace '{}': {}", path, std::strerror(errno));
  std::fprintf(trace_, "# ampforge-memtrace v1\n# recorded by the '%s' allocator on %s (provider %s)\n", name(),
               provider_.device().str().c_str(), provider_.name());
  trace_streams_.clear();
}

void CachingAllocator::trace_stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (trace_ == nullptr) return;
  const bool bad = std::ferror(trace_) != 0;
  const bool close_failed = std::fclose(trace_) != 0;
  trace_ = nullptr;
  if (bad || close_failed) AF_THROW(Io, "writing the memory trace failed (disk full?)");
}

uint64_t CachingAllocator::trace_stream(StreamId s) {
  // Traces number streams densely in order of first use; the default stream is 0.
  if (s == kDefaultStream) return 0;
  for (size_t i = 0; i < trace_streams_.size(); ++i)
    if (trace_streams_[i] == s) return i + 1;
  trace_streams_.push_back(s);
  return trace_streams_.size();
}

void CachingAllocator::trace_alloc(const Block* b) {
  const_cast<Block*>(b)->traced = true;
  std::fprintf(trace_, "a %llu %llu %llu\n", static_cast<unsigned long long>(b->id),
               static_cast<unsigned long long>(b->requested), static_cast<unsigned long long>(trace_stream(b->stream)));
}

// ---- snapshot ---------------------------------------------------------------------------------------
nlohmann::json CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats st = stats_;
  st.largest_free_block = largest_free_block_locked();
  st.fragmentation = fragmentation_locked();
  nlohmann::json segs = nlohmann::json::array();
  std::vector<const Segment*> order;
  for (const auto& s : segments_) order.push_back(s.get());
  std::sort(order.begin(), order.end(), [](const Segment* a, const Segment* b) { return a->base < b->base; });
  for (const Segment* s : order) {
    nlohmann::json blocks = nlohmann::json::array();
    // An expandable range is mostly untouched address space: describe it up to the end of its last
    // mapped granule or used block.
    size_t extent = s->expandable ? 0 : s->size;
    // Held blocks are free memory: listed merged with their free neighbours, as coalescing would leave them.
    for (const Block* b = s->first; b != nullptr;) {
      if (!b->allocated && !b->pending) {
        const uintptr_t start = b->addr;
        uintptr_t end = b->addr + b->size;
        for (b = b->next; b != nullptr && !b->allocated && !b->pending; b = b->next) end = b->addr + b->size;
        blocks.push_back({{"offset", start - s->base}, {"size", end - start}, {"requested", 0}, {"state", "free"},
                          {"id", 0}});
        continue;
      }
      extent = std::max(extent, b->addr + b->size - s->base);
      blocks.push_back({{"offset", b->addr - s->base},
                        {"size", b->size},
                        {"requested", b->requested},
                        {"state", b->allocated ? "allocated" : "pending"},
                        {"id", b->id}});
      b = b->next;
    }
    nlohmann::json mapped = nlohmann::json::array();
    if (s->expandable) {
      for (size_t i = 0; i < s->granules.size();) {
        if (!s->granules[i].mapped) {
          ++i;
          continue;
        }
        size_t j = i;
        while (j < s->granules.size() && s->granules[j].mapped) ++j;
        mapped.push_back({i * granule_, (j - i) * granule_});
        extent = std::max(extent, j * granule_);
        i = j;
      }
    }
    segs.push_back({{"address", s->base},
                    {"size", s->size},
                    {"extent", extent},
                    {"pool", s->small ? "small" : "large"},
                    {"stream", s->stream},
                    {"expandable", s->expandable},
                    {"mapped_bytes", s->expandable ? s->mapped * granule_ : s->size},
                    {"mapped", mapped},
                    {"blocks", blocks}});
  }
  nlohmann::json timeline = nlohmann::json::array();
  for (const TimelinePoint& p : timeline_)
    timeline.push_back({{"step", p.step},
                        {"allocated", p.allocated},
                        {"reserved", p.reserved},
                        {"peak_allocated", p.peak_allocated},
                        {"peak_reserved", p.peak_reserved}});
  return {{"format", "ampforge-memory-snapshot v1"},
          {"policy", config_.name},
          {"provider", provider_.name()},
          {"device", provider_.device().str()},
          {"granularity", granule_},
          {"capacity", provider_.capacity()},
          {"expandable_segments", expandable_},
          {"stats", stats_to_json(st)},
          {"segments", segs},
          {"timeline", timeline}};
}

void CachingAllocator::write_snapshot(const std::string& path) const {
  write_file_atomically(path, snapshot().dump(1) + "\n", "memory snapshot");
}

// ---- OOM report -------------------------------------------------------------------------------------
std::string CachingAllocator::oom_report(size_t nbytes, StreamId stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  return oom_report_locked(nbytes, stream);
}

std::string CachingAllocator::oom_report_locked(size_t nbytes, StreamId stream) const {
  const auto b = [](int64_t n) { return format_bytes(n); };
  const int64_t req = static_cast<int64_t>(std::min(nbytes, kMaxRequest));
  const int64_t rounded = nbytes > kMaxRequest ? req : static_cast<int64_t>(round(nbytes));
  const int64_t allocated = stats_.allocated.current, reserved = stats_.reserved.current;
  const int64_t reserved_free = std::max<int64_t>(0, reserved - stats_.active.current);
  const int64_t largest = largest_free_block_locked();
  const double frag = fragmentation_locked();
  const int64_t cap = static_cast<int64_t>(provider_.capacity());
  std::string r;
  if (nbytes > kMaxRequest) {
    r += fmt::format("out of memory: a request of {} bytes is larger than any memory (over 1 EiB); it is probably "
                     "a size computed from garbage\n",
                     nbytes);
  } else {
    r += fmt::format("out of memory: could not allocate {} ({} bytes; {} after rounding) on {}, stream {}, with the "
                     "'{}' allocator\n",
                     b(req), nbytes, b(rounded), provider_.device().str(), stream, config_.name);
  }
  r += fmt::format("  provider            {}{}\n", provider_.name(),
                   cap > 0 ? fmt::format(", capacity {}", b(cap)) : std::string(", capacity unknown"));
  r += fmt::format("  allocated           {}  (live blocks; callers asked for {})\n", b(allocated),
                   b(stats_.requested.current));
  r += fmt::format("  reserved            {}  (physically backed memory held by the allocator)\n", b(reserved));
  r += fmt::format("  reserved but free   {}\n", b(reserved_free));
  r += fmt::format("  largest free block  {}  (the largest request that fits without new memory)\n", b(largest));
  r += fmt::format("  fragmentation       {:.1f}%  (1 - largest free block / reserved but free)\n", 100 * frag);
  // The biggest live allocations: usually the tensors to look at first.
  std::vector<const Block*> live;
  live.reserve(live_.size());
  live_.for_each([&](uintptr_t, const Block* blk) { live.push_back(blk); });
  const size_t top = std::min<size_t>(5, live.size());
  std::partial_sort(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(top), live.end(),
                    [](const Block* x, const Block* y) { return x->requested > y->requested; });
  if (top > 0) {
    r += fmt::format("  largest live allocations ({} live in total):\n", live.size());
    for (size_t i = 0; i < top; ++i)
      r += fmt::format("    {:>12}  allocation #{} on stream {}\n", b(static_cast<int64_t>(live[i]->requested)),
                       live[i]->id, live[i]->stream);
  }
  r += "  what to try:\n";
  if (cap > 0 && req > cap) {
    r += fmt::format("    - this one request is larger than the whole device ({}): no allocator setting can fit it; "
                     "split the tensor (smaller batch or sequence length)\n",
                     b(cap));
  }
  const int64_t available = largest + (cap > 0 ? std::max<int64_t>(0, cap - reserved) : 0);
  if (cap > 0 && rounded > available && allocated > 0) {
    const int64_t short_by = rounded - available;
    r += fmt::format("    - reduce the batch size: {} more is needed; activations grow linearly with the batch, so "
                     "a batch about {:.0f}% smaller frees roughly that much if activations dominate\n",
                     b(short_by), std::min(100.0, 100.0 * static_cast<double>(short_by) / static_cast<double>(allocated)));
  } else {
    r += "    - reduce the batch size (activation memory grows linearly with it)\n";
  }
  r += "    - train in mixed precision (bf16 or fp16 autocast): activations and their gradients take half the "
       "memory of fp32\n";
  r += "    - use activation checkpointing: keep only some layers' activations and recompute the rest in backward\n";
  if (!expandable_ && frag > 0.2 && reserved_free >= rounded) {
    r += fmt::format("    - fragmentation: {} is free inside the cache but the largest piece is {}; use expandable "
                     "segments (the ampforge policy), which moves free memory to where it is needed\n",
                     b(reserved_free), b(largest));
  } else if (!expandable_) {
    r += "    - use expandable segments (the ampforge policy) to keep reserved memory close to what is live\n";
  }
  r += "    - free tensors you no longer need (drop every reference): after this error the program can free memory "
       "and continue\n";
  return r;
}

}  // namespace ampforge::memory
