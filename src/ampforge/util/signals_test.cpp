// watch_signal's contract (util/signals.h): the callback runs on a watcher thread with the count, the signal is
// blocked in the caller, in threads it starts later and in the pool's workers that already exist, a thread that
// still accepts it passes it on, and die_by_signal ends the process as the signal's default action would.
// Each test watches its own signal; ctest runs every test in a process of its own. The regression test for the
// reason all this exists (signals during oneDNN's JIT GEMM) is backends/cpu/matmul_onednn_test.cpp.
#include "ampforge/util/signals.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>
#include <vector>

#include "ampforge/util/error.h"
#include "ampforge/util/thread_pool.h"

namespace ampforge {
namespace {

bool blocked_here(int signo) {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, signo) == 1;
}

// Waits up to 10 s for pred().
template <class Pred>
bool eventually(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(WatchSignal, RefusesSignalsItCannotTake) {
  for (int bad : {0, -1, 65, SIGKILL, SIGSTOP, SIGSEGV, SIGFPE, SIGBUS, SIGILL, SIGABRT}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(watch_signal(bad, [](int) {}), Error);
  }
}

TEST(WatchSignal, CallbackRunsOnTheWatcherThreadWithTheCount) {
  std::mutex m;
  std::vector<int> counts;
  std::vector<std::thread::id> threads;
  watch_signal(SIGUSR1, [&](int count) {
    std::lock_guard<std::mutex> lk(m);
    counts.push_back(count);
    threads.push_back(std::this_thread::get_id());
  });
  for (size_t i = 1; i <= 3; ++i) {
    ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
    // Standard signals do not queue: wait for each before sending the next.
    ASSERT_TRUE(eventually([&] {
      std::lock_guard<std::mutex> lk(m);
      return counts.size() == i;
    }));
  }
  EXPECT_EQ(counts, (std::vector<int>{1, 2, 3}));
  for (const std::thread::id& id : threads) EXPECT_NE(id, std::this_thread::get_id());
  // A second call replaces the callback; the count goes on.
  std::atomic<int> replaced{0};
  watch_signal(SIGUSR1, [&](int count) { replaced.store(count); });
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  ASSERT_TRUE(eventually([&] { return replaced.load() == 4; }));
  std::lock_guard<std::mutex> lk(m);
  EXPECT_EQ(counts.size(), 3u);
}

TEST(WatchSignal, BlocksTheSignalInTheCallerItsNewThreadsAndThePoolsWorkers) {
  const int saved = get_num_threads();
  set_num_threads(4);
  parallel_for(4, 1, [](int64_t, int64_t) {});  // the pool's workers exist before the watch
  set_num_threads(2);                           // and a smaller pool keeps them (libgomp does)
  ASSERT_FALSE(blocked_here(SIGUSR2));
  watch_signal(SIGUSR2, [](int) {});
  set_num_threads(4);
  EXPECT_TRUE(blocked_here(SIGUSR2));
  bool in_new_thread = false;
  std::thread([&] { in_new_thread = blocked_here(SIGUSR2); }).join();
  EXPECT_TRUE(in_new_thread);
  std::mutex m;
  std::vector<bool> in_parts;
  parallel_for(4, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // every worker gets a part
    std::lock_guard<std::mutex> lk(m);
    in_parts.push_back(blocked_here(SIGUSR2));
  });
  EXPECT_EQ(in_parts, std::vector<bool>(4, true));
  set_num_threads(saved);
}

TEST(WatchSignal, AThreadStartedBeforeTheWatchPassesTheSignalOn) {
  std::mutex m;
  std::condition_variable cv;
  bool quit = false;
  std::thread earlier([&] {
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return quit; });
  });
  std::atomic<int> seen{0};
  watch_signal(SIGALRM, [&](int count) { seen.store(count); });
  ASSERT_EQ(pthread_kill(earlier.native_handle(), SIGALRM), 0);  // that thread still accepts it
  EXPECT_TRUE(eventually([&] { return seen.load() == 1; }));
  {
    std::lock_guard<std::mutex> lk(m);
    quit = true;
  }
  cv.notify_all();
  earlier.join();
}

TEST(WatchSignalDeathTest, DieBySignalEndsTheProcessAsTheDefaultActionWould) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        watch_signal(SIGUSR1, [](int) {});
        die_by_signal(SIGUSR1);
      },
      testing::KilledBySignal(SIGUSR1), "");
  // SIGCHLD's default action is to ignore it: the process exits with 128 + the number instead.
  EXPECT_EXIT(die_by_signal(SIGCHLD), testing::ExitedWithCode(128 + SIGCHLD), "");
}

// Every test binary links tests/crash_report.cpp: a crash prints the faulting thread's stack, then the process
// still dies by the signal (ctest and CI see the same SegFault, with the stack in the test's output).
TEST(CrashReportDeathTest, ACrashPrintsTheStackAndEndsByTheSignal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::raise(SIGSEGV), testing::KilledBySignal(SIGSEGV), "crash: stack of the faulting thread");
  EXPECT_EXIT(std::raise(SIGFPE), testing::KilledBySignal(SIGFPE), "crash: stack");
}

}  // namespace
}  // namespace ampforge
