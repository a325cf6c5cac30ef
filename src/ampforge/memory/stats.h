// Allocator statistics: what the policy holds and does. Units are bytes unless named a count.
// Definitions (docs/MEMORY.md has the full text):
//   requested  sum of the sizes callers asked for, over live blocks (the ideal: what a perfect allocator holds)
//   allocated  sum of the (rounded) sizes of live blocks
//   active     allocated + blocks freed by their owner whose other-stream uses have not finished yet
//   reserved   memory physically backed for this allocator: plain segments plus mapped granules of
//              expandable segments (free runs of whole granules can be unmapped and then stop counting)
//   fragmentation = 1 - largest_free_block / (reserved - allocated), 0 when nothing reserved is free
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ampforge::memory {

struct StatCounter {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t total = 0;  // sum of all increases (bytes ever allocated, reserved, ...)

  void add(int64_t n) {
    current += n;
    total += n;
    if (current > peak) peak = current;
  }
  void sub(int64_t n) { current -= n; }
  void reset_peak() { peak = current; }
};

struct AllocatorStats {
  StatCounter requested;
  StatCounter allocated;
  StatCounter active;
  StatCounter reserved;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t cache_hits = 0;      // allocations served without any provider call
  int64_t provider_calls = 0;  // every call into the provider (allocate, free, reserve, create, map, ...)
  int64_t num_retries = 0;     // allocations that failed once and retried after freeing the cache
  int64_t num_ooms = 0;        // OutOfMemory errors raised
  // Times the allocator blocked the calling thread until device work finished (an event or stream
  // synchronisation: before unmapping a granule, when recording an event failed, on the out-of-memory
  // retry). 0 on the host, whose work is synchronous.
  int64_t host_waits = 0;
  // Fragmentation measured when reserved last reached its peak (see the definition above).
  double fragmentation_at_peak = 0.0;
  // The same figures measured now.
  int64_t largest_free_block = 0;
  double fragmentation = 0.0;

  // peak reserved / peak requested: how much more than the ideal the allocator ever held (1 is perfect).
  double peak_overhead_ratio() const {
    return requested.peak > 0 ? static_cast<double>(reserved.peak) / static_cast<double>(requested.peak) : 0.0;
  }
};

nlohmann::json stats_to_json(const AllocatorStats& s);
// A short human table, one figure per line.
std::string stats_format(const AllocatorStats& s);

// 1536 -> "1.50 KiB"; exact bytes below 1 KiB.
std::string format_bytes(int64_t bytes);
// Strict size parsing: a non-negative integer with an optional unit B, KiB, MiB, GiB, TiB (powers of 1024)
// or kB, MB, GB, TB (powers of 1000). No sign, no fraction, no exponent, no spaces, no overflow.
// Throws InvalidArgument naming what was expected; `what` names the value in the message (e.g. "--budget").
uint64_t parse_size(const std::string& text, const char* what = "size");

}  // namespace ampforge::memory
