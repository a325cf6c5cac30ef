// The parity harness on CUDA (label `gpu`, binary ampforge_cuda_parity). For every case of the sample
// registry (registry.h) and each of F32/F16/BF16: the case runs on the CPU and on cuda:0 from the same
// logical input values (layouts applied on each device), and the CUDA outputs and input gradients must
// match the CPU's within the tolerance table (core/tolerance.h): both sides are implementations computing
// in that dtype, the situation the table's factors were derived for.
//
// Without a CUDA device every case skips. Everything else is a finding:
//   - the CPU reference failing in a dtype (F32, F16, BF16: the CPU computes every float dtype) fails the case
//     with the CPU's error (it used to be skipped silently);
//   - NotImplemented from a registered CUDA kernel (a dtype, layout or shape it refuses but the CPU computes)
//     fails: only an op with no CUDA kernel registered at all (dispatch's error, e.g. conv2d in a build
//     without cuDNN, which `ampforge info` reports) makes the case skip, naming the op;
//   - any other error, or a mismatch, fails.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "ampforge/autograd/node.h"
#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/ops/ops.h"
#include "registry.h"

using namespace ampforge;

namespace {

const Device kCuda0{DeviceType::CUDA, 0};

std::vector<std::string> case_names() {
  std::vector<std::string> n;
  for (const auto& c : parity::cases()) n.push_back(c.name);
  return n;
}

std::string param_name(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

void expect_close(const Tensor& cuda, const Tensor& cpu, DType dtype, const std::string& what) {
  ASSERT_EQ(cuda.shape(), cpu.shape()) << what << ": shape differs from the CPU's";
  EXPECT_EQ(cuda.dtype(), cpu.dtype()) << what << ": dtype differs from the CPU's";
  EXPECT_TRUE(cuda.device().is_cuda()) << what << ": the result is not on the CUDA device";
  const ToleranceEntry tol = tolerance(dtype);
  const std::vector<double> a = ops::to_dtype(ops::to_device(cuda.detach(), kCPU), DType::F64).tolist<double>();
  const std::vector<double> e = ops::to_dtype(cpu.detach(), DType::F64).tolist<double>();
  const CloseResult r = tolerance_close(
      static_cast<int64_t>(a.size()), [&](int64_t i) { return a[i]; }, [&](int64_t i) { return e[i]; }, tol.rtol,
      tol.atol);
  if (std::getenv("AMPFORGE_PARITY_VERBOSE"))
    std::printf("cuda-parity-ratio %s %s max_ratio %.4g max_abs_err %.3g\n", dtype_name(dtype).data(), what.c_str(),
                r.max_ratio, r.max_abs_err);
  EXPECT_TRUE(r.ok) << what << ": " << r.mismatches << " of " << a.size() << " elements differ from the CPU beyond "
                    << dtype_name(dtype) << " tolerance; worst element " << r.worst << ": cuda " << r.actual_at_worst
                    << ", cpu " << r.expected_at_worst << " (" << r.max_ratio << "x the tolerance)";
}

struct CaseRun {
  std::vector<Tensor> outs, grads;
  std::vector<size_t> grad_index;
};

CaseRun run_case(const parity::Case& c, const std::vector<Tensor>& values, DType dt, Device dev) {
  CaseRun r;
  std::vector<Tensor> ins = parity::prepare_inputs(c, values, dt, dev);
  r.outs = c.fn(ins, c.attrs);
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < ins.size(); ++i)
    if (c.inputs[i].requires_grad) leaves.push_back(ins[i]), r.grad_index.push_back(i);
  if (leaves.empty()) return r;
  Tensor go = ops::to_device(ops::to_dtype(parity::generate_grad_output(c, r.outs[0].shape()), r.outs[0].dtype()), dev);
  r.grads = autograd::grad({r.outs[0]}, leaves, {go});
  return r;
}

// The op named by dispatch's "no kernel for this device" error when that op really has no CUDA kernel
// registered; nullopt for every other error (a registered kernel's NotImplemented is a finding).
std::optional<std::string> unregistered_cuda_op(const std::string& what) {
  for (int i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    if (has_kernel(op, DeviceType::CUDA)) continue;
    if (what.find(std::string("op '") + op_name(op) + "' has no kernel for device cuda") != std::string::npos)
      return std::string(op_name(op));
  }
  return std::nullopt;
}

class CudaParity : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(CudaParity, MatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  // F32 is compared at the F32 row of the tolerance table: cuDNN's TF32 convolutions (on by default, as in
  // PyTorch) round inputs to 10 mantissa bits and would exceed it. conv_gpu_test.cpp covers TF32 itself.
  // Matmul's TF32 is off by default but AMPFORGE_ALLOW_TF32=1 in the environment turns it on: off here too.
  cuda::set_cudnn_allow_tf32(false);
  cuda::set_allow_tf32(false);
  const parity::Case& c = *parity::find_case(GetParam());
  const std::vector<Tensor> values = parity::generate_inputs(c);
  int compared = 0;
  std::string not_on_cuda;
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const std::string dn(dtype_name(dt));
    SCOPED_TRACE(c.name + " in " + dn);
    CaseRun cpu;
    try {
      cpu = run_case(c, values, dt, kCPU);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << " (" << c.op << "): the CPU reference fails in " << dn
                    << ", so CUDA cannot be compared: " << e.what();
      continue;
    }
    CaseRun gpu;
    try {
      gpu = run_case(c, values, dt, kCuda0);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::NotImplemented) {
        if (const auto op = unregistered_cuda_op(e.what())) {
          not_on_cuda = "op '" + *op + "' has no CUDA kernel in this build: " + e.what();
          continue;
        }
        ADD_FAILURE() << c.name << " (" << c.op << ") is not implemented on CUDA in " << dn
                      << " although its kernels are registered and the CPU computes it: " << e.what();
        continue;
      }
      ADD_FAILURE() << c.name << " (" << c.op << ") fails on CUDA in " << dn << ": " << e.what();
      continue;
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << " (" << c.op << ") fails on CUDA in " << dn << " (not an ampforge::Error): " << e.what();
      continue;
    }
    ++compared;
    ASSERT_EQ(gpu.outs.size(), cpu.outs.size());
    for (size_t k = 0; k < cpu.outs.size(); ++k)
      expect_close(gpu.outs[k], cpu.outs[k], dt, c.name + " output " + std::to_string(k) + " (" + dn + ")");
    ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
    for (size_t j = 0; j < cpu.grads.size(); ++j) {
      if (!cpu.grads[j].defined() && !gpu.grads[j].defined()) continue;
      ASSERT_TRUE(cpu.grads[j].defined() && gpu.grads[j].defined()) << "gradient " << j << " defined on one side only";
      expect_close(gpu.grads[j], cpu.grads[j], dt,
                   c.name + " gradient of input " + std::to_string(cpu.grad_index[j]) + " (" + dn + ")");
    }
  }
  if (compared == 0 && !not_on_cuda.empty()) GTEST_SKIP() << "not on CUDA in this build: " << not_on_cuda;
}

// The classification above, checked without a GPU: dispatch's error for an op that has no CUDA kernel is
// recognised (and only then), whatever else a message says.
TEST(CudaParityRules, OnlyUnregisteredOpsMaySkip) {
  ensure_backends_registered();
  std::optional<OpId> missing;
  for (int i = 0; i < kNumOps && !missing; ++i)
    if (!has_kernel(static_cast<OpId>(i), DeviceType::CUDA)) missing = static_cast<OpId>(i);
  if (missing) {
    // Without a GPU no CUDA kernel is registered: dispatching any op there gives the error to recognise.
    std::string what;
    try {
      dispatch(*missing, Device(DeviceType::CUDA, 0), {}, {}, nullptr);
    } catch (const Error& e) {
      what = e.what();
    }
    ASSERT_FALSE(what.empty()) << "dispatch on an unregistered (op, cuda) pair must throw";
    EXPECT_EQ(unregistered_cuda_op(what), std::string(op_name(*missing))) << what;
  }
  // A kernel's own NotImplemented (here: a matmul dtype refusal as blas.cpp words it) never counts as
  // "unregistered" for an op that has a CUDA kernel; for one that has none, only dispatch's wording counts.
  EXPECT_FALSE(unregistered_cuda_op("matmul on CUDA: dtype F64 is not supported (F32, F16 and BF16 are)"));
  EXPECT_FALSE(unregistered_cuda_op("conv2d on CUDA: cuDNN 91900 offers no usable algorithm for F16 NCHW"));
}

INSTANTIATE_TEST_SUITE_P(Parity, CudaParity, ::testing::ValuesIn(case_names()), param_name);
