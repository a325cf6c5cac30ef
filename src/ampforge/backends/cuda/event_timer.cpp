// cuda::EventTimer (cuda.h): timing events on a device's compute stream.
#include <vector>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/runtime.h"
#include "ampforge/util/error.h"
#include "ampforge/util/log.h"

namespace ampforge::cuda {

struct EventTimer::Impl {
  std::vector<cudaEvent_t> events;
};

EventTimer::EventTimer(int device) : device_(device), impl_(nullptr) {
  AF_CHECK(device >= 0 && device < device_count(), "CUDA device {} does not exist ({} device(s))", device,
           device_count());
  impl_ = new Impl;
}

EventTimer::~EventTimer() {
  if (impl_ == nullptr) return;
  try {  // selecting the device fails after a device loss: a destructor must not throw (std::terminate)
    DeviceGuard guard(device_);
    for (cudaEvent_t e : impl_->events) AF_CUDA_WARN(cudaEventDestroy(e));
  } catch (const std::exception& e) {
    log(LogLevel::Warn, "EventTimer: events of cuda:{} not destroyed: {}", device_, e.what());
  }
  delete impl_;
}

void EventTimer::mark() {
  AF_CHECK(!is_capturing(), "EventTimer::mark inside a CUDA graph capture (mark around the replay instead)");
  DeviceGuard guard(device_);
  cudaEvent_t e = nullptr;
  AF_CUDA_CHECK(cudaEventCreate(&e));  // with timing (the default flags)
  impl_->events.push_back(e);
  AF_CUDA_CHECK(cudaEventRecord(e, device_state(device_).compute));
}

std::vector<double> EventTimer::intervals() {
  std::vector<double> out;
  if (impl_->events.size() < 2) return out;
  DeviceGuard guard(device_);
  count_host_sync();
  AF_CUDA_CHECK(cudaEventSynchronize(impl_->events.back()));
  for (size_t i = 1; i < impl_->events.size(); ++i) {
    float ms = 0;
    AF_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->events[i - 1], impl_->events[i]));
    out.push_back(1e-3 * static_cast<double>(ms));
  }
  return out;
}

int64_t EventTimer::marks() const { return static_cast<int64_t>(impl_->events.size()); }

}  // namespace ampforge::cuda
