// ampforge's errors as Python exceptions, carrying the engine's message unchanged:
//   InvalidArgument (usage, shapes, dtypes, values)  -> ValueError
//   Io, the file is missing                          -> FileNotFoundError (other Io: RuntimeError)
//   NotImplemented (an op without a kernel there)    -> NotImplementedError (a RuntimeError)
//   OutOfMemory                                      -> ampforge.OutOfMemoryError (a RuntimeError, as torch's)
//   Interrupted                                      -> KeyboardInterrupt
//   Internal (a bug)                                 -> RuntimeError
#include <strings.h>

#include <cstring>

#include "common.h"

namespace ampforge::python {

namespace {
PyObject* g_out_of_memory = nullptr;

bool says_missing(const char* msg) {
  return strcasestr(msg, "no such file") != nullptr || std::strstr(msg, "does not exist") != nullptr;
}
}  // namespace

void init_errors(nb::module_& m) {
  g_out_of_memory = PyErr_NewExceptionWithDoc("ampforge.OutOfMemoryError",
                                              "An allocator could not satisfy a request; the message is the engine's "
                                              "out-of-memory report.",
                                              PyExc_RuntimeError, nullptr);
  m.attr("OutOfMemoryError") = nb::handle(g_out_of_memory);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const af::Error& e) {
      PyObject* type = PyExc_RuntimeError;
      switch (e.kind()) {
        case af::ErrorKind::InvalidArgument: type = PyExc_ValueError; break;
        case af::ErrorKind::Io:
          if (says_missing(e.what())) type = PyExc_FileNotFoundError;
          else if (std::strstr(e.what(), "Permission denied")) type = PyExc_PermissionError;
          break;
        case af::ErrorKind::NotImplemented: type = PyExc_NotImplementedError; break;
        case af::ErrorKind::OutOfMemory: type = g_out_of_memory; break;
        case af::ErrorKind::Interrupted: type = PyExc_KeyboardInterrupt; break;
        case af::ErrorKind::Internal: type = PyExc_RuntimeError; break;
      }
      PyErr_SetString(type, e.what());
    }
  });
}

}  // namespace ampforge::python
