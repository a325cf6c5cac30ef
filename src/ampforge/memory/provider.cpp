#include "ampforge/memory/provider.h"

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

}  // namespace ampforge::memory
