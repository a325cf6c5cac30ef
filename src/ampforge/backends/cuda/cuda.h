// The CUDA backend's public interface. No CUDA header is included here: tests, the CLI and tools use this
// in every build. In a build without CUDA (AMPFORGE_WITH_CUDA undefined) backends/no_cuda.cpp defines
// these with "nothing available" answers, so callers never need #ifdefs.
//
// Execution model (phase 1):
//   - Every CUDA device has one compute stream and one copy stream (non-blocking streams, created on
//     first use). Every kernel and every copy of the backend runs on the compute stream of the device
//     that holds the tensors, so work on one device executes in program order and no event is needed.
//     The copy stream is for overlapping host-to-device transfers (DataLoader prefetch); code that uses
//     it must record the compute stream's use of the memory (caching allocator's record_stream).
//   - Kernels are asynchronous. Host code sees results only through a synchronising call: a copy to the
//     CPU (Tensor::to("cpu"), item(), tolist()) or synchronize(). Errors that a kernel can only detect
//     on the device (a class index out of range in cross_entropy) are reported at the next such call.
//   - CUDA memory comes from one caching allocator per device (memory/caching_allocator.h) over the
//     cudaMalloc provider (memory/cuda_provider.h), keyed by the device's compute stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge::memory {
class CachingAllocator;
}

namespace ampforge::cuda {

// True when this build contains the CUDA backend (independent of any GPU being present).
bool is_built();
// Number of CUDA devices this process can use; 0 without the backend, without a driver, or without a GPU.
int device_count();
inline bool is_available() { return device_count() > 0; }
// Why device_count() is 0 (for skip messages and `ampforge info`); empty when devices are available.
std::string unavailable_reason();

// Blocks until every piece of work queued on `device`'s streams has finished, then reports device-side
// errors (see check_device_errors). device < 0: every device.
void synchronize(int device = -1);
// Throws Error(InvalidArgument) when a kernel of `device` flagged an invalid input since the last check
// (currently: a cross_entropy target outside [0, C) that is not ignore_index), and clears the flag.
// Only meaningful after a synchronisation; synchronising calls run it themselves.
void check_device_errors(int device);

// TF32 tensor-core math for F32 matmul/linear. Default off, as PyTorch >= 1.12
// (torch.backends.cuda.matmul.allow_tf32 = False); the environment variable AMPFORGE_ALLOW_TF32=1 turns it
// on at start. F16/BF16 GEMMs always accumulate in F32.
void set_allow_tf32(bool allow);
bool allow_tf32();

// cuDNN convolutions (backends/cuda/conv.cpp; every switch is process-wide and read at each call):
//   TF32 for F32 convolutions: on by default, as PyTorch (torch.backends.cudnn.allow_tf32 = True; note
//   the difference from matmul's allow_tf32 above); AMPFORGE_CUDNN_ALLOW_TF32=0 turns it off at start.
//   F16/BF16 convolutions always accumulate in F32.
void set_cudnn_allow_tf32(bool allow);
bool cudnn_allow_tf32();
//   Benchmark mode (torch.backends.cudnn.benchmark): the first call of each problem (shapes, strides,
//   dtype, conv parameters, direction, device) times cuDNN's algorithms and keeps the fastest; otherwise
//   cuDNN's heuristics choose. Default off; AMPFORGE_CUDNN_BENCHMARK=1 turns it on at start.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();
//   Deterministic mode: only algorithms cuDNN declares deterministic (bit-identical results run to run;
//   the backward ops' atomics-based algorithms are excluded). Default off; AMPFORGE_CUDNN_DETERMINISTIC=1.
void set_cudnn_deterministic(bool on);
bool cudnn_deterministic();
// The version of the cuDNN library in use as cudnnGetVersion() reports it (9.19.0 -> 91900); 0 when this
// build has no cuDNN (conv2d then has no CUDA kernel) or no CUDA backend.
int64_t cudnn_version();
// Test hooks: algorithm choices cached so far (all devices), and cudnnFind runs (benchmark mode) so far.
int64_t cudnn_cache_size();
int64_t cudnn_benchmark_runs();
// Test hooks for the retries (conv.cpp, blas.cpp): the next `calls` cuDNN heuristics queries answer
// CUDNN_STATUS_BAD_PARAM, and the next `calls` cuBLASLt heuristic queries find no algorithm, as the
// libraries do for problems they have no kernel for; and how many retries each has made so far (a
// convolution in another layout, a GEMM from packed, aligned copies).
void set_cudnn_heuristic_bad_param_for_testing(int calls);
int64_t cudnn_layout_retries();
void set_gemm_no_algorithm_for_testing(int calls);
int64_t gemm_aligned_retries();

// The streams of a device as opaque ids (the cudaStream_t value), for the allocator's record_stream and
// for code that launches its own work. Creates them on first use. Throws when no such device exists.
uint64_t compute_stream(int device);
uint64_t copy_stream(int device);

// The caching allocator that serves CUDA tensors on `device` (statistics, snapshots, empty_cache).
// nullptr when the device does not exist or the backend is not built.
memory::CachingAllocator* caching_allocator(int device);

// ---- uploads on the copy stream (DataLoader prefetch) --------------------------------------------------
// Copies CPU tensors to a device asynchronously on the device's copy stream, staged through page-locked
// buffers that the uploader owns and reuses (a copy from pageable memory cannot overlap compute), so that
// the next batch travels while the current step computes. Thread-safe: DataLoader workers call upload().
//   upload(): dense device tensors with the inputs' shapes, dtypes and layouts (channels-last stays
//     channels-last), their memory keyed by the copy stream; the copies are queued, not finished. Returns
//     a ticket for ready(). Waits (on the calling worker) only when the staging buffer it reuses is still
//     being read by an earlier copy.
//   ready(): on the consuming thread, before the tensors are used: the compute stream waits for the copies
//     (a device-side wait, not a host one) and the tensors' blocks are marked as used by the compute
//     stream, so the allocator reuses them only after that work too.
//   discard(): releases a ticket whose tensors will never be used.
class Uploader {
 public:
  Uploader(int device, int buffers);
  ~Uploader();  // waits for copies still in flight (they read the staging buffers)
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  std::vector<Tensor> upload(const std::vector<Tensor>& host, uint64_t* ticket);
  void ready(const std::vector<Tensor>& uploaded, uint64_t ticket);
  void discard(uint64_t ticket) noexcept;
  int device() const { return device_; }

 private:
  struct Impl;
  int device_;
  Impl* impl_;
};

// ---- device-side timing ---------------------------------------------------------------------------
// Times work queued on a device's compute stream with CUDA timing events (what `ampforge bench` reports
// for a GPU: the device's time per step, not the host's enqueue time). mark() records an event on the
// compute stream (no host wait); intervals() waits once for the last mark and returns the seconds between
// consecutive marks (mark i to mark i+1), in order. Marks made during a graph capture are refused.
class EventTimer {
 public:
  explicit EventTimer(int device);  // throws InvalidArgument when the device does not exist
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  void mark();
  std::vector<double> intervals();
  int64_t marks() const;

 private:
  struct Impl;
  int device_;
  Impl* impl_;
};

// ---- host synchronisation ----------------------------------------------------------------------------
// How many times this process has waited on the host for CUDA work so far, on any thread: synchronize(),
// copies to the CPU (item(), to("cpu")), transfers from pageable or pinned memory, cross-device copies, the
// start of a graph capture, the uploader's staging-buffer waits, and the caching allocator's own waits
// (event and stream synchronisations before unmapping memory, on the out-of-memory retry, when an event
// could not be recorded: memory::host_wait_count(), the one counter behind this). A training step that
// keeps its decisions on the device (GradScaler, the optimizer's step count) leaves it unchanged; tests
// assert that. Without the backend it counts only what memory/ notes (nothing on a CPU-only machine).
uint64_t host_sync_count();

// ---- CUDA graphs ----------------------------------------------------------------------------------------
// Whether this thread is capturing a CUDA graph right now (work is recorded, not run). Code that would
// freeze a host value into the graph (an optimizer writing its learning rate) checks this.
bool is_capturing();

// A captured sequence of device work, replayed with one launch (torch.cuda.CUDAGraph's role).
//   capture_begin(): from now on every kernel and device-side copy this thread queues on `device` is
//     recorded instead of run, and every CUDA allocation this thread makes on it comes from the graph's
//     private memory pool. The pool keeps its memory for the graph's lifetime: a replay writes to the
//     same addresses as the capture, so nothing else may ever receive them. Memory freed during the capture
//     is reused by later allocations of the same capture (the replay runs in the same order).
//   capture_end(): ends the capture and instantiates the graph. Throws with CUDA's reason when the
//     capture was invalidated (something in it synchronised with the host or used another stream).
//   replay(): queues the whole graph on the device's compute stream: asynchronous, in program order with
//     all other work of the device.
// Tensors that the captured work reads or writes (parameters, optimizer state, static inputs, outputs
// created during the capture) must stay alive, at the same address, while the graph is replayed; inputs
// are refreshed by copying into them before replay(). Random numbers drawn during capture would repeat at
// every replay, so random kernels refuse to run inside a capture.
class Graph {
 public:
  explicit Graph(int device = 0);
  ~Graph();  // never throws; the private pool's cached memory is released (live tensors keep their blocks)
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void capture_begin();
  void capture_end();
  void replay();
  bool ready() const;  // captured and instantiated
  // Operations in the graph (kernels, memsets, device copies): the launches one eager run of the captured
  // work takes, against one launch per replay.
  int64_t num_nodes() const;
  int64_t num_kernel_nodes() const;
  // Bytes the private pool holds from the device (reserved), and the most its tensors held at once (the captured
  // work's live tensors at their peak: a replay uses that memory again, allocating nothing).
  int64_t pool_reserved_bytes() const;
  int64_t pool_peak_allocated_bytes() const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace ampforge::cuda
