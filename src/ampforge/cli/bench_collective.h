// `ampforge bench --collective` (cli/bench_collective.cpp): collective bandwidth between the ranks of a
// data-parallel job, with nccl-tests' algbw / busbw.
#pragma once

#include <cstdint>
#include <string>

namespace ampforge::cli {

struct CollectiveBenchOptions {
  std::string device = "cpu";  // cpu (MPI) | cuda (NCCL, cuda:<LOCAL_RANK>) | cuda:N
  int64_t min_bytes = 1024, max_bytes = 64 << 20, factor = 4;
  int warmup = 5, iterations = 20;
  bool json = false;
};

// Runs the sweep on every rank (each process of the job calls it); rank 0 prints. Returns 1 when a check
// found wrong values, else 0.
int run_collective_bench(const CollectiveBenchOptions& options);

}  // namespace ampforge::cli
