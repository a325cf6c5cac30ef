// GPU: a real kernel, a real memcpy and a real memset show up in CUPTI's activity with the right kind,
// bytes, and a launch that maps back to the calling thread. The driver API is loaded with dlopen (nothing
// CUDA is linked); the kernel is PTX JIT-compiled by the driver. Then the two ways the project collects:
// a Session in a process whose CUDA context already exists (train --profile on CUDA), and `ampforge profile`
// (the driver loads the injection library during the child's cuInit). Skips without a GPU.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/cli/cli_test_util.h"
#include "ampforge/ops/ops.h"
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

// The in-process path of `train --profile` on CUDA: CUPTI attaches to a context that already ran work, and
// the backend's kernels (launched through the runtime API) map back to the ops that launched them.
TEST(ProfilerGpu, SessionMapsTheBackendsKernelsToTheirOps) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  ASSERT_FALSE(cupti_injection_library().empty()) << "a GPU is present but the CUPTI injection library was not built";
  const Device dev(DeviceType::CUDA, 0);
  const Tensor x = ops::to_device(ops::arange(0, 4096, 1, DType::F32), dev);  // the context exists before
  cuda::synchronize(0);
  SessionOptions o;
  o.memory_device = dev;
  Session session(o);
  session.start();
  const Tensor y = ops::add_scalar(ops::mul_scalar(x, 2.0), 1.0);
  cuda::synchronize(0);  // every kernel complete before CUPTI's final flush
  const ProfileData data = session.stop();
  EXPECT_TRUE(data.device_observed) << data.device_note;
  EXPECT_EQ(ops::to_device(y, kCPU).tolist<float>()[4095], 8191.0f);
  const Report rep = compute_report(data);
  ASSERT_FALSE(rep.kernels.empty()) << "no kernel observed; note: " << data.device_note;
  std::set<std::string> ops_seen;
  for (const TimeStat& op : rep.ops) ops_seen.insert(op.name);
  int mapped = 0;
  for (const TimeStat& k : rep.kernels) {
    if (k.op.empty()) continue;
    ++mapped;
    EXPECT_TRUE(ops_seen.count(k.op)) << "kernel " << k.name << " mapped to op " << k.op << ", not a recorded op";
  }
  EXPECT_GT(mapped, 0) << "no kernel maps back to the op that launched it";
  EXPECT_GT(rep.busy_ns, 0);
}

// `ampforge profile -- ampforge train --device cuda --profile`: the driver loads the injection library in
// the child's cuInit (CUDA_INJECTION64_PATH), the file is completed at the child's exit (atexit), and the
// child's host ranges are merged, so kernels map to ops.
TEST(ProfilerGpu, ProfileCommandObservesAChildsCudaTraining) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  ASSERT_FALSE(cupti_injection_library().empty()) << "a GPU is present but the CUPTI injection library was not built";
  const std::string bin = std::string(AMPFORGE_BINARY_DIR) + "/bin/ampforge";
  ASSERT_EQ(::access(bin.c_str(), X_OK), 0) << bin << " was not built (the ampforge target)";
  const std::string dir = ::testing::TempDir();
  const std::string out = dir + "/af_prof_gpu_child.out", err = dir + "/af_prof_gpu_child.err";
  const std::string cmd = bin + " profile --json -- " + bin +
                          " train --device cuda --dataset synthetic --synthetic-size 256 --batch 32 --epochs 1"
                          " --max-steps 4 --no-progress --profile >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  const std::string o = cli::testing::read_text(out), e = cli::testing::read_text(err);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << e;
  const nlohmann::json j = nlohmann::json::parse(o);  // the child prints nothing on stdout
  EXPECT_EQ(j["exit_code"], 0);
  const nlohmann::json& d = j["device"];
  ASSERT_TRUE(d["observed"].get<bool>()) << d.dump() << "\n" << e;
  ASSERT_FALSE(d["kernels"].empty()) << d.dump() << "\n" << e;
  int mapped = 0;
  for (const auto& k : d["kernels"]) mapped += !k.value("op", std::string()).empty();
  EXPECT_GT(mapped, 0) << "no kernel maps back to an op of the child: " << d["kernels"].dump();
  EXPECT_GT(j["op_calls"].get<int64_t>(), 0);
  EXPECT_GT(d["busy_ns"].get<int64_t>(), 0);
  std::remove(out.c_str());
  std::remove(err.c_str());
}

}  // namespace
}  // namespace ampforge::profiler
