#include "ampforge/memory/host_provider.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#define AF_HOST_VMM 1
#else
#define AF_HOST_VMM 0
#endif

#include "ampforge/util/error.h"

namespace ampforge::memory {

HostProvider::HostProvider(size_t granule) : granule_(granule) {
  AF_CHECK(granule >= 4096 && (granule & (granule - 1)) == 0,
           "host provider granule must be a power of two of at least 4096 bytes, got {}", granule);
}

size_t HostProvider::capacity() const {
#if AF_HOST_VMM
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return static_cast<size_t>(pages) * static_cast<size_t>(page);
#endif
  return 0;
}

void* HostProvider::allocate(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 511) / 512 * 512;
  return std::aligned_alloc(512, rounded);
}

void HostProvider::deallocate(void* ptr, size_t) noexcept { std::free(ptr); }

bool HostProvider::supports_virtual() const { return AF_HOST_VMM != 0; }

void* HostProvider::reserve(size_t bytes) {
#if AF_HOST_VMM
  // Over-reserve by one granule and trim, so that the range starts on a granule boundary.
  const size_t total = bytes + granule_;
  void* p = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + granule_ - 1) / granule_ * granule_;
  if (aligned > start) munmap(p, aligned - start);
  const uintptr_t end = start + total, aligned_end = aligned + bytes;
  if (end > aligned_end) munmap(reinterpret_cast<void*>(aligned_end), end - aligned_end);
  return reinterpret_cast<void*>(aligned);
#else
  (void)bytes;
  return nullptr;
#endif
}

void HostProvider::unreserve(void* base, size_t bytes) noexcept {
#if AF_HOST_VMM
  munmap(base, bytes);
#endif
}

std::optional<uint64_t> HostProvider::create_physical() { return next_handle_++; }

void HostProvider::release_physical(uint64_t) noexcept {}

void HostProvider::map(void* addr, uint64_t) {
#if AF_HOST_VMM
  if (mprotect(addr, granule_, PROT_READ | PROT_WRITE) != 0)
    AF_THROW(Internal, "host provider: mprotect(READ|WRITE) of {} bytes at {} failed: {}", granule_, addr,
             std::strerror(errno));
#ifdef MADV_HUGEPAGE
  // Granules are 2 MiB-aligned multiples of 2 MiB: ask for transparent huge pages (Debian's default THP mode
  // is "madvise", so without this every tensor sits on 4 KiB pages). One TLB entry per 2 MiB instead of 512
  // matters for memory-bound kernels streaming tens of MiB. Advice only: failure is harmless.
  if (granule_ % (size_t{2} << 20) == 0) madvise(addr, granule_, MADV_HUGEPAGE);
#endif
#endif
}

void HostProvider::unmap(void* addr) noexcept {
#if AF_HOST_VMM
  // Give the pages back to the kernel, then make the range inaccessible again (a use after unmap faults).
  madvise(addr, granule_, MADV_DONTNEED);
  mprotect(addr, granule_, PROT_NONE);
#endif
}

// Simulated addresses start high (1 TiB) so that they are never mistaken for small integers, and keep
// the same alignment rules as the real providers.
SimulatedProvider::SimulatedProvider(size_t granule, Device device, bool virtual_memory)
    : granule_(granule), device_(device), next_address_(uint64_t{1} << 40), virtual_(virtual_memory) {
  AF_CHECK(granule >= 512 && (granule & (granule - 1)) == 0,
           "simulated provider granule must be a power of two of at least 512 bytes, got {}", granule);
}

void* SimulatedProvider::allocate(size_t bytes) {
  const uint64_t p = next_address_;
  next_address_ += (std::max<size_t>(bytes, 1) + granule_ - 1) / granule_ * granule_;
  return reinterpret_cast<void*>(p);
}

void* SimulatedProvider::reserve(size_t bytes) { return allocate(bytes); }

}  // namespace ampforge::memory
