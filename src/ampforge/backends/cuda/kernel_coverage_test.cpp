// Every op a training step of the brief's model families dispatches has a CUDA kernel: a model that reaches an
// op without one would fail on a GPU with NotImplemented, after the build and the data, where CI cannot see it
// (no GPU there). Runs without a GPU: the CUDA kernels are registered without a device (registration only
// stores function pointers). What it checks is the CPU step's op list; where the ops layer routes a CUDA step
// differently (the CPU's fused block ends), the GPU tests cover those ops.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/train/benchmark.h"
#include "ampforge/train/workload.h"

using namespace ampforge;

namespace {

std::map<OpId, int64_t>& seen_ops() {
  static std::map<OpId, int64_t> seen;
  return seen;
}

void* count_op(OpId op, const KernelArgs&) {
  ++seen_ops()[op];
  return nullptr;
}
void end_op(void*) {}

// The CUDA backend's kernels, registered here when no device did it at start-up.
void register_cuda_kernels() {
  ensure_backends_registered();
  if (!cuda::is_available()) cuda::register_kernels_cuda();  // else register_cuda_backend() has
}

}  // namespace

TEST(CudaKernelCoverage, EveryOpOfATrainingStepOfEachModelFamilyHasACudaKernel) {
  register_cuda_kernels();
  ASSERT_TRUE(has_kernel(OpId::conv2d, DeviceType::CUDA)) << "cuDNN missing from this build: no CUDA convolutions";
  static const DispatchObserver observer{count_op, end_op};
  // One model per family (ResNeXt: bottlenecks and grouped convolutions, as ResNet-50's; BERT-Tiny: BERT-base's
  // ops), small inputs; fp16 adds the GradScaler's ops.
  for (const std::string model : {"cnn", "resnet-small", "resnext50_32x4d", "yolov8n", "bert-tiny"})
    for (const char* precision : {"fp32", "fp16", "bf16"}) {
      train::WorkloadOptions wo;
      wo.batch = 2;
      wo.seq_len = 16;
      if (model == "resnext50_32x4d") wo.image_size = 64;
      if (model == "yolov8n") wo.image_size = 96;
      train::Workload w = train::make_workload(model, wo);
      train::BenchmarkOptions bo;
      bo.precision = train::bench_precision_from_string(precision);
      bo.warmup = 0;
      bo.steps = 1;
      seen_ops().clear();
      set_dispatch_observer(&observer);
      train::benchmark_training(w, bo);
      set_dispatch_observer(nullptr);
      EXPECT_GT(seen_ops().size(), 10u) << model << " " << precision << ": the observer saw the step";
      for (const auto& [op, n] : seen_ops())
        EXPECT_TRUE(has_kernel(op, DeviceType::CUDA))
            << model << " " << precision << ": " << op_name(op) << " (" << n << " calls) has no CUDA kernel";
    }
}
