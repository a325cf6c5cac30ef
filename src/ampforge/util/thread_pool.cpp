// Thread pool behind parallel_for, in one of two forms chosen at build time:
//  - OpenMP (AMPFORGE_POOL_OPENMP: builds with oneDNN on GCC's libgomp). oneDNN runs its convolutions on an
//    OpenMP team; a second pool of our own would put four busy threads on two cores: libgomp's workers spin
//    for ~300,000 pauses (milliseconds) after each convolution, right when our workers start the batch norm
//    that follows, and ours spun likewise before theirs. One team for both removes the contest (the
//    ResNet-50 step on two threads went from ~1.55 s to ~1.43 s, as with GOMP_SPINCOUNT=1000). PyTorch runs
//    its own kernels on the same OpenMP team as oneDNN for the same reason.
//  - Our own workers otherwise: they spin briefly on a generation counter before sleeping on a condition
//    variable, since kernels are launched hundreds of times per training step and a futex wake-up costs tens
//    of microseconds, while a short spin costs nothing when the next kernel follows at once.
// Both partition a job the same way (parts of n * p / parts), so results do not depend on the form.
#include "ampforge/util/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "ampforge/util/env.h"
#include "ampforge/util/error.h"
#include "ampforge/util/signals.h"

#if defined(AMPFORGE_POOL_OPENMP)
#include <omp.h>
#endif

extern "C" void openblas_set_num_threads(int num_threads);

namespace ampforge {
namespace {

thread_local bool t_in_parallel = false;
std::atomic<int> g_idle_scopes{0};  // live PoolIdleScope objects: workers do not spin while > 0

// Runs fn(0, n) on the calling thread, marked as inside a parallel region (nested calls run serially).
void run_serial(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const bool was = t_in_parallel;
  t_in_parallel = true;
  try {
    fn(0, n);
  } catch (...) {
    t_in_parallel = was;
    throw;
  }
  t_in_parallel = was;
}

#if defined(AMPFORGE_POOL_OPENMP)

class ThreadPool {
 public:
  explicit ThreadPool(int n) : num_threads_(std::max(1, n)) {}

  int size() const { return num_threads_.load(std::memory_order_relaxed); }

  void resize(int n) {
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    num_threads_.store(std::max(1, n), std::memory_order_relaxed);
  }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    const int64_t parts = std::min<int64_t>(size(), (n + grain - 1) / grain);
    // Serial when there is one part, when nested (in our region or in oneDNN's), or when another thread holds
    // the team: two teams would oversubscribe the cores.
    std::unique_lock<std::mutex> job_lock(job_mutex_, std::defer_lock);
    if (parts <= 1 || t_in_parallel || omp_in_parallel() || !job_lock.try_lock()) return run_serial(n, fn);
    std::exception_ptr error;
    std::mutex error_mutex;
    // num_threads on every region: omp_set_num_threads is a per-thread setting, and parallel_for may be
    // called from any thread. A team smaller than asked (OMP_THREAD_LIMIT) runs the parts in turn.
#pragma omp parallel num_threads(static_cast<int>(parts))
    {
      const bool was = t_in_parallel;
      t_in_parallel = true;
      const int64_t team = omp_get_num_threads();
      for (int64_t p = omp_get_thread_num(); p < parts; p += team) {
        try {
          fn(n * p / parts, n * (p + 1) / parts);
        } catch (...) {
          std::lock_guard<std::mutex> lk(error_mutex);
          if (!error) error = std::current_exception();
        }
      }
      t_in_parallel = was;
    }
    if (error) std::rethrow_exception(error);
  }

  // One region of the pool's size: libgomp keeps its threads from region to region and hands a team the first of
  // them, and a team smaller than the threads it has ends the surplus ones, so after this region every worker
  // there is blocks the signals, and workers started later inherit the mask of this (blocked) thread.
  void block_signals(const sigset_t& signals) {
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    const int team = std::max(size(), omp_get_max_threads());
#pragma omp parallel num_threads(team)
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  }

 private:
  std::atomic<int> num_threads_;
  std::mutex job_mutex_;  // one job at a time
};

#else

class ThreadPool {
 public:
  explicit ThreadPool(int n) { start(n); }
  ~ThreadPool() { stop(); }

  int size() const { return num_threads_; }

  void resize(int n) {
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    stop();
    start(n);
  }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    int64_t parts = std::min<int64_t>(num_threads_, (n + grain - 1) / grain);
    // Serial when there is one part, when nested, or when another thread holds the pool.
    std::unique_lock<std::mutex> job_lock(job_mutex_, std::defer_lock);
    if (parts <= 1 || t_in_parallel || !job_lock.try_lock()) return run_serial(n, fn);
    fn_.store(&fn, std::memory_order_relaxed);
    n_.store(n, std::memory_order_relaxed);
    error_ = nullptr;
    remaining_.store(parts, std::memory_order_relaxed);
    // One word holds (job sequence, part count, next part): a worker claims a part with a CAS on it,
    // so a worker still finishing the previous job can never claim a part of this one by mistake, and
    // the release here publishes fn_ and n_ to whoever claims.
    job_seq_ = (job_seq_ + 1) & kSeqMask;
    claim_.store((job_seq_ << 40) | (static_cast<uint64_t>(parts) << 20), std::memory_order_release);
    {
      std::lock_guard<std::mutex> lk(wake_mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_cv_.notify_all();
    t_in_parallel = true;
    work();
    t_in_parallel = false;
    // Wait for the parts other threads claimed.
    int spins = 0;
    while (remaining_.load(std::memory_order_acquire) != 0) {
      if (++spins > 4000) std::this_thread::yield();
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void start(int n) {
    num_threads_ = std::max(1, n);
    quit_ = false;
    // The generation a worker starts from is read here, not in the worker: a worker that first runs
    // after a later bump (a job, or stop()) must see that bump as new, or it would sleep through it.
    const uint64_t gen = generation_.load(std::memory_order_acquire);
    // Workers start with every asynchronous signal blocked (they inherit this thread's mask): a handler that runs
    // on a thread inside a JIT kernel can corrupt memory (util/signals.h).
    const ScopedSignalBlock block(asynchronous_signals());
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, gen] { worker_loop(gen); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(wake_mutex_);
      quit_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  // Claims parts until none is left. Each part is a fixed range, so who runs it does not matter.
  void work() {
    for (;;) {
      uint64_t cur = claim_.load(std::memory_order_acquire);
      int64_t p, parts;
      do {
        parts = static_cast<int64_t>((cur >> 20) & kPartMask);
        p = static_cast<int64_t>(cur & kPartMask);
        if (p >= parts) return;
      } while (!claim_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel, std::memory_order_acquire));
      const int64_t n = n_.load(std::memory_order_relaxed);
      const int64_t begin = n * p / parts, end = n * (p + 1) / parts;
      try {
        (*fn_.load(std::memory_order_relaxed))(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lk(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  void worker_loop(uint64_t seen) {
    t_in_parallel = true;
    for (;;) {
      // Spin a little, then sleep.
      int spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen && spins < 20000 &&
             g_idle_scopes.load(std::memory_order_relaxed) == 0) {
        ++spins;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
      if (generation_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lk(wake_mutex_);
        wake_cv_.wait(lk, [&] { return quit_.load() || generation_.load(std::memory_order_acquire) != seen; });
      }
      seen = generation_.load(std::memory_order_acquire);
      if (quit_) return;
      work();
    }
  }

  int num_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex job_mutex_;  // one job at a time
  std::mutex wake_mutex_;
  std::condition_variable wake_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> quit_{false};
  std::atomic<const std::function<void(int64_t, int64_t)>*> fn_{nullptr};
  std::atomic<int64_t> n_{0};
  static constexpr uint64_t kPartMask = (1u << 20) - 1, kSeqMask = (1u << 24) - 1;
  std::atomic<uint64_t> claim_{0};  // seq:24 | parts:20 | next:20; parts == 0 when no job is open
  uint64_t job_seq_ = 0;
  std::atomic<int64_t> remaining_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

#endif  // AMPFORGE_POOL_OPENMP

int default_threads() {
  int64_t env = env_int("AMPFORGE_NUM_THREADS", 0);
  if (env > 0) return static_cast<int>(env);
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

ThreadPool& pool() {
  static ThreadPool* p = [] {
    openblas_set_num_threads(1);  // GEMMs are partitioned by ampforge across this pool
    return new ThreadPool(default_threads());
  }();
  return *p;
}

}  // namespace

int get_num_threads() { return pool().size(); }

void set_num_threads(int n) {
  AF_CHECK(n >= 1, "set_num_threads: expected a thread count >= 1, got {}", n);
  openblas_set_num_threads(1);
  if (n != pool().size()) pool().resize(n);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  pool().run(n, grain, fn);
}

bool in_parallel_region() { return t_in_parallel; }

void block_signals_in_workers([[maybe_unused]] const sigset_t& signals) {
#if defined(AMPFORGE_POOL_OPENMP)
  pool().block_signals(signals);
#endif
}

PoolIdleScope::PoolIdleScope() { g_idle_scopes.fetch_add(1, std::memory_order_relaxed); }
PoolIdleScope::~PoolIdleScope() { g_idle_scopes.fetch_sub(1, std::memory_order_relaxed); }

}  // namespace ampforge
