// The CUDA `copy` kernel: dst <- src with broadcasting and dtype conversion, where at least one side is
// on a CUDA device. ops::to_device dispatches it on the CUDA side of a transfer, so it handles:
//   CUDA -> same CUDA device   copy_on_device (one memcpy when both are dense in the same layout)
//   CPU  -> CUDA (H2D)         one cudaMemcpyAsync from a host buffer laid out as dst; when src is not such
//                              a buffer (other dtype, strides, broadcast), the CPU kernel stages it first
//   CUDA -> CPU  (D2H)         one cudaMemcpyAsync into a host buffer laid out as a dense device tensor,
//                              then the CPU kernel converts/scatters it into dst; synchronises (the host
//                              needs the data) and reports device-side errors
//   CUDA -> other CUDA device  a dense staging copy on the source device, cudaMemcpyPeerAsync, then
//                              copy_on_device on the destination device
// Every transfer runs on the compute stream of the CUDA device involved (see cuda.h: program order).
#include <cuda_runtime_api.h>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/backends/cuda/runtime.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cuda {
namespace {

MemoryFormat dense_format(const Tensor& t) {
  if (t.is_contiguous()) return MemoryFormat::Contiguous;
  if (t.is_contiguous(MemoryFormat::ChannelsLast)) return MemoryFormat::ChannelsLast;
  return MemoryFormat::Preserve;  // not dense
}

bool is_dense(const Tensor& t) { return dense_format(t) != MemoryFormat::Preserve; }

// Same dtype and shape, both dense with the same layout: the bytes can move as one block.
bool same_dense_layout(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  for (MemoryFormat f : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast})
    if (a.is_contiguous(f) && b.is_contiguous(f)) return true;
  return false;
}

// A tensor of `like`'s shape and `dtype` on `device`, dense in like's layout when like is dense.
Tensor empty_dense_like(const Tensor& like, DType dtype, Device device) {
  const MemoryFormat f = dense_format(like);
  return Tensor::empty(like.shape(), dtype, device, f == MemoryFormat::ChannelsLast ? f : MemoryFormat::Contiguous);
}

void cpu_copy(const Tensor& dst, const Tensor& src) { dispatch(OpId::copy, kCPU, {src}, {dst}); }

// Whether host memory is page-locked (pinned) by CUDA: an async copy from/to it returns before the
// transfer ends, so the buffer must stay alive (and unchanged) until the stream gets there.
bool is_pinned(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

void host_to_device(const Tensor& dst, const Tensor& src) {
  const Device dev = dst.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_for(dev);
  // The device side must be dense to receive one block: a dense temporary otherwise.
  const Tensor ddst = is_dense(dst) ? dst : empty_dense_like(dst, dst.dtype(), dev);
  // The host side: src itself when it already has ddst's dtype, shape and layout; else staged by the
  // CPU copy kernel (broadcast, strides, dtype conversion).
  Tensor hsrc = src;
  if (!same_dense_layout(src, ddst)) {
    hsrc = empty_dense_like(ddst, ddst.dtype(), kCPU);
    cpu_copy(hsrc, src);
  }
  AF_CUDA_CHECK(cudaMemcpyAsync(ddst.data_ptr(), hsrc.data_ptr(), static_cast<size_t>(ddst.nbytes()),
                                cudaMemcpyHostToDevice, stream));
  // From pageable memory the call returns once the source has been staged, so hsrc may go; from pinned
  // memory the transfer is still in flight: wait before the host buffer can be freed or reused.
  if (is_pinned(hsrc.data_ptr())) {
    count_host_sync();
    AF_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  if (!ddst.is_same(dst)) copy_on_device(dst, ddst);
}

void device_to_host(const Tensor& dst, const Tensor& src) {
  const Device dev = src.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_for(dev);
  Tensor dsrc = src;
  if (!is_dense(src)) {
    dsrc = empty_dense_like(src, src.dtype(), dev);
    copy_on_device(dsrc, src);
  }
  const bool direct = same_dense_layout(dsrc, dst);
  const Tensor hdst = direct ? dst : empty_dense_like(dsrc, dsrc.dtype(), kCPU);
  AF_CUDA_CHECK(cudaMemcpyAsync(hdst.data_ptr(), dsrc.data_ptr(), static_cast<size_t>(dsrc.nbytes()),
                                cudaMemcpyDeviceToHost, stream));
  count_host_sync();
  AF_CUDA_CHECK(cudaStreamSynchronize(stream));
  check_device_errors(dev.index);
  if (!direct) cpu_copy(dst, hdst);
}

void device_to_device(const Tensor& dst, const Tensor& src) {
  const Device sdev = src.device(), ddev = dst.device();
  Tensor dsrc = src;
  {
    DeviceGuard guard(sdev);
    if (!is_dense(src)) {
      dsrc = empty_dense_like(src, src.dtype(), sdev);
      copy_on_device(dsrc, src);
    }
    // The peer copy runs on the destination's stream: the source's pending work must finish first.
    count_host_sync();
    AF_CUDA_CHECK(cudaStreamSynchronize(stream_for(sdev)));
  }
  DeviceGuard guard(ddev);
  const Tensor ddst = same_dense_layout(dsrc, dst) ? dst : empty_dense_like(dsrc, dsrc.dtype(), ddev);
  AF_CUDA_CHECK(cudaMemcpyPeerAsync(ddst.data_ptr(), ddev.index, dsrc.data_ptr(), sdev.index,
                                    static_cast<size_t>(dsrc.nbytes()), stream_for(ddev)));
  // dsrc belongs to the source device's stream: keep it alive until the transfer is done.
  count_host_sync();
  AF_CUDA_CHECK(cudaStreamSynchronize(stream_for(ddev)));
  if (!ddst.is_same(dst)) copy_on_device(dst, ddst);
}

void copy_kernel(const KernelArgs& a) {
  const Tensor& dst = a.out(0);
  const Tensor& src = a.in(0);
  if (dst.numel() == 0) return;
  const Device sd = src.device(), dd = dst.device();
  // A captured graph would replay a transfer from host memory that may be gone by then, and a copy to the
  // host needs a synchronisation, which a capture cannot contain: refuse clearly instead of letting the
  // capture fail later with an opaque status.
  AF_CHECK(sd == dd || !is_capturing(),
           "copy {} -> {} inside a CUDA graph capture: captured work must stay on the device (copy inputs into the "
           "graph's static tensors before replay, read results after it)", sd.str(), dd.str());
  if (sd == dd) {
    copy_on_device(dst, src);
  } else if (sd.is_cpu() && dd.is_cuda()) {
    host_to_device(dst, src);
  } else if (sd.is_cuda() && dd.is_cpu()) {
    device_to_host(dst, src);
  } else if (sd.is_cuda() && dd.is_cuda()) {
    device_to_device(dst, src);
  } else {
    AF_THROW(Internal, "CUDA copy kernel called for {} -> {}", sd.str(), dd.str());
  }
}

}  // namespace

void register_copy_cuda() { register_kernel(OpId::copy, DeviceType::CUDA, copy_kernel); }

}  // namespace ampforge::cuda
