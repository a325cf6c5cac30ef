// The CUDA providers on a real GPU (driver loaded with dlopen). Every test skips without a driver or GPU.
#include "ampforge/memory/cuda_provider.h"

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "ampforge/memory/caching_allocator.h"
#include "ampforge/util/error.h"

namespace ampforge::memory {
namespace {

#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    const CudaDriverStatus st = cuda_driver_status();                                        \
    if (!st.available) GTEST_SKIP() << "no usable CUDA driver/GPU: " << st.reason;           \
  } while (0)

// Writes a distinct pattern into each block through the device and reads it back.
void check_round_trip(const std::vector<std::pair<void*, size_t>>& blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::vector<unsigned char> v(blocks[i].second, static_cast<unsigned char>(17 + i));
    cuda_copy_to_device(blocks[i].first, v.data(), v.size());
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::vector<unsigned char> v(blocks[i].second, 0);
    cuda_copy_to_host(v.data(), blocks[i].first, v.size());
    for (size_t k = 0; k < v.size(); k += 4093) ASSERT_EQ(v[k], static_cast<unsigned char>(17 + i)) << i;
  }
}

TEST(CudaProvider, CachingAllocatorOverCudaMalloc) {
  SKIP_WITHOUT_GPU();
  CudaProvider dev(0);
  EXPECT_GT(dev.capacity(), 0u);
  CachingAllocator a(dev, PolicyConfig::ampforge());
  EXPECT_FALSE(a.uses_expandable_segments()) << "cudaMalloc has no virtual memory: plain segments";
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t n : {size_t{1000}, size_t{3} << 20, size_t{40} << 20}) blocks.push_back({a.allocate_on(n, 0), n});
  check_round_trip(blocks);
  for (auto& b : blocks) a.free(b.first);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 0);
}

TEST(CudaProvider, VirtualMemoryExpandableSegments) {
  SKIP_WITHOUT_GPU();
  CudaVmmProvider dev(0);
  const size_t g = dev.granularity();
  ASSERT_GT(g, 0u);
  CudaStreamEvents events(0);
  PolicyConfig c = PolicyConfig::ampforge();
  c.virtual_range = size_t{8} << 30;
  CachingAllocator a(dev, c, &events);
  ASSERT_TRUE(a.uses_expandable_segments());
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t n : {size_t{5} * g, size_t{1000}, size_t{7} * g + 512}) blocks.push_back({a.allocate_on(n, 0), n});
  check_round_trip(blocks);
  // Free the first and allocate something larger: the freed granules move to the new block.
  const int64_t reserved = a.stats().reserved.current;
  a.free(blocks[0].first);
  void* big = a.allocate_on(6 * g, 0);
  EXPECT_EQ(a.stats().reserved.current, reserved + static_cast<int64_t>(g)) << "5 granules reused, 1 new";
  blocks[0] = {big, 6 * g};
  check_round_trip(blocks);
  // Cross-stream rule with real events.
  const StreamId s = cuda_stream_create(0);
  void* p = a.allocate_on(g, 0);
  a.record_stream(p, s);
  a.free(p);
  void* q = a.allocate_on(g, 0);
  (void)q;
  a.free(q);
  cuda_stream_destroy(s);
  for (auto& b : blocks) a.free(b.first);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 0);
}

TEST(CudaProvider, BudgetLikeOutOfMemoryOnTheDevice) {
  SKIP_WITHOUT_GPU();
  CudaVmmProvider dev(0);
  CachingAllocator a(dev, PolicyConfig::ampforge());
  // More than the device has: an OutOfMemory report, and the allocator keeps working.
  EXPECT_THROW(a.allocate_on(dev.capacity() + (size_t{1} << 30), 0), Error);
  void* p = a.allocate_on(size_t{1} << 20, 0);
  EXPECT_NE(p, nullptr);
  a.free(p);
}

}  // namespace
}  // namespace ampforge::memory

namespace ampforge::memory {
namespace {

// Moving a granule between streams makes the allocator wait for the old stream (cuStreamSynchronize): the
// wait is counted in the process's host waits (cuda::host_sync_count() reads the same counter) and in the
// allocator's stats.
TEST(CudaProvider, AllocatorWaitsAreHostWaits) {
  SKIP_WITHOUT_GPU();
  CudaVmmProvider dev(0);
  CudaStreamEvents events(0);
  PolicyConfig c = PolicyConfig::ampforge();
  c.virtual_range = size_t{8} << 30;
  CachingAllocator a(dev, c, &events);
  const StreamId s1 = cuda_stream_create(0), s2 = cuda_stream_create(0);
  void* p = a.allocate_on(4 * dev.granularity(), s1);
  a.free(p);
  const uint64_t waits = host_wait_count();
  void* q = a.allocate_on(4 * dev.granularity(), s2);  // p's granules move to s2's range
  EXPECT_EQ(a.stats().host_waits, 1);
  EXPECT_EQ(host_wait_count(), waits + 1);
  std::vector<std::pair<void*, size_t>> blocks{{q, 4 * dev.granularity()}};
  check_round_trip(blocks);
  a.free(q);
  a.empty_cache();
  cuda_stream_destroy(s1);
  cuda_stream_destroy(s2);
}

}  // namespace
}  // namespace ampforge::memory

namespace ampforge::memory {
namespace {

// The cross-stream rule with real events on the default configuration (cudaMalloc segments, CUDA events): a
// block that another stream used is not handed out again while that stream's work queued before the free is
// still running. The other stream is held busy by a host function that waits for the test (cuLaunchHostFunc),
// so "still running" does not depend on a kernel's duration.
TEST(CudaProvider, ABlockUsedOnAnotherStreamWaitsForItsEvent) {
  SKIP_WITHOUT_GPU();
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr);
  using HostFn = void (*)(void*);
  auto launch_host_func = reinterpret_cast<int (*)(void*, HostFn, void*)>(dlsym(h, "cuLaunchHostFunc"));
  auto stream_sync = reinterpret_cast<int (*)(void*)>(dlsym(h, "cuStreamSynchronize"));
  ASSERT_TRUE(launch_host_func && stream_sync);
  CudaProvider dev(0);
  CudaStreamEvents events(0);
  CachingAllocator a(dev, PolicyConfig::ampforge(), &events);
  const StreamId s = cuda_stream_create(0);  // also leaves the device's primary context current here
  struct Gate {
    std::atomic<bool> open{false};
  } gate;
  // Waits (at most 20 s, so that a failing test cannot hang the stream forever) until the gate opens.
  const HostFn wait_for_gate = [](void* g) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!static_cast<Gate*>(g)->open.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  ASSERT_EQ(launch_host_func(reinterpret_cast<void*>(s), wait_for_gate, &gate), 0);
  struct Release {  // opens the gate and drains the stream however the test ends
    Gate& g;
    int (*sync)(void*);
    StreamId s;
    ~Release() {
      g.open.store(true);
      sync(reinterpret_cast<void*>(s));
      cuda_stream_destroy(s);
    }
  } release{gate, stream_sync, s};

  void* p = a.allocate_on(64 << 10, 0);
  a.record_stream(p, s);
  a.free(p);  // s is blocked behind the gate: p's event on s cannot have completed
  AllocatorStats st = a.stats();
  EXPECT_GT(st.active.current, st.allocated.current) << "p counts as active while it waits for s";
  void* q = a.allocate_on(64 << 10, 0);
  EXPECT_NE(q, p) << "p was handed out again while stream s may still use it";
  gate.open.store(true);
  ASSERT_EQ(stream_sync(reinterpret_cast<void*>(s)), 0);
  a.free(q);
  void* r = a.allocate_on(64 << 10, 0);  // this call sees p's event complete and gives p back to the pool
  st = a.stats();
  EXPECT_EQ(st.active.current, st.allocated.current) << "p's wait ended with s's work";
  a.free(r);
}

}  // namespace
}  // namespace ampforge::memory
