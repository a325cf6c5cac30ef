#include "ampforge/memory/provider.h"

#include <atomic>

#include "ampforge/util/error.h"

namespace ampforge::memory {

// Virtual-memory entries of a provider that has none: the policy checks supports_virtual() first, so
// reaching one of these is a bug in the caller.
void* Provider::reserve(size_t) { AF_THROW(NotImplemented, "provider '{}' has no virtual memory", name()); }
void Provider::unreserve(void*, size_t) noexcept {}
std::optional<uint64_t> Provider::create_physical() {
  AF_THROW(NotImplemented, "provider '{}' has no virtual memory", name());
}
void Provider::release_physical(uint64_t) noexcept {}
void Provider::map(void*, uint64_t) { AF_THROW(NotImplemented, "provider '{}' has no virtual memory", name()); }
void Provider::unmap(void*) noexcept {}

namespace {
std::atomic<uint64_t> g_host_waits{0};
}  // namespace

void note_host_wait() noexcept { g_host_waits.fetch_add(1, std::memory_order_relaxed); }
uint64_t host_wait_count() noexcept { return g_host_waits.load(std::memory_order_relaxed); }

}  // namespace ampforge::memory
