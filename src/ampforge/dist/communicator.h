// dist::Communicator: collective operations over the ranks of one data-parallel job. Two implementations:
// MPI (dist/mpi_communicator.h: CPU tensors, the engine for CPU clusters and for testing every distributed
// code path on one machine) and NCCL (dist/nccl_communicator.h: CUDA tensors, its own stream per device).
// Which one a process gets, and how the ranks find each other, is dist/environment.h.
//
// Contract of every collective:
//  - Every rank calls the same collectives in the same order with tensors of the same dtype and element
//    count (otherwise the job hangs or the result is wrong: that is MPI's and NCCL's contract too). The
//    trainer guarantees it by deriving every call from the model, which is checked equal on all ranks at
//    start (dist/model_check.h).
//  - Tensors live on device() and are dense: contiguous, or channels-last for all_reduce and broadcast (which
//    work element by element); views of a larger buffer are fine (the
//    trainer reduces views of the optimizer's flat gradient buffer). Reductions take F32, F16, BF16 or F64;
//    broadcast and all_gather move any dtype. 16-bit floats are reduced in F32 and rounded once where the
//    engine has no 16-bit arithmetic (MPI).
//  - Calls are asynchronous: they return a Work handle. Until wait() returns, the caller keeps the tensors
//    unchanged (the Work holds references, so they stay allocated). The meaning of "complete" is the
//    backend's: MPI's wait() blocks the host until the result is in the tensor; NCCL's wait() makes the
//    device's compute stream wait for the collective (a device-side wait), so kernels queued afterwards see
//    the result and the host never blocks.
//  - A Communicator is used by one thread at a time (the training thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge::dist {

enum class ReduceOp : uint8_t { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

// The completion handle of one asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  // See the contract above. Idempotent. Throws Error(Internal) when the engine reported a failure.
  virtual void wait() = 0;
  // True when wait() would return without blocking the host.
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// Waits for every handle in order.
void wait_all(std::span<const WorkPtr> works);

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual const char* backend() const = 0;  // "mpi" | "nccl"
  virtual Device device() const = 0;        // where the collectives' tensors live

  // In place on `tensor`: every rank ends with the reduction over all ranks (Avg: the sum divided by size()).
  virtual WorkPtr all_reduce(const Tensor& tensor, ReduceOp op) = 0;
  // `tensor` of rank `root` is copied into `tensor` of every other rank.
  virtual WorkPtr broadcast(const Tensor& tensor, int root) = 0;
  // input: size() x n elements, output: n elements. Rank r receives the reduction of every rank's chunk r
  // (input elements [r n, (r + 1) n)).
  virtual WorkPtr reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) = 0;
  // input: n elements, output: size() x n elements; chunk r of the output is rank r's input.
  virtual WorkPtr all_gather(const Tensor& input, const Tensor& output) = 0;
  // Returns when every rank has entered the barrier (NCCL: when the device work queued before it is done).
  virtual void barrier() = 0;

  // Seconds a collective launched from now on may run before the job ends (InitOptions::collective_timeout_s;
  // 0: no limit). ScopedCollectiveTimeout changes it for a stretch where one rank is legitimately busy alone.
  virtual double collective_timeout() const = 0;
  virtual void set_collective_timeout(double seconds) = 0;

  // Host values, blocking: for start-up checks and reports, never inside a training step's hot path.
  // Every rank passes `bytes` bytes; returns the size() x bytes concatenation, rank 0 first.
  std::vector<uint8_t> all_gather_host(const void* data, size_t bytes);
  std::vector<uint64_t> all_gather_u64(uint64_t value);
  // Reduces in rank order on every rank, so the result is bit-identical everywhere.
  void all_reduce_host(std::span<double> values, ReduceOp op);
  // `text` of rank `root` on every rank (any length).
  std::string broadcast_string(const std::string& text, int root);

 protected:
  Communicator(int rank, int size);
  // The one host primitive a backend provides: fixed-size all-gather of host bytes (blocking).
  virtual void host_all_gather(const void* in, size_t bytes, void* out) = 0;
  // Checks shared by the backends: defined, on device(), dense (contiguous when `chunked`); `what` names the
  // call in messages.
  void check_tensor(const Tensor& t, const char* what, bool chunked = false) const;
  static void check_reducible(const Tensor& t, const char* what);

 private:
  int rank_ = 0, size_ = 1;
};

using CommunicatorPtr = std::shared_ptr<Communicator>;

// Sets the collective limit while in scope, then restores it: the ranks waiting in a collective while rank 0
// evaluates alone (which may take longer than any limit meant for a hung rank) use 0, no limit.
class ScopedCollectiveTimeout {
 public:
  ScopedCollectiveTimeout(Communicator& comm, double seconds) : comm_(comm), saved_(comm.collective_timeout()) {
    comm_.set_collective_timeout(seconds);
  }
  ~ScopedCollectiveTimeout() { comm_.set_collective_timeout(saved_); }
  ScopedCollectiveTimeout(const ScopedCollectiveTimeout&) = delete;
  ScopedCollectiveTimeout& operator=(const ScopedCollectiveTimeout&) = delete;

 private:
  Communicator& comm_;
  double saved_;
};

}  // namespace ampforge::dist
