// The meta device (backends/meta/meta.h): tensors without data, kernels that compute nothing, allocations that
// follow the device it stands for.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include "ampforge/autograd/functions.h"
#include "ampforge/backends/meta/cuda_scratch.h"
#include "ampforge/backends/meta/meta.h"
#include "ampforge/memory/global.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"

namespace ampforge {
namespace {

ErrorKind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no error was raised";
  return ErrorKind::Internal;
}

TEST(MetaDevice, ParsesPrintsAndHasAKernelForEveryOp) {
  EXPECT_EQ(Device::parse("meta"), kMeta);
  EXPECT_EQ(kMeta.str(), "meta");
  EXPECT_TRUE(kMeta.is_meta());
  for (int i = 0; i < kNumOps; ++i)
    EXPECT_TRUE(has_kernel(static_cast<OpId>(i), DeviceType::Meta)) << op_name(static_cast<OpId>(i));
}

TEST(MetaDevice, TensorsHaveShapesAndSizesButNoData) {
  meta::MetaSession session(meta::MetaOptions::stand_for(DeviceType::CPU));
  const Tensor cpu = ops::randn({2, 3, 4, 5}).contiguous(MemoryFormat::ChannelsLast);
  const Tensor m = cpu.to(kMeta);
  EXPECT_EQ(m.device(), kMeta);
  EXPECT_EQ(m.shape(), cpu.shape());
  EXPECT_EQ(m.strides(), cpu.strides());  // the layout travels
  EXPECT_EQ(m.storage()->nbytes(), cpu.storage()->nbytes());
  EXPECT_EQ(session.allocator().stats().requested.current, static_cast<int64_t>(cpu.nbytes()));
  // Nothing can read it: no pointer, no copy back, no item.
  EXPECT_EQ(kind_of([&] { (void)m.data_ptr(); }), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind_of([&] { (void)m.to(kCPU); }), ErrorKind::NotImplemented);
  EXPECT_EQ(kind_of([&] { (void)ops::sum(m).item(); }), ErrorKind::NotImplemented);
  EXPECT_EQ(kind_of([&] { (void)m.tolist<float>(); }), ErrorKind::NotImplemented);
  EXPECT_NE(m.str().find("device=meta"), std::string::npos);
}

TEST(MetaDevice, OpsAllocateTheirOutputsAndComputeNothing) {
  meta::MetaSession session(meta::MetaOptions::stand_for(DeviceType::CPU));
  memory::CachingAllocator& a = session.allocator();
  {
    Tensor w = ops::zeros({64, 3, 7, 7}, DType::F32, kMeta);
    w.requires_grad_();
    const Tensor x = ops::randn({8, 3, 64, 64}, DType::F32, kMeta).contiguous(MemoryFormat::ChannelsLast);
    Conv2dAttrs at;
    at.stride[0] = at.stride[1] = 2;
    at.padding[0] = at.padding[1] = 3;
    const int64_t before = a.stats().requested.current;
    Tensor y = conv2d(x, w, Tensor(), at);
    EXPECT_EQ(y.shape(), (Shape{8, 64, 32, 32}));
    EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast));
    EXPECT_EQ(a.stats().requested.current - before, 8 * 64 * 32 * 32 * 4);
    sum(relu(y)).backward();
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(w.grad().device(), kMeta);
    EXPECT_EQ(w.grad().shape(), w.shape());
  }
  EXPECT_EQ(a.stats().allocated.current, 0);  // everything went back
}

TEST(MetaDevice, CapacityIsABudget) {
  meta::MetaSession session(meta::MetaOptions::stand_for(DeviceType::CUDA, uint64_t{64} << 20));
  const Tensor small = Tensor::empty({1 << 20}, DType::F32, kMeta);  // 4 MiB
  EXPECT_EQ(kind_of([&] { (void)Tensor::empty({int64_t{1} << 25}, DType::F32, kMeta); }),  // 128 MiB
            ErrorKind::OutOfMemory);
  // Memory planning at any size costs nothing: 1 TiB on an unlimited meta device.
  meta::MetaSession big(meta::MetaOptions::stand_for(DeviceType::CPU));
  const Tensor huge = Tensor::empty({int64_t{1} << 38}, DType::F32, kMeta);
  EXPECT_EQ(big.allocator().stats().allocated.current, int64_t{1} << 40);
}

TEST(MetaDevice, StandsForCudaWithItsAllocatorRulesAndKernelScratch) {
  meta::MetaOptions o = meta::MetaOptions::stand_for(DeviceType::CUDA);
  o.expandable_segments = false;  // cudaMalloc, the CUDA backend's default
  {
    meta::MetaSession session(o);
    EXPECT_EQ(meta::target(), DeviceType::CUDA);
    EXPECT_FALSE(session.allocator().uses_expandable_segments());
    const Tensor a = ops::zeros({64, 32}, DType::F32, kMeta), b = ops::zeros({32, 16}, DType::F32, kMeta);
    const int64_t before = session.allocator().stats().allocated.current;
    const Tensor c = ops::matmul(a, b);
    // The output, and the cuBLASLt workspace the first product keeps for good.
    EXPECT_EQ(session.allocator().stats().allocated.current - before,
              static_cast<int64_t>(meta::kCublasLtWorkspaceBytes) + 64 * 16 * 4);
    (void)ops::matmul(a, b);
    EXPECT_EQ(session.allocator().stats().allocated.current - before,
              static_cast<int64_t>(meta::kCublasLtWorkspaceBytes) + 64 * 16 * 4);
    // A convolution's workspace lives only during the call: its peak shows it.
    const Tensor x = ops::zeros({4, 64, 16, 16}, DType::F32, kMeta), w = ops::zeros({64, 64, 3, 3}, DType::F32, kMeta);
    session.allocator().reset_peak_stats();
    const int64_t base = session.allocator().stats().allocated.current;
    Conv2dAttrs at;
    at.padding[0] = at.padding[1] = 1;
    const Tensor y = ops::conv2d(x, w, Tensor(), at);
    const int64_t ws = static_cast<int64_t>(meta::cuda_scratch::cudnn_workspace_estimate(0, w.shape(), at));
    EXPECT_EQ(ws, 64 * 64 * 9 * 4);
    EXPECT_EQ(session.allocator().stats().allocated.peak - base, 4 * 64 * 16 * 16 * 4 + ws);
    EXPECT_EQ(session.allocator().stats().allocated.current - base, 4 * 64 * 16 * 16 * 4);
  }
  EXPECT_EQ(meta::target(), DeviceType::CPU);  // the session is over
  // Standing for the CPU, the same product takes only its output: CPU kernels use no allocator scratch.
  meta::MetaSession cpu(meta::MetaOptions::stand_for(DeviceType::CPU));
  EXPECT_TRUE(cpu.allocator().uses_expandable_segments());
  const Tensor a = ops::zeros({64, 32}, DType::F32, kMeta), b = ops::zeros({32, 16}, DType::F32, kMeta);
  const int64_t before = cpu.allocator().stats().allocated.current;
  const Tensor c = ops::matmul(a, b);
  EXPECT_EQ(cpu.allocator().stats().allocated.current - before, 64 * 16 * 4);
}

TEST(MetaDevice, MemoryStatsAreReachableByDevice) {
  meta::MetaSession session(meta::MetaOptions::stand_for(DeviceType::CPU));
  const Tensor t = Tensor::empty({1000}, DType::F32, kMeta);
  const auto st = memory::allocator_stats(kMeta);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->requested.current, 4000);
}

TEST(MetaDevice, RefusesToStandForItself) {
  EXPECT_EQ(kind_of([] { (void)meta::MetaOptions::stand_for(DeviceType::Meta); }), ErrorKind::InvalidArgument);
}

}  // namespace
}  // namespace ampforge
