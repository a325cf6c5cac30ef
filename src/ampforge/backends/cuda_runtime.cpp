// The CUDA device runtime (core/runtime.h) over backends/cuda/cuda.h, compiled in every build: without the CUDA
// backend, no_cuda.cpp answers cuda.h's calls with "no device" and its reason, and so does this runtime.
#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/core/runtime.h"

#include <fmt/format.h>

namespace ampforge {
namespace {

class CudaEventTimer final : public runtime::EventTimer {
 public:
  explicit CudaEventTimer(int device) : timer_(device) {}
  void mark() override { timer_.mark(); }
  std::vector<double> intervals() override { return timer_.intervals(); }

 private:
  cuda::EventTimer timer_;
};

class CudaGraph final : public runtime::Graph {
 public:
  explicit CudaGraph(int device) : graph_(device) {}
  void capture_begin() override { graph_.capture_begin(); }
  void capture_end() override { graph_.capture_end(); }
  void replay() override { graph_.replay(); }
  bool ready() const override { return graph_.ready(); }
  int64_t num_nodes() const override { return graph_.num_nodes(); }
  int64_t num_kernel_nodes() const override { return graph_.num_kernel_nodes(); }
  int64_t pool_reserved_bytes() const override { return graph_.pool_reserved_bytes(); }
  int64_t pool_peak_allocated_bytes() const override { return graph_.pool_peak_allocated_bytes(); }

 private:
  cuda::Graph graph_;
};

class CudaUploader final : public runtime::Uploader {
 public:
  CudaUploader(int device, int buffers) : up_(device, buffers) {}
  std::vector<Tensor> upload(const std::vector<Tensor>& host, uint64_t* ticket) override {
    return up_.upload(host, ticket);
  }
  void ready(const std::vector<Tensor>& uploaded, uint64_t ticket) override { up_.ready(uploaded, ticket); }
  void discard(uint64_t ticket) noexcept override { up_.discard(ticket); }

 private:
  cuda::Uploader up_;
};

class CudaRuntime final : public runtime::DeviceRuntime {
 public:
  bool is_built() const override { return cuda::is_built(); }
  int device_count() const override { return cuda::device_count(); }
  std::string unavailable_reason() const override {
    return cuda::device_count() > 0 ? std::string() : cuda::unavailable_reason();
  }
  void synchronize(int index) override { cuda::synchronize(index); }
  uint64_t host_sync_count() const override { return cuda::host_sync_count(); }
  bool is_capturing() const override { return cuda::is_capturing(); }
  uint64_t compute_stream(int index) override { return cuda::compute_stream(index); }
  std::unique_ptr<runtime::EventTimer> event_timer(int index) override {
    return std::make_unique<CudaEventTimer>(index);
  }
  std::unique_ptr<runtime::Graph> graph(int index) override { return std::make_unique<CudaGraph>(index); }
  std::unique_ptr<runtime::Uploader> uploader(int index, int buffers) override {
    return std::make_unique<CudaUploader>(index, buffers);
  }
  void set_allow_tf32(bool products, bool convolutions) override {
    cuda::set_allow_tf32(products);
    cuda::set_cudnn_allow_tf32(convolutions);
  }
  std::vector<std::string> library_lines() const override {
    if (!cuda::is_built()) return {};
    const int64_t v = cuda::cudnn_version();  // cuDNN >= 9 encodes major*10000+minor*100+patch
    if (v <= 0) return {"cuDNN: not in this build (conv2d has no CUDA kernel)"};
    return {fmt::format("cuDNN: {}.{}.{} (CUDA conv2d)", v / 10000, v % 10000 / 100, v % 100)};
  }
  bool allow_tf32_products() const override { return cuda::allow_tf32(); }
  bool allow_tf32_convolutions() const override { return cuda::cudnn_allow_tf32(); }
};

}  // namespace

// Called once from ensure_backends_registered() (core/dispatch.cpp), before register_cuda_backend(): the runtime
// answers (device count, the reason there is none) whether or not a device is present. The capabilities are the
// backend's, declared here so that a meta device standing for CUDA decides as it does on a machine without GPU.
void register_cuda_runtime() {
  runtime::register_device_runtime(DeviceType::CUDA, std::make_unique<CudaRuntime>());
  runtime::declare_capability(DeviceType::CUDA, runtime::Capability::LimitedFusedAttention);
}

}  // namespace ampforge
