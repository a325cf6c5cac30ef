// CUDA graphs (cuda.h: Graph): stream capture of the device's compute stream, a private memory pool per
// graph, instantiation and replay.
//
// Why stream capture of the compute stream: every kernel and device copy of the backend is queued on the
// compute stream of its device (cuda.h), so capturing that one stream records exactly the work of the
// captured code, with no change to any kernel. The capture mode is "thread local": only this thread's
// unsafe calls (a synchronisation, a pageable copy) invalidate it; the DataLoader's threads keep uploading
// on the copy stream meanwhile.
//
// Why a private pool: a replay reads and writes the very addresses the capture saw. If the capture's
// temporaries came from the device's main caching allocator, eager work could be handed the same blocks
// after the capture and a replay would overwrite it. The pool is a CachingAllocator of its own over its own
// cudaMalloc provider; while the graph exists its memory is never released. Its provider switches this
// thread to the relaxed capture mode around cudaMalloc/cudaFree, which the driver otherwise refuses inside
// a capture (the allocation is not part of the graph: it happens once, at capture time, as intended).
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/backends/cuda/runtime.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/cuda_provider.h"
#include "ampforge/util/error.h"

namespace ampforge::cuda {
namespace {

thread_local int t_capturing_device = -1;

// Swaps this thread's capture mode to relaxed for a scope (cudaThreadExchangeStreamCaptureMode push/pop).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// The pool's provider: plain cudaMalloc segments, allowed during a capture.
class CapturePoolProvider final : public memory::Provider {
 public:
  explicit CapturePoolProvider(int device) : inner_(device) {}
  const char* name() const override { return "cuda-graph-pool"; }
  Device device() const override { return inner_.device(); }
  size_t granularity() const override { return inner_.granularity(); }
  size_t capacity() const override { return inner_.capacity(); }
  void* allocate(size_t bytes) override {
    RelaxedCaptureMode relaxed;
    return inner_.allocate(bytes);
  }
  void deallocate(void* ptr, size_t bytes) noexcept override {
    RelaxedCaptureMode relaxed;
    inner_.deallocate(ptr, bytes);
  }

 private:
  memory::CudaProvider inner_;
};

const char* capture_status_name(cudaStreamCaptureStatus st) {
  switch (st) {
    case cudaStreamCaptureStatusNone: return "not capturing";
    case cudaStreamCaptureStatusActive: return "active";
    case cudaStreamCaptureStatusInvalidated: return "invalidated";
  }
  return "unknown";
}

}  // namespace

struct Graph::Impl {
  int device = 0;
  // Never destroyed: tensors allocated during the capture may outlive the graph, and their frees must
  // still find this allocator (runtime.cpp's registry). After the graph is gone its cache is emptied.
  memory::Provider* provider = nullptr;
  memory::CachingAllocator* pool = nullptr;
  std::unique_ptr<CaptureAllocationGuard> routing;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool capturing = false;
  int64_t nodes = 0, kernels = 0;
};

bool is_capturing() { return t_capturing_device >= 0; }

Graph::Graph(int device) : impl_(new Impl) {
  impl_->device = device;
  device_state(device);  // throws for a device that does not exist
}

Graph::~Graph() {
  Impl& g = *impl_;
  if (g.capturing) {
    // Abandoned mid-capture (an exception in the captured code): end the capture so the stream works again.
    cudaGraph_t partial = nullptr;
    AF_CUDA_WARN(cudaStreamEndCapture(device_state(g.device).compute, &partial));
    if (partial != nullptr) AF_CUDA_WARN(cudaGraphDestroy(partial));
    g.routing.reset();
    t_capturing_device = -1;
  }
  if (g.exec != nullptr) AF_CUDA_WARN(cudaGraphExecDestroy(g.exec));
  if (g.graph != nullptr) AF_CUDA_WARN(cudaGraphDestroy(g.graph));
  if (g.pool != nullptr) {
    // Replays may still be running: they use the pool's memory.
    count_host_sync();
    AF_CUDA_WARN(cudaStreamSynchronize(device_state(g.device).compute));
    try {
      g.pool->empty_cache();
    } catch (...) {
    }
  }
  delete impl_;
}

void Graph::capture_begin() {
  Impl& g = *impl_;
  AF_CHECK(!g.capturing, "CUDA graph: capture_begin() called twice without capture_end()");
  AF_CHECK(g.exec == nullptr, "CUDA graph: this graph was already captured; create a new Graph to capture again");
  AF_CHECK(!is_capturing(), "CUDA graph: this thread is already capturing another graph");
  DeviceGuard guard(g.device);
  DeviceState& s = device_state(g.device);
  if (g.pool == nullptr) {
    g.provider = new CapturePoolProvider(g.device);
    // No StreamEvents: the pool serves the compute stream only, so the synchronous single-stream rule holds.
    g.pool = new memory::CachingAllocator(*g.provider, memory::PolicyConfig::pytorch());
    register_pool(g.device, g.pool);
  }
  // Library handles and workspaces exist before the capture: creating them inside it (cudnnCreate,
  // cublasLtCreate, the workspace's allocation) would be captured or invalidate the capture.
  prepare_blas(g.device);
  prepare_cudnn(g.device);
  // Work queued before the capture must not be confused with captured work: it runs first.
  count_host_sync();
  AF_CUDA_CHECK(cudaStreamSynchronize(s.compute));
  AF_CUDA_CHECK(cudaStreamBeginCapture(s.compute, cudaStreamCaptureModeThreadLocal));
  // Only once the capture has begun: a failed begin must not leave this thread's eager allocations routed to
  // the graph's pool (only ~Graph would undo it). Nothing allocates between the two.
  g.routing = std::make_unique<CaptureAllocationGuard>(g.device, g.pool);
  g.capturing = true;
  t_capturing_device = g.device;
}

void Graph::capture_end() {
  Impl& g = *impl_;
  AF_CHECK(g.capturing, "CUDA graph: capture_end() without capture_begin()");
  DeviceGuard guard(g.device);
  DeviceState& s = device_state(g.device);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  (void)cudaStreamIsCapturing(s.compute, &status);
  const cudaError_t err = cudaStreamEndCapture(s.compute, &g.graph);
  g.capturing = false;
  t_capturing_device = -1;
  g.routing.reset();
  if (err != cudaSuccess || g.graph == nullptr) {
    (void)cudaGetLastError();
    AF_THROW(InvalidArgument,
             "CUDA graph capture failed: {} ({}); capture status was '{}'. Something in the captured code "
             "synchronised with the host (item(), a copy to the CPU), copied from host memory, or used a "
             "stream other than the device's compute stream.",
             cudaGetErrorName(err), cudaGetErrorString(err), capture_status_name(status));
  }
  size_t n = 0;
  AF_CUDA_CHECK(cudaGraphGetNodes(g.graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) AF_CUDA_CHECK(cudaGraphGetNodes(g.graph, nodes.data(), &n));
  g.nodes = static_cast<int64_t>(n);
  g.kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    AF_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) ++g.kernels;
  }
  AF_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
}

void Graph::replay() {
  Impl& g = *impl_;
  AF_CHECK(g.exec != nullptr, "CUDA graph: replay() before a successful capture_end()");
  DeviceGuard guard(g.device);
  AF_CUDA_CHECK(cudaGraphLaunch(g.exec, device_state(g.device).compute));
}

bool Graph::ready() const { return impl_->exec != nullptr; }
int64_t Graph::num_nodes() const { return impl_->nodes; }
int64_t Graph::num_kernel_nodes() const { return impl_->kernels; }
int64_t Graph::pool_peak_allocated_bytes() const {
  return impl_->pool != nullptr ? impl_->pool->stats().allocated.peak : 0;
}

int64_t Graph::pool_reserved_bytes() const {
  return impl_->pool != nullptr ? impl_->pool->stats().reserved.current : 0;
}

}  // namespace ampforge::cuda
