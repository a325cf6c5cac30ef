// Policy unit tests: rounding, pools, best fit, splitting, coalescing, stream rules, expandable segments,
// OOM then continue, stats arithmetic (checked against the provider's own accounting).
#include "ampforge/memory/caching_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "ampforge/core/tensor.h"
#include "ampforge/memory/budgeted_provider.h"
#include "ampforge/memory/global.h"
#include "ampforge/memory/host_provider.h"
#include "ampforge/memory/report.h"
#include "ampforge/memory/trace.h"
#include "ampforge/util/error.h"

namespace ampforge::memory {
namespace {

constexpr size_t KiB = 1024, MiB = size_t{1} << 20;

uintptr_t addr(void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(CachingAllocator, RoundsTo512AndAligns) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::pytorch());
  void* p0 = a.allocate_on(0, 0);
  void* p1 = a.allocate_on(1, 0);
  void* p2 = a.allocate_on(513, 0);
  EXPECT_EQ(addr(p0) % 512, 0u);
  EXPECT_EQ(addr(p1) % 512, 0u);
  EXPECT_EQ(addr(p2) % 512, 0u);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated.current, 512 + 512 + 1024);
  EXPECT_EQ(s.requested.current, 0 + 1 + 513);
  a.free(p0);
  a.free(p1);
  a.free(p2);
}

TEST(CachingAllocator, PytorchPresetSegmentSizes) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::pytorch());
  void* small = a.allocate_on(100 * KiB, 0);
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(2 * MiB));
  void* medium = a.allocate_on(5 * MiB, 0);
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(22 * MiB));
  void* large = a.allocate_on(31 * MiB, 0);  // rounded up to 2 MiB: 32 MiB
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(54 * MiB));
  // A second small request is carved from the same 2 MiB segment, right after the first (split).
  void* small2 = a.allocate_on(KiB, 0);
  EXPECT_EQ(addr(small2), addr(small) + 100 * KiB);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.provider_calls, 3);
  EXPECT_EQ(s.cache_hits, 1);
  for (void* p : {small, medium, large, small2}) a.free(p);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 0);
}

TEST(CachingAllocator, BestFitPicksTheSmallestHole) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::pytorch());
  void* x1 = a.allocate_on(100 * KiB, 0);
  void* sep1 = a.allocate_on(512, 0);
  void* x2 = a.allocate_on(50 * KiB, 0);
  void* sep2 = a.allocate_on(512, 0);
  a.free(x1);
  a.free(x2);
  void* y = a.allocate_on(40 * KiB, 0);
  EXPECT_EQ(addr(y), addr(x2)) << "the 50 KiB hole fits best";
  void* z = a.allocate_on(90 * KiB, 0);
  EXPECT_EQ(addr(z), addr(x1));
  for (void* p : {sep1, sep2, y, z}) a.free(p);
}

TEST(CachingAllocator, FreesCoalesceWithNeighbours) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::pytorch());
  void* p1 = a.allocate_on(256 * KiB, 0);
  void* p2 = a.allocate_on(256 * KiB, 0);
  void* p3 = a.allocate_on(256 * KiB, 0);
  a.free(p1);
  a.free(p3);
  a.free(p2);  // joins both sides and the tail
  const auto snap = a.snapshot();
  ASSERT_EQ(snap["segments"].size(), 1u);
  ASSERT_EQ(snap["segments"][0]["blocks"].size(), 1u);
  EXPECT_EQ(snap["segments"][0]["blocks"][0]["size"], 2 * MiB);
  EXPECT_EQ(snap["segments"][0]["blocks"][0]["state"], "free");
  // The whole segment is reusable as one block: a 1 MiB request (largest small one) is a cache hit.
  const int64_t calls = a.stats().provider_calls;
  void* big = a.allocate_on(MiB, 0);
  EXPECT_EQ(addr(big), addr(p1));
  EXPECT_EQ(a.stats().provider_calls, calls);
  a.free(big);
}

TEST(CachingAllocator, OversizeBlocksAreNotSplit) {
  SimulatedProvider sim;
  PolicyConfig c = PolicyConfig::pytorch();
  c.max_split_size = 8 * MiB;
  CachingAllocator a(sim, c);
  void* p = a.allocate_on(32 * MiB, 0);
  a.free(p);
  void* q = a.allocate_on(12 * MiB, 0);  // would waste 20 MiB of the cached 32 MiB block: new segment
  EXPECT_NE(addr(q), addr(p));
  void* r = a.allocate_on(30 * MiB, 0);  // wastes 2 MiB <= 30/8: reuses it, unsplit
  EXPECT_EQ(addr(r), addr(p));
  EXPECT_EQ(a.stats().allocated.current, static_cast<int64_t>(12 * MiB + 32 * MiB));
  a.free(q);
  a.free(r);
}

// Events that complete only when the test says so: the stream rule without a GPU.
class ManualEvents final : public StreamEvents {
 public:
  uint64_t record(StreamId s) override {
    recorded.push_back(s);
    done.push_back(false);
    return done.size() - 1;
  }
  bool query(uint64_t t) override { return done[t]; }
  void synchronize(uint64_t t) override {
    ++syncs;
    done[t] = true;
  }
  void release(uint64_t) noexcept override { ++released; }
  std::vector<StreamId> recorded;
  std::vector<bool> done;
  int syncs = 0, released = 0;
};

TEST(CachingAllocator, BlocksBelongToTheirStream) {
  SimulatedProvider sim;
  ManualEvents ev;
  CachingAllocator a(sim, PolicyConfig::pytorch(), &ev);
  void* p = a.allocate_on(4 * KiB, 1);
  a.free(p);
  void* q = a.allocate_on(4 * KiB, 2);
  EXPECT_NE(addr(q), addr(p)) << "a block freed on stream 1 is not handed to stream 2";
  void* r = a.allocate_on(4 * KiB, 1);
  EXPECT_EQ(addr(r), addr(p));
  a.free(q);
  a.free(r);
}

TEST(CachingAllocator, CrossStreamUseDelaysReuse) {
  SimulatedProvider sim;
  ManualEvents ev;
  CachingAllocator a(sim, PolicyConfig::pytorch(), &ev);
  void* p = a.allocate_on(64 * KiB, 0);
  a.record_stream(p, 7);
  a.free(p);
  ASSERT_EQ(ev.recorded.size(), 1u);
  EXPECT_EQ(ev.recorded[0], 7u);
  EXPECT_EQ(a.stats().active.current, static_cast<int64_t>(64 * KiB)) << "pending blocks stay active";
  EXPECT_EQ(a.stats().allocated.current, 0);
  void* q = a.allocate_on(64 * KiB, 0);
  EXPECT_NE(addr(q), addr(p)) << "stream 7 may still use p";
  ev.done[0] = true;
  a.free(q);
  void* r = a.allocate_on(64 * KiB, 0);
  EXPECT_EQ(addr(r), addr(p)) << "reused once the event completed";
  EXPECT_EQ(ev.released, 1);
  a.free(r);
  EXPECT_EQ(a.stats().active.current, 0);
}

TEST(CachingAllocator, ExpandableSegmentsGrowAndShrinkByGranule) {
  HostProvider host;
  PolicyConfig c = PolicyConfig::ampforge();
  c.virtual_range = 256 * MiB;
  CachingAllocator a(host, c);
  ASSERT_TRUE(a.uses_expandable_segments());
  void* p1 = a.allocate_on(10 * MiB, 0);
  void* p2 = a.allocate_on(10 * MiB, 0);
  void* p3 = a.allocate_on(10 * MiB, 0);
  EXPECT_EQ(addr(p2), addr(p1) + 10 * MiB) << "one contiguous range";
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(30 * MiB));
  for (void* p : {p1, p2, p3}) std::memset(p, 0x5a, 10 * MiB);  // really mapped and writable
  a.free(p2);
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(30 * MiB)) << "idle granules stay mapped (cached)";
  // 12 MiB does not fit the 10 MiB hole; it goes after p3 and takes the 5 idle granules plus one new one.
  void* p4 = a.allocate_on(12 * MiB, 0);
  EXPECT_EQ(addr(p4), addr(p3) + 10 * MiB);
  std::memset(p4, 0x11, 12 * MiB);
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(32 * MiB)) << "reserved == live: 10 + 10 + 12 MiB";
  a.free(p1);
  a.empty_cache();  // p1's granules are idle: unmapped and released
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(22 * MiB));
  a.free(p3);
  a.free(p4);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 0);
  EXPECT_EQ(a.snapshot()["segments"].size(), 0u);
}

TEST(CachingAllocator, RecentFreesAreReusedExactlyAndCoalescedBeforeTheProvider) {
  SimulatedProvider sim;
  BudgetedProvider card(sim, 48 * MiB);
  CachingAllocator a(card, PolicyConfig::ampforge());
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(a.allocate_on(4 * MiB, 0));
  const int64_t calls = a.stats().provider_calls;
  for (void* p : ps) a.free(p);                     // held: not coalesced yet
  // The same size again: the most recently freed block, a cache hit without any provider call.
  void* q = a.allocate_on(4 * MiB, 0);
  EXPECT_EQ(q, ps.back());
  EXPECT_EQ(a.stats().provider_calls, calls);
  // 40 MiB with 4 MiB live on a 48 MiB card fits only if the 28 MiB held are coalesced and their
  // granules reused: the allocator must flush them before asking the provider for more.
  void* big = a.allocate_on(40 * MiB, 0);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_retries, 0) << "held blocks must be coalesced before the provider is asked, not after it fails";
  EXPECT_LE(s.reserved.current, static_cast<int64_t>(48 * MiB));
  a.free(big);
  a.free(q);
  // Figures see coalesced memory: nothing active, one free range as large as everything reserved.
  s = a.stats();
  EXPECT_EQ(s.active.current, 0);
  EXPECT_EQ(s.allocated.current, 0);
  EXPECT_EQ(s.largest_free_block, s.reserved.current);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 0);
}

TEST(CachingAllocator, ExpandableSmallBlocksShareGranules) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::ampforge());
  std::vector<void*> ps;
  for (int i = 0; i < 16; ++i) ps.push_back(a.allocate_on(100 * KiB, 0));
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(2 * MiB)) << "1.56 MiB of small blocks in one granule";
  for (void* p : ps) a.free(p);
}

// A small request that would start a granule of the small pool goes into the unused end of a large block's granule
// instead (rule 2): 3 MiB + 256 KiB live fit in two granules, not three.
TEST(CachingAllocator, SmallBlocksFillTheEndsOfLargeBlocksGranules) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::ampforge());
  void* large = a.allocate_on(3 * MiB, 0);
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(4 * MiB));
  void* small = a.allocate_on(256 * KiB, 0);
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(4 * MiB)) << "no granule of the small pool's own";
  EXPECT_GE(addr(small), addr(large) + 3 * MiB);
  EXPECT_LE(addr(small) + 256 * KiB, addr(large) + 4 * MiB) << "inside the large block's second granule";
  // Once the small pool has a granule with room, small requests go there (no new granule either way).
  a.free(large);
  a.free(small);
  a.empty_cache();
  void* s1 = a.allocate_on(256 * KiB, 0);
  void* s2 = a.allocate_on(256 * KiB, 0);
  EXPECT_EQ(a.stats().reserved.current, static_cast<int64_t>(2 * MiB));
  a.free(s1);
  a.free(s2);
}

// Held blocks (hold_recent) are for an exact reuse only: any other request sees them given back and coalesced, so
// it is placed in the free space as it is. Here a 6 MiB request fits exactly where three held 2 MiB blocks were;
// with them left in place it went into the 6.5 MiB hole elsewhere, splitting it.
TEST(CachingAllocator, HeldBlocksAreGivenBackBeforeAnyOtherPlacement) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::ampforge());
  void* first = a.allocate_on(8 * MiB, 0);
  void* mid = a.allocate_on(2 * MiB, 0);
  void* p1 = a.allocate_on(2 * MiB, 0);
  void* p2 = a.allocate_on(2 * MiB, 0);
  void* p3 = a.allocate_on(2 * MiB, 0);
  void* last = a.allocate_on(2 * MiB, 0);
  a.free(first);
  void* x = a.allocate_on(1536 * KiB, 0);  // takes the start of the first block's space: a 6.5 MiB hole is left
  EXPECT_EQ(x, first);
  a.free(p1);
  a.free(p2);
  a.free(p3);
  // An exact reuse takes the most recent held block without touching the pools.
  void* again = a.allocate_on(2 * MiB, 0);
  EXPECT_EQ(again, p3);
  a.free(again);
  const int64_t reserved = a.stats().reserved.current;
  void* six = a.allocate_on(6 * MiB, 0);
  EXPECT_EQ(six, p1) << "the three held blocks' space, coalesced: the best fit";
  EXPECT_EQ(a.stats().reserved.current, reserved);
  for (void* p : {x, mid, six, last}) a.free(p);
}

TEST(CachingAllocator, OutOfMemoryReportsAndTheProcessContinues) {
  SimulatedProvider sim;
  BudgetedProvider card(sim, 64 * MiB);
  CachingAllocator a(card, PolicyConfig::ampforge());
  void* p = a.allocate_on(40 * MiB, 0);
  try {
    a.allocate_on(30 * MiB, 0);
    FAIL() << "expected OutOfMemory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
    const std::string m = e.what();
    for (const char* s : {"out of memory", "30.00 MiB", "allocated", "reserved", "reserved but free",
                          "largest free block", "fragmentation", "largest live allocations", "40.00 MiB",
                          "batch size", "bf16", "checkpointing", "capacity 64.00 MiB"})
      EXPECT_NE(m.find(s), std::string::npos) << "missing '" << s << "' in:\n" << m;
  }
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_retries, 1);
  a.free(p);
  void* q = a.allocate_on(30 * MiB, 0);  // fits now
  EXPECT_NE(q, nullptr);
  a.free(q);
}

TEST(CachingAllocator, FragmentationAdviceForPlainSegments) {
  SimulatedProvider sim;
  BudgetedProvider card(sim, 40 * MiB);
  CachingAllocator a(card, PolicyConfig::pytorch());
  // Two 20 MiB segments, each with a 6 MiB block left live: 28 MiB free in pieces of 14 MiB.
  void* a1 = a.allocate_on(6 * MiB, 0);
  void* b1 = a.allocate_on(6 * MiB, 0);
  void* a2 = a.allocate_on(6 * MiB, 0);
  void* a3 = a.allocate_on(6 * MiB, 0);
  void* b2 = a.allocate_on(6 * MiB, 0);
  a.free(a1);
  a.free(a2);
  a.free(a3);
  try {
    a.allocate_on(16 * MiB, 0);
    FAIL() << "expected OutOfMemory";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("expandable segments"), std::string::npos) << m;
    const AllocatorStats s = a.stats();
    EXPECT_GT(s.fragmentation, 0.3);
  }
  a.free(b1);
  a.free(b2);
}

TEST(CachingAllocator, AbsurdRequestIsOutOfMemoryNotACrash) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::ampforge());
  try {
    a.allocate_on(SIZE_MAX - 10, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
  }
}

// Random operations under every policy: the invariants that must hold after each one.
TEST(CachingAllocator, StatsArithmeticMatchesTheProvider) {
  for (const char* policy : {"naive", "pytorch", "ampforge"}) {
    SCOPED_TRACE(policy);
    SimulatedProvider sim;
    BudgetedProvider card(sim, size_t{1} << 40);
    CachingAllocator a(card, PolicyConfig::by_name(policy));
    std::map<uintptr_t, std::pair<size_t, size_t>> live;  // address -> (rounded size, requested)
    int64_t requested = 0, allocs = 0, frees = 0;
    uint64_t rng = 12345;
    auto next = [&] { return (rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 16; };
    for (int i = 0; i < 3000; ++i) {
      if (live.empty() || next() % 3 != 0) {
        const size_t n = size_t{1} << (next() % 26);  // 1 B .. 32 MiB
        const size_t bytes = n + next() % n;
        void* p = a.allocate_on(bytes, 0);
        const size_t rounded = (std::max<size_t>(bytes, 1) + 511) / 512 * 512;
        // No overlap with any live block.
        auto it = live.upper_bound(addr(p));
        if (it != live.end()) {
          ASSERT_LE(addr(p) + rounded, it->first);
        }
        if (it != live.begin()) {
          --it;
          ASSERT_LE(it->first + it->second.first, addr(p));
        }
        live[addr(p)] = {rounded, bytes};
        requested += static_cast<int64_t>(bytes);
        ++allocs;
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(next() % live.size()));
        requested -= static_cast<int64_t>(it->second.second);
        a.free(reinterpret_cast<void*>(it->first));
        live.erase(it);
        ++frees;
      }
      const AllocatorStats s = a.stats();
      int64_t allocated = 0;
      for (auto& kv : live) allocated += static_cast<int64_t>(kv.second.first);
      if (std::string(policy) == "pytorch") {
        // Large blocks are not split when less than 1 MiB would remain: a block may exceed the rounded request.
        ASSERT_GE(s.allocated.current, allocated);
        ASSERT_LE(s.allocated.current, allocated + static_cast<int64_t>(live.size() * MiB));
      } else {
        ASSERT_EQ(s.allocated.current, allocated);
      }
      ASSERT_EQ(s.active.current, s.allocated.current);
      ASSERT_EQ(s.requested.current, requested);
      ASSERT_EQ(s.reserved.current, static_cast<int64_t>(card.used())) << "reserved must equal what the provider holds";
      ASSERT_GE(s.reserved.current, s.allocated.current);
      ASSERT_EQ(s.reserved.peak, static_cast<int64_t>(card.peak_used()));
      ASSERT_EQ(s.num_allocs, allocs);
      ASSERT_EQ(s.num_frees, frees);
      ASSERT_LE(s.cache_hits, s.num_allocs);
      ASSERT_GE(s.fragmentation, 0.0);
      ASSERT_LE(s.fragmentation, 1.0);
      if (std::string(policy) == "naive") {
        ASSERT_EQ(s.reserved.current, s.allocated.current);
      }
    }
    for (auto& kv : live) a.free(reinterpret_cast<void*>(kv.first));
    a.empty_cache();
    EXPECT_EQ(a.stats().reserved.current, 0);
    EXPECT_EQ(card.used(), 0u);
  }
}

TEST(CachingAllocator, RecordsATraceThatParsesBack) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::ampforge());
  void* before = a.allocate_on(100, 0);  // not in the trace
  const std::string path = testing::TempDir() + "/ampforge_trace_test.memtrace";
  a.trace_start(path);
  void* p = a.allocate_on(1000, 0);
  void* q = a.allocate_on(2000, 5);
  a.step();
  a.free(p);
  a.free(before);
  a.free(q);
  a.trace_stop();
  const Trace t = trace_read(path);
  ASSERT_EQ(t.events.size(), 5u);
  EXPECT_EQ(t.events[0].kind, TraceEvent::Alloc);
  EXPECT_EQ(t.events[0].bytes, 1000u);
  EXPECT_EQ(t.events[1].bytes, 2000u);
  EXPECT_EQ(t.events[1].stream, 1u) << "streams are numbered densely, default stream 0";
  EXPECT_EQ(t.events[2].kind, TraceEvent::Step);
  EXPECT_EQ(t.events[3].kind, TraceEvent::Free);
  EXPECT_EQ(t.events[3].id, t.events[0].id);
  EXPECT_EQ(t.events[4].id, t.events[1].id);
  std::remove(path.c_str());
}

TEST(CachingAllocator, SnapshotAndReport) {
  HostProvider host;
  PolicyConfig c = PolicyConfig::ampforge();
  c.virtual_range = 64 * MiB;
  CachingAllocator a(host, c);
  void* p = a.allocate_on(3 * MiB, 0);
  a.step();
  void* q = a.allocate_on(5 * MiB, 0);
  a.free(p);
  a.step();
  const auto snap = a.snapshot();
  EXPECT_EQ(snap["format"], "ampforge-memory-snapshot v1");
  ASSERT_EQ(snap["timeline"].size(), 2u);
  EXPECT_EQ(snap["timeline"][0]["allocated"], 3 * MiB);
  EXPECT_EQ(snap["timeline"][1]["peak_allocated"], 8 * MiB);
  ASSERT_EQ(snap["segments"].size(), 1u);
  EXPECT_TRUE(snap["segments"][0]["expandable"]);
  EXPECT_EQ(snap["segments"][0]["mapped_bytes"], 8 * MiB);
  const std::string path = testing::TempDir() + "/ampforge_snapshot_test.json";
  a.write_snapshot(path);
  const auto back = snapshot_read(path);
  const std::string summary = snapshot_summary(back);
  EXPECT_NE(summary.find("policy 'ampforge'"), std::string::npos) << summary;
  EXPECT_NE(summary.find("timeline: 2 steps"), std::string::npos) << summary;
  const std::string svg = snapshot_svg(back);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("polyline"), std::string::npos);
  EXPECT_NE(svg.find("#1f5fbf"), std::string::npos) << "the allocated block is drawn";
  EXPECT_NE(snapshot_html(back).find("<svg"), std::string::npos);
  std::remove(path.c_str());
  a.free(q);
}

TEST(CachingAllocator, SnapshotReadRejectsWhatTheRenderersCannotDraw) {
  // snapshot_read checks every field the summary and the charts read, so a hand-edited or corrupt file is an
  // InvalidArgument naming the field, never a JSON library exception from a renderer or an overflow.
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::ampforge());
  void* p = a.allocate_on(4 * KiB, 0);
  a.step();
  const nlohmann::json good = a.snapshot();
  a.free(p);
  const std::string path = testing::TempDir() + "/ampforge_bad_snapshot.json";
  auto expect_rejected = [&](const nlohmann::json& j, const std::string& field) {
    { std::ofstream(path) << j.dump(); }
    try {
      (void)snapshot_summary(snapshot_read(path));
      ADD_FAILURE() << "accepted a snapshot with a bad " << field;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  nlohmann::json j = good;
  j["stats"]["num_allocs"] = "many";
  expect_rejected(j, "stats.num_allocs");
  j = good;
  j["stats"].erase("fragmentation");
  expect_rejected(j, "stats.fragmentation");
  j = good;
  j["segments"][0]["blocks"][0]["size"] = -5;
  expect_rejected(j, "segments[0].blocks[0].size");
  j = good;
  j["segments"][0]["extent"] = int64_t{1} << 62;  // the chart's arithmetic would overflow
  expect_rejected(j, "segments[0].extent");
  j = good;
  j["timeline"][0]["peak_reserved"] = nullptr;
  expect_rejected(j, "timeline[0].peak_reserved");
  j = good;
  j["policy"] = 3;
  expect_rejected(j, "policy");
  { std::ofstream(path) << good.dump(); }
  EXPECT_NE(snapshot_summary(snapshot_read(path)).find("timeline: 1 steps"), std::string::npos);
  std::remove(path.c_str());
}

TEST(CachingAllocator, InstallsAsTheCpuAllocator) {
  Allocator* before = get_allocator(DeviceType::CPU);
  CachingAllocator& a = install_host_caching_allocator({.budget = size_t{1} << 30});
  EXPECT_EQ(get_allocator(DeviceType::CPU), &a);
  EXPECT_EQ(&install_host_caching_allocator({.budget = size_t{1} << 30}), &a) << "idempotent";
  EXPECT_THROW(install_host_caching_allocator({.budget = 5}), Error);
  const int64_t n0 = allocator_stats()->num_allocs;
  {
    Tensor t = Tensor::empty({1024, 1024});
    EXPECT_EQ(allocator_stats()->num_allocs, n0 + 1);
    EXPECT_GE(allocator_stats()->allocated.current, 4 * static_cast<int64_t>(MiB));
    step();
  }
  EXPECT_EQ(allocator_stats()->num_frees, allocator_stats()->num_allocs);
  // Under the 1 GiB budget, a 2 GiB tensor is an OutOfMemory error, and the process goes on.
  EXPECT_THROW(Tensor::empty({512, 1024, 1024}), Error);
  Tensor ok = Tensor::empty({256, 1024});
  EXPECT_TRUE(ok.defined());
  uninstall_host_caching_allocator();
  EXPECT_EQ(get_allocator(DeviceType::CPU), before);
  EXPECT_FALSE(allocator_stats().has_value());
}

}  // namespace
}  // namespace ampforge::memory

namespace ampforge::memory {
namespace {

// One allocation sequence; `observe` runs between the frees and the next allocation.
std::vector<uintptr_t> offsets_after_frees(const std::function<void(CachingAllocator&)>& observe) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::ampforge());
  void* p = a.allocate_on(1 * KiB, 0);
  void* q = a.allocate_on(1 * KiB, 0);
  a.free(p);
  a.free(q);  // both held: kept for an exact-size reuse, not coalesced
  observe(a);
  void* r = a.allocate_on(2 * KiB, 0);
  void* t = a.allocate_on(1 * KiB, 0);
  std::vector<uintptr_t> out{addr(r) - addr(p), addr(t) - addr(p)};
  a.free(r);
  a.free(t);
  return out;
}

}  // namespace

TEST(CachingAllocator, ReadingFiguresChangesNothing) {
  const auto control = offsets_after_frees([](CachingAllocator&) {});
  const auto observed = offsets_after_frees([](CachingAllocator& a) {
    const AllocatorStats before = a.stats();
    const nlohmann::json snap = a.snapshot();
    (void)a.oom_report(64 * MiB, 0);
    (void)a.timeline();
    EXPECT_EQ(a.stats().largest_free_block, before.largest_free_block);
    EXPECT_EQ(a.snapshot(), snap);
    // The figures already count the held blocks as coalesced free memory.
    EXPECT_EQ(before.active.current, 0);
    EXPECT_EQ(before.largest_free_block, before.reserved.current);
    int free_runs = 0;
    for (const auto& b : snap["segments"][0]["blocks"]) free_runs += b["state"] == "free";
    EXPECT_EQ(free_runs, 1) << snap.dump();
  });
  EXPECT_EQ(observed, control) << "stats()/snapshot()/oom_report() changed where the next allocations went";
}

TEST(CachingAllocator, TimelineIsACopy) {
  SimulatedProvider sim;
  CachingAllocator a(sim, PolicyConfig::ampforge());
  void* p = a.allocate_on(4 * KiB, 0);
  a.step();
  const std::vector<TimelinePoint> t = a.timeline();
  a.step();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].allocated, static_cast<int64_t>(4 * KiB));
  EXPECT_EQ(a.timeline().size(), 2u);
  a.free(p);
}

}  // namespace ampforge::memory
