// libampforge_torch_alloc.so as PyTorch's CUDAPluggableAllocator uses it: loaded with dlopen, its C functions looked
// up by name, run over the fake CUDA runtime (tests/fake_nvml/fake_cudart.c: cudaMalloc is host malloc, never
// touched). Streams are pools, a freed block comes back to the next request of its size and stream, devices are
// separate, an impossible request returns NULL with the reason, and the stats add up.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "ampforge/memory/torch_alloc.h"

namespace {

struct Lib {
  void* h = nullptr;
  decltype(&af_torch_malloc) malloc_fn = nullptr;
  decltype(&af_torch_free) free_fn = nullptr;
  decltype(&af_torch_stats_get) stats = nullptr;
  decltype(&af_torch_stats_json) json = nullptr;
  decltype(&af_torch_last_error) last_error = nullptr;
  decltype(&af_torch_provider) provider = nullptr;
  decltype(&af_torch_empty_cache) empty_cache = nullptr;
};

template <typename F>
void sym(void* h, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(h, name));
  ASSERT_NE(f, nullptr) << name << " is not exported";
}

TEST(TorchAlloc, PluggableAllocatorOverTheFakeCudaRuntime) {
  const std::string path = std::string(AMPFORGE_BINARY_DIR) + "/lib/libampforge_torch_alloc.so";
  setenv("AMPFORGE_CUDART_LIBRARY", AMPFORGE_FAKE_CUDART, 1);
  setenv("AMPFORGE_TORCH_ALLOC_PROVIDER", "cudart", 1);
  setenv("FAKE_CUDART_DEVICES", "2", 1);
  Lib l;
  l.h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(l.h, nullptr) << dlerror() << " (build the target ampforge_torch_alloc)";
  sym(l.h, "af_torch_malloc", l.malloc_fn);
  sym(l.h, "af_torch_free", l.free_fn);
  sym(l.h, "af_torch_stats_get", l.stats);
  sym(l.h, "af_torch_stats_json", l.json);
  sym(l.h, "af_torch_last_error", l.last_error);
  sym(l.h, "af_torch_provider", l.provider);
  sym(l.h, "af_torch_empty_cache", l.empty_cache);
  EXPECT_EQ(dlsym(l.h, "_ZN8ampforge6memory16CachingAllocator4freeEPv"), nullptr) << "only af_torch_* are exported";

  af_torch_stats s{};
  EXPECT_EQ(l.stats(0, &s), -1) << "nothing allocated yet";
  EXPECT_STREQ(l.json(0), "{}");
  void* s1 = reinterpret_cast<void*>(0x1234);
  void* a = l.malloc_fn(1000, 0, nullptr);
  void* b = l.malloc_fn(5 << 20, 0, s1);
  void* c = l.malloc_fn(5 << 20, 1, nullptr);
  ASSERT_NE(a, nullptr) << l.last_error();
  ASSERT_NE(b, nullptr) << l.last_error();
  ASSERT_NE(c, nullptr) << l.last_error();
  EXPECT_STREQ(l.provider(0), "cudart");
  l.free_fn(a, 1000, 0, nullptr);
  EXPECT_EQ(l.malloc_fn(1000, 0, nullptr), a) << "the freed block serves the next request of its size and stream";
  void* d = l.malloc_fn(1000, 0, s1);
  EXPECT_NE(d, a) << "another stream, another pool";
  // An impossible request: NULL and the out-of-memory report, the allocator still usable.
  EXPECT_EQ(l.malloc_fn(size_t{1} << 50, 0, nullptr), nullptr);
  EXPECT_NE(std::string(l.last_error()).find("out of memory"), std::string::npos) << l.last_error();
  ASSERT_EQ(l.stats(0, &s), 0);
  EXPECT_EQ(s.requested, 1000 + (5 << 20) + 1000);
  EXPECT_EQ(s.num_allocs, 4);
  EXPECT_EQ(s.num_frees, 1);
  EXPECT_EQ(s.num_ooms, 1);
  // Plain cudaMalloc segments under the ampforge policy's rules: a 2 MiB small segment per stream, and a 20 MiB one
  // for the 5 MiB request.
  EXPECT_EQ(s.reserved, (2 << 20) + (2 << 20) + (20 << 20));
  const nlohmann::json j = nlohmann::json::parse(l.json(0));
  EXPECT_EQ(j.at("provider"), "cudart");
  EXPECT_EQ(j.at("policy"), "ampforge");
  EXPECT_EQ(j.at("num_allocs"), 4);
  ASSERT_EQ(l.stats(1, &s), 0);
  EXPECT_EQ(s.requested, 5 << 20) << "devices have separate allocators";
  // Everything freed and the cache emptied: nothing reserved.
  l.free_fn(b, 5 << 20, 0, s1);
  l.free_fn(d, 1000, 0, s1);
  l.free_fn(a, 1000, 0, nullptr);
  l.free_fn(c, 5 << 20, 1, nullptr);
  l.empty_cache();
  ASSERT_EQ(l.stats(0, &s), 0);
  EXPECT_EQ(s.reserved, 0);
  EXPECT_EQ(s.requested, 0);
}

}  // namespace
