// GPU: a real kernel, a real memcpy and a real memset show up in CUPTI's activity with the right kind,
// bytes, and a launch that maps back to the calling thread. The driver API is loaded with dlopen (nothing
// CUDA is linked); the kernel is PTX JIT-compiled by the driver. Skips without a GPU.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <vector>

#include "ampforge/profiler/activity_file.h"
#include "ampforge/profiler/device.h"
#include "ampforge/profiler/profiler.h"
#include "ampforge/profiler/report.h"
#include "ampforge/util/timer.h"

namespace ampforge::profiler {
namespace {

// out[0] = 7
constexpr const char* kPtx = R"(
.version 7.0
.target sm_52
.address_size 64
.visible .entry af_profiler_test_kernel(.param .u64 out)
{
  .reg .b64 %rd<3>;
  .reg .b32 %r<2>;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, 7;
  st.global.u32 [%rd2], %r1;
  ret;
}
)";

struct Driver {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  template <class F>
  F fn(const char* name) {
    return reinterpret_cast<F>(dlsym(h, name));
  }
};

TEST(ProfilerGpu, KernelMemcpyAndMemsetAreObserved) {
  const CudaPresence cuda = probe_cuda();
  if (!cuda.present) GTEST_SKIP() << cuda.reason;
  const std::string lib = cupti_injection_library();
  ASSERT_FALSE(lib.empty()) << "a GPU is present but the CUPTI injection library was not built";
  void* inj = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(inj, nullptr) << dlerror();
  auto start = reinterpret_cast<int (*)(const char*)>(dlsym(inj, "ampforge_cupti_start"));
  auto stop = reinterpret_cast<int (*)()>(dlsym(inj, "ampforge_cupti_stop"));
  ASSERT_TRUE(start && stop);

  Driver d;
  using CUdevice = int;
  using CUcontext = void*;
  using CUmodule = void*;
  using CUfunction = void*;
  using CUdeviceptr = unsigned long long;
  auto cuDeviceGet = d.fn<int (*)(CUdevice*, int)>("cuDeviceGet");
  auto cuPrimaryCtxRetain = d.fn<int (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain");
  auto cuCtxSetCurrent = d.fn<int (*)(CUcontext)>("cuCtxSetCurrent");
  auto cuMemAlloc = d.fn<int (*)(CUdeviceptr*, size_t)>("cuMemAlloc_v2");
  auto cuMemFree = d.fn<int (*)(CUdeviceptr)>("cuMemFree_v2");
  auto cuMemcpyHtoD = d.fn<int (*)(CUdeviceptr, const void*, size_t)>("cuMemcpyHtoD_v2");
  auto cuMemcpyDtoH = d.fn<int (*)(void*, CUdeviceptr, size_t)>("cuMemcpyDtoH_v2");
  auto cuMemsetD8 = d.fn<int (*)(CUdeviceptr, unsigned char, size_t)>("cuMemsetD8_v2");
  auto cuModuleLoadData = d.fn<int (*)(CUmodule*, const void*)>("cuModuleLoadData");
  auto cuModuleGetFunction = d.fn<int (*)(CUfunction*, CUmodule, const char*)>("cuModuleGetFunction");
  auto cuLaunchKernel = d.fn<int (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     void*, void**, void**)>("cuLaunchKernel");
  auto cuCtxSynchronize = d.fn<int (*)()>("cuCtxSynchronize");
  ASSERT_TRUE(cuDeviceGet && cuPrimaryCtxRetain && cuCtxSetCurrent && cuMemAlloc && cuMemFree && cuMemcpyHtoD &&
              cuMemcpyDtoH && cuMemsetD8 && cuModuleLoadData && cuModuleGetFunction && cuLaunchKernel &&
              cuCtxSynchronize);

  const std::string path = ::testing::TempDir() + "/af_profiler_gpu_activity.txt";
  const int64_t t0 = now_ns();
  ASSERT_EQ(start(path.c_str()), 0);
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuDeviceGet(&dev, 0), 0);
  ASSERT_EQ(cuPrimaryCtxRetain(&ctx, dev), 0);
  ASSERT_EQ(cuCtxSetCurrent(ctx), 0);
  constexpr size_t kBytes = 1 << 20;
  std::vector<unsigned char> host(kBytes, 1);
  CUdeviceptr buf = 0;
  ASSERT_EQ(cuMemAlloc(&buf, kBytes), 0);
  ASSERT_EQ(cuMemcpyHtoD(buf, host.data(), kBytes), 0);
  ASSERT_EQ(cuMemsetD8(buf, 0, kBytes), 0);
  CUmodule mod = nullptr;
  CUfunction f = nullptr;
  ASSERT_EQ(cuModuleLoadData(&mod, kPtx), 0);
  ASSERT_EQ(cuModuleGetFunction(&f, mod, "af_profiler_test_kernel"), 0);
  void* params[] = {&buf};
  ASSERT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr), 0);
  ASSERT_EQ(cuCtxSynchronize(), 0);
  ASSERT_EQ(cuMemcpyDtoH(host.data(), buf, kBytes), 0);
  EXPECT_EQ(host[0], 7);
  cuMemFree(buf);
  ASSERT_EQ(stop(), 0);
  const int64_t t1 = now_ns();

  const ProfileData data = read_activity_file(path);
  EXPECT_TRUE(data.device_observed);
  const DeviceActivity* k = nullptr;
  int64_t htod = 0, dtoh = 0, memset_bytes = 0;
  for (const auto& a : data.activities) {
    if (a.kind == ActivityKind::Kernel && a.name.find("af_profiler_test_kernel") != std::string::npos) k = &a;
    if (a.kind == ActivityKind::Memcpy && a.copy == CopyKind::HtoD) htod += a.bytes;
    if (a.kind == ActivityKind::Memcpy && a.copy == CopyKind::DtoH) dtoh += a.bytes;
    if (a.kind == ActivityKind::Memset) memset_bytes += a.bytes;
  }
  ASSERT_NE(k, nullptr) << "the kernel was not observed";
  EXPECT_EQ(htod, static_cast<int64_t>(kBytes));
  EXPECT_EQ(dtoh, static_cast<int64_t>(kBytes));
  EXPECT_EQ(memset_bytes, static_cast<int64_t>(kBytes));
  // CUPTI's timestamps are on the host ranges' clock.
  EXPECT_GE(k->begin_ns, t0);
  EXPECT_LE(k->end_ns, t1);
  // The launch maps back to this thread's cuLaunchKernel call.
  bool launch = false;
  for (const auto& r : data.ranges)
    launch |= r.kind == RangeKind::CudaApi && r.correlation_id == k->correlation_id && r.tid == current_tid();
  EXPECT_TRUE(launch) << "no API record with the kernel's correlation id on this thread";
  const Report rep = compute_report(data);
  EXPECT_GT(rep.busy_ns, 0);
  EXPECT_EQ(rep.kernels.empty(), false);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ampforge::profiler
