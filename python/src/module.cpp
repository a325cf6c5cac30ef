// ampforge._core: the module entry (one NB_MODULE, as MLX's mlx.cpp), the dtype and device types, the shared argument
// conversions of common.h, and what happens once at import (the engine's worker threads stop taking signals).
#include <pthread.h>

#include <cstdlib>

#include "common.h"

#include "ampforge/util/build_info.h"

namespace ampforge::python {

// ---- guards --------------------------------------------------------------------------------------------
SignalsHeld::SignalsHeld() {
  static const sigset_t async = asynchronous_signals();
  pthread_sigmask(SIG_BLOCK, &async, &old_);
}
SignalsHeld::~SignalsHeld() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

PyObjectRef::PyObjectRef(nb::handle h) {
  PyObject* o = h.inc_ref().ptr();
  ref_ = std::shared_ptr<PyObject*>(new PyObject*(o), [](PyObject** p) {
    if (nb::is_alive()) {
      nb::gil_scoped_acquire gil;
      Py_XDECREF(*p);
    }
    delete p;
  });
}

// ---- conversions -----------------------------------------------------------------------------------------
std::vector<int64_t> ints_from_sequence(nb::handle seq, const char* what) {
  if (PyLong_Check(seq.ptr())) return {nb::cast<int64_t>(seq)};
  if (!PySequence_Check(seq.ptr()) || PyUnicode_Check(seq.ptr()))
    throw nb::type_error((std::string(what) + ": expected an int or a sequence of ints, got " +
                          nb::type_name(seq.type()).c_str()).c_str());
  std::vector<int64_t> out;
  for (nb::handle v : nb::borrow<nb::object>(seq)) {
    if (!PyLong_Check(v.ptr()) && !PyIndex_Check(v.ptr()))
      throw nb::type_error((std::string(what) + ": expected ints, got " + nb::type_name(v.type()).c_str()).c_str());
    out.push_back(nb::cast<int64_t>(nb::int_(v)));
  }
  return out;
}

af::Shape shape_from_sequence(nb::handle seq, const char* what) {
  const std::vector<int64_t> v = ints_from_sequence(seq, what);
  AF_CHECK(static_cast<int>(v.size()) <= af::kMaxDims, "{}: tensors have at most {} dimensions, got {}", what,
           af::kMaxDims, v.size());
  return af::Shape(v);
}

af::Shape shape_from_args(const nb::args& args, const char* what) {
  if (args.size() == 1 && !PyLong_Check(args[0].ptr())) return shape_from_sequence(args[0], what);
  return shape_from_sequence(args, what);
}

af::Device device_from(nb::handle h) {
  if (nb::isinstance<af::Device>(h)) return nb::cast<af::Device>(h);
  if (PyUnicode_Check(h.ptr())) return af::Device::parse(nb::cast<std::string>(h));
  if (PyLong_Check(h.ptr())) return af::Device(af::DeviceType::CUDA, nb::cast<int>(h));
  throw nb::type_error(("expected a device ('cpu', 'cuda:0', an ampforge.device or a CUDA index), got " +
                        std::string(nb::type_name(h.type()).c_str())).c_str());
}

af::DType dtype_from(nb::handle h) {
  if (nb::isinstance<af::DType>(h)) return nb::cast<af::DType>(h);
  if (PyUnicode_Check(h.ptr())) return af::dtype_from_string(nb::cast<std::string>(h));
  throw nb::type_error(("expected a dtype (ampforge.float32, ...) or its name, got " +
                        std::string(nb::type_name(h.type()).c_str())).c_str());
}

std::vector<int64_t> dims_from(nb::handle h) {
  if (h.is_none()) return {};
  return ints_from_sequence(h, "dim");
}

nb::tuple shape_tuple(const af::Shape& s) {
  nb::list l;
  for (int64_t v : s) l.append(v);
  return nb::tuple(l);
}

af::Tensor scalar_like(nb::handle scalar, const af::Tensor& like) {
  const bool is_bool = PyBool_Check(scalar.ptr());
  const bool is_int = !is_bool && PyLong_Check(scalar.ptr());
  af::DType dt = like.dtype();
  if (!is_bool && !is_int && !af::dtype_is_float(dt)) dt = af::DType::F32;  // int tensor (op) float -> float
  if (is_bool && !af::dtype_is_float(dt) && dt != af::DType::Bool) dt = like.dtype();
  const double v = is_bool ? (scalar.ptr() == Py_True ? 1.0 : 0.0) : nb::cast<double>(scalar);
  return af::full(af::Shape{}, v, dt, like.device());
}

std::optional<af::Tensor> tensor_or_scalar(nb::handle h, const af::Tensor& like) {
  if (nb::isinstance<af::Tensor>(h)) return nb::cast<af::Tensor>(h);
  if (PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr())) return scalar_like(h, like);
  return std::nullopt;
}

namespace {

std::string dtype_python_name(af::DType d) {
  switch (d) {
    case af::DType::F32: return "float32";
    case af::DType::F16: return "float16";
    case af::DType::BF16: return "bfloat16";
    case af::DType::F64: return "float64";
    case af::DType::I32: return "int32";
    case af::DType::I64: return "int64";
    case af::DType::U8: return "uint8";
    case af::DType::Bool: return "bool";
  }
  return "?";
}

void init_dtype_device(nb::module_& m) {
  nb::enum_<af::DType> dt(m, "dtype", "Element types, PyTorch's names: ampforge.float32, float16, bfloat16, ...");
  dt.value("float32", af::DType::F32)
      .value("float16", af::DType::F16)
      .value("bfloat16", af::DType::BF16)
      .value("float64", af::DType::F64)
      .value("int32", af::DType::I32)
      .value("int64", af::DType::I64)
      .value("uint8", af::DType::U8)
      .value("bool", af::DType::Bool);
  dt.def("__repr__", [](af::DType d) { return "ampforge." + dtype_python_name(d); });
  dt.def("__str__", [](af::DType d) { return "ampforge." + dtype_python_name(d); });
  dt.def_prop_ro("is_floating_point", [](af::DType d) { return af::dtype_is_float(d); });
  dt.def_prop_ro("itemsize", [](af::DType d) { return af::dtype_size(d); });
  for (af::DType d : {af::DType::F32, af::DType::F16, af::DType::BF16, af::DType::F64, af::DType::I32,
                      af::DType::I64, af::DType::U8, af::DType::Bool})
    m.attr(dtype_python_name(d).c_str()) = nb::cast(d);
  // PyTorch's aliases.
  m.attr("float") = nb::cast(af::DType::F32);
  m.attr("half") = nb::cast(af::DType::F16);
  m.attr("double") = nb::cast(af::DType::F64);
  m.attr("long") = nb::cast(af::DType::I64);

  // torch.contiguous_format / torch.channels_last, for contiguous(memory_format=...) and is_contiguous(...).
  nb::enum_<af::MemoryFormat> mf(m, "memory_format",
                                 "Memory layouts, PyTorch's names: ampforge.contiguous_format, ampforge.channels_last.");
  mf.value("contiguous_format", af::MemoryFormat::Contiguous)
      .value("channels_last", af::MemoryFormat::ChannelsLast)
      .value("preserve_format", af::MemoryFormat::Preserve);
  mf.def("__repr__", [](af::MemoryFormat f) {
    return std::string(f == af::MemoryFormat::ChannelsLast ? "ampforge.channels_last"
                       : f == af::MemoryFormat::Preserve   ? "ampforge.preserve_format"
                                                            : "ampforge.contiguous_format");
  });
  m.attr("contiguous_format") = nb::cast(af::MemoryFormat::Contiguous);
  m.attr("channels_last") = nb::cast(af::MemoryFormat::ChannelsLast);
  m.attr("preserve_format") = nb::cast(af::MemoryFormat::Preserve);

  nb::class_<af::Device>(m, "device", "Where a tensor lives: device('cpu'), device('cuda', 0), device('cuda:1').")
      .def("__init__", [](af::Device* self, const std::string& s) { new (self) af::Device(af::Device::parse(s)); },
           nb::arg("type"))
      .def("__init__",
           [](af::Device* self, const std::string& type, int index) {
             af::Device d = af::Device::parse(type);
             AF_CHECK(index >= 0, "device index must be >= 0, got {}", index);
             new (self) af::Device(d.type, index);
           },
           nb::arg("type"), nb::arg("index"))
      .def_prop_ro("type", [](const af::Device& d) { return std::string(af::device_type_name(d.type)); })
      .def_prop_ro("index", [](const af::Device& d) -> std::optional<int> {
        if (d.is_cuda()) return d.index;
        return std::nullopt;
      })
      .def("__str__", &af::Device::str)
      .def("__repr__", [](const af::Device& d) {
        if (d.is_cuda()) return "device(type='cuda', index=" + std::to_string(d.index) + ")";
        return "device(type='" + std::string(af::device_type_name(d.type)) + "')";
      })
      .def("__eq__", [](const af::Device& a, nb::handle b) {
        try {
          return a == device_from(b);
        } catch (...) {
          return false;
        }
      })
      .def("__hash__", [](const af::Device& d) { return static_cast<int>(d.type) * 4096 + d.index; });
  nb::implicitly_convertible<std::string, af::Device>();
}

// The engine's worker threads never take an asynchronous signal (common.h): block them in every member of the
// OpenMP team now (util/thread_pool.h; later members inherit the mask of the thread that starts them), then give
// this thread its own mask back, so that Python's handlers keep working here.
void block_signals_in_engine_workers() {
  sigset_t mine;
  pthread_sigmask(SIG_SETMASK, nullptr, &mine);
  af::block_signals_in_workers(af::asynchronous_signals());
  pthread_sigmask(SIG_SETMASK, &mine, nullptr);
}

}  // namespace
}  // namespace ampforge::python

NB_MODULE(_core, m) {
  using namespace ampforge::python;
  m.doc() = "ampforge's C++ engine, bound with nanobind. Use the `ampforge` package, which re-exports these names.";
  m.attr("__version__") = AMPFORGE_VERSION_STRING;
  // A module held by a C++ container (Sequential, the Trainer) holds its Python object through a shared_ptr, whose
  // deleter does not run Python code once the interpreter is finalising: such objects alive at exit are let go with
  // the process, which nanobind would report as leaks. AMPFORGE_PY_LEAK_WARNINGS=1 keeps the report (debugging).
  if (const char* v = std::getenv("AMPFORGE_PY_LEAK_WARNINGS"); !(v && std::string(v) == "1"))
    nb::set_leak_warnings(false);
  init_errors(m);
  init_dtype_device(m);
  init_tensor(m);
  init_dlpack(m);
  init_ops(m);
  init_nn(m);
  init_optim(m);
  init_amp(m);
  init_data(m);
  init_train(m);
  init_tools(m);
  block_signals_in_engine_workers();
}
