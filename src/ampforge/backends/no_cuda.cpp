// Entry point for the CUDA backend as seen from core/dispatch.cpp, and the public CUDA interface
// (backends/cuda/cuda.h), for builds without CUDA: nothing to register, no devices. Callers learn that
// from `false` / 0 instead of #ifdefs.
#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/memory/provider.h"
#include "ampforge/util/error.h"

namespace ampforge {

#if !defined(AMPFORGE_WITH_CUDA)
bool register_cuda_backend() { return false; }

namespace cuda {
namespace {
[[noreturn]] void no_device(int device) {
  AF_THROW(InvalidArgument, "CUDA device {} does not exist: {}", device, unavailable_reason());
}
}  // namespace

bool is_built() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this build of ampforge has no CUDA backend (configure with -DAMPFORGE_CUDA=ON)"; }
void synchronize(int device) {
  if (device >= 0) no_device(device);
}
void check_device_errors(int device) { no_device(device); }
void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }
void set_cudnn_allow_tf32(bool) {}
bool cudnn_allow_tf32() { return false; }
void set_cudnn_benchmark(bool) {}
bool cudnn_benchmark() { return false; }
void set_cudnn_deterministic(bool) {}
bool cudnn_deterministic() { return false; }
int64_t cudnn_version() { return 0; }
int64_t cudnn_cache_size() { return 0; }
int64_t cudnn_benchmark_runs() { return 0; }
void set_cudnn_heuristic_bad_param_for_testing(int) {}
int64_t cudnn_layout_retries() { return 0; }
void set_gemm_no_algorithm_for_testing(int) {}
int64_t gemm_aligned_retries() { return 0; }
uint64_t compute_stream(int device) { no_device(device); }
uint64_t copy_stream(int device) { no_device(device); }
memory::CachingAllocator* caching_allocator(int) { return nullptr; }
uint64_t host_sync_count() { return memory::host_wait_count(); }
Uploader::Uploader(int device, int) : device_(device), impl_(nullptr) { no_device(device); }
Uploader::~Uploader() = default;
std::vector<Tensor> Uploader::upload(const std::vector<Tensor>&, uint64_t*) { no_device(device_); }
void Uploader::ready(const std::vector<Tensor>&, uint64_t) { no_device(device_); }
void Uploader::discard(uint64_t) noexcept {}
bool is_capturing() { return false; }
EventTimer::EventTimer(int device) : device_(device), impl_(nullptr) { no_device(device); }
EventTimer::~EventTimer() = default;
void EventTimer::mark() { no_device(device_); }
std::vector<double> EventTimer::intervals() { no_device(device_); }
int64_t EventTimer::marks() const { return 0; }

namespace {
[[noreturn]] void no_graphs() {
  AF_THROW(NotImplemented, "CUDA graphs need the CUDA backend: {}", unavailable_reason());
}
}  // namespace
Graph::Graph(int device) : impl_(nullptr) { no_device(device); }
Graph::~Graph() = default;
void Graph::capture_begin() { no_graphs(); }
void Graph::capture_end() { no_graphs(); }
void Graph::replay() { no_graphs(); }
bool Graph::ready() const { return false; }
int64_t Graph::num_nodes() const { return 0; }
int64_t Graph::num_kernel_nodes() const { return 0; }
int64_t Graph::pool_reserved_bytes() const { return 0; }
int64_t Graph::pool_peak_allocated_bytes() const { return 0; }
}  // namespace cuda
#endif

}  // namespace ampforge
