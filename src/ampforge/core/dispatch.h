// The kernel registry: one function pointer per (op, device type), filled by explicit registration
// functions (backends/cpu/register_cpu.cpp, backends/cuda/...), never by static initialisers.
//
// Kernel contract: every kernel has the signature void(const KernelArgs&). The ops/ layer has already
// validated shapes, dtypes and devices, allocated the outputs, and put op-specific parameters in an
// attrs struct (core/attrs.h). Kernels overwrite their outputs unless the attrs say otherwise.
#pragma once

#include <initializer_list>
#include <span>

#include "ampforge/core/op_list.h"
#include "ampforge/core/tensor.h"

namespace ampforge {

struct KernelArgs {
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;
  const void* attrs = nullptr;

  const Tensor& in(size_t i) const { return inputs[i]; }
  const Tensor& out(size_t i) const { return outputs[i]; }
  template <class A>
  const A& attr() const {
    return *static_cast<const A*>(attrs);
  }
};

using KernelFn = void (*)(const KernelArgs&);

// Registers a kernel; registering the same (op, device type) twice throws (a sign of a double init).
void register_kernel(OpId op, DeviceType device, KernelFn fn);
bool has_kernel(OpId op, DeviceType device);

// Capability: the kernel of `op` on `device` computes an F32 result from F16/BF16 operands (or a mix with
// F32 ones) read as they are, converting in its loop. ops/ then passes such operands unconverted instead
// of making a full-size F32 copy first. Declared by the backend next to the registration.
void declare_mixed_float_inputs(OpId op, DeviceType device);
bool accepts_mixed_float_inputs(OpId op, DeviceType device);

// Observer called around every dispatch (the profiler installs one). Null: no cost beyond one branch.
struct DispatchObserver {
  void* (*on_begin)(OpId op, const KernelArgs& args) = nullptr;
  void (*on_end)(void* token) = nullptr;
};
void set_dispatch_observer(const DispatchObserver* observer);

// Runs the kernel for `op` on `device`; an unregistered pair throws NotImplemented naming both.
void dispatch(OpId op, Device device, const KernelArgs& args);

// Convenience: dispatch(op, device, {inputs}, {outputs}, &attrs).
void dispatch(OpId op, Device device, std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
              const void* attrs = nullptr);

// Registers the built-in backends once (CPU always; CUDA when built and present). Called by ops on first
// use; idempotent and thread-safe.
void ensure_backends_registered();

}  // namespace ampforge
