// A rank of the dist/ tests: started by mpirun or `ampforge launch --spawn` from src/ampforge/dist/*_test.cpp,
// it exercises the communicator or the rendezvous store and prints what it found; the test reads the output
// and the exit code. Modes:
//   collectives            every collective of the MPI communicator, each dtype and op, checked against the
//                          values every rank can compute for itself; prints "rank R/N ok <checks>"
//   store [--exit-rank R] [--absent-rank R] [--timeout S]
//                          the torchrun-style rendezvous (dist::detect_world + TcpStore): set/get/add, a
//                          barrier, then a second barrier that rank R misses by exiting early or by never
//                          connecting; prints "rank R store ok" or the error and exits 2.
//   hang [--absent-rank R] [--timeout S] [--barrier]
//                          the collective limit of the MPI communicator: one all_reduce every rank joins, then a
//                          second one (or a barrier) that rank R never joins (it sleeps); the others' wait must
//                          fail after S seconds, and the error ends the job (abort_job).
//   fake-nccl ok|hang|async|initfail [--timeout S]
//                          the NCCL communicator of a torchrun-style world of one against tests/fake_nccl (the
//                          environment points AMPFORGE_NCCL_LIBRARY and AMPFORGE_CUDA_DRIVER_LIBRARY there and
//                          sets the fake's FAKE_NCCL_* knobs): host helpers, the watchdog's timeout and
//                          asynchronous error, a failed ncclCommInitRank; prints what happened and the fake's
//                          count of objects not given back ("live N").
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ampforge/core/half.h"
#include "ampforge/core/tensor.h"
#include "ampforge/dist/environment.h"
#include "ampforge/dist/mpi_communicator.h"
#include "ampforge/dist/nccl_communicator.h"
#include "ampforge/dist/store.h"
#include "ampforge/util/error.h"

using namespace ampforge;

namespace {

int checks = 0;
void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// rank r's value of element i: exact in every dtype (small integers and halves).
double value(int r, int64_t i) { return static_cast<double>((r + 1) * 2 + (i % 7)) * 0.5; }

Tensor filled(DType d, int64_t n, int r) {
  Tensor t = Tensor::empty({n}, d);
  for (int64_t i = 0; i < n; ++i) {
    const double v = value(r, i);
    switch (d) {
      case DType::F32: t.data<float>()[i] = static_cast<float>(v); break;
      case DType::F64: t.data<double>()[i] = v; break;
      case DType::F16: static_cast<uint16_t*>(t.data_ptr())[i] = float_to_half_bits(static_cast<float>(v)); break;
      case DType::BF16: static_cast<uint16_t*>(t.data_ptr())[i] = float_to_bf16_bits(static_cast<float>(v)); break;
      default: throw std::runtime_error("dtype");
    }
  }
  return t;
}

double at(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return t.data<float>()[i];
    case DType::F64: return t.data<double>()[i];
    case DType::F16: return half_bits_to_float(static_cast<const uint16_t*>(t.data_ptr())[i]);
    case DType::BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(t.data_ptr())[i]);
    default: throw std::runtime_error("dtype");
  }
}

// The expected reduction of element i over `size` ranks, rounded to the dtype as the engine must round it.
double expected(DType d, dist::ReduceOp op, int size, int64_t i) {
  double s = 0, m = -1e300;
  for (int r = 0; r < size; ++r) {
    s += value(r, i);
    m = std::max(m, value(r, i));
  }
  double v = op == dist::ReduceOp::Max ? m : op == dist::ReduceOp::Avg ? s / size : s;
  if (d == DType::F16) return half_bits_to_float(float_to_half_bits(static_cast<float>(v)));
  if (d == DType::BF16) return bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(v)));
  if (d == DType::F32) return static_cast<float>(v);
  return v;
}

int collectives() {
  dist::WorldInfo w = dist::detect_world();
  if (!w.distributed()) w.launcher = dist::Launcher::Env;  // run alone: a world of one (MPI singleton)
  dist::CommunicatorPtr c = dist::init_process_group(w, {});
  const int R = c->rank(), N = c->size();
  expect(std::string(c->backend()) == "mpi", "backend");
  const int64_t n = 1000;
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max}) {
      Tensor t = filled(d, n, R);
      dist::WorkPtr work = c->all_reduce(t, op);
      work->wait();
      expect(work->is_completed(), "is_completed after wait");
      for (int64_t i = 0; i < n; ++i)
        expect(at(t, i) == expected(d, op, N, i), std::string("all_reduce ") + std::string(dtype_name(d)) + " " +
                                                      dist::reduce_op_name(op) + " element " + std::to_string(i) +
                                                      " = " + std::to_string(at(t, i)) + ", expected " +
                                                      std::to_string(expected(d, op, N, i)));
    }
    // reduce_scatter: rank r gets chunk r of the sums.
    Tensor in = filled(d, n * N, R), out = Tensor::empty({n}, d);
    c->reduce_scatter(in, out, dist::ReduceOp::Sum)->wait();
    for (int64_t i = 0; i < n; ++i)
      expect(at(out, i) == expected(d, dist::ReduceOp::Sum, N, R * n + i), std::string("reduce_scatter ") + std::string(dtype_name(d)));
    // all_gather: chunk r is rank r's input.
    Tensor mine = filled(d, n, R), all = Tensor::empty({n * N}, d);
    c->all_gather(mine, all)->wait();
    for (int r = 0; r < N; ++r)
      for (int64_t i = 0; i < n; ++i)
        expect(at(all, r * n + i) == at(filled(d, n, r), i), std::string("all_gather ") + std::string(dtype_name(d)));
    // broadcast from the last rank.
    Tensor b = filled(d, n, R);
    c->broadcast(b, N - 1)->wait();
    for (int64_t i = 0; i < n; ++i) expect(at(b, i) == at(filled(d, n, N - 1), i), "broadcast");
  }
  // Several outstanding collectives, completed in any order of waiting.
  std::vector<Tensor> ts;
  std::vector<dist::WorkPtr> ws;
  for (int k = 0; k < 8; ++k) {
    ts.push_back(filled(DType::F32, 100000 + k, R));
    ws.push_back(c->all_reduce(ts.back(), dist::ReduceOp::Sum));
  }
  for (int k = 7; k >= 0; --k) ws[static_cast<size_t>(k)]->wait();
  for (int k = 0; k < 8; ++k) expect(at(ts[static_cast<size_t>(k)], 99999) == expected(DType::F32, dist::ReduceOp::Sum, N, 99999), "outstanding");
  // Host helpers.
  const std::vector<uint64_t> g = c->all_gather_u64(static_cast<uint64_t>(R) * 10 + 1);
  for (int r = 0; r < N; ++r) expect(g[static_cast<size_t>(r)] == static_cast<uint64_t>(r) * 10 + 1, "all_gather_u64");
  double v[2] = {static_cast<double>(R), 1.0};
  c->all_reduce_host(v, dist::ReduceOp::Sum);
  expect(v[0] == N * (N - 1) / 2.0 && v[1] == N, "all_reduce_host");
  expect(c->broadcast_string(R == 0 ? std::string("hello from rank 0") : std::string(), 0) == "hello from rank 0",
         "broadcast_string");
  c->barrier();
  // A non-dense tensor and an integer reduction are refused with a message.
  bool refused = false;
  try {
    c->all_reduce(Tensor::empty({4}, DType::I64), dist::ReduceOp::Sum);
  } catch (const Error& e) {
    refused = std::strstr(e.what(), "reductions take") != nullptr;
  }
  expect(refused, "integer all_reduce refused");
  std::printf("rank %d/%d ok %d checks\n", R, N, checks);
  return 0;
}

int hang(int argc, char** argv) {
  int absent_rank = 1;
  double timeout = 1;
  bool barrier = false;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--absent-rank") && i + 1 < argc) absent_rank = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--timeout") && i + 1 < argc) timeout = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--barrier")) barrier = true;
  }
  dist::CommunicatorPtr c = dist::make_mpi_communicator(timeout);
  Tensor t = filled(DType::F32, 4, c->rank());
  c->all_reduce(t, dist::ReduceOp::Sum)->wait();  // collective #1: everyone
  if (c->rank() == absent_rank) {                  // alive but silent: only the others' limit ends the job
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (barrier) c->barrier();
  else c->all_reduce(t, dist::ReduceOp::Sum)->wait();
  std::printf("rank %d: the collective completed without rank %d\n", c->rank(), absent_rank);
  return 1;
}

// The fake's count of objects not released (tests/fake_nccl/fake_nccl.c).
long fake_live() {
  const char* path = std::getenv("AMPFORGE_NCCL_LIBRARY");
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  auto* fn = h ? reinterpret_cast<long (*)()>(dlsym(h, "fake_nccl_live")) : nullptr;
  return fn ? fn() : -1;
}

int fake_nccl(int argc, char** argv) {
  const std::string scenario = argc > 2 ? argv[2] : "";
  double timeout = 1800;
  for (int i = 3; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--timeout")) timeout = std::atof(argv[i + 1]);
  dist::InitOptions o;
  o.device = Device(DeviceType::CUDA, 0);
  o.collective_timeout_s = timeout;
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  try {
    dist::CommunicatorPtr c = dist::init_process_group(dist::detect_world(), o);
    std::printf("backend %s, rank %d of %d\n", c->backend(), c->rank(), c->size());
    c->barrier();                                        // collective #1
    expect(c->all_gather_u64(42) == std::vector<uint64_t>{42}, "all_gather_u64");  // #2
    if (scenario == "async") std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the watchdog polls
    expect(c->broadcast_string("hello", 0) == "hello", "broadcast_string");  // #3, #4 (length, then bytes)
    std::printf("%s: every call returned after %.1f s\n", scenario.c_str(), seconds());
    try {
      c->barrier();
    } catch (const Error& e) {
      std::printf("later call: %s\n", e.what());
    }
  } catch (const Error& e) {
    std::printf("caught after %.1f s (%s): %s\n", seconds(), error_kind_name(e.kind()), e.what());
  }
  std::printf("live %ld\n", fake_live());
  return 0;
}

int store(int argc, char** argv) {
  int exit_rank = -1, absent_rank = -1;
  double timeout = 5;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--exit-rank")) exit_rank = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--absent-rank")) absent_rank = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--timeout")) timeout = std::atof(argv[i + 1]);
  }
  const dist::WorldInfo w = dist::detect_world();
  if (w.launcher != dist::Launcher::Env) throw std::runtime_error("store mode needs a torchrun-style environment");
  if (w.rank == absent_rank) {  // never arrives: alive but silent until the others have given up
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout + 3));
    return 0;
  }
  dist::StoreOptions so;
  so.host = w.master_addr;
  so.port = w.master_port;
  so.rank = w.rank;
  so.world_size = w.size;
  so.is_server = w.rank == 0;
  so.timeout_s = timeout;
  if (w.rank == exit_rank) {
    auto* s = new dist::TcpStore(so);  // connected, then gone without a goodbye (no destructor)
    s->set("hello/" + std::to_string(w.rank), "x");
    std::fflush(stdout);
    _exit(3);
  }
  dist::TcpStore s(so);
  s.set("key/" + std::to_string(w.rank), "value " + std::to_string(w.rank));
  const int64_t count = s.add("counter", 1);
  s.barrier("first");
  for (int r = 0; r < w.size; ++r) {
    if (r == exit_rank || r == absent_rank) continue;
    expect(s.get("key/" + std::to_string(r)) == "value " + std::to_string(r), "get");
  }
  expect(count >= 1 && count <= w.size, "add");
  s.barrier("second");
  std::printf("rank %d store ok\n", w.rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "collectives") return collectives();
    if (mode == "store") return store(argc, argv);
    if (mode == "hang") return hang(argc, argv);
    if (mode == "fake-nccl") return fake_nccl(argc, argv);
    std::fprintf(stderr, "usage: ampforge_dist_worker collectives | store [--exit-rank R] [--absent-rank R] | hang "
                 "[--absent-rank R] [--timeout S] [--barrier]\n");
    return 2;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    std::fflush(stdout);
    dist::abort_job(2);
    return 2;
  }
}
