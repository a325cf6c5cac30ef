// Cache-hit latency of the caching allocator: one allocation + one free of a block that is already in
// the cache, on the host. Peers measured in the same run: malloc/free of the same size, and the
// allocator with the pytorch preset (plain segments). Target: median <= 100 ns for ampforge.
//   alloc_bench --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
#include <cstdlib>

#include <benchmark/benchmark.h>

#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/host_provider.h"

using namespace ampforge::memory;

namespace {

void run_hit(benchmark::State& state, const PolicyConfig& config) {
  HostProvider host;
  CachingAllocator alloc(host, config);
  const size_t bytes = static_cast<size_t>(state.range(0));
  // A few live neighbours, so the free has something to coalesce against and the pools are not empty.
  void* keep[4];
  for (void*& k : keep) k = alloc.allocate_on(bytes, 0);
  alloc.free(alloc.allocate_on(bytes, 0));  // warm: the block is now cached
  for (auto _ : state) {
    void* p = alloc.allocate_on(bytes, 0);
    benchmark::DoNotOptimize(p);
    alloc.free(p);
  }
  for (void* k : keep) alloc.free(k);
  const AllocatorStats s = alloc.stats();
  state.counters["hit_rate"] = static_cast<double>(s.cache_hits) / static_cast<double>(s.num_allocs);
}

void BM_ampforge_hit(benchmark::State& state) { run_hit(state, PolicyConfig::ampforge()); }
void BM_pytorch_preset_hit(benchmark::State& state) { run_hit(state, PolicyConfig::pytorch()); }

void BM_malloc_free(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(bytes);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}

}  // namespace

BENCHMARK(BM_ampforge_hit)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_pytorch_preset_hit)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_malloc_free)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK_MAIN();
