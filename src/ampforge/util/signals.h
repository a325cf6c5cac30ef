// Asynchronous signals (SIGINT, SIGTERM, ...) handled on a thread of their own instead of in a handler.
//
// Why: a handler runs on whichever thread the kernel picks, and the kernel writes the signal frame (about 3 KiB with
// the AVX-512 state) just below that thread's stack pointer. oneDNN's JIT GEMM kernels (the F32 products and the
// GEMM-based convolutions of Debian's libdnnl 2.6, and of every release up to 3.11) point the stack pointer at a
// heap workspace while they run, so a signal caught there writes its frame into the heap: oneDNN issue #4845, fixed
// upstream by pull request #4855 (2026). In ampforge this was Ctrl-C during `ampforge train`: about one run in 30
// under load aborted with "corrupted size vs. prev_size" or "malloc(): unaligned tcache chunk detected", and a
// process receiving a signal every 200 us died within about a second (util/signals_test.cpp does that). With the signal blocked in every thread that runs kernels and taken
// by sigwait() on a watcher thread, no frame is ever written on a compute thread's stack, and the callback may do
// what a handler may not (print, lock, allocate).
#pragma once

#include <spawn.h>

#include <csignal>
#include <functional>

namespace ampforge {

// Every signal but the synchronous ones (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS), which report a
// fault of the thread that raised them and must stay deliverable to it.
sigset_t asynchronous_signals();

// Blocks `signals` in the calling thread while alive, then restores the thread's previous mask. Threads started
// meanwhile inherit the blocked mask: the way to start threads that never run a handler for them.
class ScopedSignalBlock {
 public:
  explicit ScopedSignalBlock(const sigset_t& signals);
  ~ScopedSignalBlock();
  ScopedSignalBlock(const ScopedSignalBlock&) = delete;
  ScopedSignalBlock& operator=(const ScopedSignalBlock&) = delete;

 private:
  sigset_t old_;
};

// Calls `on_signal(count)` on a watcher thread each time `signo` arrives (count = 1, 2, ... over the process's
// life). From this call on, `signo` is blocked in the calling thread and so in every thread it starts later (masks
// are inherited), and in the pool's workers that exist now (util/thread_pool.h). Threads other libraries started
// before this call may still accept it: a tiny handler there forwards it to the watcher. Call from the main thread
// before training starts threads. Calling again for the same signal replaces the callback; callbacks run one at a
// time (under one lock: a callback must not call watch_signal). Not for synchronous signals (SIGSEGV, SIGFPE,
// SIGBUS, SIGILL, SIGTRAP, SIGABRT, SIGSYS): throws InvalidArgument for those and for numbers that are not signals.
void watch_signal(int signo, std::function<void(int count)> on_signal);

// True once watch_signal(signo, ...) has been called in this process.
bool watching_signal(int signo);

// The signal's default action, now: restores SIG_DFL, unblocks it on the calling thread and raises it there (for a
// callback's "a second Ctrl-C stops at once"; the process then ends as if never caught, e.g. exit status 130 in a
// shell for SIGINT). Falls back to _exit(128 + signo) for a signal whose default action is not to terminate.
[[noreturn]] void die_by_signal(int signo);

// Sets `attr` (initialised by the caller) for a program this process starts: a process group of its own (stopping
// the group stops what the program starts too), nothing blocked, and SIGINT, SIGTERM and SIGPIPE at their default
// actions. Masks and ignored dispositions survive exec: what watch_signal blocked here, or a caller ignored, must not
// make the child deaf to Ctrl-C.
void set_child_spawn_attributes(posix_spawnattr_t& attr);

}  // namespace ampforge
