// ops/: creation, copies, layout.
#include <cmath>

#include "ampforge/ops/ops.h"

namespace ampforge::ops {

void fill_(const Tensor& t, double value) {
  check_defined(t, "fill_", "self");
  FillAttrs at{value};
  dispatch(OpId::fill, t.device(), {}, {t}, &at);
  t.storage()->bump_version();
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_(t, value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t) { return full_like(t, 0.0); }
Tensor ones_like(const Tensor& t) { return full_like(t, 1.0); }
Tensor full_like(const Tensor& t, double value) {
  Tensor o = empty_like(t);
  fill_(o, value);
  return o;
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  AF_CHECK(step != 0, "arange: step must be non-zero");
  AF_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), "arange: start, end and step must be finite");
  const double n = std::ceil((end - start) / step);
  AF_CHECK(n >= 0, "arange: the range [{}, {}) with step {} is empty in the wrong direction", start, end, step);
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(n)}, dtype, device);
  ArangeAttrs at{start, step};
  dispatch(OpId::arange, device, {}, {t}, &at);
  return t;
}

void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  check_float(t, "uniform_", "self");
  AF_CHECK(low <= high, "uniform_: expected low <= high, got [{}, {})", low, high);
  AF_CHECK(t.is_contiguous(), "uniform_: the tensor must be contiguous");
  Generator& g = gen ? *gen : default_generator();
  RandAttrs at{g.reserve(t.numel()), low, high};
  dispatch(OpId::rand_uniform, t.device(), {}, {t}, &at);
  t.storage()->bump_version();
}

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  check_float(t, "normal_", "self");
  AF_CHECK(std >= 0, "normal_: std must be >= 0, got {}", std);
  AF_CHECK(t.is_contiguous(), "normal_: the tensor must be contiguous");
  Generator& g = gen ? *gen : default_generator();
  RandAttrs at{g.reserve(2 * t.numel()), mean, std};  // one Box-Muller pair (2 counters' worth) per 2 values
  dispatch(OpId::rand_normal, t.device(), {}, {t}, &at);
  t.storage()->bump_version();
}

Tensor rand(const Shape& shape, DType dtype, Device device, Generator* gen, double low, double high) {
  Tensor t = Tensor::empty(shape, dtype, device);
  uniform_(t, low, high, gen);
  return t;
}

Tensor randn(const Shape& shape, DType dtype, Device device, Generator* gen, double mean, double std) {
  Tensor t = Tensor::empty(shape, dtype, device);
  normal_(t, mean, std, gen);
  return t;
}

void copy_(const Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy_", "dst");
  check_defined(src, "copy_", "src");
  check_same_device(dst, src, "copy_");
  broadcast_shapes(dst.shape(), src.shape(), "copy_");
  AF_CHECK(src.dim() <= dst.dim(), "copy_: source shape {} does not broadcast to destination shape {}",
           src.shape().str(), dst.shape().str());
  for (int i = 0; i < src.dim(); ++i) {
    const int64_t s = src.shape()[i], d = dst.shape()[dst.dim() - src.dim() + i];
    AF_CHECK(s == d || s == 1, "copy_: source shape {} does not broadcast to destination shape {}", src.shape().str(),
             dst.shape().str());
  }
  dispatch(OpId::copy, dst.device(), {src}, {dst});
  dst.storage()->bump_version();
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  check_defined(t, "to", "self");
  if (t.dtype() == dtype) return t;
  Tensor o = empty_like(t, dtype);
  dispatch(OpId::copy, t.device(), {t}, {o});
  return o;
}

Tensor contiguous(const Tensor& t, MemoryFormat format) {
  check_defined(t, "contiguous", "self");
  if (format == MemoryFormat::Preserve) format = t.suggest_memory_format();
  if (format == MemoryFormat::ChannelsLast)
    AF_CHECK(t.dim() == 4, "contiguous(ChannelsLast): needs a 4-D tensor, got shape {}", t.shape().str());
  if (t.is_contiguous(format)) {
    if (format != MemoryFormat::ChannelsLast || t.suggest_memory_format() == MemoryFormat::ChannelsLast) return t;
    // The memory already is channels-last (size-1 dims make both layouts fit, e.g. one channel): only
    // the strides change, so downstream ops see the layout that was asked for. No copy.
    return t.as_strided_raw(t.shape(), channels_last_strides(t.shape()), t.offset());
  }
  Tensor o = Tensor::empty(t.shape(), t.dtype(), t.device(), format);
  dispatch(OpId::copy, t.device(), {t}, {o});
  return o;
}

Tensor clone(const Tensor& t, MemoryFormat format) {
  check_defined(t, "clone", "self");
  Tensor o = empty_like(t, format);
  dispatch(OpId::copy, t.device(), {t}, {o});
  return o;
}

Tensor to_device(const Tensor& t, Device device) {
  check_defined(t, "to", "self");
  if (t.device() == device) return t;
  // The meta device (backends/meta/meta.h): a tensor moved there keeps its shape, dtype and layout and loses
  // its values; nothing comes back from it, because there is nothing to copy.
  if (t.device().is_meta())
    AF_THROW(NotImplemented, "to({}): a tensor on the meta device has no data to copy (shape {}, {}); meta tensors "
             "only carry shapes and sizes", device.str(), t.shape().str(), dtype_name(t.dtype()));
  if (device.is_meta()) {
    Tensor o = Tensor::empty(t.shape(), t.dtype(), device, t.suggest_memory_format());
    dispatch(OpId::copy, device, {t}, {o});
    return o;
  }
  // Transfers are the CUDA backend's copy kernel, dispatched on the CUDA side (it handles host<->device
  // and device<->device). The result keeps a dense layout of the source (contiguous or channels-last).
  AF_CHECK(t.device().is_cuda() || device.is_cuda(), "to({}): no copy path from {} to {}", device.str(),
           t.device().str(), device.str());
  if (!has_kernel(OpId::copy, DeviceType::CUDA))
    AF_THROW(NotImplemented, "to({}): copies between {} and {} need the CUDA backend, which this build does not "
             "have or which found no device", device.str(), t.device().str(), device.str());
  Tensor o = Tensor::empty(t.shape(), t.dtype(), device, t.suggest_memory_format());
  dispatch(OpId::copy, device.is_cuda() ? device : t.device(), {t}, {o});
  return o;
}

}  // namespace ampforge::ops
