// Synthetic memory traces that fragment a caching allocator, generated deterministically (same seed,
// same trace, on every machine: the generator uses its own integer RNG, not <random>'s distributions).
//   varlen      a transformer's training steps with a sequence length that grows step by step (bucketed
//               variable-length batches): every step's activations are a little larger than the last.
//   cnn         a ResNet-like network whose batch size changes from step to step, with short-lived
//               workspaces interleaved with saved activations and gradients allocated during backward.
//   many-sizes  random sizes from 512 B to 256 MiB (log-uniform) with random lifetimes around a target
//               live total: no structure at all.
// `scale` shrinks the models (1 = full size, peak live a few GiB; smaller for the committed test traces).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampforge/memory/trace.h"

namespace ampforge::memory {

struct SyntheticOptions {
  int steps = 30;
  double scale = 1.0;
  uint64_t seed = 1;
};

Trace synthetic_varlen(const SyntheticOptions& o);
Trace synthetic_cnn(const SyntheticOptions& o);
Trace synthetic_many_sizes(const SyntheticOptions& o);
// By name ("varlen", "cnn", "many-sizes"); unknown names are an InvalidArgument error.
Trace synthetic_trace(const std::string& name, const SyntheticOptions& o);
std::vector<std::string> synthetic_trace_names();

}  // namespace ampforge::memory
