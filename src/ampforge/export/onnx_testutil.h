// Test helpers for the ONNX export: the file checked by Debian's python3-onnx (onnx.checker) and run by
// ONNX Runtime (onnxruntime from PyPI, in the project venv .venv/, through scripts/onnx_run.py). Both are installed
// by scripts/setup.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "ampforge/core/tensor.h"
#include "ampforge/hw/subprocess.h"

namespace ampforge::onnx_export::testing {

inline const char* kPython = "/usr/bin/python3";

inline bool python_onnx_available() {
  const auto r = hw::run_subprocess({kPython, "-c", "import onnx"}, 60, true);
  return r.started && r.exit_code == 0;
}

// onnx.checker.check_model(full_check=True: shape inference too) on the file; out: "ir <v> opset <v>" or the
// checker's message.
inline hw::SubprocessResult check_model(const std::string& path) {
  return hw::run_subprocess({kPython, "-c",
                             "import onnx, sys\n"
                             "m = onnx.load(sys.argv[1])\n"
                             "onnx.checker.check_model(m, full_check=True)\n"
                             "print('ir', m.ir_version, 'opset', m.opset_import[0].version, 'onnx', onnx.__version__)\n",
                             path},
                            120, true);
}

// The project venv's interpreter (scripts/setup makes .venv/ with onnxruntime pinned); AMPFORGE_ORT_PYTHON names
// another interpreter that has onnxruntime.
inline std::string ort_python() {
  if (const char* p = std::getenv("AMPFORGE_ORT_PYTHON"); p && *p) return p;
  return std::string(AMPFORGE_SOURCE_DIR) + "/.venv/bin/python";
}

inline bool ort_available() {
  if (!std::filesystem::exists(ort_python())) return false;
  const auto r = hw::run_subprocess({ort_python(), "-c", "import onnxruntime, numpy"}, 60, true);
  return r.started && r.exit_code == 0;
}

// What a test prints when onnxruntime cannot be imported: after scripts/setup this is a failure, not a skip.
inline std::string ort_missing_message() {
  return "onnxruntime is not importable by " + ort_python() + " (scripts/setup makes .venv/ with it)";
}

// python scripts/onnx_run.py MODEL IN OUT
inline hw::SubprocessResult run_ort(const std::string& model, const std::string& in, const std::string& out) {
  return hw::run_subprocess({ort_python(), std::string(AMPFORGE_SOURCE_DIR) + "/scripts/onnx_run.py", model, in, out},
                            120, true);
}

// max |a - b| / max |b| (the error relative to the output's magnitude), in double.
inline double max_rel_error(const Tensor& a, const Tensor& b) {
  const auto x = a.to(DType::F64).contiguous().tolist<double>();
  const auto y = b.to(DType::F64).contiguous().tolist<double>();
  if (x.size() != y.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, std::abs(x[i] - y[i]));
    den = std::max(den, std::abs(y[i]));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace ampforge::onnx_export::testing
