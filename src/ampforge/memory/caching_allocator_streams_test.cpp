// The allocator's stream rules against a device simulated on the host (FakeGpu): work is queued per stream
// as address ranges that stay "in use" until the stream drains, and the fake records what a real GPU would
// punish by faulting or by silent corruption: unmapping a granule that queued work still touches, handing
// out a block that another stream still uses, querying an event that was recorded into a graph capture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/global.h"
#include "ampforge/memory/host_provider.h"
#include "ampforge/util/error.h"

namespace ampforge::memory {
namespace {

constexpr size_t KiB = 1024, MiB = size_t{1} << 20;

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

class FakeGpu final : public Provider, public StreamEvents {
 public:
  FakeGpu() : sim_(kHostGranule) {}

  // ---- Provider: address space from the simulator, mappings tracked here -----------------------------
  const char* name() const override { return "fake-gpu"; }
  Device device() const override { return kCPU; }
  size_t granularity() const override { return kHostGranule; }
  void* allocate(size_t bytes) override {
    if (used + bytes > budget) return nullptr;
    used += bytes;
    return sim_.allocate(bytes);
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    used -= bytes;
    if (busy(p, 1)) violations.push_back("segment freed while queued work uses it");
  }
  bool supports_virtual() const override { return true; }
  void* reserve(size_t bytes) override { return sim_.reserve(bytes); }
  void unreserve(void*, size_t) noexcept override {}
  std::optional<uint64_t> create_physical() override {
    ++created;
    return sim_.create_physical();
  }
  void release_physical(uint64_t) noexcept override {}
  void map(void* a, uint64_t) override { mapped.insert(addr(a)); }
  void unmap(void* a) noexcept override {
    ++unmaps;
    mapped.erase(addr(a));
    if (busy(a, kHostGranule)) violations.push_back("granule unmapped while queued work still touches it");
  }

  // ---- work ------------------------------------------------------------------------------------------
  // A kernel on `s` that reads or writes [p, p + n) until the stream's queue drains.
  void launch(StreamId s, const void* p, size_t n) { work[s].push_back({addr(p), n, ++seq}); }
  void drain(StreamId s) { work[s].clear(); }
  bool busy(const void* p, size_t n) const {
    for (const auto& [s, items] : work)
      for (const Item& w : items)
        if (w.addr < addr(p) + n && addr(p) < w.addr + w.bytes) return true;
    return false;
  }

  // ---- StreamEvents ------------------------------------------------------------------------------------
  uint64_t record(StreamId s) override {
    if (fail_records > 0 && --fail_records == 0) AF_THROW(Internal, "cuEventCreate failed: out of resources");
    Token t{s, seq, capturing.count(s) > 0};
    if (t.captured) ++records_into_capture;
    tokens.push_back(t);
    return tokens.size() - 1;
  }
  bool query(uint64_t t) override {
    // What the driver answers for an event recorded into a capture says nothing about eager work.
    if (tokens[t].captured) AF_THROW(Internal, "cuEventQuery: the event was recorded during a stream capture");
    return !pending_before(tokens[t]);
  }
  void synchronize(uint64_t t) override {
    if (on_wait) on_wait();
    if (tokens[t].captured) AF_THROW(Internal, "cuEventSynchronize: the event was recorded during a stream capture");
    auto& items = work[tokens[t].stream];
    std::erase_if(items, [&](const Item& w) { return w.seq <= tokens[t].seq; });
  }
  void release(uint64_t) noexcept override { ++released; }
  void synchronize_stream(StreamId s) override {
    if (on_wait) on_wait();
    ++stream_syncs;
    if (capturing.count(s)) violations.push_back("synchronised a stream that is being captured");
    if (fail_stream_syncs > 0) {
      --fail_stream_syncs;
      AF_THROW(Internal, "cuStreamSynchronize failed");
    }
    drain(s);
  }
  bool is_capturing(StreamId s) noexcept override { return capturing.count(s) > 0; }

  struct Item {
    uintptr_t addr;
    size_t bytes;
    uint64_t seq;
  };
  struct Token {
    StreamId stream;
    uint64_t seq;  // work up to this sequence number came before the event
    bool captured;
  };
  bool pending_before(const Token& t) {
    for (const Item& w : work[t.stream])
      if (w.seq <= t.seq) return true;
    return false;
  }

  SimulatedProvider sim_;
  std::map<StreamId, std::vector<Item>> work;
  std::vector<Token> tokens;
  std::set<uintptr_t> mapped;
  std::set<StreamId> capturing;
  std::vector<std::string> violations;
  uint64_t seq = 0;
  size_t budget = SIZE_MAX, used = 0;  // plain segments: allocate() returns nullptr beyond the budget
  std::function<void()> on_wait;       // called at the start of every blocking wait
  int fail_records = 0;  // the n-th record from now throws
  int fail_stream_syncs = 0;
  int stream_syncs = 0, released = 0, unmaps = 0, created = 0, records_into_capture = 0;
};

// Everything queued work touches is reported by the fake; an empty list is the pass condition.
std::string describe(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "; ";
  return s;
}

TEST(CachingAllocatorStreams, MovingAGranuleWaitsForItsStreamEvenOnTheSameStream) {
  FakeGpu gpu;
  CachingAllocator a(gpu, PolicyConfig::ampforge(), &gpu);
  ASSERT_TRUE(a.uses_expandable_segments());
  // [p: granules 0-1][q: granule 2][free] (q large too: small blocks have a range of their own)
  void* p = a.allocate_on(4 * MiB, 1);
  void* q = a.allocate_on(2 * MiB, 1);
  gpu.launch(1, p, 4 * MiB);  // a kernel still reading p when the host frees it (legal: stream order)
  a.free(p);
  // 6 MiB does not fit p's hole: it goes after q and takes p's two idle granules, unmapping them from p's
  // addresses, which the queued kernel still touches.
  const int64_t reserved = a.stats().reserved.current;
  void* r = a.allocate_on(6 * MiB, 1);
  EXPECT_TRUE(gpu.violations.empty()) << describe(gpu.violations);
  EXPECT_EQ(gpu.unmaps, 2) << "both idle granules moved";
  EXPECT_EQ(gpu.stream_syncs, 1) << "one wait for the stream, not one per granule";
  EXPECT_EQ(a.stats().host_waits, 1);
  EXPECT_EQ(a.stats().reserved.current, reserved + static_cast<int64_t>(2 * MiB))
      << "r spans granules 3-5: 3 and 4 are p's, moved, 5 is new";
  a.free(q);
  a.free(r);
}

TEST(CachingAllocatorStreams, MovingAGranuleToAnotherStreamWaitsForTheOldOne) {
  FakeGpu gpu;
  CachingAllocator a(gpu, PolicyConfig::ampforge(), &gpu);
  void* p = a.allocate_on(6 * MiB, 1);
  gpu.launch(1, p, 6 * MiB);
  int unrelated = 0;
  gpu.launch(2, &unrelated, sizeof(unrelated));  // work on stream 2 elsewhere: not waited for
  a.free(p);
  void* q = a.allocate_on(6 * MiB, 2);  // another stream's range: p's three granules move there
  EXPECT_TRUE(gpu.violations.empty()) << describe(gpu.violations);
  EXPECT_EQ(gpu.unmaps, 3);
  EXPECT_EQ(gpu.created, 3) << "no new physical granule: the idle ones moved";
  EXPECT_EQ(gpu.stream_syncs, 1);
  EXPECT_FALSE(gpu.work[2].empty()) << "stream 2 itself was not waited for";
  a.free(q);
}

TEST(CachingAllocatorStreams, EmptyCacheWaitsOnceBeforeUnmapping) {
  FakeGpu gpu;
  CachingAllocator a(gpu, PolicyConfig::ampforge(), &gpu);
  void* p = a.allocate_on(8 * MiB, 3);
  void* q = a.allocate_on(2 * MiB, 4);
  gpu.launch(3, p, 8 * MiB);
  gpu.launch(4, q, 2 * MiB);
  a.free(p);
  a.free(q);
  a.empty_cache();
  EXPECT_TRUE(gpu.violations.empty()) << describe(gpu.violations);
  EXPECT_EQ(gpu.unmaps, 5);
  EXPECT_EQ(gpu.stream_syncs, 2) << "each stream once";
  EXPECT_EQ(a.stats().reserved.current, 0);
  EXPECT_TRUE(gpu.mapped.empty());
}

TEST(CachingAllocatorStreams, DestructionWaitsBeforeUnmapping) {
  FakeGpu gpu;
  {
    CachingAllocator a(gpu, PolicyConfig::ampforge(), &gpu);
    void* p = a.allocate_on(4 * MiB, 1);
    gpu.launch(1, p, 4 * MiB);
    a.free(p);
  }
  EXPECT_TRUE(gpu.violations.empty()) << describe(gpu.violations);
  EXPECT_EQ(gpu.unmaps, 2);
  EXPECT_EQ(gpu.stream_syncs, 1);
}

TEST(CachingAllocatorStreams, WhenAnEventCannotBeRecordedTheUseStreamsAreWaitedFor) {
  FakeGpu gpu;
  CachingAllocator a(gpu, PolicyConfig::pytorch(), &gpu);
  void* p = a.allocate_on(64 * KiB, 0);
  a.record_stream(p, 5);
  a.record_stream(p, 6);
  gpu.launch(5, p, 64 * KiB);
  gpu.launch(6, p, 64 * KiB);
  gpu.fail_records = 2;  // the event on stream 5 is recorded, the one on stream 6 fails
  a.free(p);
  EXPECT_EQ(gpu.released, 1) << "the event recorded before the failure is released";
  EXPECT_EQ(gpu.stream_syncs, 2) << "both use streams waited for";
  EXPECT_EQ(a.stats().host_waits, 2);
  EXPECT_FALSE(gpu.busy(p, 64 * KiB));
  void* q = a.allocate_on(64 * KiB, 0);
  EXPECT_EQ(q, p) << "reusable at once: nothing still uses it";
  a.free(q);
}

TEST(CachingAllocatorStreams, WhenNeitherEventNorWaitWorksTheBlockStaysOutOfUse) {
  FakeGpu gpu;
  CachingAllocator a(gpu, PolicyConfig::pytorch(), &gpu);
  void* p = a.allocate_on(64 * KiB, 0);
  a.record_stream(p, 5);
  gpu.launch(5, p, 64 * KiB);
  gpu.fail_records = 1;
  gpu.fail_stream_syncs = 1;
  a.free(p);
  EXPECT_EQ(a.stats().active.current, static_cast<int64_t>(64 * KiB)) << "still active: stream 5 may use it";
  void* q = a.allocate_on(64 * KiB, 0);  // the next call retries: records an event now
  EXPECT_NE(q, p);
  gpu.drain(5);
  a.free(q);
  void* r = a.allocate_on(64 * KiB, 0);
  EXPECT_EQ(r, p) << "reused once stream 5's work before the free has finished";
  EXPECT_TRUE(gpu.violations.empty()) << describe(gpu.violations);
  a.free(r);
}

TEST(CachingAllocatorStreams, UsesFreedDuringACaptureAreRecordedAfterIt) {
  FakeGpu gpu;
  CachingAllocator a(gpu, PolicyConfig::pytorch(), &gpu);  // no held blocks: reuse is plain best fit
  const StreamId copy = 9, compute = 1;
  // An uploaded batch: allocated on the copy stream, read by the compute stream (record_stream).
  void* p = a.allocate_on(256 * KiB, copy);
  a.record_stream(p, compute);
  gpu.launch(compute, p, 256 * KiB);
  gpu.capturing.insert(compute);  // the compute stream is being captured into a graph
  a.free(p);
  EXPECT_EQ(gpu.records_into_capture, 0) << "no event recorded into the capture";
  void* q = a.allocate_on(256 * KiB, copy);  // another thread keeps uploading during the capture
  EXPECT_NE(q, p);
  a.free(q);
  gpu.capturing.clear();  // capture ended; the kernel that reads p is still queued
  void* r = a.allocate_on(256 * KiB, copy);
  EXPECT_NE(r, p) << "the deferred event now marks the compute stream's queued work";
  gpu.drain(compute);
  a.free(r);
  void* s = a.allocate_on(256 * KiB, copy);
  EXPECT_EQ(s, p) << "reused once that work has finished";
  EXPECT_TRUE(gpu.violations.empty()) << describe(gpu.violations);
  a.free(s);
}

TEST(CachingAllocatorStreams, GranulesOfACapturedStreamStayMapped) {
  FakeGpu gpu;
  CachingAllocator a(gpu, PolicyConfig::ampforge(), &gpu);
  void* p = a.allocate_on(4 * MiB, 1);
  gpu.launch(1, p, 4 * MiB);
  a.free(p);
  gpu.capturing.insert(1);
  // Stream 2 needs granules: stream 1's idle ones cannot move (stream 1 cannot be waited for).
  void* q = a.allocate_on(4 * MiB, 2);
  EXPECT_EQ(gpu.unmaps, 0);
  EXPECT_EQ(gpu.created, 4) << "two new granules instead";
  a.empty_cache();
  EXPECT_EQ(gpu.unmaps, 0) << "empty_cache leaves the captured stream's granules alone";
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(8 * MiB));
  gpu.capturing.clear();
  a.empty_cache();
  EXPECT_EQ(gpu.unmaps, 2);
  EXPECT_TRUE(gpu.violations.empty()) << describe(gpu.violations);
  a.free(q);
}

TEST(CachingAllocatorStreams, NoWaitForDeviceWorkWhileHoldingTheLock) {
  // A wait for the GPU can take as long as the queued work: with the allocator's lock held, every other
  // thread's allocation and free (the data loader's uploads among them) would stall behind it. Each wait
  // asks another thread to read the allocator's figures; that read must get the lock at once.
  FakeGpu gpu;
  gpu.budget = 24 * MiB;
  CachingAllocator a(gpu, PolicyConfig::pytorch(), &gpu);
  std::vector<std::future<void>> probes;  // joined after the allocation: a blocked probe must not deadlock us
  int blocked = 0;
  gpu.on_wait = [&] {
    probes.push_back(std::async(std::launch::async, [&a] { (void)a.stats(); }));
    if (probes.back().wait_for(std::chrono::seconds(2)) == std::future_status::timeout) ++blocked;
  };
  void* p = a.allocate_on(3 * MiB, 0);  // a 20 MiB segment
  a.record_stream(p, 5);
  gpu.launch(5, p, 3 * MiB);
  a.free(p);  // pending until stream 5 is done
  void* q = a.allocate_on(18 * MiB, 0);  // no room: the retry waits for stream 5, frees the segment, fits
  for (auto& f : probes) f.get();
  EXPECT_NE(q, nullptr);
  EXPECT_GE(gpu.stream_syncs, 1);
  EXPECT_FALSE(probes.empty()) << "the retry did not wait at all";
  EXPECT_EQ(blocked, 0) << "the allocator waited for the device with its lock held";
  EXPECT_TRUE(gpu.violations.empty()) << describe(gpu.violations);
  a.free(q);
  gpu.on_wait = nullptr;
}

// memory::trace_start/step/trace_stop/allocator_stats(Device) reach a device's caching allocator through the
// backend's resolver (what `train --device cuda --memory-trace` records): a host-backed allocator stands in
// for cuda:2 here.
CachingAllocator* g_device_allocator = nullptr;
CachingAllocator* resolve(int index) { return index == 2 ? g_device_allocator : nullptr; }

TEST(CachingAllocatorStreams, DeviceAllocatorsAreTracedThroughTheResolver) {
  ensure_backends_registered();  // on a GPU machine the real backend registers its resolver first
  SimulatedProvider sim;
  CachingAllocator dev(sim, PolicyConfig::ampforge());
  g_device_allocator = &dev;
  const CachingAllocatorResolver previous = set_caching_allocator_resolver(DeviceType::CUDA, resolve);
  const Device cuda2(DeviceType::CUDA, 2), cuda0(DeviceType::CUDA, 0);
  EXPECT_EQ(caching_allocator_for(cuda2), &dev);
  EXPECT_EQ(caching_allocator_for(cuda0), nullptr);
  EXPECT_THROW(trace_start("/tmp/never-written.memtrace", cuda0), Error) << "no allocator: a clear error";
  const std::string path = ::testing::TempDir() + "/device.memtrace";
  trace_start(path, cuda2);
  void* p = dev.allocate_on(5 * KiB, 0);
  step(cuda2);
  dev.free(p);
  trace_stop(cuda2);
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("\na 1 5120 0\ns\nf 1\n"), std::string::npos) << text.str();
  ASSERT_TRUE(allocator_stats(cuda2).has_value());
  EXPECT_EQ(allocator_stats(cuda2)->num_allocs, 1);
  EXPECT_FALSE(allocator_stats(cuda0).has_value());
  set_caching_allocator_resolver(DeviceType::CUDA, previous);
  g_device_allocator = nullptr;
  std::remove(path.c_str());
}

TEST(CachingAllocatorStreams, OneHostWaitCounterForTheAllocatorAndTheCudaBackend) {
  const uint64_t before = host_wait_count();
  const uint64_t cuda_before = cuda::host_sync_count();
  note_host_wait();
  EXPECT_EQ(host_wait_count(), before + 1);
  EXPECT_EQ(cuda::host_sync_count(), cuda_before + 1) << "cuda::host_sync_count() reads the same counter";
}

}  // namespace
}  // namespace ampforge::memory
