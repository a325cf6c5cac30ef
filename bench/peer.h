// Running the PyTorch peer (bench/peer/torch_peer.py) from a bench program and reading its JSON.
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ampforge/backends/cpu/blas_kernels.h"

namespace ampforge::bench {

// The interpreter that has torch: AMPFORGE_PEER_PYTHON, else /usr/bin/python3 (Debian's python3-torch).
inline std::string peer_python() {
  const char* env = std::getenv("AMPFORGE_PEER_PYTHON");
  return env ? env : "/usr/bin/python3";
}

// Runs the peer script (bench/peer/<script>) with `args`; nullopt (with a note on stderr) when torch is not
// available.
// The peer inherits this process's OPENBLAS_CORETYPE: select_blas_kernels() runs first, so both sides' GEMMs run
// the same OpenBLAS kernels (docs/BENCH.md, "The peer").
inline std::optional<nlohmann::json> run_peer(const std::string& args, const std::string& script = "torch_peer.py") {
  ampforge::cpu::select_blas_kernels();
  const std::string cmd =
      peer_python() + " " + AMPFORGE_SOURCE_DIR "/bench/peer/" + script + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0 || out.empty()) {
    std::fprintf(stderr, "peer: PyTorch not available (%s); install it with scripts/setup --peer\n", cmd.c_str());
    return std::nullopt;
  }
  try {
    return nlohmann::json::parse(out);
  } catch (...) {
    std::fprintf(stderr, "peer: unreadable output: %s\n", out.c_str());
    return std::nullopt;
  }
}

}  // namespace ampforge::bench
