// ampforge.Tensor: the C++ Tensor handle (copying it shares the data, as in PyTorch) with PyTorch's attribute and
// method names: shape, dtype, device, requires_grad, grad, backward(), detach(), to(), the operators, the indexing
// the C++ API has views for (ints, slices with a positive step, None, ...), numpy() without a copy. Parameter is a
// Tensor that a Module registers when assigned as an attribute. DLPack is in dlpack.cpp, creation functions and the
// functional ops in ops.cpp.
#include <cmath>

#include "common.h"

namespace ampforge::python {

namespace {

af::Tensor checked(const af::Tensor& t) {
  if (!t.defined()) throw nb::value_error("the tensor is undefined");
  return t;
}

nb::object tensor_or_none(const af::Tensor& t) { return t.defined() ? nb::cast(t) : nb::none(); }

// In-place writes through Python (t[...] = v, t.fill_(), t.add_(), ...) change data autograd may have saved, so, as
// PyTorch, they are refused on tensors that take part in autograd unless grad mode is off (no_grad()).
void check_inplace(const af::Tensor& t, const char* what) {
  if (t.requires_grad() && af::autograd::grad_enabled()) {
    if (t.is_leaf())
      throw std::runtime_error(std::string(what) + ": a leaf tensor that requires grad is being written in place; "
                               "do it under ampforge.no_grad()");
    throw std::runtime_error(std::string(what) + ": in-place writes into a tensor with autograd history are not "
                             "supported; compute a new tensor instead");
  }
}

int64_t wrap_index(int64_t i, int64_t size, int dim) {
  if (i < -size || i >= size)
    throw nb::index_error(("index " + std::to_string(i) + " is out of bounds for dimension " + std::to_string(dim) +
                           " with size " + std::to_string(size)).c_str());
  return i < 0 ? i + size : i;
}

// t[idx] as a view: ints select, slices (step > 0) slice, None inserts a dim, Ellipsis stands for the dims not named.
af::Tensor index_view(const af::Tensor& t, nb::handle idx) {
  std::vector<nb::handle> items;
  if (PyTuple_Check(idx.ptr()))
    for (nb::handle h : nb::borrow<nb::tuple>(idx)) items.push_back(h);
  else
    items.push_back(idx);
  int consumed = 0;  // dims of t the index names (not None, not Ellipsis)
  bool ellipsis = false;
  for (nb::handle h : items) {
    if (h.is_none()) continue;
    if (nb::isinstance<af::Tensor>(h))
      throw nb::type_error("ampforge indexes with ints, slices (step > 0), None and '...'; tensor indices have no "
                           "view in the C++ API");
    if (h.ptr() == Py_Ellipsis) {
      if (ellipsis) throw nb::index_error("an index can only have a single ellipsis ('...')");
      ellipsis = true;
      continue;
    }
    if (PyBool_Check(h.ptr()) || !(PyLong_Check(h.ptr()) || PySlice_Check(h.ptr()) || PyIndex_Check(h.ptr())))
      throw nb::type_error(("ampforge indexes with ints, slices (step > 0), None and '...'; got " +
                            std::string(nb::type_name(h.type()).c_str()) +
                            " (tensor and boolean indices have no view in the C++ API)")
                               .c_str());
    ++consumed;
  }
  if (consumed > t.dim())
    throw nb::index_error(("too many indices for a tensor of dimension " + std::to_string(t.dim())).c_str());
  af::Tensor r = t;
  int dim = 0;  // the next dim of r to index
  for (nb::handle h : items) {
    if (h.is_none()) {
      r = r.unsqueeze(dim);
      ++dim;
    } else if (h.ptr() == Py_Ellipsis) {
      dim += t.dim() - consumed;
    } else if (PySlice_Check(h.ptr())) {
      Py_ssize_t start, stop, step;
      if (PySlice_Unpack(h.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
      if (step <= 0) throw nb::value_error("slice step must be positive (ampforge has no negative-stride views)");
      const Py_ssize_t len = PySlice_AdjustIndices(static_cast<Py_ssize_t>(r.size(dim)), &start, &stop, step);
      r = r.slice(dim, start, len > 0 ? start + (len - 1) * step + 1 : start, step);
      ++dim;
    } else {
      const int64_t i = nb::cast<int64_t>(nb::int_(h));
      r = r.select(dim, wrap_index(i, r.size(dim), dim));
    }
  }
  return r;
}

nb::object to_python_list(const std::vector<double>& v, const af::Shape& s, int d, int64_t& pos, af::DType dt) {
  if (d == s.size()) {
    const double x = v[static_cast<size_t>(pos++)];
    if (dt == af::DType::Bool) return nb::bool_(x != 0);
    if (!af::dtype_is_float(dt)) return nb::int_(static_cast<int64_t>(x));
    return nb::float_(x);
  }
  nb::list l;
  for (int64_t i = 0; i < s[d]; ++i) l.append(to_python_list(v, s, d + 1, pos, dt));
  return l;
}

nb::object scalar_of(const af::Tensor& t, double x) {
  if (t.dtype() == af::DType::Bool) return nb::bool_(x != 0);
  if (!af::dtype_is_float(t.dtype())) return nb::int_(static_cast<int64_t>(x));
  return nb::float_(x);
}

// The DLPack dtype of an ampforge dtype (numpy() and __dlpack__).
nb::dlpack::dtype dl_dtype(af::DType d) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C c, int bits) { return nb::dlpack::dtype{static_cast<uint8_t>(c), static_cast<uint8_t>(bits), 1}; };
  switch (d) {
    case af::DType::F32: return make(C::Float, 32);
    case af::DType::F16: return make(C::Float, 16);
    case af::DType::BF16: return make(C::Bfloat, 16);
    case af::DType::F64: return make(C::Float, 64);
    case af::DType::I32: return make(C::Int, 32);
    case af::DType::I64: return make(C::Int, 64);
    case af::DType::U8: return make(C::UInt, 8);
    case af::DType::Bool: return make(C::Bool, 8);
  }
  return make(C::Float, 32);
}

nb::object binary_op(const af::Tensor& a, nb::handle other, af::Tensor (*fn)(const af::Tensor&, const af::Tensor&),
                     bool reflected) {
  std::optional<af::Tensor> b = tensor_or_scalar(other, a);
  if (!b) return nb::borrow(Py_NotImplemented);
  return nb::cast(reflected ? fn(*b, a) : fn(a, *b));
}

af::Tensor t_add(const af::Tensor& a, const af::Tensor& b) { return af::add(a, b); }
af::Tensor t_sub(const af::Tensor& a, const af::Tensor& b) { return af::sub(a, b); }
af::Tensor t_mul(const af::Tensor& a, const af::Tensor& b) { return af::mul(a, b); }
af::Tensor t_div(const af::Tensor& a, const af::Tensor& b) { return af::div(a, b); }
af::Tensor t_pow(const af::Tensor& a, const af::Tensor& b) { return af::pow(a, b); }
af::Tensor t_eq(const af::Tensor& a, const af::Tensor& b) { return af::eq(a, b); }
af::Tensor t_ne(const af::Tensor& a, const af::Tensor& b) { return af::ne(a, b); }
af::Tensor t_lt(const af::Tensor& a, const af::Tensor& b) { return af::lt(a, b); }
af::Tensor t_le(const af::Tensor& a, const af::Tensor& b) { return af::le(a, b); }
af::Tensor t_gt(const af::Tensor& a, const af::Tensor& b) { return af::gt(a, b); }
af::Tensor t_ge(const af::Tensor& a, const af::Tensor& b) { return af::ge(a, b); }
af::Tensor t_matmul(const af::Tensor& a, const af::Tensor& b) {
  EngineCall call;
  return af::matmul(a, b);
}

void inplace_binary(const af::Tensor& t, nb::handle other, af::OpId op, const char* what) {
  check_inplace(t, what);
  std::optional<af::Tensor> b = tensor_or_scalar(other, t);
  if (!b) throw nb::type_error((std::string(what) + ": expected a tensor or a number").c_str());
  af::autograd::NoGradGuard ng;
  af::ops::binary_(op, t, b->dtype() == t.dtype() ? *b : af::ops::to_dtype(*b, t.dtype()));
}

// Tensor.to(...): a dtype, a device (or its name), another tensor (its dtype and device), as keywords or positional.
af::Tensor tensor_to(const af::Tensor& t, const nb::args& args, const nb::kwargs& kwargs) {
  std::optional<af::DType> dtype;
  std::optional<af::Device> device;
  bool copy = false;
  auto take = [&](nb::handle h) {
    if (nb::isinstance<af::DType>(h)) dtype = nb::cast<af::DType>(h);
    else if (nb::isinstance<af::Tensor>(h)) {
      const af::Tensor o = nb::cast<af::Tensor>(h);
      dtype = o.dtype();
      device = o.device();
    } else device = device_from(h);
  };
  for (nb::handle a : args) take(a);
  for (auto [k, v] : kwargs) {
    const std::string key = nb::cast<std::string>(k);
    if (key == "dtype") {
      if (!v.is_none()) dtype = dtype_from(v);
    } else if (key == "device") {
      if (!v.is_none()) device = device_from(v);
    } else if (key == "copy") {
      copy = nb::cast<bool>(v);
    } else if (key == "non_blocking" || key == "memory_format") {
      // accepted for PyTorch compatibility; copies are ordered on the device's stream
    } else {
      throw nb::type_error(("to(): unexpected keyword argument '" + key + "'").c_str());
    }
  }
  af::Tensor r = t;
  EngineCall call;
  if (device && *device != r.device()) r = r.to(*device);
  if (dtype && *dtype != r.dtype()) r = r.to(*dtype);
  if (copy && r.is_same(t)) r = r.clone();
  return r;
}

struct HookHandle {
  af::Tensor tensor;
  uint64_t id = 0;
  void remove() {
    if (tensor.defined()) tensor.remove_hook(id);
    tensor = af::Tensor();
  }
};

}  // namespace

nb::ndarray<nb::numpy> tensor_numpy(const af::Tensor& t, bool force);

nb::ndarray<nb::numpy> tensor_numpy(const af::Tensor& t, bool force) {
  af::Tensor x = checked(t);
  if (x.requires_grad() && !force)
    throw std::runtime_error("numpy(): the tensor requires grad; use tensor.detach().numpy()");
  if (!x.device().is_cpu()) {
    if (!force)
      throw nb::type_error(("numpy(): the tensor is on " + x.device().str() + "; copy it with .cpu() first").c_str());
    EngineCall call;
    x = x.detach().to(af::kCPU);
  }
  if (x.dtype() == af::DType::BF16) {
    if (!force)
      throw nb::type_error("numpy(): NumPy has no bfloat16; convert first (tensor.float().numpy()), or share it with "
                           "a framework that has one through DLPack");
    x = x.detach().to(af::DType::F32);
  }
  // The owner keeps the storage alive, not the tensor handle: a later set_data (the optimizer moving parameters
  // into its flat buffers, Module.to) then leaves this array on the old values instead of on freed memory.
  auto* owner = new af::Storage(x.storage());
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<af::Storage*>(p); });
  std::vector<size_t> shape;
  std::vector<int64_t> strides;
  for (int i = 0; i < x.dim(); ++i) {
    shape.push_back(static_cast<size_t>(x.size(i)));
    strides.push_back(x.stride(i));
  }
  return nb::ndarray<nb::numpy>(x.numel() == 0 ? nullptr : x.data_ptr(), shape.size(), shape.data(), cap,
                                strides.data(), dl_dtype(x.dtype()), nb::device::cpu::value, 0);
}

nb::dlpack::dtype tensor_dl_dtype(af::DType d) { return dl_dtype(d); }
nb::object tensor_dlpack(const af::Tensor& t, nb::kwargs kwargs);  // dlpack.cpp
nb::tuple tensor_dlpack_device(const af::Tensor& t);

namespace {

// The layout contiguous() / is_contiguous() are asked for: PyTorch's memory_format=ampforge.channels_last (or
// contiguous_format), or the shorter channels_last=True; both at once must agree. preserve_format is refused, as
// PyTorch's contiguous() refuses it.
af::MemoryFormat layout_asked(const char* what, std::optional<af::MemoryFormat> f, bool channels_last) {
  if (!f) return channels_last ? af::MemoryFormat::ChannelsLast : af::MemoryFormat::Contiguous;
  if (*f == af::MemoryFormat::Preserve)
    throw nb::value_error(
        (std::string(what) + "(): memory_format must be ampforge.contiguous_format or ampforge.channels_last").c_str());
  if (channels_last && *f != af::MemoryFormat::ChannelsLast)
    throw nb::value_error((std::string(what) + "(): channels_last=True contradicts memory_format=" +
                           "ampforge.contiguous_format; give one of them")
                              .c_str());
  return *f;
}

}  // namespace

void init_tensor(nb::module_& m) {
  nb::class_<HookHandle>(m, "RemovableHandle", "Returned by Tensor.register_hook; remove() takes the hook off.")
      .def("remove", &HookHandle::remove);

  nb::class_<af::Tensor> t(m, "Tensor",
                           "A tensor: a handle to (storage, shape, strides, dtype, device) with autograd state. Copying "
                           "a handle shares the data, as in PyTorch. Create one with ampforge.tensor(), zeros(), "
                           "from_numpy(), from_dlpack(), ...");
  t.def("__init__", [](af::Tensor* self, const af::Tensor& other) { new (self) af::Tensor(checked(other)); },
        nb::arg("other"), "A new handle to `other`'s data and autograd state.")
      // ---- metadata -----------------------------------------------------------------------------------------
      .def_prop_ro("shape", [](const af::Tensor& x) { return shape_tuple(checked(x).shape()); })
      .def_prop_ro("dtype", [](const af::Tensor& x) { return checked(x).dtype(); })
      .def_prop_ro("device", [](const af::Tensor& x) { return checked(x).device(); })
      .def_prop_ro("ndim", [](const af::Tensor& x) { return checked(x).dim(); })
      .def_prop_ro("is_cuda", [](const af::Tensor& x) { return checked(x).device().is_cuda(); })
      .def_prop_ro("is_leaf", [](const af::Tensor& x) { return checked(x).is_leaf(); })
      .def_prop_ro("itemsize", [](const af::Tensor& x) { return checked(x).element_size(); })
      .def_prop_ro("nbytes", [](const af::Tensor& x) { return checked(x).nbytes(); })
      .def_prop_ro("grad_fn",
                   [](const af::Tensor& x) -> std::optional<std::string> {
                     const auto& fn = checked(x).grad_fn();
                     if (!fn) return std::nullopt;
                     return fn->name();
                   },
                   "The name of the backward node that produced this tensor (None for leaves).")
      .def("dim", [](const af::Tensor& x) { return checked(x).dim(); })
      .def("numel", [](const af::Tensor& x) { return checked(x).numel(); })
      .def("element_size", [](const af::Tensor& x) { return checked(x).element_size(); })
      .def("size",
           [](const af::Tensor& x, std::optional<int64_t> d) -> nb::object {
             if (d) return nb::int_(checked(x).size(*d));
             return shape_tuple(checked(x).shape());
           },
           nb::arg("dim") = nb::none())
      .def("stride",
           [](const af::Tensor& x, std::optional<int64_t> d) -> nb::object {
             if (d) return nb::int_(checked(x).stride(*d));
             return shape_tuple(checked(x).strides());
           },
           nb::arg("dim") = nb::none())
      .def("storage_offset", [](const af::Tensor& x) { return checked(x).offset(); })
      .def("data_ptr", [](const af::Tensor& x) { return reinterpret_cast<uintptr_t>(checked(x).data_ptr()); })
      .def("is_contiguous",
           [](const af::Tensor& x, std::optional<af::MemoryFormat> f, bool channels_last) {
             return checked(x).is_contiguous(layout_asked("is_contiguous", f, channels_last));
           },
           nb::arg("memory_format") = nb::none(), nb::arg("channels_last") = false)
      .def("is_floating_point", [](const af::Tensor& x) { return checked(x).is_floating_point(); })
      .def("__len__",
           [](const af::Tensor& x) {
             if (checked(x).dim() == 0) throw nb::type_error("len() of a 0-d tensor");
             return x.size(0);
           })
      // ---- autograd ---------------------------------------------------------------------------------------
      .def_prop_rw(
          "requires_grad", [](const af::Tensor& x) { return checked(x).requires_grad(); },
          [](af::Tensor& x, bool v) { checked(x).requires_grad_(v); })
      .def("requires_grad_",
           [](af::Tensor& x, bool v) {
             checked(x).requires_grad_(v);
             return x;
           },
           nb::arg("requires_grad") = true)
      .def_prop_rw(
          "grad", [](const af::Tensor& x) { return tensor_or_none(checked(x).grad()); },
          [](af::Tensor& x, std::optional<af::Tensor> g) { checked(x).set_grad(g ? *g : af::Tensor()); },
          "The accumulated gradient (None until backward reaches this leaf).")
      .def_prop_rw(
          "data", [](const af::Tensor& x) { return checked(x).detach(); },
          [](af::Tensor& x, const af::Tensor& v) { checked(x).set_data(checked(v)); },
          "The same data without autograd history; assigning rebinds every handle to the new data.")
      .def("detach", [](const af::Tensor& x) { return checked(x).detach(); })
      .def("backward",
           [](const af::Tensor& x, std::optional<af::Tensor> gradient, std::optional<bool> retain_graph,
              bool create_graph) {
             if (create_graph) throw nb::value_error("backward(create_graph=True): higher-order gradients are not "
                                                     "supported by ampforge");
             checked(x);
             EngineCall call;
             x.backward(gradient ? *gradient : af::Tensor(), retain_graph.value_or(false));
           },
           nb::arg("gradient") = nb::none(), nb::arg("retain_graph") = nb::none(), nb::arg("create_graph") = false,
           "Reverse-mode autodiff from this tensor (gradient defaults to 1 for one element); accumulates into the "
           "leaves' .grad. Runs without the GIL.")
      .def("retain_grad", [](const af::Tensor& x) { checked(x).retain_grad(); })
      .def_prop_ro("retains_grad", [](const af::Tensor& x) { return checked(x).retains_grad(); })
      .def("register_hook",
           [](const af::Tensor& x, nb::callable fn) {
             PyObjectRef ref(fn);
             const uint64_t id = checked(x).register_hook([ref](const af::Tensor& g) -> af::Tensor {
               nb::gil_scoped_acquire gil;
               nb::object r = nb::borrow<nb::callable>(ref.get())(g);
               if (r.is_none()) return af::Tensor();
               return nb::cast<af::Tensor>(r);
             });
             return HookHandle{x, id};
           },
           nb::arg("hook"), "hook(grad) runs when this tensor's gradient is computed; a returned tensor replaces it.")
      // ---- conversions -----------------------------------------------------------------------------------
      .def("numpy", &tensor_numpy, nb::arg("force") = false,
           "A NumPy array sharing this tensor's memory (CPU tensors; force=True copies from a device, detaches and "
           "turns bfloat16 into float32).")
      .def("__array__",
           [](const af::Tensor& x, nb::handle dtype, nb::handle copy) {
             nb::object a = nb::cast(tensor_numpy(x.detach(), true));
             if (!dtype.is_none()) a = a.attr("astype")(dtype);
             if (!copy.is_none() && nb::cast<bool>(copy)) a = a.attr("copy")();
             return a;
           },
           nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none())
      .def("tolist",
           [](const af::Tensor& x) {
             std::vector<double> v;
             {
               EngineCall call;
               v = checked(x).tolist<double>();
             }
             int64_t pos = 0;
             return to_python_list(v, x.shape(), 0, pos, x.dtype());
           })
      .def("item",
           [](const af::Tensor& x) {
             double v;
             {
               EngineCall call;
               v = checked(x).item();
             }
             return scalar_of(x, v);
           })
      .def("__float__", [](const af::Tensor& x) { return checked(x).item(); })
      .def("__int__", [](const af::Tensor& x) { return static_cast<int64_t>(checked(x).item()); })
      .def("__index__",
           [](const af::Tensor& x) {
             if (checked(x).is_floating_point() || x.numel() != 1)
               throw nb::type_error("only one-element integer tensors can be used as an index");
             return static_cast<int64_t>(x.item());
           })
      .def("__bool__",
           [](const af::Tensor& x) {
             if (checked(x).numel() != 1)
               throw std::runtime_error("the truth value of a tensor with more than one element is ambiguous");
             return x.item() != 0;
           })
      .def("to", &tensor_to, "to(dtype) / to(device) / to(other) / to(device=..., dtype=..., copy=False)")
      .def("cpu", [](const af::Tensor& x) { EngineCall c; return checked(x).to(af::kCPU); })
      .def("cuda",
           [](const af::Tensor& x, std::optional<int> index) {
             EngineCall c;
             return checked(x).to(af::Device(af::DeviceType::CUDA, index.value_or(0)));
           },
           nb::arg("device") = nb::none())
      .def("float", [](const af::Tensor& x) { return checked(x).to(af::DType::F32); })
      .def("half", [](const af::Tensor& x) { return checked(x).to(af::DType::F16); })
      .def("bfloat16", [](const af::Tensor& x) { return checked(x).to(af::DType::BF16); })
      .def("double", [](const af::Tensor& x) { return checked(x).to(af::DType::F64); })
      .def("long", [](const af::Tensor& x) { return checked(x).to(af::DType::I64); })
      .def("int", [](const af::Tensor& x) { return checked(x).to(af::DType::I32); })
      .def("bool", [](const af::Tensor& x) { return checked(x).to(af::DType::Bool); })
      .def("type", [](const af::Tensor& x, af::DType d) { return checked(x).to(d); }, nb::arg("dtype"))
      // ---- views and shapes ---------------------------------------------------------------------------------
      .def("reshape", [](const af::Tensor& x, nb::args s) { return checked(x).reshape(shape_from_args(s, "reshape")); })
      .def("view", [](const af::Tensor& x, nb::args s) { return checked(x).view(shape_from_args(s, "view")); })
      .def("flatten", [](const af::Tensor& x, int64_t s, int64_t e) { return checked(x).flatten(s, e); },
           nb::arg("start_dim") = 0, nb::arg("end_dim") = -1)
      .def("permute",
           [](const af::Tensor& x, nb::args d) {
             if (d.size() == 1 && !PyLong_Check(d[0].ptr())) return checked(x).permute(ints_from_sequence(d[0], "permute"));
             return checked(x).permute(ints_from_sequence(d, "permute"));
           })
      .def("transpose", [](const af::Tensor& x, int64_t a, int64_t b) { return checked(x).transpose(a, b); },
           nb::arg("dim0"), nb::arg("dim1"))
      .def("t", [](const af::Tensor& x) { return checked(x).t(); })
      .def_prop_ro("T", [](const af::Tensor& x) { return checked(x).t(); })
      .def("unsqueeze", [](const af::Tensor& x, int64_t d) { return checked(x).unsqueeze(d); }, nb::arg("dim"))
      .def("squeeze",
           [](const af::Tensor& x, std::optional<int64_t> d) { return d ? checked(x).squeeze(*d) : checked(x).squeeze(); },
           nb::arg("dim") = nb::none())
      .def("expand", [](const af::Tensor& x, nb::args s) { return checked(x).expand(shape_from_args(s, "expand")); })
      .def("narrow", [](const af::Tensor& x, int64_t d, int64_t s, int64_t l) { return checked(x).narrow(d, s, l); },
           nb::arg("dim"), nb::arg("start"), nb::arg("length"))
      .def("select", [](const af::Tensor& x, int64_t d, int64_t i) { return checked(x).select(d, i); },
           nb::arg("dim"), nb::arg("index"))
      .def("chunk", [](const af::Tensor& x, int64_t n, int64_t d) { return af::chunk(checked(x), n, d); },
           nb::arg("chunks"), nb::arg("dim") = 0)
      .def("split", [](const af::Tensor& x, int64_t n, int64_t d) { return af::split(checked(x), n, d); },
           nb::arg("split_size"), nb::arg("dim") = 0)
      .def("contiguous",
           [](const af::Tensor& x, std::optional<af::MemoryFormat> f, bool channels_last) {
             return checked(x).contiguous(layout_asked("contiguous", f, channels_last));
           },
           nb::arg("memory_format") = nb::none(), nb::arg("channels_last") = false)
      .def("clone", [](const af::Tensor& x) { return checked(x).clone(); })
      .def("__getitem__", [](const af::Tensor& x, nb::handle idx) { return index_view(checked(x), idx); },
           nb::arg("index").none())
      .def("__setitem__",
           [](af::Tensor& x, nb::handle idx, nb::handle value) {
             check_inplace(checked(x), "__setitem__");
             af::Tensor view = index_view(x, idx);
             af::autograd::NoGradGuard ng;
             if (nb::isinstance<af::Tensor>(value)) {
               af::ops::copy_(view, checked(nb::cast<af::Tensor>(value)));
             } else if (PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr())) {
               af::ops::fill_(view, nb::cast<double>(value));
             } else {
               throw nb::type_error("tensor[...] = value: value must be a tensor or a number");
             }
           },
           nb::arg("index").none(), nb::arg("value"))
      .def("__iter__",
           [](const af::Tensor& x) {
             if (checked(x).dim() == 0) throw nb::type_error("iteration over a 0-d tensor");
             nb::list l;
             for (int64_t i = 0; i < x.size(0); ++i) l.append(x.select(0, i));
             return nb::iter(l);
           })
      // ---- in place (no autograd: under no_grad(), or on tensors that do not require grad) ------------------
      .def("copy_",
           [](af::Tensor& x, const af::Tensor& src) {
             check_inplace(checked(x), "copy_");
             EngineCall call;
             af::autograd::NoGradGuard ng;
             af::ops::copy_(x, checked(src).device() == x.device() ? src : af::ops::to_device(src, x.device()));
             return x;
           },
           nb::arg("src"))
      .def("fill_",
           [](af::Tensor& x, double v) {
             check_inplace(checked(x), "fill_");
             af::ops::fill_(x, v);
             return x;
           },
           nb::arg("value"))
      .def("zero_",
           [](af::Tensor& x) {
             check_inplace(checked(x), "zero_");
             af::ops::fill_(x, 0);
             return x;
           })
      .def("add_", [](af::Tensor& x, nb::handle o) { inplace_binary(checked(x), o, af::OpId::add, "add_"); return x; })
      .def("sub_", [](af::Tensor& x, nb::handle o) { inplace_binary(checked(x), o, af::OpId::sub, "sub_"); return x; })
      .def("mul_", [](af::Tensor& x, nb::handle o) { inplace_binary(checked(x), o, af::OpId::mul, "mul_"); return x; })
      .def("div_", [](af::Tensor& x, nb::handle o) { inplace_binary(checked(x), o, af::OpId::div, "div_"); return x; })
      // ---- operators --------------------------------------------------------------------------------------
      .def("__add__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_add, false); },
           nb::arg("other").none())
      
      .def("__radd__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_add, true); },
           nb::arg("other").none())
      
      .def("__sub__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_sub, false); },
           nb::arg("other").none())
      
      .def("__rsub__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_sub, true); },
           nb::arg("other").none())
      
      .def("__mul__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_mul, false); },
           nb::arg("other").none())
      
      .def("__rmul__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_mul, true); },
           nb::arg("other").none())
      
      .def("__truediv__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_div, false); },
           nb::arg("other").none())
      
      .def("__rtruediv__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_div, true); },
           nb::arg("other").none())
      
      .def("__pow__",
           [](const af::Tensor& a, nb::handle b) -> nb::object {
             if (PyFloat_Check(b.ptr()) || PyLong_Check(b.ptr())) return nb::cast(af::pow(checked(a), nb::cast<double>(b)));
             return binary_op(checked(a), b, t_pow, false);
           })
      .def("__rpow__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_pow, true); },
           nb::arg("other").none())
      
      .def("__matmul__", [](const af::Tensor& a, const af::Tensor& b) { return t_matmul(checked(a), checked(b)); })
      .def("__rmatmul__", [](const af::Tensor& a, const af::Tensor& b) { return t_matmul(checked(b), checked(a)); })
      .def("__neg__", [](const af::Tensor& a) { return af::neg(checked(a)); })
      .def("__pos__", [](const af::Tensor& a) { return checked(a); })
      .def("__abs__", [](const af::Tensor& a) { return af::abs(checked(a)); })
      .def("__eq__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_eq, false); },
           nb::arg("other").none())
      
      .def("__ne__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_ne, false); },
           nb::arg("other").none())
      
      .def("__lt__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_lt, false); },
           nb::arg("other").none())
      
      .def("__le__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_le, false); },
           nb::arg("other").none())
      
      .def("__gt__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_gt, false); },
           nb::arg("other").none())
      
      .def("__ge__", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_ge, false); },
           nb::arg("other").none())
      
      .def("__hash__", [](nb::handle self) { return reinterpret_cast<intptr_t>(self.ptr()) >> 4; })
      .def("matmul", [](const af::Tensor& a, const af::Tensor& b) { return t_matmul(checked(a), checked(b)); })
      .def("add", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_add, false); })
      .def("sub", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_sub, false); })
      .def("mul", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_mul, false); })
      .def("div", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_div, false); })
      .def("pow", [](const af::Tensor& a, double e) { return af::pow(checked(a), e); }, nb::arg("exponent"))
      .def("eq", [](const af::Tensor& a, nb::handle b) { return binary_op(checked(a), b, t_eq, false); })
      // ---- elementwise and reductions -------------------------------------------------------------------------
      .def("neg", [](const af::Tensor& a) { return af::neg(checked(a)); })
      .def("abs", [](const af::Tensor& a) { return af::abs(checked(a)); })
      .def("sign", [](const af::Tensor& a) { return af::sign(checked(a)); })
      .def("exp", [](const af::Tensor& a) { return af::exp(checked(a)); })
      .def("log", [](const af::Tensor& a) { return af::log(checked(a)); })
      .def("sqrt", [](const af::Tensor& a) { return af::sqrt(checked(a)); })
      .def("rsqrt", [](const af::Tensor& a) { return af::rsqrt(checked(a)); })
      .def("relu", [](const af::Tensor& a) { return af::relu(checked(a)); })
      .def("sigmoid", [](const af::Tensor& a) { return af::sigmoid(checked(a)); })
      .def("tanh", [](const af::Tensor& a) { return af::tanh(checked(a)); })
      .def("clamp",
           [](const af::Tensor& a, std::optional<double> lo, std::optional<double> hi) { return af::clamp(checked(a), lo, hi); },
           nb::arg("min") = nb::none(), nb::arg("max") = nb::none())
      .def("softmax", [](const af::Tensor& a, int64_t d) { return af::softmax(checked(a), d); }, nb::arg("dim"))
      .def("log_softmax", [](const af::Tensor& a, int64_t d) { return af::log_softmax(checked(a), d); }, nb::arg("dim"))
      .def("sum", [](const af::Tensor& a, nb::handle d, bool k) { return af::sum(checked(a), dims_from(d), k); },
           nb::arg("dim") = nb::none(), nb::arg("keepdim") = false)
      .def("mean", [](const af::Tensor& a, nb::handle d, bool k) { return af::mean(checked(a), dims_from(d), k); },
           nb::arg("dim") = nb::none(), nb::arg("keepdim") = false)
      .def("amax", [](const af::Tensor& a, nb::handle d, bool k) { return af::amax(checked(a), dims_from(d), k); },
           nb::arg("dim") = nb::none(), nb::arg("keepdim") = false)
      .def("amin", [](const af::Tensor& a, nb::handle d, bool k) { return af::amin(checked(a), dims_from(d), k); },
           nb::arg("dim") = nb::none(), nb::arg("keepdim") = false)
      .def("var",
           [](const af::Tensor& a, nb::handle d, int64_t correction, bool k) {
             return af::var(checked(a), dims_from(d), correction, k);
           },
           nb::arg("dim") = nb::none(), nb::arg("correction") = 1, nb::arg("keepdim") = false)
      .def("max",
           [](const af::Tensor& a, std::optional<int64_t> d, bool k) -> nb::object {
             if (!d) return nb::cast(af::amax(checked(a)));
             auto [v, i] = af::max(checked(a), *d, k);
             return nb::make_tuple(v, i);
           },
           nb::arg("dim") = nb::none(), nb::arg("keepdim") = false,
           "max() over every element, or (values, indices) along `dim`.")
      .def("min",
           [](const af::Tensor& a, std::optional<int64_t> d, bool k) -> nb::object {
             if (!d) return nb::cast(af::amin(checked(a)));
             auto [v, i] = af::min(checked(a), *d, k);
             return nb::make_tuple(v, i);
           },
           nb::arg("dim") = nb::none(), nb::arg("keepdim") = false)
      .def("argmax",
           [](const af::Tensor& a, std::optional<int64_t> d, bool k) {
             if (!d) return af::argmax(checked(a).reshape(af::Shape{a.numel()}), 0);
             return af::argmax(checked(a), *d, k);
           },
           nb::arg("dim") = nb::none(), nb::arg("keepdim") = false)
      .def("argmin",
           [](const af::Tensor& a, std::optional<int64_t> d, bool k) {
             if (!d) return af::argmin(checked(a).reshape(af::Shape{a.numel()}), 0);
             return af::argmin(checked(a), *d, k);
           },
           nb::arg("dim") = nb::none(), nb::arg("keepdim") = false)
      .def("_str", [](const af::Tensor& a) { return checked(a).str(); })
      .def("__dlpack__", &tensor_dlpack,
           "A DLPack capsule sharing this tensor's memory (keywords: stream, max_version, dl_device, copy).")
      .def("__dlpack_device__", &tensor_dlpack_device, "(device type, index): (1, 0) for the CPU, (2, i) for cuda:i.");

  nb::class_<Parameter, af::Tensor>(m, "Parameter",
                                    "A tensor that a Module registers as a parameter when it is assigned as an "
                                    "attribute (a leaf that requires grad by default), as torch.nn.Parameter.")
      .def("__init__",
           [](Parameter* self, const af::Tensor& data, bool requires_grad) {
             af::Tensor leaf = checked(data).detach();
             if (requires_grad && !leaf.is_floating_point())
               throw nb::value_error("Parameter: only floating-point tensors can require gradients");
             new (self) Parameter(leaf.impl_ptr());
             if (requires_grad) self->requires_grad_(true);
           },
           nb::arg("data"), nb::arg("requires_grad") = true);
}

}  // namespace ampforge::python
