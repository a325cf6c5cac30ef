// Test helper (header-only, used by the hw *_test.cpp files): runs the real ampforge binary as a subprocess
// with a given environment, pointed at the fake NVML / CUDA runtime built in tests/fake_nvml/.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace ampforge::hw::testing {

inline std::string ampforge_binary() { return std::string(AMPFORGE_BINARY_DIR) + "/bin/ampforge"; }

struct CliResult {
  int exit_code = -1;  // -1: killed or did not exit
  std::string out, err;
  double seconds = 0;
};

// As an environment value: remove the variable from the child's environment.
inline constexpr const char* kUnset = "\x01(unset)";

// The environment every scenario starts from: the fakes, no CUDA libraries, no Python, no colour, every GPU
// visible (whatever the test machine's CUDA_VISIBLE_DEVICES), and
// OpenBLAS's kernels as the process chooses them (an OPENBLAS_CORETYPE of the machine's environment would make
// host.blas_kernels say "set by the user"; empty is unset for OpenBLAS and ampforge alike).
inline std::map<std::string, std::string> fake_env(const std::string& scenario) {
  return {{"OPENBLAS_CORETYPE", ""},
          {"AMPFORGE_NVML_LIBRARY", AMPFORGE_FAKE_NVML},
          {"AMPFORGE_CUDART_LIBRARY", AMPFORGE_FAKE_CUDART},
          {"AMPFORGE_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9"},
          {"AMPFORGE_CUBLAS_LIBRARY", "/nonexistent/libcublas.so.12"},
          {"AMPFORGE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2"},
          {"AMPFORGE_PYTHON", "/nonexistent/python3"},
          {"NO_COLOR", "1"},
          {"CUDA_VISIBLE_DEVICES", kUnset},
          {"FAKE_NVML_SCENARIO", scenario}};
}

// A running ampforge with stdout and stderr on pipes.
class Spawned {
 public:
  Spawned(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
    int o[2], e[2];
    if (::pipe(o) != 0 || ::pipe(e) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(o[1], 1);
      ::dup2(e[1], 2);
      ::close(o[0]), ::close(o[1]), ::close(e[0]), ::close(e[1]);
      for (const auto& [k, v] : env) {
        if (v == kUnset) ::unsetenv(k.c_str());
        else ::setenv(k.c_str(), v.c_str(), 1);
      }
      std::vector<std::string> argv_s = {ampforge_binary()};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(o[1]), ::close(e[1]);
    out_fd_ = o[0], err_fd_ = e[0];
    start_ = std::chrono::steady_clock::now();
  }
  ~Spawned() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }
  int pid() const { return pid_; }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  // Reads whatever is available within `seconds`; returns false when both pipes are closed.
  bool pump(double seconds) {
    std::vector<pollfd> fds;
    if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
    if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
    if (fds.empty()) return false;
    if (::poll(fds.data(), fds.size(), static_cast<int>(seconds * 1000)) <= 0) return true;
    for (auto& p : fds) {
      if (!(p.revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t n = ::read(p.fd, buf, sizeof(buf));
      std::string& dst = p.fd == out_fd_ ? out : err;
      if (n > 0) {
        dst.append(buf, static_cast<size_t>(n));
      } else {
        ::close(p.fd);
        (p.fd == out_fd_ ? out_fd_ : err_fd_) = -1;
      }
    }
    return true;
  }
  // Waits for exit (killing it after `timeout` seconds) and returns the result.
  CliResult finish(double timeout) {
    while (elapsed() < timeout && pump(0.05)) {
    }
    CliResult r;
    int status = 0;
    if (elapsed() >= timeout) ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    while (pump(0)) {
    }
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = out;
    r.err = err;
    r.seconds = elapsed();
    return r;
  }
  std::string out, err;

 private:
  int pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  std::chrono::steady_clock::time_point start_;
};

inline CliResult run_ampforge(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                              double timeout = 20) {
  Spawned s(args, env);
  return s.finish(timeout);
}

}  // namespace ampforge::hw::testing
