// The stop signals (stop.h).
#include "ampforge/train/stop.h"

#include <csignal>
#include <cstdio>
#include <mutex>
#include <utility>

#include "ampforge/dist/environment.h"
#include "ampforge/util/error.h"
#include "ampforge/util/signals.h"

namespace ampforge::train {

std::atomic<bool>& stop_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

namespace {
// The stop signals' state (install_stop_signals). A checkpoint being written holds off "stop at once": a second
// Ctrl-C or SIGTERM during a save takes effect when the file is complete.
std::mutex g_stop_mutex;
int g_stop_signal = 0;                // the first stop signal, 0 before one
int g_saves = 0;                      // checkpoints being written
int g_die_after_save = 0;             // a signal whose default action waits for the save to end
std::atomic<bool> g_training{false};  // a fit() is between its first and last step: what a stop message says

void die_unless_saving(int sig) {
  {
    std::lock_guard<std::mutex> lk(g_stop_mutex);
    if (g_saves > 0) {
      g_die_after_save = sig;
      return;
    }
  }
  die_by_signal(sig);
}

// Without install_stop_signals (a library caller), SIGTERM keeps its default action; a save defers it by a
// handler of its own: a launcher stopping a job (mpirun, `ampforge launch`, Slurm) sends SIGTERM before SIGKILL,
// and the file must be complete when the process dies.
std::atomic<bool> g_sigterm_pending{false};
void defer_sigterm(int) { g_sigterm_pending.store(true); }

}  // namespace

TrainingScope::TrainingScope() { g_training.store(true); }
TrainingScope::~TrainingScope() { g_training.store(false); }

CheckpointWriteScope::CheckpointWriteScope() {
  {
    std::lock_guard<std::mutex> lk(g_stop_mutex);
    ++g_saves;
  }
  if (!watching_signal(SIGTERM)) {
    struct sigaction sa {};
    sa.sa_handler = defer_sigterm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_);
    deferring_ = true;
  }
}

CheckpointWriteScope::~CheckpointWriteScope() {
  if (deferring_) {
    sigaction(SIGTERM, &old_, nullptr);
    if (g_sigterm_pending.exchange(false)) std::raise(SIGTERM);
  }
  int die = 0;
  {
    std::lock_guard<std::mutex> lk(g_stop_mutex);
    if (--g_saves == 0) die = std::exchange(g_die_after_save, 0);
  }
  if (die != 0) die_by_signal(die);
}

int stop_signal() {
  std::lock_guard<std::mutex> lk(g_stop_mutex);
  return g_stop_signal;
}

void install_stop_signals() {
  // On watcher threads, not in handlers: a handler on a thread inside oneDNN's JIT GEMM corrupts the heap
  // (util/signals.h). Launchers pass signals to every rank: one of them says so.
  bool say = true;
  try {
    say = dist::detect_world().rank == 0;
  } catch (const Error&) {  // a malformed environment: train() reports it
  }
  // Before the first step (a corpus being tokenised, data being prepared) the run ends without training.
  auto request = [say](int sig, const char* what, const char* again) {
    {
      std::lock_guard<std::mutex> lk(g_stop_mutex);
      if (g_stop_signal == 0) g_stop_signal = sig;
    }
    if (say)
      std::fprintf(stderr, "\n%s: %s%s\n", what,
                   g_training.load() ? "stopping after this step" : "stopping before training starts", again);
    stop_requested().store(true);  // after the message: who sees the flag sees the message written
  };
  watch_signal(SIGINT, [request](int count) {
    if (count > 1) return die_unless_saving(SIGINT);  // a second Ctrl-C stops at once
    request(SIGINT, "interrupted", " (Ctrl-C again to stop at once)");
  });
  watch_signal(SIGTERM, [request](int count) {
    if (count > 1) return die_unless_saving(SIGTERM);
    request(SIGTERM, "SIGTERM", " (SIGTERM again to stop at once)");
  });
  watch_signal(SIGUSR1, [request](int count) {
    if (count == 1) request(SIGUSR1, "SIGUSR1", "");
    stop_requested().store(true);
  });
}

}  // namespace ampforge::train
