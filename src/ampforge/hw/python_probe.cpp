#include "ampforge/hw/python_probe.h"

#include <sstream>

#include <nlohmann/json.hpp>

#include "ampforge/hw/subprocess.h"
#include "ampforge/util/env.h"

namespace ampforge::hw {

namespace {

// One JSON object per line, flushed as soon as known, so that a probe killed at its deadline still tells
// what it learned (e.g. the installed version, read from package metadata before the slow import).
constexpr const char* kTorchProbe = R"PY(
import json, sys
def emit(**k): print(json.dumps(k), flush=True)
emit(python=sys.version.split()[0])
import importlib.util
if importlib.util.find_spec("torch") is None:
    emit(installed=False); sys.exit(0)
emit(installed=True)
try:
    from importlib.metadata import version
    emit(version=version("torch"))
except Exception:
    pass
try:
    import torch
    cudnn = None
    try:
        v = torch.backends.cudnn.version()
        cudnn = None if v is None else str(v)
    except Exception:
        pass
    emit(version=torch.__version__, cuda=torch.version.cuda or "", cudnn=cudnn)
except BaseException as e:
    emit(error="import torch failed: %s: %s" % (type(e).__name__, e))
)PY";

constexpr const char* kTensorflowProbe = R"PY(
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
def emit(**k): print(json.dumps(k), flush=True)
emit(python=sys.version.split()[0])
import importlib.util
if importlib.util.find_spec("tensorflow") is None:
    emit(installed=False); sys.exit(0)
emit(installed=True)
try:
    from importlib.metadata import version
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly"):
        try:
            emit(version=version(dist)); break
        except Exception:
            pass
except Exception:
    pass
try:
    import tensorflow as tf
    info = tf.sysconfig.get_build_info()
    cuda = info.get("cuda_version") if info.get("is_cuda_build") else ""
    cudnn = info.get("cudnn_version")
    emit(version=tf.__version__, cuda=cuda or "", cudnn=None if cudnn is None else str(cudnn))
except BaseException as e:
    emit(error="import tensorflow failed: %s: %s" % (type(e).__name__, e))
)PY";

}  // namespace

void parse_python_probe_output(const std::string& out, FrameworkInfo& info, PythonReport& py) {
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;  // a framework printed something of its own on stdout
    if (j.contains("python") && j["python"].is_string()) py.version = j["python"].get<std::string>();
    if (j.contains("installed") && j["installed"].is_boolean()) info.installed = j["installed"].get<bool>();
    if (j.contains("version") && j["version"].is_string()) info.version = j["version"].get<std::string>();
    if (j.contains("cuda") && j["cuda"].is_string()) info.cuda = j["cuda"].get<std::string>();
    if (j.contains("cudnn")) {
      if (j["cudnn"].is_string()) info.cudnn = j["cudnn"].get<std::string>();
    }
    if (j.contains("error") && j["error"].is_string()) info.error = j["error"].get<std::string>();
  }
}

PythonProbe::PythonProbe(double timeout_s) : timeout_s_(timeout_s) {
  const std::string program = env_get("AMPFORGE_PYTHON").value_or("python3");
  exe_ = find_program(program);
  if (exe_.empty()) {
    exe_ = program;
    return;
  }
  torch_ = std::make_unique<Subprocess>(std::vector<std::string>{exe_, "-c", kTorchProbe}, false);
  tf_ = std::make_unique<Subprocess>(std::vector<std::string>{exe_, "-c", kTensorflowProbe}, false);
}

PythonProbe::~PythonProbe() = default;

PythonReport PythonProbe::collect() {
  PythonReport py;
  py.executable = exe_;
  py.timeout_s = timeout_s_;
  py.torch.name = "PyTorch";
  py.tensorflow.name = "TensorFlow";
  if (!torch_) {
    py.error = exe_ + ": not found in PATH";
    return py;
  }
  struct Job {
    Subprocess* p;
    FrameworkInfo* info;
  };
  bool any_started = false;
  for (Job job : {Job{torch_.get(), &py.torch}, Job{tf_.get(), &py.tensorflow}}) {
    SubprocessResult r = job.p->wait(timeout_s_);
    if (!r.started) {
      job.info->error = r.error;
      continue;
    }
    any_started = true;
    job.info->probed = true;
    parse_python_probe_output(r.out, *job.info, py);
    if (r.timed_out) {
      job.info->timed_out = true;
      if (job.info->error.empty())
        job.info->error = "the probe did not finish within " + std::to_string(static_cast<int>(timeout_s_)) + " s";
    } else if (r.exit_code != 0 && job.info->error.empty() && !job.info->installed.has_value()) {
      job.info->error = "python exited with status " + std::to_string(r.exit_code) +
                        (r.signal ? " (signal " + std::to_string(r.signal) + ")" : "");
    }
  }
  if (!any_started) py.error = py.torch.error;
  py.found = any_started && !py.version.empty();
  if (any_started && py.version.empty() && py.error.empty())
    py.error = py.torch.timed_out ? "python did not answer within the timeout" : "python did not run the probe";
  return py;
}

}  // namespace ampforge::hw
