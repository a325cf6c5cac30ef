// `ampforge bench --collective`: all-reduce and all-gather bandwidth over a size sweep between the ranks of a
// data-parallel job (MPI on CPU ranks, NCCL on GPUs), with nccl-tests' definitions:
//   time     mean time of one operation (the slowest rank's, after warm-up)
//   algbw    bytes / time, where bytes is the all-reduced buffer, or the all-gathered output
//   busbw    algbw x 2 (n - 1) / n for all-reduce, x (n - 1) / n for all-gather: the traffic every link
//            carries in a ring, comparable with the hardware's link bandwidth (NVLink, PCIe, the network)
// Each size is checked once after timing (ones all-reduced must give n; every rank's chunk gathered).
#include "ampforge/cli/bench_collective.h"

#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/core/runtime.h"
#include "ampforge/dist/environment.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"
#include "ampforge/util/timer.h"

namespace ampforge::cli {

namespace {

struct Row {
  std::string op;
  int64_t bytes = 0;
  double seconds = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
};

double bus_factor(const std::string& op, int n) {
  return op == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

}  // namespace

int run_collective_bench(const CollectiveBenchOptions& o) {
  AF_CHECK(o.min_bytes >= 4 && o.max_bytes >= o.min_bytes && o.factor >= 2, "--min-bytes (>= 4), --max-bytes (>= "
           "--min-bytes) and --factor (>= 2) make no sweep: {} {} {}", o.min_bytes, o.max_bytes, o.factor);
  AF_CHECK(o.iterations >= 1 && o.warmup >= 0, "--steps must be >= 1 and --warmup >= 0");
  dist::WorldInfo world = dist::detect_world();
  if (!world.distributed()) world.launcher = dist::Launcher::Env;  // alone: a world of one (busbw 0)
  Device dev = Device::parse(o.device);
  if (dev.is_cuda() && o.device == "cuda") dev = Device(DeviceType::CUDA, world.local_rank);
  dist::InitOptions io;
  io.device = dev;
  io.compute_stream = runtime::device_runtime(dev).compute_stream(dev.index);
  const dist::CommunicatorPtr comm = dist::init_process_group(world, io);
  const int n = comm->size();
  auto sync = [&] {
    runtime::synchronize(dev);
  };
  std::vector<Row> rows;
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    const int64_t count = bytes / 4;  // F32 elements
    for (const std::string op : {"all_reduce", "all_gather"}) {
      // all_gather: `bytes` is the output; each rank sends its n-th.
      const int64_t per_rank = op == "all_gather" ? std::max<int64_t>(1, count / n) : count;
      Tensor in = ops::full({per_rank}, 1.0, DType::F32, dev);
      Tensor out = op == "all_gather" ? ops::zeros({per_rank * n}, DType::F32, dev) : in;
      auto once = [&] {
        return op == "all_reduce" ? comm->all_reduce(in, dist::ReduceOp::Sum) : comm->all_gather(in, out);
      };
      for (int i = 0; i < o.warmup; ++i) once()->wait();
      sync();
      comm->barrier();
      const Stopwatch clock;
      for (int i = 0; i < o.iterations; ++i) once()->wait();
      sync();
      double t = clock.seconds() / o.iterations;
      comm->all_reduce_host(std::span<double>(&t, 1), dist::ReduceOp::Max);
      // The check: ones all-reduced sum to n; gathered chunks hold each rank's value.
      ops::fill_(in, static_cast<double>(comm->rank() + 1));
      once()->wait();
      const Tensor got = ops::to_device(out, kCPU);
      Row r{op, (op == "all_gather" ? per_rank * n : count) * 4, t};
      const float* g = got.data<float>();
      for (int64_t i = 0; i < got.numel(); ++i) {
        const float want = op == "all_reduce" ? static_cast<float>(n * (n + 1) / 2)
                                              : static_cast<float>(i / per_rank + 1);
        r.wrong += g[i] != want;
      }
      double wrong = static_cast<double>(r.wrong);
      comm->all_reduce_host(std::span<double>(&wrong, 1), dist::ReduceOp::Sum);
      r.wrong = static_cast<int64_t>(wrong);
      r.algbw = static_cast<double>(r.bytes) / t / 1e9;
      r.busbw = r.algbw * bus_factor(op, n);
      rows.push_back(r);
    }
  }
  int64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (comm->rank() != 0) return wrong == 0 ? 0 : 1;
  if (o.json) {
    nlohmann::json j = {{"schema", "ampforge.bench.collective/1"}, {"backend", comm->backend()},
                        {"world_size", n}, {"device", dev.is_cuda() ? "cuda" : "cpu"}, {"dtype", "f32"},
                        {"warmup", o.warmup}, {"iterations", o.iterations}, {"results", nlohmann::json::array()}};
    for (const Row& r : rows)
      j["results"].push_back({{"op", r.op}, {"bytes", r.bytes}, {"time_us", r.seconds * 1e6},
                              {"algbw_gbps", r.algbw}, {"busbw_gbps", r.busbw}, {"wrong", r.wrong}});
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("collectives: %s, %d ranks, %s, f32, %d iterations after %d warm-up (nccl-tests' algbw/busbw)\n",
                comm->backend(), n, dev.is_cuda() ? "cuda" : "cpu", o.iterations, o.warmup);
    std::printf("%12s  %-10s  %10s  %10s  %10s  %6s\n", "bytes", "op", "time us", "algbw GB/s", "busbw GB/s",
                "wrong");
    for (const Row& r : rows)
      std::printf("%12lld  %-10s  %10.1f  %10.3f  %10.3f  %6lld\n", static_cast<long long>(r.bytes), r.op.c_str(),
                  r.seconds * 1e6, r.algbw, r.busbw, static_cast<long long>(r.wrong));
    if (n == 1) std::printf("one rank: no traffic between ranks, busbw is 0 by definition\n");
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace ampforge::cli
