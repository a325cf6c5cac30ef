// PyTorch memory snapshots: the dict `torch.cuda.memory._snapshot()` returns and `_dump_snapshot(path)`
// pickles, read without Python (memory/pickle.h) and turned into an ampforge memory trace (memory/trace.h),
// so the replay engine and its policies run on a PyTorch user's own recording.
//
// What a snapshot holds (facts from pytorch/pytorch torch/csrc/cuda/Module.cpp and memory_snapshot.cpp, which
// build it, and c10/cuda/CUDACachingAllocator.cpp, which records it; /work/shared/docs/specs/TORCH-MEMORY.md):
//   segments              the allocator's segments at the end, each with its blocks (state active_allocated,
//                         active_pending_free or inactive)
//   device_traces         one list per device, oldest first: {action, addr, size, stream[, time_us, frames,
//                         compile_context, user_metadata]}; `oom` entries carry device_free instead of addr
//   allocator_settings    (newer) max_split_size (-1: none), expandable_segments, roundup_power2_divisions
//                         ({"1": n, "2": n, ... "32768": n}: per power-of-two interval of MiB), ...
// Missing optional keys and unknown extra keys are accepted; what the replay needs is checked, and bad input is
// an InvalidArgument error naming the file, the entry and the field.
//
// Reconstruction (torch_trace_build) follows PyTorch's own viewer (torch/utils/viz/MemoryViz.js):
//   - `alloc` starts a block of the requested size (the entry's size: PyTorch records the caller's request,
//     before rounding, so the replayed policy rounds it again with the snapshot's settings);
//   - the block becomes reusable at `free_completed` (not `free_requested`: a block used on another stream
//     through record_stream stays unusable until that stream's work is done);
//   - a block freed with no recorded alloc, or alive at the end with none, was allocated before recording
//     began: its allocation is placed at the start of the trace;
//   - segment_alloc/segment_free (and segment_map/segment_unmap with expandable segments) are the recorded
//     reserved memory: they give the recorded peak reserved and the segment sizes the replay is checked against;
//   - `oom` entries become probe allocations (TraceEvent::kProbe): the request that failed, replayed to see
//     whether a policy would have served it;
//   - streams are kept, numbered densely in order of first use (the default stream, 0, stays 0).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/trace.h"

namespace ampforge::memory {

// Sizes above this are refused as absurd (1 PiB; the memtrace limit, 2^44, is applied after rounding).
inline constexpr int64_t kTorchMaxSize = int64_t{1} << 50;

struct TorchTraceEntry {
  enum Action : uint8_t { Alloc, FreeRequested, FreeCompleted, SegmentAlloc, SegmentFree, SegmentMap, SegmentUnmap,
                          Snapshot, Oom };
  Action action = Alloc;
  uint64_t addr = 0;  // oom: what CUDA reported free (device_free)
  int64_t size = 0;
  uint64_t stream = 0;  // the raw cudaStream_t
  int64_t time_us = -1;  // -1: not recorded (older snapshots)
  int32_t site = -1;     // index into TorchSnapshot::sites; -1: no frames
};

struct TorchBlock {
  enum State : uint8_t { Allocated, PendingFree, Inactive };
  uint64_t address = 0;
  int64_t size = 0;
  int64_t requested_size = 0;
  State state = Inactive;
  int32_t site = -1;
};

struct TorchSegment {
  int device = 0;
  uint64_t address = 0;
  int64_t total_size = 0;
  uint64_t stream = 0;
  bool large = true;
  bool expandable = false;
  std::vector<TorchBlock> blocks;
};

struct TorchAllocatorSettings {
  bool recorded = false;      // the snapshot had allocator_settings (PyTorch 2.2 and later)
  int64_t max_split_size = -1;  // bytes; -1: unlimited
  bool expandable_segments = false;
  std::array<uint16_t, 16> roundup_power2_divisions{};  // index k: sizes in [2^k MiB, 2^(k+1) MiB); 0: none
  double garbage_collection_threshold = 0.0;
  std::string conf;  // PYTORCH_CUDA_ALLOC_CONF as recorded
  // "expandable_segments:True,max_split_size_mb:..." as the settings read (for reports).
  std::string describe() const;
};

struct TorchSnapshot {
  std::string source;
  TorchAllocatorSettings settings;
  std::vector<TorchSegment> segments;
  std::vector<std::vector<TorchTraceEntry>> device_traces;
  std::vector<std::string> sites;  // "file:line function" of each distinct allocation site
  bool has_time = false;           // entries carry time_us (newer snapshots)
  bool overflowed = false;         // the snapshot says its ring buffer dropped entries (trace_alloc_overflowed)
  int64_t max_entries = -1;        // trace_alloc_max_entries when recorded
  int64_t ignored_entries = 0;     // entries of actions this reader does not know (skipped)
};

// Reads a snapshot pickle (check_readable_file first; Io errors for unreadable files).
TorchSnapshot torch_snapshot_read(const std::string& path);
TorchSnapshot torch_snapshot_parse(std::string_view bytes, const std::string& source);

// A recorded out-of-memory, as placed in the reconstructed trace.
struct TorchOom {
  int64_t event = 0;       // index in Trace::events of its probe allocation
  int64_t size = 0;        // the request, rounded as PyTorch rounded it
  uint64_t device_free = 0;  // what cudaMemGetInfo reported free
  uint64_t stream = 0;     // raw stream
  int64_t recorded_reserved = 0;  // reserved by PyTorch's allocator at the time (from the segment entries)
  int32_t site = -1;
};

struct TorchReplayInput {
  Trace trace;
  int device = 0;
  std::vector<int32_t> site;      // per event of `trace`: the allocation's site (-1: none, or not an alloc)
  std::vector<uint64_t> streams;  // dense stream number -> raw cudaStream_t
  int64_t allocs_before_recording = 0;  // blocks placed at the start (allocated before the first entry)
  int64_t bytes_before_recording = 0;
  bool wrapped = false;  // the ring buffer (max_entries) dropped the oldest entries
  int64_t entries = 0;   // trace entries of this device
  std::vector<TorchOom> ooms;
  // Recorded reserved memory (segment entries): at the first entry, at its peak, at the end. When the recording
  // starts by giving cached segments back (freed_at_start bytes, before any allocation), the peak is counted
  // from after them: that cached memory is not in the trace, so no replay could hold it.
  int64_t recorded_reserved_start = 0;
  int64_t recorded_peak_reserved = 0;
  int64_t recorded_reserved_end = 0;
  int64_t freed_at_start = 0;
  // Recorded segment allocations (segment_alloc, or segment_map with expandable segments): (index in
  // trace.events of the allocation that caused it, bytes), in order.
  std::vector<std::pair<int64_t, int64_t>> recorded_segments;
  int64_t empty_cache_frees = 0;  // segment frees/unmaps not explained by an oom (torch.cuda.empty_cache())
  int64_t empty_cache_calls = 0;  // the runs of them: TraceEvent::EmptyCache events in `trace`
  std::vector<std::string> notes;  // what a reader should know (gaps, skipped entries)
};

// Builds the trace of `device`. InvalidArgument when the device is not in the snapshot or recorded no entries
// (the message names the devices that did, or says how to record when none did), or the entries contradict
// themselves (an alloc at a live address, a free of an address already freed).
TorchReplayInput torch_trace_build(const TorchSnapshot& snap, int device);
// The device to replay when the user names none: the lowest with trace entries. InvalidArgument, with what
// the segments hold and how to record, when no device has any (a snapshot taken without
// torch.cuda.memory._record_memory_history()).
int torch_default_device(const TorchSnapshot& snap);

// The `pytorch` policy under the snapshot's settings (PyTorch's rounding, split and oversize rules, its
// expandable segments when `expandable`), named "pytorch" or "pytorch-expandable".
PolicyConfig torch_policy(const TorchAllocatorSettings& settings, bool expandable);

}  // namespace ampforge::memory
