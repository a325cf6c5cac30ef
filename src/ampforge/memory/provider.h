// Providers: where the caching allocator (memory/caching_allocator.h) gets its memory from.
//
// A provider offers one or both of two interfaces:
//   - plain segments: allocate(bytes) / deallocate(ptr, bytes), fully backed (cudaMalloc, aligned_alloc);
//   - virtual memory (supports_virtual()): reserve an address range with no backing, create physical
//     memory one granule at a time, map a granule at a granule-aligned address of a reserved range, unmap
//     it, release it. This is the shape of CUDA's cuMemAddressReserve / cuMemCreate / cuMemMap; a physical
//     granule can be unmapped from one address and mapped at another without being released.
//
// Contract: running out of memory is not an exception here. allocate() returns nullptr and
// create_physical() returns std::nullopt; the policy decides what to do (free its cache, retry, raise
// OutOfMemory with a report). Other failures (a driver error, a bad argument) throw ampforge::Error.
// Providers are not thread-safe by themselves: the allocator that owns one serialises calls (its mutex).
//
// Streams: work on a device is ordered per stream. The policy only needs to know when the work that was
// queued on a stream up to now has finished: StreamEvents records such a point and answers queries.
// The host has one stream (0) and no asynchronous work, so HostStreamEvents completes at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "ampforge/core/device.h"

namespace ampforge::memory {

// A stream as the policy sees it: an opaque 64-bit id (a CUstream cast to an integer on CUDA; 0 is the
// default stream on every device and the only one on the host).
using StreamId = uint64_t;
inline constexpr StreamId kDefaultStream = 0;

// The granule of the host providers: 2 MiB, the granularity CUDA's virtual-memory API reports for
// current NVIDIA GPUs (and the size of a huge page on x86-64), so host figures match device figures.
inline constexpr size_t kHostGranule = size_t{2} << 20;

class Provider {
 public:
  virtual ~Provider() = default;
  virtual const char* name() const = 0;
  virtual Device device() const = 0;
  // The mapping granularity in bytes (a power of two). Virtual ranges, physical granules and mapping
  // addresses are multiples of it. For plain-only providers: the alignment of allocate().
  virtual size_t granularity() const = 0;
  // Physical bytes this provider can hand out in total, or 0 when unknown (reports use it).
  virtual size_t capacity() const { return 0; }

  // ---- plain segments -----------------------------------------------------------------------------
  // Fully backed memory of `bytes` bytes (aligned to at least 512 bytes), or nullptr when out of memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) noexcept = 0;

  // ---- virtual memory (optional) ------------------------------------------------------------------
  virtual bool supports_virtual() const { return false; }
  // An address range of `bytes` (a multiple of granularity()), no memory behind it; nullptr on failure.
  virtual void* reserve(size_t bytes);
  virtual void unreserve(void* base, size_t bytes) noexcept;
  // One granule of physical memory; std::nullopt when out of memory. The handle is opaque.
  virtual std::optional<uint64_t> create_physical();
  virtual void release_physical(uint64_t handle) noexcept;
  // Maps the granule `handle` at `addr` (granule-aligned, inside a reserved range, currently unmapped),
  // readable and writable by the device.
  virtual void map(void* addr, uint64_t handle);
  // Unmaps the granule at `addr`; the physical granule stays alive (it can be mapped elsewhere). Unmapping
  // does not wait for queued device work (cuMemUnmap does not synchronise in every case): the caller makes
  // sure no queued work can still touch the granule. The policy synchronises the stream that last used it
  // first (StreamEvents::synchronize_stream, once per allocator call and stream).
  virtual void unmap(void* addr) noexcept;
};

// Completion of stream work, for the policy's cross-stream rule (memory/caching_allocator.h).
class StreamEvents {
 public:
  virtual ~StreamEvents() = default;
  // Marks "everything queued on `stream` so far"; returns a token for query()/synchronize()/release().
  virtual uint64_t record(StreamId stream) = 0;
  // True when the work before the token has finished. Never blocks.
  virtual bool query(uint64_t token) = 0;
  // Blocks until the work before the token has finished.
  virtual void synchronize(uint64_t token) = 0;
  virtual void release(uint64_t token) noexcept = 0;
  // Blocks until everything queued on `stream` so far has finished. The default records a token and waits
  // for it; CUDA's waits for the stream itself, which also works when an event cannot be created.
  virtual void synchronize_stream(StreamId stream) {
    const uint64_t t = record(stream);
    synchronize(t);
    release(t);
  }
  // Whether `stream` is being captured into a CUDA graph right now. While it is, an event recorded on it
  // would become a node of the graph instead of marking eager work (querying it later says nothing about
  // the memory), and waiting for it would invalidate the capture: the policy then defers such records
  // until the capture has ended and never waits for that stream. Never throws.
  virtual bool is_capturing(StreamId) noexcept { return false; }
};

// Host waits on device work in this process: every time a thread blocked until a GPU finished something
// (stream and event synchronisations, copies to the host, the allocator's waits). CUDA code calls
// note_host_wait() right before each such wait; cuda::host_sync_count() reads this counter.
void note_host_wait() noexcept;
uint64_t host_wait_count() noexcept;

// The host: one stream, synchronous work. Every token is complete when recorded.
class HostStreamEvents final : public StreamEvents {
 public:
  uint64_t record(StreamId) override { return 0; }
  bool query(uint64_t) override { return true; }
  void synchronize(uint64_t) override {}
  void release(uint64_t) noexcept override {}
  void synchronize_stream(StreamId) override {}
};

}  // namespace ampforge::memory
