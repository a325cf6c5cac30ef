// The meta device: tensors with shapes, dtypes, strides and storage sizes but no data, so that a training step
// of any model at any batch runs in seconds on any machine and its memory can be measured for a device that
// is not at hand (`ampforge memory fit --device meta`).
//
// What it computes: nothing. Every op has a meta kernel (register_meta.cpp) that does no arithmetic; the ops/
// layer has already validated the operands and allocated the outputs, through the caching allocator installed
// for DeviceType::Meta. That allocator is the real policy (memory/caching_allocator.h) over a provider that
// hands out address ranges without memory (memory::SimulatedProvider), configured as the device the meta run
// stands for (MetaOptions::target):
//   cpu   the host's rules: the ampforge policy with expandable segments over 2 MiB granules (what
//         `ampforge train` and `memory fit` install on the CPU), so a meta step's peak equals the CPU step's;
//   cuda  the CUDA backend's rules: the ampforge policy over plain segments (cudaMalloc), or expandable
//         segments with AMPFORGE_CUDA_EXPANDABLE_SEGMENTS=1 (the backend's own switch); plus the scratch the CUDA
//         kernels take from the allocator: the persistent 32 MiB cuBLASLt workspace, an estimate of each cuDNN
//         convolution's workspace, and the batch-norm, layer-norm, loss, attention and embedding scratch
//         (cuda_scratch.cpp says which and how).
// Decisions that depend on the device (the fused attention's CUDA limits, GradScaler's F64 reciprocal on the
// CPU) follow the target too (stands_for()).
//
// Data never exists: Tensor::data_ptr() refuses a meta tensor, and copies from meta to another device raise
// NotImplemented, so nothing can read garbage. Code that reads values on the host says what it assumes on meta
// (the common case), documented where it is: train_step treats the loss as finite; GradScaler and the
// optimizers assume no Inf/NaN gradient (the step runs); clip_grad_norm_ assumes the norm exceeds max_norm
// (gradients are scaled, in place); the masked-LM head gathers the expected number of masked rows
// (tasks/masked_lm.h); the YOLO loss assumes foreground anchors exist (tasks/detection_loss.h).
//
// Thread safety: one session at a time per process (sessions nest: the inner one restores the outer one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ampforge/core/device.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/provider.h"

namespace ampforge::meta {

struct MetaOptions {
  DeviceType target = DeviceType::CPU;  // what the meta device stands for: CPU or CUDA
  uint64_t capacity = 0;                // bytes the device holds (a budget); 0: unlimited
  // Expandable segments (virtual memory). CPU target: always (the host provider has virtual memory); CUDA
  // target: the CUDA backend's default, AMPFORGE_CUDA_EXPANDABLE_SEGMENTS=1, read when the options are made.
  bool expandable_segments = true;
  size_t granule = memory::kHostGranule;  // 2 MiB: the host's, and CUDA's virtual-memory minimum on current GPUs

  // The options of a meta device standing for `target` (CPU or CUDA; InvalidArgument otherwise).
  static MetaOptions stand_for(DeviceType target, uint64_t capacity = 0);
};

// Installs a fresh caching allocator for meta tensors while it lives, and the options above. Tensors made on
// the meta device in its scope should die before it: when some outlive it, its memory bookkeeping is kept
// for the rest of the process instead of being freed (storages point at their allocator).
class MetaSession {
 public:
  explicit MetaSession(const MetaOptions& options);
  ~MetaSession();
  MetaSession(const MetaSession&) = delete;
  MetaSession& operator=(const MetaSession&) = delete;

  memory::CachingAllocator& allocator();
  const MetaOptions& options() const;

  struct State;  // defined in meta.cpp

 private:
  State* state_;
  State* previous_;
};

// The device type the meta device currently stands for (the active session's target; CPU without one).
DeviceType target();
// d's type, or for a meta device the type it stands for: what device-dependent decisions should follow.
inline DeviceType stands_for(Device d) { return d.is_meta() ? target() : d.type; }

// The caching allocator serving meta tensors now (the session's, or the default one: CPU rules, no limit).
memory::CachingAllocator& current_allocator();

// Scratch of `bytes` on the meta device for the duration of a kernel call (as backends/cuda's Scratch):
// allocated at construction, freed at destruction, counted by the allocator like any block.
class MetaScratch {
 public:
  explicit MetaScratch(size_t bytes);
  ~MetaScratch();
  MetaScratch(const MetaScratch&) = delete;
  MetaScratch& operator=(const MetaScratch&) = delete;

 private:
  memory::CachingAllocator* allocator_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The persistent cuBLASLt workspace of a CUDA-target session: allocated by the first matmul/linear, kept
// until the session ends (the CUDA backend keeps its workspace for the life of the process).
void ensure_blas_workspace();
inline constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;  // backends/cuda/blas.cpp's kWorkspaceBytes

}  // namespace ampforge::meta
