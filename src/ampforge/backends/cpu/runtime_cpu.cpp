// The CPU's device runtime (core/runtime.h): one device, work synchronous, and what a user should know about
// 16-bit training on this CPU.
#include "ampforge/backends/cpu/bf16_compute.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/core/runtime.h"

#include <fmt/format.h>

namespace ampforge::cpu {
namespace {

class CpuRuntime final : public runtime::DeviceRuntime {
 public:
  int device_count() const override { return 1; }
  std::string precision_note(DType precision) const override {
    // BF16 on a CPU whose BF16 kernels are not faster than F32 (bf16_compute.h): say what the user gets.
    if (precision != DType::BF16 || cpu_bf16_compute(Bf16Kind::Matmul) != Bf16Compute::F32 ||
        cpu_bf16_compute(Bf16Kind::Conv) != Bf16Compute::F32)
      return "";
    return fmt::format("bf16 products and convolutions run in F32 on copies on this CPU (products: {}; convolutions: "
                       "{}): bf16 halves activation memory and traffic, but its products are not faster than fp32's "
                       "(AMPFORGE_CPU_BF16=native runs the BF16 kernels anyway)",
                       cpu_bf16_summary(Bf16Kind::Matmul), cpu_bf16_summary(Bf16Kind::Conv));
  }
};

}  // namespace

void register_cpu_runtime() {
  runtime::register_device_runtime(DeviceType::CPU, std::make_unique<CpuRuntime>());
  using runtime::Capability;
  runtime::declare_capability(DeviceType::CPU, Capability::HostMemory);
  runtime::declare_capability(DeviceType::CPU, Capability::F64Arithmetic);
  runtime::declare_capability(DeviceType::CPU, Capability::FusedBatchNormActivation);
}

}  // namespace ampforge::cpu
