#include "ampforge/memory/host_provider.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>

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
  {
    // Parked pages inside the range go with it.
    std::lock_guard<std::mutex> lock(mu_);
    const auto lo = reinterpret_cast<uintptr_t>(base), hi = lo + bytes;
    for (auto it = parked_.begin(); it != parked_.end();)
      it = it->second >= lo && it->second < hi ? parked_.erase(it) : std::next(it);
    for (auto it = mapped_.begin(); it != mapped_.end();)
      it = it->first >= lo && it->first < hi ? mapped_.erase(it) : std::next(it);
  }
  munmap(base, bytes);
#else
  (void)base;
  (void)bytes;
#endif
}

std::optional<uint64_t> HostProvider::create_physical() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_handle_++;
}

void HostProvider::release_physical(uint64_t handle) noexcept {
#if AF_HOST_VMM
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = parked_.find(handle);
  if (it == parked_.end()) return;
  madvise(reinterpret_cast<void*>(it->second), granule_, MADV_DONTNEED);  // the pages go back to the kernel
  parked_.erase(it);
#else
  (void)handle;
#endif
}

void HostProvider::map(void* addr, uint64_t handle) {
#if AF_HOST_VMM
  std::lock_guard<std::mutex> lock(mu_);
  bool moved = false;
  if (const auto it = parked_.find(handle); it != parked_.end()) {
    void* from = reinterpret_cast<void*>(it->second);
    parked_.erase(it);
#ifdef MREMAP_DONTUNMAP
    if (from == addr) {
      moved = true;  // mapped back where it sits: the pages are there already
    } else {
      // Moves the page tables (one PMD per huge page) to `addr`, replacing the PROT_NONE reservation there;
      // `from` stays mapped, empty and PROT_NONE, so the source range stays reserved.
      void* r = mremap(from, granule_, granule_, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, addr);
      moved = r == addr;
    }
#endif
    if (!moved) madvise(from, granule_, MADV_DONTNEED);  // no page moving: give them back, fault in fresh ones
    else ++moved_;
  }
  if (mprotect(addr, granule_, PROT_READ | PROT_WRITE) != 0)
    AF_THROW(Internal, "host provider: mprotect(READ|WRITE) of {} bytes at {} failed: {}", granule_, addr,
             std::strerror(errno));
#ifdef MADV_HUGEPAGE
  // Granules are 2 MiB-aligned multiples of 2 MiB: ask for transparent huge pages (Debian's default THP mode
  // is "madvise", so without this every tensor sits on 4 KiB pages). One TLB entry per 2 MiB instead of 512
  // matters for memory-bound kernels streaming tens of MiB. Advice only: failure is harmless.
  if (!moved && granule_ % (size_t{2} << 20) == 0) madvise(addr, granule_, MADV_HUGEPAGE);
#endif
  mapped_[reinterpret_cast<uintptr_t>(addr)] = handle;
#else
  (void)addr;
  (void)handle;
#endif
}

void HostProvider::unmap(void* addr) noexcept {
#if AF_HOST_VMM
  std::lock_guard<std::mutex> lock(mu_);
  // Inaccessible (a use after unmap faults) but the pages stay with the handle until release_physical().
  mprotect(addr, granule_, PROT_NONE);
  const auto it = mapped_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == mapped_.end()) {
    madvise(addr, granule_, MADV_DONTNEED);
    return;
  }
  parked_[it->second] = it->first;
  mapped_.erase(it);
#else
  (void)addr;
#endif
}

uint64_t HostProvider::pages_moved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return moved_;
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
