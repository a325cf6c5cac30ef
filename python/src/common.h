// What every binding file of ampforge._core shares: the includes, the area initialisers module.cpp calls, the
// argument conversions (dtype, device, shape) and the guard that long engine calls run under.
//
// Threads and signals (docs/PYTHON.md, "GIL and Ctrl-C"):
//   - EngineCall releases the GIL and blocks the asynchronous signals on the calling thread for a call into the
//     engine that may run oneDNN's JIT GEMMs (products, convolutions, a module's forward, backward, a step). Those
//     kernels point the stack pointer into the heap while they run, so a signal handler running there would write its
//     frame into the heap (util/signals.h). A signal that arrives meanwhile stays pending and is delivered when the
//     call returns: Python's handler then raises KeyboardInterrupt after the call, not inside a kernel.
//   - The engine's worker threads (the OpenMP team) block them for good (module.cpp, at import).
//   - PyObjectRef holds a Python object in C++ state that may be copied or destroyed without the GIL (autograd
//     hooks, data sets read on loader threads): its copies share one reference, released under the GIL.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <csignal>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ampforge/ampforge.h"

namespace nb = nanobind;
namespace af = ampforge;

namespace ampforge::python {

// One per area (file), called once from module.cpp in this order.
void init_errors(nb::module_& m);
void init_tensor(nb::module_& m);
void init_dlpack(nb::module_& m);
void init_ops(nb::module_& m);
void init_nn(nb::module_& m);
void init_optim(nb::module_& m);
void init_amp(nb::module_& m);
void init_data(nb::module_& m);
void init_train(nb::module_& m);
void init_tools(nb::module_& m);

// ampforge.nn.Parameter: a Tensor that a Python-defined Module registers as a parameter when it is assigned as an
// attribute (nn.cpp).
struct Parameter : af::Tensor {
  using af::Tensor::Tensor;
};

// ---- the guard of long engine calls ----------------------------------------------------------------
class SignalsHeld {
 public:
  SignalsHeld();
  ~SignalsHeld();
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t old_;
};

// GIL released, asynchronous signals held back until the call returns (see the top of this file).
struct EngineCall {
  nb::gil_scoped_release release;
  SignalsHeld signals;
};

// ---- Python objects kept by C++ state ----------------------------------------------------------------
class PyObjectRef {
 public:
  PyObjectRef() = default;
  explicit PyObjectRef(nb::handle h);  // needs the GIL (takes a reference)
  nb::handle get() const { return ref_ ? nb::handle(*ref_) : nb::handle(); }
  explicit operator bool() const { return ref_ != nullptr; }

 private:
  std::shared_ptr<PyObject*> ref_;  // the deleter drops the reference under the GIL
};

// ---- argument conversions ----------------------------------------------------------------------------
// A shape from ints given as *args (reshape(2, 3)) or one sequence (reshape((2, 3))).
af::Shape shape_from_args(const nb::args& args, const char* what);
af::Shape shape_from_sequence(nb::handle seq, const char* what);
std::vector<int64_t> ints_from_sequence(nb::handle seq, const char* what);
// A device from an ampforge.device, a string ("cpu", "cuda:1", "meta") or an int (a CUDA index).
af::Device device_from(nb::handle h);
// A dtype from an ampforge dtype or its name ("float16", "bf16", ...).
af::DType dtype_from(nb::handle h);
// dims given as None (all), an int or a sequence of ints.
std::vector<int64_t> dims_from(nb::handle h);
nb::tuple shape_tuple(const af::Shape& s);
// The Python scalar as a 0-dim tensor on `like`'s device, in the dtype type promotion gives it against `like`
// (a Python float keeps a floating tensor's dtype; a float with an integer tensor is F32; an int keeps it).
af::Tensor scalar_like(nb::handle scalar, const af::Tensor& like);
// A Tensor argument, or a Python number turned into one with scalar_like; nullopt for anything else.
std::optional<af::Tensor> tensor_or_scalar(nb::handle h, const af::Tensor& like);

}  // namespace ampforge::python
