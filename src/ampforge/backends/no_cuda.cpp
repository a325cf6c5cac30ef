// Entry point for the CUDA backend as seen from core/dispatch.cpp, and the public CUDA interface
// (backends/cuda/cuda.h), for builds without CUDA: nothing to register, no devices. Callers learn that
// from `false` / 0 instead of #ifdefs.
#include "ampforge/backends/cuda/cuda.h"
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
uint64_t compute_stream(int device) { no_device(device); }
uint64_t copy_stream(int device) { no_device(device); }
memory::CachingAllocator* caching_allocator(int) { return nullptr; }
}  // namespace cuda
#endif

}  // namespace ampforge
