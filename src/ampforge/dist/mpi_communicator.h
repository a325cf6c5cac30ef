// The MPI implementation of dist::Communicator (CPU tensors), and the few MPI process-level calls the
// bootstrap needs. MPI is optional at build time (cmake/Dependencies.cmake: ON when found, and
// scripts/setup installs OpenMPI); in a build without it every function here that needs MPI throws
// InvalidArgument saying so, and mpi_built() is false. No MPI header leaks out of this module.
//
// Collectives are MPI's nonblocking ones (MPI_Iallreduce, MPI_Ibcast, MPI_Ireduce_scatter_block,
// MPI_Iallgather) on a duplicate of MPI_COMM_WORLD, so ampforge's traffic never matches an application's
// own messages. MPI has no 16-bit float types: F16/BF16 tensors are widened into an F32 staging buffer,
// reduced in F32 and rounded once (round to nearest even) when the Work completes. Avg is MPI_SUM followed
// by a division by the world size in the tensor's precision (F32 staging for 16-bit tensors). Counts above
// 2^30 elements are split into several requests (MPI counts are int).
//
// Open MPI progresses nonblocking collectives only inside MPI calls: a Work makes progress when it is
// tested or waited on, which the trainer does right after launching its buckets. wait() polls MPI_Testall
// (spinning at first, as MPI_Waitall does, then yielding the core) so that a limit can end the wait.
#pragma once

#include <cstddef>
#include <utility>

#include "ampforge/dist/communicator.h"

namespace ampforge::dist {

// Whether this build has MPI.
bool mpi_built();
// Initialises MPI once per process (MPI_Init_thread, MPI_THREAD_SERIALIZED) and registers MPI_Finalize to
// run at exit. Idempotent; thread-compatible (call it from the thread that will use MPI).
void mpi_init();
bool mpi_initialized();
// MPI_COMM_WORLD's (rank, size); initialises MPI.
std::pair<int, int> mpi_world();
// Rank within this host (MPI_Comm_split_type SHARED), and the number of ranks on this host.
std::pair<int, int> mpi_local_rank();
// A communicator over every rank of MPI_COMM_WORLD (its duplicate); initialises MPI. A Work's wait() (and
// barrier, the host helpers) still waiting after collective_timeout_s seconds throws Error(Io) naming the
// collective and this rank (0: no limit); MPI cannot cancel a collective, so the communicator then waits for
// nothing more, and the caller ends the job (dist::abort_job).
CommunicatorPtr make_mpi_communicator(double collective_timeout_s = 1800);
// Broadcast of host bytes over MPI_COMM_WORLD, blocking (the NCCL unique id under mpirun).
void mpi_broadcast_bytes(void* data, size_t bytes, int root);
// MPI_Abort(MPI_COMM_WORLD, code): stops every rank of the job (used for fatal errors, so the other ranks
// do not wait forever in a collective). Does nothing when MPI is not initialised.
void mpi_abort(int code);

}  // namespace ampforge::dist
