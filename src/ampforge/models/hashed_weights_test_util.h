// Test helper (header-only): the integer-hash weights and inputs of the model parity goldens, computed
// bit-identically to scripts/gen_resnet_golden.py (numpy uint64 arithmetic). The formula and the per-tensor
// rules are documented there; keep the two in step.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "ampforge/autograd/node.h"
#include "ampforge/nn/module.h"
#include "ampforge/ops/ops.h"

namespace ampforge::models::hashinit {

inline constexpr uint64_t kInputStream = uint64_t{1} << 20;
inline constexpr uint64_t kLabelStream = kInputStream + 1;

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// u(s, i) in (-1, 1): (2 * top24 + 1 - 2^24) / 2^24, exact in float and double.
inline double hash_unit(uint64_t stream, uint64_t i) {
  const uint64_t h = splitmix64((stream << 40) + i);
  return (2.0 * static_cast<double>(h >> 40) + 1.0 - 16777216.0) / 16777216.0;
}

// float32(c + a * u) with the product and the sum rounded separately, as numpy does (no fused multiply-add:
// the volatile keeps the compiler from contracting them).
inline float hashed_value(uint64_t stream, uint64_t i, double c, double a) {
  volatile double prod = a * hash_unit(stream, i);
  return static_cast<float>(c + prod);
}

// Fills an F32 CPU tensor (contiguous) with hashed values; returns their sum in double.
inline double fill_hashed(const Tensor& t, uint64_t stream, double c, double a) {
  AF_ASSERT(t.dtype() == DType::F32 && t.is_contiguous(), "fill_hashed: expected a contiguous F32 tensor");
  float* p = t.data<float>();
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = hashed_value(stream, static_cast<uint64_t>(i), c, a);
    sum += p[i];
  }
  return sum;
}

// Writes the hashed weights into every state tensor of `m` (stream = 1 + index in state_dict order) and
// returns each tensor's sum, in that order. Rules: gen_resnet_golden.py's init_rule.
inline std::vector<double> set_hashed_weights(nn::Module& m) {
  const nn::NamedTensors sd = m.state_dict();
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : sd) shapes[name] = t.shape();
  std::vector<double> sums;
  autograd::NoGradGuard ng;
  for (size_t idx = 0; idx < sd.size(); ++idx) {
    const auto& [name, t] = sd[idx];
    const size_t dot = name.rfind('.');
    const std::string prefix = dot == std::string::npos ? "" : name.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
    if (leaf == "num_batches_tracked") {
      ops::fill_(t, 0.0);
      sums.push_back(0.0);
      continue;
    }
    double c = 0, a = 0;
    const Shape& s = t.shape();
    auto w = shapes.find(prefix + ".weight");
    if (s.size() == 4) {
      a = std::sqrt(6.0 / static_cast<double>(s[1] * s[2] * s[3]));
    } else if (s.size() == 2) {
      a = 1.0 / std::sqrt(static_cast<double>(s[1]));
    } else if (leaf == "bias" && w != shapes.end() && w->second.size() == 2) {
      a = 1.0 / std::sqrt(static_cast<double>(w->second[1]));
    } else if (leaf == "weight") {
      c = 0.25, a = 0.05;
    } else if (leaf == "bias") {
      c = 0.1, a = 0.05;
    } else if (leaf == "running_mean") {
      a = 0.1;
    } else if (leaf == "running_var") {
      c = 1.0, a = 0.5;
    } else {
      AF_ASSERT(false, "set_hashed_weights: no rule for '{}'", name);
    }
    Tensor tmp = Tensor::empty(t.shape(), DType::F32);
    sums.push_back(fill_hashed(tmp, idx + 1, c, a));
    ops::copy_(t, tmp);
  }
  return sums;
}

// The input x (N, C, H, W) F32 (uniform in (-1, 1)) and labels y (N) I64 in [0, classes).
inline Tensor hashed_input(const Shape& shape) {
  Tensor x = Tensor::empty(shape, DType::F32);
  fill_hashed(x, kInputStream, 0.0, 1.0);
  return x;
}
inline Tensor hashed_labels(int64_t n, int64_t classes) {
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    y[static_cast<size_t>(i)] = static_cast<int64_t>(splitmix64((kLabelStream << 40) + static_cast<uint64_t>(i)) %
                                                     static_cast<uint64_t>(classes));
  return Tensor::from_vector(y, {n});
}

}  // namespace ampforge::models::hashinit
