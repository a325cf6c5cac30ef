// cuda::Uploader (cuda.h): host-to-device copies on the copy stream through reusable page-locked staging
// buffers, for the DataLoader's prefetch.
//
// Why staging instead of pinning the batch itself: the DataLoader builds batches in ordinary memory (the
// host caching allocator's), and registering every batch with cudaHostRegister costs more than the copy.
// A few pinned buffers, reused round-robin, make every transfer a true asynchronous DMA that overlaps the
// compute stream. One event per buffer says when its last copy finished (reuse), one event per upload is
// what the consumer's compute stream waits on (ready()).
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/runtime.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/util/error.h"
#include "ampforge/util/log.h"

namespace ampforge::cuda {

namespace {
constexpr size_t kAlign = 256;  // staging offsets: DMA-friendly alignment
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

MemoryFormat dense_format(const Tensor& t) {
  if (t.is_contiguous()) return MemoryFormat::Contiguous;
  if (t.dim() == 4 && t.is_contiguous(MemoryFormat::ChannelsLast)) return MemoryFormat::ChannelsLast;
  return MemoryFormat::Preserve;
}
}  // namespace

struct Uploader::Impl {
  struct Buffer {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded after the last copy that read this buffer
  };
  std::mutex mu;
  std::vector<Buffer> buffers;
  size_t next = 0;
};

Uploader::Uploader(int device, int buffers) : device_(device), impl_(new Impl) {
  AF_CHECK(buffers >= 1, "Uploader: need at least one staging buffer, got {}", buffers);
  DeviceGuard guard(device);
  device_state(device);  // the streams exist from here on
  impl_->buffers.resize(static_cast<size_t>(buffers));
  for (auto& b : impl_->buffers) AF_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
}

Uploader::~Uploader() {
  try {  // selecting the device fails after a device loss: a destructor must not throw (std::terminate)
    DeviceGuard guard(device_);
    for (auto& b : impl_->buffers) {
      if (b.done != nullptr) {
        count_host_sync();
        AF_CUDA_WARN(cudaEventSynchronize(b.done));
        AF_CUDA_WARN(cudaEventDestroy(b.done));
      }
      if (b.host != nullptr) AF_CUDA_WARN(cudaFreeHost(b.host));
    }
  } catch (const std::exception& e) {
    log(LogLevel::Warn, "Uploader: staging buffers of cuda:{} not released: {}", device_, e.what());
  }
  delete impl_;
}

std::vector<Tensor> Uploader::upload(const std::vector<Tensor>& host, uint64_t* ticket) {
  AF_CHECK(ticket != nullptr, "Uploader::upload: no ticket to fill");
  const Device dev(DeviceType::CUDA, static_cast<int16_t>(device_));
  // Dense host sources (contiguous or channels-last: one block of bytes each) and the staging size.
  const std::vector<Tensor>& src = host;
  size_t total = 0;
  for (const Tensor& t : host) {
    AF_CHECK(t.defined() && t.device().is_cpu() && dense_format(t) != MemoryFormat::Preserve,
             "Uploader::upload: inputs must be dense (contiguous or channels-last) CPU tensors");
    total += align_up(static_cast<size_t>(t.nbytes()));
  }
  DeviceGuard guard(device_);
  DeviceState& s = device_state(device_);
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Buffer& buf = impl_->buffers[impl_->next++ % impl_->buffers.size()];
  // The previous copy out of this buffer must be done before we overwrite it (a worker-side wait, counted only
  // when there is one: with several buffers a copy of microseconds is long done, and counting every upload made
  // `ampforge train --device cuda` report a host synchronisation per batch). A never-recorded event is complete.
  const cudaError_t copied = cudaEventQuery(buf.done);
  if (copied == cudaErrorNotReady) {
    count_host_sync();
    AF_CUDA_CHECK(cudaEventSynchronize(buf.done));
  } else {
    AF_CUDA_CHECK(copied);
  }
  if (buf.capacity < total) {
    if (buf.host != nullptr) AF_CUDA_CHECK(cudaFreeHost(buf.host));
    buf.host = nullptr;
    buf.capacity = 0;
    AF_CUDA_CHECK(cudaHostAlloc(&buf.host, total, cudaHostAllocPortable));
    buf.capacity = total;
  }
  std::vector<Tensor> out;
  out.reserve(src.size());
  size_t off = 0;
  for (const Tensor& t : src) {
    const size_t n = static_cast<size_t>(t.nbytes());
    char* staged = static_cast<char*>(buf.host) + off;
    if (n > 0) std::memcpy(staged, t.data_ptr(), n);
    const MemoryFormat f = dense_format(t);
    Tensor d;
    {
      CopyStreamAllocationGuard on_copy_stream(device_);
      d = Tensor::empty(t.shape(), t.dtype(), dev, f == MemoryFormat::ChannelsLast ? f : MemoryFormat::Contiguous);
    }
    if (n > 0) AF_CUDA_CHECK(cudaMemcpyAsync(d.data_ptr(), staged, n, cudaMemcpyHostToDevice, s.copy));
    out.push_back(std::move(d));
    off += align_up(n);
  }
  AF_CUDA_CHECK(cudaEventRecord(buf.done, s.copy));
  cudaEvent_t ev = nullptr;
  AF_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  AF_CUDA_CHECK(cudaEventRecord(ev, s.copy));
  *ticket = reinterpret_cast<uint64_t>(ev);
  return out;
}

void Uploader::ready(const std::vector<Tensor>& uploaded, uint64_t ticket) {
  AF_CHECK(ticket != 0, "Uploader::ready: no ticket (these tensors were not uploaded)");
  DeviceGuard guard(device_);
  DeviceState& s = device_state(device_);
  const auto ev = reinterpret_cast<cudaEvent_t>(ticket);
  AF_CUDA_CHECK(cudaStreamWaitEvent(s.compute, ev, 0));
  // The wait is queued: the event can go (CUDA releases it once the wait is satisfied).
  AF_CUDA_WARN(cudaEventDestroy(ev));
  for (const Tensor& t : uploaded)
    if (t.defined() && t.numel() > 0 && t.storage()->data() != nullptr)
      s.allocator->record_stream(t.storage()->data(), reinterpret_cast<memory::StreamId>(s.compute));
}

void Uploader::discard(uint64_t ticket) noexcept {
  if (ticket == 0) return;
  AF_CUDA_WARN(cudaEventDestroy(reinterpret_cast<cudaEvent_t>(ticket)));
}

}  // namespace ampforge::cuda
