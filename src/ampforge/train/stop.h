// Stopping a training run cleanly: the process-wide stop request that the Trainer polls between steps, the stop
// signals that set it (Ctrl-C, SIGTERM from docker/Kubernetes/systemd/Slurm, SIGUSR1 from launchers), and the
// scopes the Trainer marks so that a signal never leaves half a checkpoint behind. `ampforge train` installs the
// signals; a library caller may, or may set stop_requested() itself (the Python package does on KeyboardInterrupt).
#pragma once

#include <atomic>
#include <csignal>

namespace ampforge::train {

// Process-wide stop request (a stop signal sets it; the trainer finishes the current step, writes the checkpoint
// and returns with TrainResult::interrupted; set before fit() starts, fit() runs no step). Nothing clears it: a
// program that trains again after a stop clears it itself.
std::atomic<bool>& stop_requested();
// Takes the stop signals on watcher threads from now on (util/signals.h: blocked in this thread and the threads it
// starts): SIGINT (Ctrl-C), SIGTERM and SIGUSR1 set stop_requested() and say so on stderr (rank 0 of a data-parallel
// job). A second SIGINT or SIGTERM kills the process as the signal does by default, once a checkpoint being written
// is complete. SIGTERM is what docker, Kubernetes, systemd and Slurm send before SIGKILL; SIGUSR1 is for launchers:
// mpirun forwards it to every rank (it aborts the job on SIGINT), `ampforge launch` sends it on the first Ctrl-C,
// Slurm sends it with `scancel --signal=USR1` or `sbatch --signal=USR1@SECONDS`. Call before training starts its
// threads. Without it, a checkpoint being written still defers SIGTERM until the file is complete.
void install_stop_signals();
// The first stop signal taken (SIGINT, SIGTERM or SIGUSR1), 0 before one: `ampforge train` exits 128 + it.
int stop_signal();

// Marks fit()'s steps: a stop signal's message says "stopping after this step" inside, "stopping before training
// starts" outside.
class TrainingScope {
 public:
  TrainingScope();
  ~TrainingScope();
  TrainingScope(const TrainingScope&) = delete;
  TrainingScope& operator=(const TrainingScope&) = delete;
};

// Held while a checkpoint file is written: a second Ctrl-C or SIGTERM ("stop at once") waits for the file to be
// complete. Without install_stop_signals (a library caller), SIGTERM keeps its default action outside the scope and
// is deferred inside it: a launcher stopping a job (mpirun, `ampforge launch`, Slurm) sends SIGTERM before SIGKILL.
class CheckpointWriteScope {
 public:
  CheckpointWriteScope();
  ~CheckpointWriteScope();
  CheckpointWriteScope(const CheckpointWriteScope&) = delete;
  CheckpointWriteScope& operator=(const CheckpointWriteScope&) = delete;

 private:
  bool deferring_ = false;
  struct sigaction old_{};
};

}  // namespace ampforge::train
