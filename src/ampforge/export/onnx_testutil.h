// Test helpers for the ONNX export: the file checked by Debian's python3-onnx (onnx.checker) and run by
// ONNX Runtime (onnxruntime-node through scripts/onnx_run.js). Both are installed by scripts/setup.
#pragma once

#include <algorithm>
#include <cmath>
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

inline std::string ort_package_dir() {
  return std::string(AMPFORGE_SOURCE_DIR) + "/.deps/onnxruntime/node_modules/onnxruntime-node";
}

inline bool ort_available() {
  return !hw::find_in_path("node").empty() && std::filesystem::exists(ort_package_dir());
}

// node scripts/onnx_run.js MODEL IN OUT
inline hw::SubprocessResult run_ort(const std::string& model, const std::string& in, const std::string& out) {
  return hw::run_subprocess({hw::find_in_path("node"), std::string(AMPFORGE_SOURCE_DIR) + "/scripts/onnx_run.js", model,
                             in, out},
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
