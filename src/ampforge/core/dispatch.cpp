#include "ampforge/core/dispatch.h"

#include <array>
#include <atomic>
#include <mutex>

#include "ampforge/util/error.h"

namespace ampforge {
namespace {

struct OpInfo {
  const char* name;
  AmpCategory amp;
  bool differentiable;
};

constexpr OpInfo kOpInfo[] = {
#define AF_OP_INFO(name, amp, diff) {#name, AmpCategory::amp, diff},
    AF_FOR_EACH_OP(AF_OP_INFO)
#undef AF_OP_INFO
};
static_assert(sizeof(kOpInfo) / sizeof(kOpInfo[0]) == kNumOps);

std::array<std::array<KernelFn, kNumDeviceTypes>, kNumOps> g_table{};
std::array<std::array<bool, kNumDeviceTypes>, kNumOps> g_mixed{};
std::atomic<const DispatchObserver*> g_observer{nullptr};

}  // namespace

const char* op_name(OpId op) { return kOpInfo[static_cast<int>(op)].name; }
AmpCategory op_amp_category(OpId op, DeviceType device) {
  const AmpCategory cuda = kOpInfo[static_cast<int>(op)].amp;
  if (device == DeviceType::CUDA || cuda != AmpCategory::F32) return cuda;
  // PyTorch's CPU lists: the same lower-precision ops (convolutions, matrix products, attention), but of the
  // ops CUDA runs in F32 only the losses; softmax, layer_norm, exp, log, pow, rsqrt and sum keep their input
  // dtype on the CPU (its kernels accumulate 16-bit inputs in float anyway).
  switch (op) {
    case OpId::cross_entropy:
    case OpId::bce_with_logits: return AmpCategory::F32;
    default: return AmpCategory::None;
  }
}
bool op_differentiable(OpId op) { return kOpInfo[static_cast<int>(op)].differentiable; }

void register_kernel(OpId op, DeviceType device, KernelFn fn) {
  KernelFn& slot = g_table[static_cast<int>(op)][static_cast<int>(device)];
  AF_ASSERT(slot == nullptr, "kernel for op '{}' on {} registered twice", op_name(op), device_type_name(device));
  slot = fn;
}

bool has_kernel(OpId op, DeviceType device) {
  ensure_backends_registered();
  return g_table[static_cast<int>(op)][static_cast<int>(device)] != nullptr;
}

void declare_mixed_float_inputs(OpId op, DeviceType device) {
  g_mixed[static_cast<int>(op)][static_cast<int>(device)] = true;
}

bool accepts_mixed_float_inputs(OpId op, DeviceType device) {
  ensure_backends_registered();
  return g_mixed[static_cast<int>(op)][static_cast<int>(device)];
}

void set_dispatch_observer(const DispatchObserver* observer) { g_observer.store(observer, std::memory_order_release); }

void dispatch(OpId op, Device device, const KernelArgs& args) {
  ensure_backends_registered();
  KernelFn fn = g_table[static_cast<int>(op)][static_cast<int>(device.type)];
  if (fn == nullptr) [[unlikely]] {
    AF_THROW(NotImplemented, "op '{}' has no kernel for device {} (there is no fallback to another device; move "
             "the tensors with .to(\"cpu\") if that is what you want)", op_name(op), device.str());
  }
  const DispatchObserver* obs = g_observer.load(std::memory_order_acquire);
  if (obs == nullptr) [[likely]] {
    fn(args);
    return;
  }
  void* token = obs->on_begin(op, args);
  try {
    fn(args);
  } catch (...) {
    obs->on_end(token);
    throw;
  }
  obs->on_end(token);
}

void dispatch(OpId op, Device device, std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
              const void* attrs) {
  KernelArgs args{std::span<const Tensor>(inputs.begin(), inputs.size()),
                  std::span<const Tensor>(outputs.begin(), outputs.size()), attrs};
  dispatch(op, device, args);
}

// Backend registration entry points, defined in backends/. Declared here (not included) because
// core sits below backends in the dependency order; the linker ties them together.
void register_cpu_backend();
void register_cuda_runtime();  // core/runtime.h's CUDA runtime, in every build (no device: it says why)
bool register_cuda_backend();  // false when the CUDA backend is not built or no device is present
void register_meta_backend();

void ensure_backends_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_cpu_backend();
    register_cuda_runtime();
    register_cuda_backend();
    register_meta_backend();
  });
}

}  // namespace ampforge
