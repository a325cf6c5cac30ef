// What the layers above backends/ ask of a device, without naming a backend: how many devices there are,
// waiting for them, event timing, graph capture, asynchronous uploads, precision switches, and the facts that
// decide how an op computes there (capabilities). Each backend registers one DeviceRuntime per device type
// when the backends are registered (core/dispatch.h ensure_backends_registered()); train/, optim/, data/, amp/,
// tasks/ and cli/ call these and never a backend's own interface (tests/layering checks it).
//
//   runtime::device_runtime(DeviceType::CUDA).device_count();
//   runtime::synchronize(dev);                                  // no-op on the CPU
//   if (runtime::has_capability(x.device(), runtime::Capability::F64Arithmetic)) ...
//
// The meta device (backends/meta) stands for another device type while a planning session lives
// (plan_for()): its capabilities are that type's, so a planned step decides as the real one would.
//
// Thread safety: registration happens once, under ensure_backends_registered()'s lock; lookups are read-only
// after that. The objects a runtime hands out (EventTimer, Graph, Uploader) follow their own contracts below.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/core/device.h"
#include "ampforge/core/dtype.h"
#include "ampforge/core/tensor.h"

namespace ampforge::runtime {

// ---- capabilities ----------------------------------------------------------------------------------------
// Facts about how a device type computes, declared by its backend next to its kernels' registration (as
// core/dispatch.h's declare_mixed_float_inputs), and asked by ops/, amp/ and tasks/ where a result or a memory
// plan depends on them.
enum class Capability : uint8_t {
  HostMemory,                // its tensors are host memory: host-side work (the YOLO assigner) shares them
  F64Arithmetic,             // kernels compute in F64 (GradScaler's reciprocal as PyTorch's double one)
  FusedBatchNormActivation,  // batch norm applies a following ReLU/SiLU in the same pass
  LimitedFusedAttention,     // fused attention only for F32/F16/BF16, head dims <= ops' kAttentionMaxHeadDimCuda
};

void declare_capability(DeviceType type, Capability c);
// For the meta device: the capabilities of the type it stands for in the current planning session.
bool has_capability(Device device, Capability c);
// The device type whose decisions `device` follows: itself, or what the meta device stands for.
DeviceType behaves_as(Device device);

// ---- objects a runtime hands out -------------------------------------------------------------------------

// Times work queued on a device with the device's own clock (CUDA events on the compute stream): mark()
// records a point without waiting; intervals() waits once for the last mark and returns the seconds between
// consecutive marks, in order.
class EventTimer {
 public:
  virtual ~EventTimer() = default;
  virtual void mark() = 0;
  virtual std::vector<double> intervals() = 0;
};

// A captured sequence of device work replayed with one launch (torch.cuda.CUDAGraph's role). Contract of
// backends/cuda/cuda.h's Graph: tensors the captured work touches stay alive at the same address while the
// graph is replayed; inputs are refreshed by copying into them.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void capture_begin() = 0;
  virtual void capture_end() = 0;  // throws with the device's reason when the capture was invalidated
  virtual void replay() = 0;
  virtual bool ready() const = 0;
  virtual int64_t num_nodes() const = 0;
  virtual int64_t num_kernel_nodes() const = 0;
  virtual int64_t pool_reserved_bytes() const = 0;
  virtual int64_t pool_peak_allocated_bytes() const = 0;
};

// Copies CPU tensors to a device asynchronously (DataLoader prefetch). upload() is thread-safe and returns
// device tensors whose copies are queued, with a ticket; ready(ticket) on the consuming thread orders the
// device's compute after the copies; discard() drops a ticket whose tensors will not be used.
class Uploader {
 public:
  virtual ~Uploader() = default;
  virtual std::vector<Tensor> upload(const std::vector<Tensor>& host, uint64_t* ticket) = 0;
  virtual void ready(const std::vector<Tensor>& uploaded, uint64_t ticket) = 0;
  virtual void discard(uint64_t ticket) noexcept = 0;
};

// While it lives, meta tensors allocate as on a device of the planned type (the real caching policy over
// simulated memory of `capacity` bytes) and decide as that type does (has_capability, behaves_as).
class PlanningSession {
 public:
  virtual ~PlanningSession() = default;
};

// ---- the runtime of one device type ---------------------------------------------------------------------
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // Whether this build contains the backend (independent of a device being present).
  virtual bool is_built() const { return true; }
  virtual int device_count() const = 0;
  // Why there is no device ("" when there is one): the build, the driver, CUDA_VISIBLE_DEVICES.
  virtual std::string unavailable_reason() const { return ""; }
  // Waits on the host for the device's queued work (index -1: every device). A no-op where work is synchronous.
  virtual void synchronize(int /*index*/) {}
  // Host waits for device work so far, any thread (a step that keeps its decisions on the device adds none).
  virtual uint64_t host_sync_count() const { return 0; }
  // Whether this thread is capturing a graph now (work is recorded, not run).
  virtual bool is_capturing() const { return false; }
  // The stream the device's kernels run on, as an opaque id (NCCL orders its collectives against it); 0: none.
  virtual uint64_t compute_stream(int /*index*/) { return 0; }
  // Objects of the interfaces above; a runtime without them throws NotImplemented naming the device type.
  virtual std::unique_ptr<EventTimer> event_timer(int index);
  virtual std::unique_ptr<Graph> graph(int index);
  virtual std::unique_ptr<Uploader> uploader(int index, int buffers);
  // TF32 for F32 products and convolutions (tensor cores); false where there is no such mode.
  virtual void set_allow_tf32(bool /*products*/, bool /*convolutions*/) {}
  virtual bool allow_tf32_products() const { return false; }
  virtual bool allow_tf32_convolutions() const { return false; }
  // The libraries the backend runs on, one line each for `ampforge info` (e.g. "cuDNN: 9.10.2 (CUDA conv2d)").
  virtual std::vector<std::string> library_lines() const { return {}; }
  // What a user should know when training at `precision` here ("" when nothing): e.g. that BF16 products run
  // in F32 on copies on a CPU without fast BF16 kernels.
  virtual std::string precision_note(DType /*precision*/) const { return ""; }
  // The meta device only: a planning session standing for `type` with `capacity` bytes (0: unlimited), and
  // whether such a session's allocator uses expandable segments.
  virtual std::unique_ptr<PlanningSession> plan_for(DeviceType type, uint64_t capacity);
  virtual bool plans_expandable_segments(DeviceType /*type*/) const { return false; }
  // The meta device only: the type it stands for now.
  virtual DeviceType stands_for() const { return DeviceType::CPU; }
};

// Called by a backend's registration function; a second registration for a type throws (a double init).
void register_device_runtime(DeviceType type, std::unique_ptr<DeviceRuntime> runtime);
// The runtime of a type (backends registered first). A type whose backend registered none answers "no device"
// with the reason that this build has no such backend.
DeviceRuntime& device_runtime(DeviceType type);
inline DeviceRuntime& device_runtime(Device device) { return device_runtime(device.type); }

// Conveniences over device_runtime(device).
inline void synchronize(Device device) { device_runtime(device).synchronize(static_cast<int>(device.index)); }
// InvalidArgument naming the device, the count and the reason when `device` does not exist (CPU and meta: always
// exist). `what` prefixes the message (e.g. "--device cuda:3").
void check_device_exists(Device device, const std::string& what);
// A meta device planning as `type` while the returned session lives (InvalidArgument for an unsupported type).
std::unique_ptr<PlanningSession> plan_for(DeviceType type, uint64_t capacity = 0);
bool plans_expandable_segments(DeviceType type);

}  // namespace ampforge::runtime
