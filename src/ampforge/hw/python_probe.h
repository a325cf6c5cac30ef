// Python frameworks seen by `python3` (or AMPFORGE_PYTHON): PyTorch and TensorFlow versions, the CUDA version
// PyTorch was built for, cuDNN versions. Each framework is probed in its own python process with a deadline,
// both at once; a probe that hangs is killed and reported as timed out, with whatever it printed before.
// The probe never initialises CUDA (no torch.cuda.is_available()): it reads build facts only.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace ampforge::hw {

struct FrameworkInfo {
  std::string name;                // "PyTorch" / "TensorFlow"
  bool probed = false;             // false when python itself was not found
  std::optional<bool> installed;   // nullopt: could not tell (timed out before saying)
  std::string version;             // e.g. "2.3.1+cu121"
  std::optional<std::string> cuda;   // CUDA the build targets; empty string: a CPU-only build
  std::optional<std::string> cudnn;  // cuDNN version the build uses
  bool timed_out = false;
  std::string error;
};

struct PythonReport {
  bool found = false;
  std::string executable;  // the program run
  std::string version;     // "3.11.7"
  std::string error;       // why python was not usable
  FrameworkInfo torch, tensorflow;
  double timeout_s = 0;
};

class Subprocess;

// Starts the probes at once; collect() waits (at most timeout_s from start) for both.
class PythonProbe {
 public:
  explicit PythonProbe(double timeout_s);
  ~PythonProbe();
  PythonReport collect();

 private:
  double timeout_s_;
  std::string exe_;
  std::unique_ptr<Subprocess> torch_, tf_;
};

// Exposed for tests: merge the probe's JSON lines into `info` (and the python version into `py`).
void parse_python_probe_output(const std::string& out, FrameworkInfo& info, PythonReport& py);

}  // namespace ampforge::hw
