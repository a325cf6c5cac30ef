// `ampforge launch`: starts the N processes of a data-parallel job on this machine and stops them all when
// one fails. Two ways:
//  - mpirun (the default when it is on PATH and this build has MPI): `mpirun -n N --oversubscribe
//    --bind-to none [--allow-run-as-root] COMMAND...`. The ranks find their place through MPI; CPU ranks need
//    this (their collectives run on MPI), GPU ranks get their NCCL id by MPI_Bcast. mpirun itself stops the
//    job when a rank fails and exits with that rank's code, naming it.
//  - spawn: the processes are started directly with a torchrun-style environment (RANK, WORLD_SIZE,
//    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0 serves the TCP store). For GPU ranks on
//    machines without MPI, and for any program that reads that environment.
//    When a process exits with a non-zero code or a signal, the launcher names it, sends SIGTERM to the
//    others' process groups, SIGKILL after `grace_s`, and exits with the failed process's code (128 + the
//    signal for a signal).
// Signals: the first Ctrl-C (SIGINT) asks every process to stop after its current step (`ampforge train` then
// writes its checkpoint and exits 128 + the signal): spawned processes get SIGINT, mpirun gets SIGUSR1, which it
// forwards to the ranks (on SIGINT it would abort the job at once). Nothing is killed then. A second Ctrl-C, or SIGTERM, is
// forwarded as it is (mpirun aborts the job; a spawned `ampforge train` stops after its step on a first SIGTERM)
// and SIGKILL follows after `grace_s`. The launcher exits 128 + the signal it was sent (130 for Ctrl-C) unless a
// process failed first.
#pragma once

#include <string>
#include <vector>

namespace ampforge::dist {

enum class LaunchMode { Auto, Mpirun, Spawn };

struct LaunchOptions {
  int nproc = 1;
  LaunchMode mode = LaunchMode::Auto;
  std::string master_addr = "127.0.0.1";  // spawn: the store's address
  int master_port = 0;                    // spawn: 0 picks a free port
  double grace_s = 5;                     // SIGTERM -> SIGKILL
  bool verbose = true;                    // say what is started and what failed on stderr
  std::vector<std::string> command;       // program and arguments (program searched in PATH)
};

// The mpirun program that `Auto` would use ("" when none is on PATH or this build has no MPI).
std::string find_mpirun();
// The argument vector of the mpirun mode (for messages and tests).
std::vector<std::string> mpirun_command(const std::string& mpirun, const LaunchOptions& options);
// Runs the job; returns the exit code for the launcher (0 when every process exited with 0). Throws
// InvalidArgument for bad options (nproc < 1, no command, mpirun asked for and missing).
int launch(const LaunchOptions& options);

}  // namespace ampforge::dist
