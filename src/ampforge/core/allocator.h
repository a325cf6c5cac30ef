// The allocator interface every Storage goes through, and the registry of one allocator per device type.
// core holds only the interface and a plain host allocator; the caching policy and its providers live
// in memory/ and install themselves with set_allocator().
#pragma once

#include <cstddef>
#include <cstdint>

#include "ampforge/core/device.h"

namespace ampforge {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory aligned to at least 64 bytes, or throws Error(OutOfMemory). nbytes may be 0.
  virtual void* allocate(size_t nbytes, Device device) = 0;
  // Gives back a pointer from allocate() with the same size and device. Never throws.
  virtual void deallocate(void* ptr, size_t nbytes, Device device) noexcept = 0;
  virtual const char* name() const = 0;
};

// The allocator used for new storages on a device type. Defaults: the host allocator for CPU, none
// for CUDA (the CUDA backend installs one).
Allocator* get_allocator(DeviceType type);
// Installs `a` (not owned; must outlive every storage it allocated) and returns the previous one.
Allocator* set_allocator(DeviceType type, Allocator* a);

// Plain aligned host memory (64-byte aligned, for AVX-512 loads and cache lines).
Allocator* host_allocator();

// Bytes currently allocated through host_allocator() (a global counter; see STYLE.md habit 7).
int64_t host_allocator_bytes_in_use();
// Highest value of host_allocator_bytes_in_use() since start.
int64_t host_allocator_peak_bytes();

}  // namespace ampforge
