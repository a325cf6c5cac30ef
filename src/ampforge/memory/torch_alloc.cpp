// libampforge_torch_alloc.so (torch_alloc.h): one ampforge CachingAllocator per device behind the two C functions
// PyTorch's CUDAPluggableAllocator calls. Built as its own shared library from the memory sources it needs (compiled
// position-independent; src/CMakeLists.txt, the block at the end), so it carries no training code.
#include "ampforge/memory/torch_alloc.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/cuda_provider.h"
#include "ampforge/memory/stats.h"
#include "ampforge/util/error.h"

namespace {

using namespace ampforge;
using namespace ampforge::memory;

// cudaMalloc/cudaFree of the CUDA runtime, loaded with dlopen: the copy PyTorch already loaded when there is one
// (RTLD_NOLOAD), else AMPFORGE_CUDART_LIBRARY, else the usual sonames.
class CudartProvider final : public Provider {
 public:
  explicit CudartProvider(int device) : device_(device) {
    // AMPFORGE_CUDART_LIBRARY, when set, is the only one tried; else the copy already loaded (PyTorch's), else the
    // usual sonames.
    const char* env = std::getenv("AMPFORGE_CUDART_LIBRARY");
    std::vector<std::string> names;
    if (env != nullptr && *env != '\0') names.push_back(env);
    else names = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    for (const std::string& n : names)
      if ((lib_ = dlopen(n.c_str(), RTLD_NOW | RTLD_NOLOAD)) != nullptr) break;
    for (size_t i = 0; lib_ == nullptr && i < names.size(); ++i) lib_ = dlopen(names[i].c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) AF_THROW(NotImplemented, "no CUDA runtime: could not load {} (set AMPFORGE_CUDART_LIBRARY)", names[0]);
    malloc_ = reinterpret_cast<int (*)(void**, size_t)>(dlsym(lib_, "cudaMalloc"));
    free_ = reinterpret_cast<int (*)(void*)>(dlsym(lib_, "cudaFree"));
    set_device_ = reinterpret_cast<int (*)(int)>(dlsym(lib_, "cudaSetDevice"));
    get_device_ = reinterpret_cast<int (*)(int*)>(dlsym(lib_, "cudaGetDevice"));
    mem_info_ = reinterpret_cast<int (*)(size_t*, size_t*)>(dlsym(lib_, "cudaMemGetInfo"));
    get_last_error_ = reinterpret_cast<int (*)()>(dlsym(lib_, "cudaGetLastError"));
    if (malloc_ == nullptr || free_ == nullptr || set_device_ == nullptr)
      AF_THROW(NotImplemented, "the CUDA runtime lacks cudaMalloc, cudaFree or cudaSetDevice");
    DeviceScope scope(*this);
    if (mem_info_ != nullptr) {
      size_t free_bytes = 0, total = 0;
      if (mem_info_(&free_bytes, &total) == 0) total_ = total;
    }
  }
  const char* name() const override { return "cudart"; }
  Device device() const override { return Device(DeviceType::CUDA, device_); }
  size_t granularity() const override { return 512; }
  size_t capacity() const override { return total_; }
  void* allocate(size_t bytes) override {
    DeviceScope scope(*this);
    void* p = nullptr;
    if (malloc_(&p, bytes) != 0) {
      // Out of memory is not sticky; clear it so that PyTorch's next runtime call does not see it.
      if (get_last_error_ != nullptr) (void)get_last_error_();
      return nullptr;
    }
    return p;
  }
  void deallocate(void* ptr, size_t) noexcept override {
    DeviceScope scope(*this);
    (void)free_(ptr);
  }

 private:
  // The caller's current device is restored afterwards (PyTorch calls with its device guard set).
  struct DeviceScope {
    explicit DeviceScope(CudartProvider& p) : p_(p) {
      if (p_.get_device_ == nullptr || p_.get_device_(&previous_) != 0) previous_ = -1;
      if (previous_ != p_.device_) (void)p_.set_device_(p_.device_);
    }
    ~DeviceScope() {
      if (previous_ >= 0 && previous_ != p_.device_) (void)p_.set_device_(previous_);
    }
    CudartProvider& p_;
    int previous_ = -1;
  };
  int device_;
  void* lib_ = nullptr;
  size_t total_ = 0;
  int (*malloc_)(void**, size_t) = nullptr;
  int (*free_)(void*) = nullptr;
  int (*set_device_)(int) = nullptr;
  int (*get_device_)(int*) = nullptr;
  int (*mem_info_)(size_t*, size_t*) = nullptr;
  int (*get_last_error_)() = nullptr;
};

struct DeviceAllocator {
  std::unique_ptr<Provider> provider;
  std::unique_ptr<StreamEvents> events;
  std::unique_ptr<CachingAllocator> alloc;
  std::string provider_name;
};

constexpr int kMaxDevices = 64;
std::mutex g_mu;
DeviceAllocator* g_devices[kMaxDevices] = {};  // created once, never destroyed (PyTorch frees at exit in any order)
thread_local std::string t_error;
thread_local std::string t_json;

DeviceAllocator* get(int device, bool create) {
  if (device < 0 || device >= kMaxDevices) AF_THROW(InvalidArgument, "device {} out of range (0 to {})", device, kMaxDevices - 1);
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceAllocator* d = g_devices[device];
  if (d != nullptr || !create) return d;
  auto n = std::make_unique<DeviceAllocator>();
  const char* want = std::getenv("AMPFORGE_TORCH_ALLOC_PROVIDER");
  const bool cudart_only = want != nullptr && std::string(want) == "cudart";
  if (!cudart_only) {
    try {
      n->provider = std::make_unique<CudaVmmProvider>(device);
      n->events = std::make_unique<CudaStreamEvents>(device);
      n->provider_name = "vmm";
    } catch (const std::exception&) {
      n->provider.reset();
      n->events.reset();
    }
  }
  if (n->provider == nullptr) {
    n->provider = std::make_unique<CudartProvider>(device);
    n->provider_name = "cudart";
  }
  n->alloc = std::make_unique<CachingAllocator>(*n->provider, PolicyConfig::ampforge(), n->events.get());
  g_devices[device] = n.release();
  return g_devices[device];
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* af_torch_malloc(size_t size, int device, void* stream) {
  try {
    t_error.clear();
    return get(device, true)->alloc->allocate_on(size, reinterpret_cast<uintptr_t>(stream));
  } catch (const std::exception& e) {
    t_error = e.what();
    return nullptr;
  }
}

__attribute__((visibility("default"))) void af_torch_free(void* ptr, size_t, int device, void*) {
  try {
    if (DeviceAllocator* d = get(device, false)) d->alloc->free(ptr);
  } catch (const std::exception& e) {
    t_error = e.what();
  }
}

__attribute__((visibility("default"))) int af_torch_stats_get(int device, af_torch_stats* out) {
  try {
    DeviceAllocator* d = get(device, false);
    if (d == nullptr || out == nullptr) return -1;
    const AllocatorStats s = d->alloc->stats();
    *out = {s.requested.current, s.requested.peak, s.allocated.current, s.allocated.peak, s.reserved.current,
            s.reserved.peak,     s.largest_free_block, s.fragmentation, s.num_allocs, s.num_frees,
            s.num_ooms,          s.provider_calls, s.cache_hits};
    return 0;
  } catch (const std::exception& e) {
    t_error = e.what();
    return -1;
  }
}

__attribute__((visibility("default"))) const char* af_torch_stats_json(int device) {
  try {
    DeviceAllocator* d = get(device, false);
    if (d == nullptr) {
      t_json = "{}";
    } else {
      nlohmann::json j = stats_to_json(d->alloc->stats());
      j["provider"] = d->provider_name;
      j["device"] = device;
      j["policy"] = d->alloc->config().name;
      j["expandable_segments"] = d->alloc->uses_expandable_segments();
      t_json = j.dump();
    }
  } catch (const std::exception& e) {
    t_json = "{}";
    t_error = e.what();
  }
  return t_json.c_str();
}

__attribute__((visibility("default"))) void af_torch_empty_cache(void) {
  for (int i = 0; i < kMaxDevices; ++i) {
    DeviceAllocator* d = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      d = g_devices[i];
    }
    if (d == nullptr) continue;
    try {
      d->alloc->empty_cache();
    } catch (const std::exception& e) {
      t_error = e.what();
    }
  }
}

__attribute__((visibility("default"))) const char* af_torch_last_error(void) { return t_error.c_str(); }

__attribute__((visibility("default"))) const char* af_torch_provider(int device) {
  try {
    DeviceAllocator* d = get(device, false);
    return d == nullptr ? "" : d->provider_name.c_str();
  } catch (const std::exception&) {
    return "";
  }
}

}  // extern "C"
