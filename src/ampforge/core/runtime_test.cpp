// The device runtime interface (core/runtime.h) as the layers above backends/ use it: capabilities per device
// type (the meta device deciding as the type it plans for), device existence checks with the reason, and the
// objects a runtime hands out, refused clearly where the device has none.
#include <gtest/gtest.h>

#include <string>

#include "ampforge/core/runtime.h"
#include "ampforge/memory/global.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"

using namespace ampforge;
using runtime::Capability;

TEST(DeviceRuntime, CapabilitiesAreTheBackendsDeclarations) {
  EXPECT_TRUE(runtime::has_capability(kCPU, Capability::HostMemory));
  EXPECT_TRUE(runtime::has_capability(kCPU, Capability::F64Arithmetic));
  EXPECT_TRUE(runtime::has_capability(kCPU, Capability::FusedBatchNormActivation));
  EXPECT_FALSE(runtime::has_capability(kCPU, Capability::LimitedFusedAttention));
  // CUDA's are declared in every build (a meta device plans for CUDA on a machine without one).
  const Device gpu(DeviceType::CUDA, 0);
  EXPECT_TRUE(runtime::has_capability(gpu, Capability::LimitedFusedAttention));
  EXPECT_FALSE(runtime::has_capability(gpu, Capability::HostMemory));
  EXPECT_FALSE(runtime::has_capability(gpu, Capability::F64Arithmetic));
  EXPECT_FALSE(runtime::has_capability(gpu, Capability::FusedBatchNormActivation));
}

TEST(DeviceRuntime, MetaDecidesAsTheTypeItPlansFor) {
  EXPECT_EQ(runtime::behaves_as(kMeta), DeviceType::CPU) << "outside a planning session: the CPU's rules";
  EXPECT_TRUE(runtime::has_capability(kMeta, Capability::F64Arithmetic));
  {
    const auto plan = runtime::plan_for(DeviceType::CUDA, uint64_t{1} << 30);
    EXPECT_EQ(runtime::behaves_as(kMeta), DeviceType::CUDA);
    EXPECT_TRUE(runtime::has_capability(kMeta, Capability::LimitedFusedAttention));
    EXPECT_FALSE(runtime::has_capability(kMeta, Capability::HostMemory));
    // The session's allocator serves meta tensors with the planned capacity.
    memory::CachingAllocator* a = memory::caching_allocator_for(kMeta);
    ASSERT_NE(a, nullptr);
    EXPECT_THROW(ops::zeros({int64_t{1} << 29}, DType::F32, kMeta), Error) << "2 GiB on a 1 GiB plan";
    EXPECT_FALSE(runtime::has_capability(kCPU, Capability::LimitedFusedAttention)) << "the CPU stays the CPU";
  }
  EXPECT_EQ(runtime::behaves_as(kMeta), DeviceType::CPU) << "the session ended";
  EXPECT_TRUE(runtime::plans_expandable_segments(DeviceType::CPU));
  EXPECT_THROW(runtime::plan_for(DeviceType::Meta), Error) << "meta cannot stand for itself";
  EXPECT_THROW(runtime::device_runtime(DeviceType::CPU).plan_for(DeviceType::CPU, 0), Error)
      << "only the meta device plans";
}

TEST(DeviceRuntime, DevicesThatDoNotExistAreNamedWithTheReason) {
  EXPECT_EQ(runtime::device_runtime(DeviceType::CPU).device_count(), 1);
  EXPECT_EQ(runtime::device_runtime(DeviceType::Meta).device_count(), 1);
  runtime::check_device_exists(kCPU, "--device cpu");
  runtime::check_device_exists(kMeta, "--device meta");
  runtime::DeviceRuntime& gpu = runtime::device_runtime(DeviceType::CUDA);
  const int n = gpu.device_count();
  try {
    runtime::check_device_exists(Device(DeviceType::CUDA, n), "--device cuda:" + std::to_string(n));
    FAIL() << "cuda:" << n << " cannot exist with " << n << " devices";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--device cuda:" + std::to_string(n) + ": no such CUDA device (" + std::to_string(n) +
                        " available"),
              std::string::npos)
        << what;
    if (n == 0) {
      EXPECT_FALSE(gpu.unavailable_reason().empty());
      EXPECT_NE(what.find(gpu.unavailable_reason()), std::string::npos) << what;
    }
  }
  if (n == 0) {
    EXPECT_THROW(gpu.event_timer(0), Error);
    EXPECT_THROW(gpu.graph(0), Error);
    EXPECT_THROW(gpu.uploader(0, 2), Error);
    EXPECT_THROW(gpu.synchronize(0), Error);
  }
}

TEST(DeviceRuntime, TheCpuHasNoDeviceObjectsAndNothingToWaitFor) {
  runtime::DeviceRuntime& cpu = runtime::device_runtime(DeviceType::CPU);
  runtime::synchronize(kCPU);  // synchronous: returns at once
  EXPECT_FALSE(cpu.is_capturing());
  EXPECT_EQ(cpu.compute_stream(0), 0u);
  EXPECT_THROW(cpu.event_timer(0), Error);
  EXPECT_THROW(cpu.graph(0), Error);
  EXPECT_THROW(cpu.uploader(0, 2), Error);
  EXPECT_FALSE(cpu.allow_tf32_products());
  EXPECT_EQ(cpu.precision_note(DType::F32), "") << "nothing to say about fp32";
  EXPECT_EQ(cpu.precision_note(DType::F16), "");
}
