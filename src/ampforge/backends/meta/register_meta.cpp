// The meta backend's kernels: one per op of the op list, none of which computes anything (meta.h). The ops/
// layer allocates every output before it dispatches, so the generic kernel has nothing to do. When the meta
// device stands for CUDA, the kernels of ops whose CUDA kernels take memory from the caching allocator take the
// same amount for the duration of the call (cuda_scratch.h), so that a meta step's peak is the GPU step's; likewise
// for the few CPU kernels that do (cpu_scratch.h) when it stands for the CPU.
#include "ampforge/backends/meta/cpu_scratch.h"
#include "ampforge/backends/meta/cuda_scratch.h"
#include "ampforge/backends/meta/meta.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/core/runtime.h"

#include <memory>

namespace ampforge {

namespace meta::detail {
void install_default_allocator();
}

namespace {

void meta_nothing(const KernelArgs&) {}

// Runs `scratch` only when the meta device stands for CUDA.
template <void (*scratch)(const KernelArgs&)>
void meta_cuda_scratch(const KernelArgs& args) {
  if (meta::target() == DeviceType::CUDA) scratch(args);
}

// Runs the CUDA kernel's scratch or the CPU kernel's, whichever device the meta device stands for.
template <void (*cuda)(const KernelArgs&), void (*cpu)(const KernelArgs&)>
void meta_scratch(const KernelArgs& args) {
  if (meta::target() == DeviceType::CUDA) cuda(args);
  else if (meta::target() == DeviceType::CPU) cpu(args);
}

KernelFn meta_kernel(OpId op) {
  namespace cs = meta::cuda_scratch;
  namespace hs = meta::cpu_scratch;
  switch (op) {
    case OpId::matmul:
    case OpId::linear: return meta_cuda_scratch<cs::blas>;
    case OpId::conv2d: return meta_scratch<cs::conv2d, hs::conv2d>;
    case OpId::conv2d_backward_input: return meta_scratch<cs::conv2d_backward_input, hs::conv2d_backward_input>;
    case OpId::conv2d_backward_weight: return meta_scratch<cs::conv2d_backward_weight, hs::conv2d_backward_weight>;
    case OpId::batch_norm: return meta_cuda_scratch<cs::batch_norm>;
    case OpId::batch_norm_backward: return meta_scratch<cs::batch_norm_backward, hs::batch_norm_backward>;
    case OpId::layer_norm_backward: return meta_cuda_scratch<cs::layer_norm_backward>;
    case OpId::cross_entropy: return meta_cuda_scratch<cs::cross_entropy>;
    case OpId::bce_with_logits: return meta_cuda_scratch<cs::bce_with_logits>;
    case OpId::attention_backward: return meta_cuda_scratch<cs::attention_backward>;
    case OpId::embedding_backward: return meta_cuda_scratch<cs::embedding_backward>;
    default: return meta_nothing;
  }
}

// The meta device's runtime (core/runtime.h): always present, synchronous, and the one that plans for another
// device type (a MetaSession standing for it).
class MetaPlan final : public runtime::PlanningSession {
 public:
  MetaPlan(DeviceType type, uint64_t capacity) : session_(meta::MetaOptions::stand_for(type, capacity)) {}

 private:
  meta::MetaSession session_;
};

class MetaRuntime final : public runtime::DeviceRuntime {
 public:
  int device_count() const override { return 1; }
  DeviceType stands_for() const override { return meta::target(); }
  std::unique_ptr<runtime::PlanningSession> plan_for(DeviceType type, uint64_t capacity) override {
    return std::make_unique<MetaPlan>(type, capacity);
  }
  bool plans_expandable_segments(DeviceType type) const override {
    return meta::MetaOptions::stand_for(type).expandable_segments;
  }
};

}  // namespace

// Called once from ensure_backends_registered() (core/dispatch.cpp).
void register_meta_backend() {
  runtime::register_device_runtime(DeviceType::Meta, std::make_unique<MetaRuntime>());
  for (int i = 0; i < kNumOps; ++i) register_kernel(static_cast<OpId>(i), DeviceType::Meta, meta_kernel(static_cast<OpId>(i)));
  meta::detail::install_default_allocator();
}

}  // namespace ampforge
