// Bootstrap: who am I in which job, and the communicator that connects the ranks.
//
// A process learns its place from its launcher's environment, without any flag:
//  - an MPI launcher (mpirun / mpiexec, srun with PMI or PMIx): Open MPI's OMPI_COMM_WORLD_{RANK,SIZE},
//    PMIx's PMIX_RANK, MPICH's and Slurm PMI's PMI_{RANK,SIZE}. Rank and size then come from MPI itself.
//  - a torchrun-style environment: RANK, WORLD_SIZE, LOCAL_RANK (default RANK), LOCAL_WORLD_SIZE,
//    MASTER_ADDR, MASTER_PORT (torchrun, `ampforge launch --spawn`, or set by hand); Slurm's SLURM_PROCID,
//    SLURM_NTASKS and SLURM_LOCALID stand in for RANK, WORLD_SIZE and LOCAL_RANK when MASTER_ADDR is set
//    and RANK is not (srun without an MPI plugin). Rank 0 serves a TCP store (dist/store.h) on
//    MASTER_ADDR:MASTER_PORT for the rendezvous.
//  - neither: a single process (no communicator).
//
// Transports (never a home-made one): CUDA ranks use NCCL, whose unique id travels by MPI_Bcast under an
// MPI launcher and through the TCP store otherwise; CPU ranks use MPI, so they must be started by an MPI
// launcher (`ampforge launch` uses mpirun for them). A torchrun-style world of one CPU rank runs on MPI
// as a singleton. Why not MPI's own dynamic connection (MPI_Comm_connect/accept between processes the TCP
// store introduced): docs/ARCHITECTURE.md, "Data parallel (dist/)".
#pragma once

#include <cstdint>
#include <string>

#include "ampforge/core/device.h"
#include "ampforge/dist/communicator.h"

namespace ampforge::dist {

enum class Launcher : uint8_t { None, Mpi, Env };
const char* launcher_name(Launcher l);  // "none" | "mpi" | "env"

struct WorldInfo {
  Launcher launcher = Launcher::None;
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  std::string master_addr;  // Env only
  int master_port = 0;      // Env only
  bool distributed() const { return launcher != Launcher::None; }
};

// Reads the environment; initialises nothing (under MPI, rank and size are the launcher's variables until
// init_process_group asks MPI). Throws InvalidArgument naming the variable for malformed values
// (WORLD_SIZE "abc" or 0, RANK outside [0, WORLD_SIZE), a missing MASTER_ADDR or a bad MASTER_PORT).
WorldInfo detect_world();

struct InitOptions {
  // CPU: an MPI communicator. CUDA: NCCL on this device (callers pass cuda:<local rank>).
  Device device = kCPU;
  double timeout_s = 300;       // store connection and rendezvous
  // A collective still running after this many seconds ends the job (0: no limit): NCCL's watchdog
  // (dist/watchdog.h) aborts the communicator; an MPI Work's wait throws, and the caller ends the job.
  double collective_timeout_s = 1800;
  uint64_t compute_stream = 0;  // CUDA: cuda::compute_stream(device.index), which NCCL orders against
};

// Connects this process to the other ranks of `world` (which must be distributed()) and returns the
// communicator; every rank has arrived when it returns. Errors name the rank that did not arrive, MPI or
// NCCL being unavailable, or a CPU job started without an MPI launcher, and say what to do.
CommunicatorPtr init_process_group(const WorldInfo& world, const InitOptions& options);

// For a fatal error in a distributed run: stops every rank of an MPI job (MPI_Abort with `exit_code`), so
// that no rank waits forever in a collective for this one. Without MPI the process's exit is enough (the
// launcher stops the others, and the TCP store reports the departure). Returns only when there is nothing
// to abort.
void abort_job(int exit_code);

}  // namespace ampforge::dist
