// DLPack both ways (the array API's protocol: __dlpack__, __dlpack_device__, from_dlpack), without copies.
//   export: Tensor.__dlpack__ hands out a capsule (versioned when the consumer asks with max_version >= (1, 0))
//           through nanobind's ndarray object, whose owner keeps the tensor's storage alive; a CUDA tensor's device
//           is synchronised first, so a consumer on any stream reads finished values.
//   import: nanobind's ndarray caster asks the producer's __dlpack__ (or the buffer protocol) for a writable view;
//           the tensor's storage wraps that memory and holds the producer's capsule until the last ampforge handle
//           to it dies. A read-only producer (a NumPy array with writeable=False) is copied: ampforge tensors are
//           always writable.
// dtypes: float32, float16, bfloat16, float64, int32, int64, uint8, bool.
#include "common.h"

namespace ampforge::python {

nb::dlpack::dtype tensor_dl_dtype(af::DType d);

namespace {

af::DType dtype_of_dl(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    switch (static_cast<C>(t.code)) {
      case C::Float:
        if (t.bits == 32) return af::DType::F32;
        if (t.bits == 16) return af::DType::F16;
        if (t.bits == 64) return af::DType::F64;
        break;
      case C::Bfloat:
        if (t.bits == 16) return af::DType::BF16;
        break;
      case C::Int:
        if (t.bits == 32) return af::DType::I32;
        if (t.bits == 64) return af::DType::I64;
        break;
      case C::UInt:
        if (t.bits == 8) return af::DType::U8;
        break;
      case C::Bool:
        if (t.bits == 8) return af::DType::Bool;
        break;
      default: break;
    }
  }
  throw nb::type_error(("from_dlpack: dtype (code " + std::to_string(t.code) + ", " + std::to_string(t.bits) +
                        " bits) has no ampforge dtype (float32, float16, bfloat16, float64, int32, int64, uint8, "
                        "bool)")
                           .c_str());
}

af::Device device_of_dl(int type, int id) {
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) return af::kCPU;
  if (type == nb::device::cuda::value) return af::Device(af::DeviceType::CUDA, id);
  throw nb::type_error(("from_dlpack: DLPack device type " + std::to_string(type) +
                        " is not one ampforge has (CPU 1, CUDA 2)")
                           .c_str());
}

// A tensor over the memory `a` describes; `holder` keeps the producer's buffer alive.
template <class Array>
af::Tensor wrap(const Array& a, bool copy_out) {
  const af::DType dtype = dtype_of_dl(a.dtype());
  const af::Device device = device_of_dl(a.device_type(), a.device_id());
  if (a.ndim() > static_cast<size_t>(af::kMaxDims))
    throw nb::value_error(("from_dlpack: " + std::to_string(a.ndim()) + " dimensions; ampforge tensors have at most " +
                           std::to_string(af::kMaxDims)).c_str());
  af::Shape shape, strides;
  int64_t lo = 0, hi = 0, numel = 1;
  for (size_t i = 0; i < a.ndim(); ++i) {
    const int64_t n = static_cast<int64_t>(a.shape(i)), s = a.stride(i);
    shape.push_back(n);
    strides.push_back(s);
    numel *= n;
    if (n > 1) (s >= 0 ? hi : lo) += (n - 1) * s;
  }
  if (lo < 0)
    throw nb::value_error("from_dlpack: negative strides have no ampforge view; pass a copy (e.g. numpy's "
                          "ascontiguousarray)");
  const int64_t extent = numel == 0 ? 0 : hi + 1;
  auto* holder = new Array(a);
  auto release = [holder](void*) {
    if (nb::is_alive()) {
      nb::gil_scoped_acquire gil;
      delete holder;
    }
  };
  void* base = const_cast<void*>(static_cast<const void*>(a.data()));
  af::Tensor flat = af::Tensor::from_blob(base, af::Shape{extent}, dtype, device, release);
  af::Tensor t = flat.as_strided_raw(shape, strides, 0);
  if (copy_out) {
    EngineCall call;
    return t.clone();
  }
  return t;
}

}  // namespace

nb::object tensor_dlpack(const af::Tensor& t, nb::kwargs kwargs) {
  if (!t.defined()) throw nb::value_error("the tensor is undefined");
  if (t.requires_grad())
    throw std::runtime_error("__dlpack__: the tensor requires grad; export tensor.detach() (the consumer shares the "
                             "data, not the autograd history)");
  af::Tensor x = t;
  nb::kwargs pass;
  for (auto [k, v] : kwargs) {
    if (nb::cast<std::string>(k) == "copy") {
      if (!v.is_none() && nb::cast<bool>(v)) {
        EngineCall call;
        x = x.clone();
      }
    } else {
      pass[k] = v;
    }
  }
  if (x.device().is_meta()) throw nb::buffer_error("__dlpack__: meta tensors have no data to share");
  if (!x.device().is_cpu()) {
    EngineCall call;
    af::runtime::synchronize(x.device());
  }
  auto* owner = new af::Storage(x.storage());
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<af::Storage*>(p); });
  std::vector<size_t> shape;
  std::vector<int64_t> strides;
  for (int i = 0; i < x.dim(); ++i) {
    shape.push_back(static_cast<size_t>(x.size(i)));
    strides.push_back(x.stride(i));
  }
  const int dev_type = x.device().is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  nb::ndarray<nb::array_api> nd(x.numel() == 0 ? nullptr : x.data_ptr(), shape.size(), shape.data(), cap,
                                strides.data(), tensor_dl_dtype(x.dtype()), dev_type, x.device().is_cuda() ? x.device().index : 0);
  nb::object arr = nb::cast(nd);
  return arr.attr("__dlpack__")(**pass);
}

nb::tuple tensor_dlpack_device(const af::Tensor& t) {
  if (!t.defined()) throw nb::value_error("the tensor is undefined");
  const af::Device d = t.device();
  if (d.is_cuda()) return nb::make_tuple(static_cast<int>(nb::device::cuda::value), static_cast<int>(d.index));
  if (d.is_cpu()) return nb::make_tuple(static_cast<int>(nb::device::cpu::value), 0);
  throw nb::buffer_error("__dlpack_device__: meta tensors have no DLPack device");
}

void init_dlpack(nb::module_& m) {
  m.def("_from_dlpack_shared", [](nb::ndarray<> a) { return wrap(a, false); }, nb::arg("x").noconvert(),
        "A tensor sharing a writable DLPack / buffer-protocol producer's memory (TypeError when it is read-only).");
  m.def("_from_dlpack_copy", [](nb::ndarray<nb::ro> a) { return wrap(a, true); }, nb::arg("x").noconvert(),
        "A tensor holding a copy of a (read-only) DLPack / buffer-protocol producer's values.");
}

}  // namespace ampforge::python
