// The CUDA backend's entry point (called once from core/dispatch.cpp's ensure_backends_registered()).
// Without a usable device (no driver, no GPU, CUDA_VISIBLE_DEVICES empty) nothing is registered and no
// allocator is installed, so CUDA tensors and ops fail with messages that say why.
#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/backends/cuda/runtime.h"
#include "ampforge/core/allocator.h"
#include "ampforge/memory/global.h"
#include "ampforge/util/log.h"

namespace ampforge {

bool register_cuda_backend() {
  if (cuda::device_count() == 0) {
    log(LogLevel::Debug, "CUDA backend not registered: {}", cuda::unavailable_reason());
    return false;
  }
  set_allocator(DeviceType::CUDA, cuda::cuda_allocator());
  // memory::caching_allocator_for(cuda:N), and so memory::trace_start/step/allocator_stats(Device) and the
  // profiler's memory samples, reach each device's caching allocator.
  memory::set_caching_allocator_resolver(DeviceType::CUDA, [](int device) { return cuda::caching_allocator(device); });
  cuda::register_kernels_cuda();
  return true;
}

namespace cuda {
void register_kernels_cuda() {
  register_copy_cuda();
  register_elementwise_cuda();
  register_unary_cuda();
  register_random_cuda();
  register_reduce_cuda();
  register_softmax_cuda();
  register_optim_cuda();
  register_blas_cuda();
  register_conv_cuda();
  register_pool_cuda();
  register_norm_cuda();
  register_embedding_cuda();
  register_attention_cuda();
}
}  // namespace cuda

}  // namespace ampforge
