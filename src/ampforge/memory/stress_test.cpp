// Thread safety: 8 threads allocate and free at random through one allocator over real host memory,
// writing a pattern into every block and checking it before the free (overlapping blocks would clobber
// each other's patterns). Run under ThreadSanitizer (-DAMPFORGE_TSAN=ON) and ASan/LSan (-DAMPFORGE_SANITIZE=ON).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "ampforge/memory/budgeted_provider.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/host_provider.h"

namespace ampforge::memory {
namespace {

void stress(const PolicyConfig& config) {
  HostProvider host;
  BudgetedProvider card(host, size_t{2} << 30);
  PolicyConfig c = config;
  c.virtual_range = size_t{1} << 30;
  CachingAllocator a(card, c);
  constexpr int kThreads = 8, kOps = 3000;
  std::atomic<int> bad{0};
  std::atomic<bool> stop{false};
  std::thread observer([&] {  // stats, snapshots and steps while the others work
    while (!stop.load()) {
      const AllocatorStats s = a.stats();
      if (s.allocated.current < 0 || s.reserved.current < s.allocated.current) ++bad;
      a.step();
      (void)a.snapshot();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint64_t rng = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(t + 1);
      auto next = [&] { return (rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 20; };
      struct Live {
        unsigned char* p;
        size_t n;
        unsigned char tag;
      };
      std::vector<Live> live;
      for (int i = 0; i < kOps; ++i) {
        if (live.size() < 4 || (next() % 2 == 0 && live.size() < 64)) {
          const size_t n = (size_t{1} << (next() % 22)) + next() % 4096;  // 1 B .. ~4 MiB
          auto* p = static_cast<unsigned char*>(a.allocate_on(n, static_cast<StreamId>(t % 2)));
          const auto tag = static_cast<unsigned char>(next());
          std::memset(p, tag, n);
          live.push_back({p, n, tag});
        } else {
          const size_t k = next() % live.size();
          const Live l = live[k];
          if (l.p[0] != l.tag || l.p[l.n / 2] != l.tag || l.p[l.n - 1] != l.tag) ++bad;
          a.free(l.p);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (const Live& l : live) a.free(l.p);
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  observer.join();
  EXPECT_EQ(bad.load(), 0);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated.current, 0);
  EXPECT_EQ(s.num_allocs, s.num_frees);
  EXPECT_EQ(s.reserved.current, static_cast<int64_t>(card.used()));
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 0);
}

TEST(AllocatorStress, EightThreadsAmpforgePolicy) { stress(PolicyConfig::ampforge()); }
TEST(AllocatorStress, EightThreadsPytorchPolicy) { stress(PolicyConfig::pytorch()); }

}  // namespace
}  // namespace ampforge::memory
