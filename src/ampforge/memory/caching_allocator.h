// CachingAllocator: the caching policy. Device-agnostic: it takes segments (or virtual ranges and
// physical granules) from a Provider and carves blocks out of them. docs/MEMORY.md explains the policy
// and defines every figure it reports.
//
// Rules, in order of an allocation:
//   1. Round the request up to a multiple of 512 bytes (0 becomes 512). Rounded sizes <= 1 MiB go to the
//      small pool, the rest to the large pool. Pools are further keyed by stream.
//   2. Best fit: the smallest free block of the pool and stream that is large enough (ties: lowest
//      address). With plain segments, blocks larger than max_split_size are never split: they serve only
//      requests larger than max_split_size that waste at most 1/8 of the block.
//      Expandable segments (ampforge rules): among the 8 best-fitting free blocks, the request goes at the
//      start or the end of one, wherever it touches the fewest granules that no live block touches yet, then
//      the fewest unmapped granules, then the better fit. Reserved memory at a peak is the granules live
//      blocks touch, so a request that fits in the unused part of a granule a live neighbour already holds
//      costs nothing there, where best fit alone would start a granule of its own. A small request that
//      would touch a granule no live block touches goes instead into the large pool's range when one of its
//      8 best-fitting free blocks has room in granules that live blocks touch and that are mapped: the partly
//      used granules at the edges of large blocks take small blocks that would each need a granule of the
//      small pool's own.
//   3. No fit: new memory from the provider.
//        plain segments      a segment of: 2 MiB (small pool), 20 MiB (requests under 10 MiB), or the
//                            request rounded up to 2 MiB (config; the naive preset asks for exactly the
//                            request and never caches);
//        expandable segments one large virtual range per (pool, stream); blocks are carved from its
//                            address space and only granules touched by live blocks need physical memory.
//   4. Split the block when the remainder is worth keeping (small pool: >= 512 bytes; large pool: > 1 MiB;
//      expandable segments: >= 512 bytes).
//   5. Expandable: map every granule the block touches. A granule that is already mapped is reused; else
//      an idle granule (mapped, touched by no live block) is unmapped from its old address and mapped here;
//      only when there is none is a new physical granule created. So reserved grows only when every granule
//      held is in use, and peak reserved stays close to peak live.
//   6. Out of memory: wait for pending cross-stream frees, give cached memory back to the provider, retry
//      once; then raise Error(OutOfMemory) whose message is the OOM report. The allocator stays usable.
// Frees coalesce with free neighbours. A block used on another stream (record_stream) is reused only when
// that stream's work queued before the free has finished (StreamEvents): an event is recorded on each such
// stream at the free. When a use stream is being captured into a CUDA graph the record is deferred until
// the capture has ended (an event recorded during a capture is a graph node, not a mark in eager work);
// when recording fails, the allocator waits for the use streams themselves before the block is reused.
// Unmapping (expandable segments: moving an idle granule, giving idle granules back) first waits for the
// work queued on the stream that used the granule, once per allocator call and stream: the driver's unmap
// does not wait for kernels that may still touch the address.
//
// Thread safety: every public member takes one mutex; the cache-hit path is a few set/map operations.
// Waits for device work on the slow paths (a retry after the provider ran dry, empty_cache) happen with the
// mutex released (wait_unlocked), so other threads keep allocating and freeing meanwhile. Readers (stats,
// snapshot, the OOM report, timeline) change nothing: figures are computed as if the held blocks were
// given back, without giving them back.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/core/allocator.h"
#include "ampforge/memory/fast_containers.h"
#include "ampforge/memory/provider.h"
#include "ampforge/memory/stats.h"

namespace ampforge::memory {

struct PolicyConfig {
  std::string name = "ampforge";
  bool cache = true;                // false: every allocation is a provider call, every free gives it back
  bool expandable_segments = true;  // used when the provider supports virtual memory
  bool exact_segments = false;      // plain segments of exactly the rounded request (naive)
  size_t round_bytes = 512;
  size_t small_max = size_t{1} << 20;        // rounded requests up to this go to the small pool
  size_t small_segment = size_t{2} << 20;    // plain segment size of the small pool
  size_t medium_max = size_t{10} << 20;      // large requests below this come from medium segments
  size_t medium_segment = size_t{20} << 20;  // plain segment size for those
  size_t large_round = size_t{2} << 20;      // larger requests: a segment of the request rounded to this
  size_t max_split_size = SIZE_MAX;          // plain segments: blocks larger than this are never split
  size_t virtual_range = 0;                  // bytes of address space per expandable range; 0: automatic
  // Recently freed blocks kept as they are (not coalesced, not back in the free pools) for an exact-size
  // reuse: a free followed by a request of the same size (a loop's temporaries) then skips the split/coalesce
  // churn (two tree erases and inserts per allocate + free). Any other request gives them back to the pools
  // before it is placed, so placement always sees the free space as it is (held blocks left in place split
  // the free blocks around them and keep their granules counted as live: rule 2 then packs worse); and they
  // are given back before any figure or snapshot, so reserved memory and reports are as without them. 0 turns
  // it off (the pytorch preset).
  int hold_recent = 16;
  // PyTorch's exact rules (pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp, round_size, should_split,
  // get_free_block), for replaying PyTorch's own recordings (memory/torch_snapshot.h):
  //   - roundup_power2_divisions[k] > 1: a request in [2^k MiB, 2^(k+1) MiB) (k = 0 also below 1 MiB, k = 15 also
  //     above) larger than 512 x divisions is rounded up to the next of `divisions` equal steps between two powers
  //     of two (a power of two stays as it is); PYTORCH_CUDA_ALLOC_CONF roundup_power2_divisions;
  //   - torch_rules: a plain large block is split only when the request is below max_split_size (ours: when the
  //     block is not above it); an oversize block (>= max_split_size) serves only requests >= max_split_size that
  //     are smaller than the block by less than oversize_slack (PyTorch: kLargeBuffer, 20 MiB), ours a 1/8 waste;
  //     the oversize rules hold under expandable segments too;
  //   - move_idle_granules = false: PyTorch's expandable segments map pages where they are and keep them mapped
  //     while free (until the cache is emptied or an allocation fails); ours moves idle granules (rule 5);
  //   - large_page: the large pool's expandable segments map in pages of this many bytes (PyTorch: 20 MiB; the
  //     small pool maps 2 MiB pages); 0: one granule.
  std::array<uint16_t, 16> roundup_power2_divisions{};
  bool torch_rules = false;
  size_t oversize_slack = size_t{20} << 20;
  bool move_idle_granules = true;
  size_t large_page = 0;

  // The three policies of `ampforge memory replay`.
  static PolicyConfig ampforge();  // expandable segments with granule reuse
  static PolicyConfig pytorch();   // PyTorch's documented caching rules, no expandable segments
  static PolicyConfig naive();     // no cache: a provider call per allocation and per free
  // PyTorch with expandable_segments:True: its pages (2 MiB small pool, 20 MiB large pool) mapped in place.
  static PolicyConfig pytorch_expandable();
  // By name: "ampforge", "pytorch", "pytorch-expandable", "naive"; anything else is an InvalidArgument error.
  static PolicyConfig by_name(const std::string& name);
};

// The stream that Allocator::allocate() (no stream parameter) uses on this thread; 0 by default.
StreamId current_stream();
class StreamGuard {
 public:
  explicit StreamGuard(StreamId s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  StreamId previous_;
};

// One entry of the per-step timeline (step() appends one).
struct TimelinePoint {
  int64_t step = 0;
  int64_t allocated = 0;       // at the step boundary
  int64_t reserved = 0;
  int64_t peak_allocated = 0;  // highest since the previous boundary
  int64_t peak_reserved = 0;
};

class CachingAllocator final : public Allocator {
 public:
  // `provider` and `events` are not owned and must outlive the allocator; events = nullptr means the host
  // rule (one stream, synchronous).
  CachingAllocator(Provider& provider, PolicyConfig config = PolicyConfig::ampforge(), StreamEvents* events = nullptr);
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // ---- Allocator interface (stream: current_stream()) ----------------------------------------------
  void* allocate(size_t nbytes, Device device) override;
  void deallocate(void* ptr, size_t nbytes, Device device) noexcept override;
  const char* name() const override { return config_.name.c_str(); }

  // ---- the policy's own interface ------------------------------------------------------------------
  // Memory for `nbytes` on `stream`, aligned to 512 bytes. Throws Error(OutOfMemory) with the report.
  void* allocate_on(size_t nbytes, StreamId stream);
  // Frees a pointer from allocate()/allocate_on(). Unknown pointers are a bug (reported at debug level
  // and ignored: this never throws).
  void free(void* ptr) noexcept;
  // Marks that `stream` uses the block of `ptr` (which belongs to another stream): after free, the block
  // is reused only once the work queued on `stream` before the free has finished.
  void record_stream(void* ptr, StreamId stream);
  // Whether `ptr` is a live allocation of this allocator (routing frees among several allocators: a CUDA
  // graph's private pool beside the device's main one).
  bool owns(const void* ptr) const;
  // Gives every cached (free) segment and idle granule back to the provider. Live blocks stay.
  void empty_cache();

  AllocatorStats stats() const;
  // The byte counters now, without the figures stats() computes (cheap: for sampling a replay).
  struct Usage {
    int64_t requested = 0, allocated = 0, reserved = 0;
  };
  Usage usage() const;
  int64_t largest_free_block() const;
  void reset_peak_stats();
  // Snapshot of segments, blocks, stats and the timeline (see docs/MEMORY.md "Snapshots").
  nlohmann::json snapshot() const;
  void write_snapshot(const std::string& path) const;
  // The OOM report for a request of `nbytes` as it would read now (also used in the error message).
  std::string oom_report(size_t nbytes, StreamId stream) const;

  // A step boundary: appends a timeline point and, when tracing, an `s` line.
  void step();
  // A copy, taken under the lock (another thread may be calling step()).
  std::vector<TimelinePoint> timeline() const;
  // Records every allocation and free to `path` in the memtrace v1 format until trace_stop().
  // Allocations live at the start are not in the trace (their frees are omitted too).
  void trace_start(const std::string& path);
  void trace_stop();

  const PolicyConfig& config() const { return config_; }
  Provider& provider() const { return provider_; }
  bool uses_expandable_segments() const { return expandable_; }

 private:
  struct Segment;
  struct Block {
    uintptr_t addr = 0;
    size_t size = 0;
    size_t requested = 0;
    Segment* segment = nullptr;
    Block* prev = nullptr;  // address neighbours inside the segment
    Block* next = nullptr;
    StreamId stream = 0;
    uint64_t id = 0;  // allocation number (trace id)
    bool allocated = false;
    bool pending = false;     // freed, waiting for other streams' work
    bool traced = false;      // allocated while a trace was being recorded
    bool held = false;        // freed, kept in held_ for exact-size reuse (neither allocated nor in a pool)
    std::vector<StreamId> uses;  // other streams that used it (record_stream)
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->addr < b->addr;
    }
  };
  using FreeSet = std::set<Block*, BlockLess, PoolAllocator<Block*>>;
  struct Granule {
    uint64_t handle = 0;
    uint32_t live = 0;  // live blocks touching it
    bool mapped = false;
    size_t idle_pos = SIZE_MAX;  // index in idle_ when mapped and live == 0
  };
  struct Segment {
    uintptr_t base = 0;
    size_t size = 0;  // plain: bytes; expandable: the whole address range
    bool small = false;
    bool expandable = false;
    StreamId stream = 0;
    Block* first = nullptr;
    std::vector<Granule> granules;  // expandable only
    size_t mapped = 0;              // mapped granules
    size_t index = 0;               // position in segments_
    size_t page = 1;                // expandable: granules mapped and unmapped together (PolicyConfig::large_page)
  };
  struct IdleRef {
    Segment* segment;
    size_t index;
  };
  struct Pending {
    Block* block;
    std::vector<uint64_t> tokens;
  };

  size_t round(size_t n) const;
  FreeSet& pool(bool small) { return small ? small_free_ : large_free_; }
  Block* new_block();
  void delete_block(Block* b);
  // Where a request goes: the first `size` bytes of `block`, or with `tail` its last (null: no free block).
  struct Fit {
    Block* block = nullptr;
    bool tail = false;
    uintptr_t addr(size_t size) const { return tail ? block->addr + block->size - size : block->addr; }
  };
  Fit find_free(bool small, StreamId stream, size_t size);
  Block* try_allocate(size_t size, StreamId stream);
  Block* new_plain_segment(size_t size, bool small, StreamId stream);
  Block* new_expandable_range(size_t size, bool small, StreamId stream);
  void split(Block* b, size_t size);
  // Free block b (out of its pool) split so that its last `size` bytes are a block, which is returned; the
  // rest goes back to the pool.
  Block* split_tail(Block* b, size_t size);
  bool map_block(Block* b, StreamId stream);
  void unmap_block_refs(Block* b);
  void take_granule(Segment& s, size_t index);
  void make_idle(Segment& s, size_t index);
  void remove_idle(Segment& s, size_t index);
  void free_block(Block* b);
  void finish_free(Block* b);
  // A freed block that other streams used: events on them (pending_), deferred while a use stream is
  // being captured (deferred_), or a wait for the streams when an event cannot be recorded.
  void retire_used_block(Block* b);
  void process_deferred();
  // Waits for the work queued on `stream` so far, at most once per allocator call (synced_); false when
  // the stream is being captured into a CUDA graph (it cannot be waited for, so nothing it used is unmapped).
  bool quiesce(StreamId stream);
  void wait_token(uint64_t token);
  void begin_call() { synced_.clear(); }
  Block* take_held(size_t size, StreamId stream);
  // Granules [first, last] that bytes [addr, addr + bytes) of segment s touch (bytes > 0).
  struct GranuleSpan {
    size_t first, last;
  };
  GranuleSpan granules_of(const Segment& s, uintptr_t addr, size_t bytes) const {
    const size_t first = (addr - s.base) / granule_, last = (addr + bytes - 1 - s.base) / granule_;
    if (s.page == 1) return {first, last};
    return {first / s.page * s.page, std::min(s.granules.size() - 1, (last / s.page + 1) * s.page - 1)};
  }
  // Unmapped granules under bytes [addr, addr + size) of segment s (expandable segments; 0 otherwise),
  // counting stops at `stop`.
  size_t unmapped_granules(const Segment& s, uintptr_t addr, size_t size, size_t stop = SIZE_MAX) const;
  // Granules under bytes [addr, addr + size) of free block `free` that no live block touches (expandable).
  size_t untouched_granules(const Block* free, uintptr_t addr, size_t size) const;
  void release_held(size_t index);
  void flush_held();
  // Waits, with `lock` released, for the streams whose work keeps memory from being reused: those of the
  // idle granules and held blocks release_cached() would unmap, and with `pending` those of the blocks
  // waiting for other streams. The streams count as synchronised for this call (synced_) unless another
  // thread changed the allocator meanwhile; then no stream does (not even one waited for before the lock was
  // released) and release_cached() waits for each again.
  void wait_unlocked(std::unique_lock<std::mutex>& lock, bool pending);
  uintptr_t granule_addr(const Segment& s, size_t index) const { return s.base + index * granule_; }
  bool acquire_granule(Segment& s, size_t index, StreamId stream);
  void process_events(bool wait);
  void release_cached();
  void release_segment(Segment* s);
  int64_t largest_free_block_locked() const;
  double fragmentation_locked() const;
  void note_peak_reserved();
  void trace_alloc(const Block* b);
  uint64_t trace_stream(StreamId s);
  std::string oom_report_locked(size_t nbytes, StreamId stream) const;

  Provider& provider_;
  PolicyConfig config_;
  HostStreamEvents host_events_;
  StreamEvents* events_;
  bool expandable_;
  size_t granule_;
  size_t range_bytes_;
  size_t capacity_ = 0;  // the provider's, read once (0: unknown)
  mutable std::mutex mu_;
  NodePool nodes_;  // before the sets that use it
  FreeSet small_free_{BlockLess{}, PoolAllocator<Block*>(&nodes_)};
  FreeSet large_free_{BlockLess{}, PoolAllocator<Block*>(&nodes_)};
  PtrMap<Block*> live_;
  std::vector<std::unique_ptr<Segment>> segments_;
  std::deque<Block> block_store_;
  std::vector<Block*> spare_blocks_;
  std::vector<IdleRef> idle_;
  std::vector<Pending> pending_;
  std::vector<Block*> deferred_;  // freed, used by a stream that was being captured: no event recorded yet
  std::vector<StreamId> synced_;  // streams waited for during the current call (quiesce)
  std::vector<Block*> held_;  // oldest first; at most config_.hold_recent
  uint64_t mutations_ = 0;    // allocations and frees so far (wait_unlocked: did anything change meanwhile?)
  AllocatorStats stats_;
  uint64_t next_id_ = 1;
  // timeline
  std::vector<TimelinePoint> timeline_;
  int64_t step_ = 0;
  int64_t step_peak_allocated_ = 0;
  int64_t step_peak_reserved_ = 0;
  // trace
  std::FILE* trace_ = nullptr;
  std::vector<StreamId> trace_streams_;
};

}  // namespace ampforge::memory
