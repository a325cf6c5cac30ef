// Ranges, sessions and the dispatch observer, recorded for real (real threads, real op dispatches).
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/memory/global.h"
#include "ampforge/memory/host_provider.h"
#include "ampforge/ops/ops.h"
#include "ampforge/profiler/device.h"
#include "ampforge/profiler/profiler.h"
#include "ampforge/profiler/report.h"
#include "ampforge/util/error.h"

namespace ampforge::profiler {
namespace {

void profiled_helper() {
  AF_PROFILE_FUNCTION();
  AF_PROFILE_RANGE("inner");
}

const HostRange* find(const ProfileData& d, const std::string& name) {
  for (const auto& r : d.ranges)
    if (r.name == name) return &r;
  return nullptr;
}

TEST(Profiler, RangesNestPerThreadAndOpsAreRecorded) {
  EXPECT_FALSE(recording());
  profiled_helper();  // no session: records nothing
  Session s(SessionOptions{.device = false});
  s.start();
  EXPECT_TRUE(recording());
  profiled_helper();
  Tensor a = ops::full({64}, 1.0), b = ops::full({64}, 2.0);
  {
    AF_PROFILE_RANGE_KIND("forward", Phase);
    Tensor c = add(a, b);
    EXPECT_DOUBLE_EQ(sum(c).item(), 192.0);
  }
  std::thread worker([] {
    set_thread_name("worker");
    AF_PROFILE_RANGE("on worker");
  });
  worker.join();
  counter("allocated", 5.0);
  const ProfileData d = s.stop();
  EXPECT_FALSE(recording());

  const HostRange* fn = find(d, "profiled_helper");
  const HostRange* inner = find(d, "inner");
  ASSERT_NE(fn, nullptr);
  ASSERT_NE(inner, nullptr);
  EXPECT_LE(fn->begin_ns, inner->begin_ns);
  EXPECT_GE(fn->end_ns, inner->end_ns);
  EXPECT_EQ(fn->tid, current_tid());
  const HostRange* op = find(d, "add");
  ASSERT_NE(op, nullptr) << "the dispatch observer did not record the add op";
  EXPECT_EQ(op->kind, RangeKind::Op);
  const HostRange* fwd = find(d, "forward");
  ASSERT_NE(fwd, nullptr);
  EXPECT_LE(fwd->begin_ns, op->begin_ns);
  EXPECT_GE(fwd->end_ns, op->end_ns);
  const HostRange* w = find(d, "on worker");
  ASSERT_NE(w, nullptr);
  EXPECT_NE(w->tid, current_tid());
  EXPECT_EQ(d.thread_names.at(w->tid), "worker");
  EXPECT_EQ(d.thread_names.at(current_tid()), "main");
  ASSERT_EQ(d.windows.size(), 1u);
  EXPECT_GE(d.wall_ns(), fn->duration_ns());
  bool found_counter = false;
  for (const auto& c : d.counters) found_counter |= c.name == "allocated" && c.value == 5.0;
  EXPECT_TRUE(found_counter);
  EXPECT_TRUE(d.memory.valid);
  EXPECT_GT(d.memory.peak_allocated, 0);

  const Report r = compute_report(d);
  EXPECT_GE(r.op_calls, 2);  // add + sum (+ the fills)
  EXPECT_LE(r.op_self_ns, r.wall_ns);
}

TEST(Profiler, PauseStopsRecordingAndWindowsAddUp) {
  Session s(SessionOptions{.device = false});
  s.start();
  { AF_PROFILE_RANGE("first"); }
  s.pause();
  { AF_PROFILE_RANGE("while paused"); }
  s.start();
  { AF_PROFILE_RANGE("second"); }
  const ProfileData d = s.stop();
  EXPECT_NE(find(d, "first"), nullptr);
  EXPECT_NE(find(d, "second"), nullptr);
  EXPECT_EQ(find(d, "while paused"), nullptr);
  ASSERT_EQ(d.windows.size(), 2u);
  EXPECT_LE(d.windows[0].second, d.windows[1].first);
}

TEST(Profiler, OneSessionAtATimeAndFreshBuffers) {
  {
    Session s(SessionOptions{.device = false});
    EXPECT_THROW(Session(SessionOptions{.device = false}), Error);
    s.start();
    { AF_PROFILE_RANGE("old session"); }
  }  // destroyed without stop(): data dropped, observer removed
  Session s(SessionOptions{.device = false});
  s.start();
  const ProfileData d = s.stop();
  EXPECT_EQ(find(d, "old session"), nullptr);
}

// A session that trains on a device samples that device's caching allocator (the one
// memory::caching_allocator_for resolves), not the CPU's: here a host-backed allocator stands in for cuda:3.
memory::CachingAllocator* g_fake_device_allocator = nullptr;
memory::CachingAllocator* fake_resolver(int index) { return index == 3 ? g_fake_device_allocator : nullptr; }

TEST(Profiler, MemorySamplesComeFromTheSessionsDevice) {
  ensure_backends_registered();  // the real CUDA backend (on a GPU machine) registers its resolver first
  memory::SimulatedProvider sim;
  memory::CachingAllocator device_alloc(sim, memory::PolicyConfig::ampforge());
  g_fake_device_allocator = &device_alloc;
  const memory::CachingAllocatorResolver previous =
      memory::set_caching_allocator_resolver(DeviceType::CUDA, fake_resolver);
  ProfileData d;
  {
    Session s(SessionOptions{.device = false, .memory_device = Device(DeviceType::CUDA, 3)});
    s.start();
    void* p = device_alloc.allocate_on(3 << 20, 0);  // 3 MiB on the "device"
    sample_memory();
    device_alloc.free(p);
    d = s.stop();
  }
  memory::set_caching_allocator_resolver(DeviceType::CUDA, previous);
  g_fake_device_allocator = nullptr;
  bool allocated = false, reserved = false;
  for (const auto& c : d.counters) {
    allocated |= c.name == "allocated" && c.value == static_cast<double>(3 << 20);
    reserved |= c.name == "reserved" && c.value == static_cast<double>(4 << 20);  // two 2 MiB granules
  }
  EXPECT_TRUE(allocated) << "the device allocator's live bytes were sampled";
  EXPECT_TRUE(reserved);
  EXPECT_TRUE(d.memory.valid);
  EXPECT_EQ(d.memory.source, "caching allocator, cuda:3");
  EXPECT_EQ(d.memory.peak_allocated, 3 << 20);
  EXPECT_EQ(d.memory.peak_reserved, 4 << 20);
}

// "The injection library builds whenever CUDA is present": with CUPTI's header in the toolkit, the build
// must have produced the library, and it must export the entry points.
TEST(Profiler, CuptiInjectionLibraryBuiltWhenCudaIsPresent) {
  struct stat st {};
  [[maybe_unused]] const bool cupti_headers = ::stat("/usr/local/cuda/include/cupti.h", &st) == 0;
#ifdef AMPFORGE_CUPTI_INJECTION
  void* h = dlopen(AMPFORGE_CUPTI_INJECTION, RTLD_LAZY | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  EXPECT_NE(dlsym(h, "InitializeInjection"), nullptr);
  EXPECT_NE(dlsym(h, "ampforge_cupti_start"), nullptr);
  EXPECT_NE(dlsym(h, "ampforge_cupti_stop"), nullptr);
  EXPECT_EQ(cupti_injection_library(), AMPFORGE_CUPTI_INJECTION);
  // Not dlclose()d: libcupti brings its own copy of libstdc++, whose 72 KiB emergency exception pool
  // LeakSanitizer reports as leaked once the library is unloaded (seen in the -DAMPFORGE_SANITIZE=ON run).
  (void)h;
#else
  EXPECT_FALSE(cupti_headers) << "CUPTI headers are installed but the injection library was not built";
  GTEST_SKIP() << "no CUDA toolkit with CUPTI at build time";
#endif
}

// Where the injection library is looked for: an installation's lib/ (relative to the program, so that an
// installed bin/ampforge finds the installed library wherever the prefix is) before this build tree's path;
// $AMPFORGE_CUPTI_INJECTION first of all, and returned even when the file does not exist.
TEST(Profiler, CuptiInjectionSearchOrder) {
  const char* saved = std::getenv("AMPFORGE_CUPTI_INJECTION");
  const std::string saved_value = saved != nullptr ? saved : "";
  ::unsetenv("AMPFORGE_CUPTI_INJECTION");
  const std::vector<std::string> c = cupti_injection_candidates();
#ifdef AMPFORGE_CUPTI_INJECTION
  namespace fs = std::filesystem;
  const fs::path built = AMPFORGE_CUPTI_INJECTION;
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  auto index = [&c](const fs::path& p) {
    return std::find(c.begin(), c.end(), p.lexically_normal().string()) - c.begin();
  };
  const auto n = static_cast<std::ptrdiff_t>(c.size());
  const std::ptrdiff_t in_build = index(built), beside_program = index(exe.parent_path() / ".." / "lib" / built.filename());
  EXPECT_LT(in_build, n) << "the build tree's library is a candidate";
  EXPECT_LT(beside_program, n) << "<program>/../lib is a candidate";
  // Program-relative before the build tree (equal here: this test binary sits in <build>/tests/, so
  // <exe>/../lib is the build's lib/ and the two are one entry).
  EXPECT_LE(beside_program, in_build);
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    EXPECT_EQ(fs::path(c[i]).filename(), built.filename()) << c[i];
    EXPECT_TRUE(fs::path(c[i]).is_absolute()) << c[i];
  }
#else
  EXPECT_TRUE(c.empty());
#endif
  ::setenv("AMPFORGE_CUPTI_INJECTION", "/nonexistent/libinjection.so", 1);
  const std::vector<std::string> with_env = cupti_injection_candidates();
  const std::string chosen = cupti_injection_library();
  if (saved != nullptr)
    ::setenv("AMPFORGE_CUPTI_INJECTION", saved_value.c_str(), 1);
  else
    ::unsetenv("AMPFORGE_CUPTI_INJECTION");
  ASSERT_FALSE(with_env.empty());
  EXPECT_EQ(with_env.front(), "/nonexistent/libinjection.so");
  EXPECT_EQ(chosen, "/nonexistent/libinjection.so");
}

}  // namespace
}  // namespace ampforge::profiler
