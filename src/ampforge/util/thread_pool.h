// A fixed-size thread pool for the CPU kernels, with one primitive: parallel_for.
//
// Contract: parallel_for(n, grain, fn) calls fn(begin, end) on disjoint ranges covering [0, n).
// Partitioning is static and depends only on (n, grain, thread count), so a kernel whose ranges
// do not interact gives bit-identical results run after run. Kernels that must be identical for
// every thread count (RNG, reductions) partition by fixed-size chunks instead (see docs/ARCHITECTURE.md).
// Nested calls from inside a worker run serially on that worker (no oversubscription, no deadlock).
// Exceptions thrown by fn are rethrown on the calling thread (the first one wins).
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>

namespace ampforge {

// Number of threads kernels use (default: hardware concurrency, or AMPFORGE_NUM_THREADS).
int get_num_threads();
// Changes the pool size (also sets the BLAS thread count to 1: ampforge partitions GEMMs itself).
void set_num_threads(int n);

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// True when the caller is a pool worker (or inside a parallel region).
bool in_parallel_region();

// Blocks `signals` in every worker thread that exists now (on the OpenMP team: one region in which each member
// calls pthread_sigmask), for util/signals.h: no thread that runs kernels may run a signal handler. Workers started
// later inherit the mask of the thread that starts them. Our own workers (builds without the OpenMP pool) block
// every asynchronous signal from the start, so there it has nothing to do. Call it outside parallel regions.
void block_signals_in_workers(const sigset_t& signals);

// While one is alive (on any thread), idle pool workers sleep at once instead of spinning for the next
// parallel_for first. For code that runs on threads of its own (oneDNN's OpenMP team): a worker spinning
// in its ~1 ms window would share a core with those threads and slow them down as a third thread on two
// cores would. Scopes nest and may overlap across threads. The price: the first parallel_for after the
// scope wakes its workers through the condition variable (tens of microseconds). Where parallel_for runs on
// the OpenMP team itself (builds with oneDNN on GCC: util/thread_pool.cpp), there are no other workers and a
// scope does nothing.
class PoolIdleScope {
 public:
  PoolIdleScope();
  ~PoolIdleScope();
  PoolIdleScope(const PoolIdleScope&) = delete;
  PoolIdleScope& operator=(const PoolIdleScope&) = delete;
};

}  // namespace ampforge
