// parallel_for's contract (util/thread_pool.h), for whichever form this build has (our workers, or the
// OpenMP team of a build with oneDNN on GCC): every index exactly once, static parts, nested calls serial,
// exceptions reach the caller, callers on several threads at once.
#include "ampforge/util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace ampforge {
namespace {

struct ThreadCount {
  int saved = get_num_threads();
  ~ThreadCount() { set_num_threads(saved); }
};

TEST(ParallelFor, CoversEveryIndexOnceInStaticParts) {
  ThreadCount guard;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}})
      for (int64_t grain : {int64_t{1}, int64_t{64}, int64_t{1} << 20}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex m;
        std::set<std::pair<int64_t, int64_t>> ranges;
        parallel_for(n, grain, [&](int64_t b, int64_t e) {
          EXPECT_TRUE(in_parallel_region());
          {
            std::lock_guard<std::mutex> lk(m);
            ranges.emplace(b, e);
          }
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i;
        // The parts are n * p / parts for parts = min(threads, ceil(n / grain)): who runs them does not matter.
        const int64_t parts = std::min<int64_t>(threads, (n + grain - 1) / grain);
        std::set<std::pair<int64_t, int64_t>> expected;
        for (int64_t p = 0; p < parts; ++p) expected.emplace(n * p / parts, n * (p + 1) / parts);
        EXPECT_EQ(ranges, expected) << "threads " << threads << " n " << n << " grain " << grain;
      }
  }
  EXPECT_FALSE(in_parallel_region());
}

TEST(ParallelFor, NestedCallsRunSeriallyOnTheirPart) {
  ThreadCount guard;
  set_num_threads(2);
  std::atomic<int64_t> sum{0}, nested_calls{0};
  parallel_for(2, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(100, 1, [&](int64_t b2, int64_t e2) {
        nested_calls.fetch_add(1);
        EXPECT_EQ(b2, 0);
        EXPECT_EQ(e2, 100);
        for (int64_t j = b2; j < e2; ++j) sum.fetch_add(j);
      });
  });
  EXPECT_EQ(nested_calls.load(), 2);
  EXPECT_EQ(sum.load(), 2 * 4950);
}

TEST(ParallelFor, AnExceptionReachesTheCallerAndThePoolStaysUsable) {
  ThreadCount guard;
  set_num_threads(2);
  EXPECT_THROW(parallel_for(1000, 1,
                            [](int64_t b, int64_t) {
                              if (b > 0) throw std::runtime_error("part failed");
                            }),
               std::runtime_error);
  EXPECT_FALSE(in_parallel_region());
  std::atomic<int64_t> count{0};
  parallel_for(1000, 1, [&](int64_t b, int64_t e) { count.fetch_add(e - b); });
  EXPECT_EQ(count.load(), 1000);
}

TEST(ParallelFor, CallersOnSeveralThreadsAtOnce) {
  ThreadCount guard;
  set_num_threads(2);
  std::vector<int64_t> totals(4, 0);
  std::vector<std::thread> callers;
  for (size_t t = 0; t < totals.size(); ++t)
    callers.emplace_back([&, t] {
      for (int rep = 0; rep < 200; ++rep) {
        std::atomic<int64_t> s{0};
        parallel_for(5000, 16, [&](int64_t b, int64_t e) {
          int64_t local = 0;
          for (int64_t i = b; i < e; ++i) local += i;
          s.fetch_add(local);
        });
        totals[t] += s.load();
      }
    });
  for (auto& c : callers) c.join();
  for (int64_t v : totals) EXPECT_EQ(v, 200 * (int64_t{4999} * 5000 / 2));
}

}  // namespace
}  // namespace ampforge
