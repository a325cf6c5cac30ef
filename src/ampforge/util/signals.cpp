#include "ampforge/util/signals.h"

#include <pthread.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <mutex>
#include <thread>

#include "ampforge/util/error.h"
#include "ampforge/util/thread_pool.h"

namespace ampforge {
namespace {

constexpr int kSynchronous[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};

bool synchronous(int signo) {
  for (int s : kSynchronous)
    if (s == signo) return true;
  return false;
}

struct Watch {
  std::function<void(int)> on_signal;
  int count = 0;
};

constexpr int kSignals = 65;  // Linux: 1..64
std::mutex g_mutex;           // the callbacks and counts; held while a callback runs (one at a time)
std::array<Watch, kSignals> g_watch;
std::array<pthread_t, kSignals> g_watcher{};
std::array<std::atomic<bool>, kSignals> g_started{};  // g_watcher[s] is valid (release / acquire)

// On a thread that accepts the signal (started by a library before watch_signal): pass it to the watcher, which
// blocks it and so takes it in sigwait. pthread_kill is async-signal-safe.
void forward(int signo) {
  if (signo > 0 && signo < kSignals && g_started[signo].load(std::memory_order_acquire))
    pthread_kill(g_watcher[signo], signo);
}

void watcher_loop(int signo) {
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signo);
  for (;;) {
    int got = 0;
    if (sigwait(&one, &got) != 0 || got != signo) continue;
    std::lock_guard<std::mutex> lk(g_mutex);
    Watch& w = g_watch[signo];
    ++w.count;
    if (w.on_signal) w.on_signal(w.count);
  }
}

}  // namespace

sigset_t asynchronous_signals() {
  sigset_t set;
  sigfillset(&set);
  for (int s : kSynchronous) sigdelset(&set, s);
  return set;
}

ScopedSignalBlock::ScopedSignalBlock(const sigset_t& signals) { pthread_sigmask(SIG_BLOCK, &signals, &old_); }
ScopedSignalBlock::~ScopedSignalBlock() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

void watch_signal(int signo, std::function<void(int count)> on_signal) {
  AF_CHECK(signo > 0 && signo < kSignals && signo != SIGKILL && signo != SIGSTOP && !synchronous(signo),
           "watch_signal: {} is not an asynchronous signal a process can catch", signo);
  std::lock_guard<std::mutex> lk(g_mutex);
  g_watch[signo].on_signal = std::move(on_signal);
  if (g_started[signo].load(std::memory_order_acquire)) return;
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signo);
  pthread_sigmask(SIG_BLOCK, &one, nullptr);
  block_signals_in_workers(one);
  // The watcher blocks every signal (it inherits this mask): only sigwait takes its own, and no other lands there.
  std::thread watcher;
  {
    sigset_t all;
    sigfillset(&all);
    const ScopedSignalBlock block(all);
    watcher = std::thread(watcher_loop, signo);
  }
  g_watcher[signo] = watcher.native_handle();
  watcher.detach();  // lives as long as the process; exit ends it
  g_started[signo].store(true, std::memory_order_release);
  struct sigaction sa{};
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(signo, &sa, nullptr);
}

bool watching_signal(int signo) {
  return signo > 0 && signo < kSignals && g_started[signo].load(std::memory_order_acquire);
}

void die_by_signal(int signo) {
  std::signal(signo, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signo);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  std::raise(signo);
  _exit(128 + signo);
}

void set_child_spawn_attributes(posix_spawnattr_t& attr) {
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

}  // namespace ampforge
