// The NCCL implementation of dist::Communicator (CUDA tensors). NCCL (libnccl.so.2) and the CUDA driver
// (libcuda.so.1) are loaded at run time with dlopen, like the project's other NVIDIA libraries, so this
// compiles as plain C++ in every build and a binary without a GPU starts normally; nccl_status() says what
// is missing. $AMPFORGE_NCCL_LIBRARY names the library file when it is not on the loader's path (a
// PyTorch wheel's site-packages/nvidia/nccl/lib/libnccl.so.2).
//
// Streams: the communicator owns one non-blocking stream on its device. Each collective
//   1. records an event on the compute stream (the kernels that produced the input) and makes the NCCL
//      stream wait for it (device-side);
//   2. enqueues the NCCL call on the NCCL stream;
//   3. records a completion event there. Work::wait() makes the compute stream wait for that event
//      (device-side again), so the host never blocks inside a training step, and kernels queued after
//      wait() read the result. Work::is_completed() queries the event.
// The Work keeps its tensors referenced until it is destroyed (after wait(), or its destructor waits), so
// their memory goes back to the caching allocator, which is keyed by the compute stream, only once the
// compute stream is ordered after the collective.
// Host helpers (all_gather_host, barrier) copy through a small device buffer and synchronise the NCCL
// stream: start-up and reporting only.
// A watchdog thread (dist/watchdog.h) ends a job whose ranks stopped talking: a collective pending longer than
// collective_timeout_s, or an asynchronous NCCL error (a peer's connection broke), aborts the communicator
// (ncclCommAbort), and every later call on it throws that failure.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>

#include "ampforge/dist/communicator.h"

namespace ampforge::dist {

struct NcclStatus {
  bool available = false;
  std::string library;   // the file that was loaded
  std::string version;   // "2.21.5"
  std::string reason;    // why not available
};
// Loads NCCL and the CUDA driver once; never throws.
const NcclStatus& nccl_status();

using NcclUniqueId = std::array<char, 128>;  // ncclUniqueId (NCCL_UNIQUE_ID_BYTES)

struct NcclOptions {
  int rank = 0, size = 1;
  int device = 0;               // CUDA device index (the local rank, usually)
  uint64_t compute_stream = 0;  // the device's compute stream (cuda::compute_stream), as an opaque id
  // Hands rank 0's unique id to every rank: called with the id filled on rank 0, to be filled on the others
  // (a TCP store's set/get, or an MPI broadcast). Called once, on every rank.
  std::function<void(NcclUniqueId& id)> share_id;
  // A collective still running after this many seconds ends the job (0: no limit; set_collective_timeout
  // changes it for the collectives launched afterwards).
  double collective_timeout_s = 1800;
  // Kept alive as long as the communicator (the TCP store whose server runs in rank 0's process).
  std::shared_ptr<void> keep_alive;
};

// ncclCommInitRank over the given ranks. Throws InvalidArgument when NCCL cannot be loaded (the reason),
// Internal with NCCL's message when initialisation fails.
CommunicatorPtr make_nccl_communicator(const NcclOptions& options);

}  // namespace ampforge::dist
