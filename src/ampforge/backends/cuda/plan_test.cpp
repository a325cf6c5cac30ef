// Host-side parts of the CUDA backend, tested without a GPU (label `unit`, built only with CUDA):
//   - elementwise plans: the offsets the device loop computes (OffsetCalc, both the 32- and 64-bit paths)
//     visit every output element once with the right input elements, in the output's memory order;
//   - reduction plans: emulating the kernels' addressing on the host reproduces the CPU's sum and argmax;
//   - GEMM operand mapping: emulating the column-major product cuBLASLt computes reproduces matmul;
//   - the layouts a cuDNN convolution is retried in;
//   - error reporting: CUDA/cuBLAS failures name the call, the place and the library's error;
//   - without a GPU the backend reports itself unavailable and CUDA tensors fail with a clear message.
#if defined(AMPFORGE_WITH_CUDA)

#include <gtest/gtest.h>

#include <cublasLt.h>

#include <map>
#include <set>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/plan.h"
#include "ampforge/backends/cuda/runtime.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
using namespace ampforge::cuda;

namespace {

Tensor f64(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return ops::randn(s, DType::F64, kCPU, &g);
}

Tensor transposed(const Tensor& x) {
  std::vector<int64_t> p(static_cast<size_t>(x.dim()));
  for (int i = 0; i < x.dim(); ++i) p[i] = i;
  std::swap(p[x.dim() - 1], p[x.dim() - 2]);
  return ops::permute(ops::contiguous(ops::permute(x, p)), p);
}

Tensor strided(const Tensor& x) {  // every other element of a wider buffer
  Shape wide = x.shape();
  wide[wide.size() - 1] *= 2;
  Tensor v = ops::slice(ops::zeros(wide, x.dtype()), x.dim() - 1, 0, wide.back(), 2);
  ops::copy_(v, x);
  return v;
}

// Emulates the elementwise kernel's addressing for out = in0 + in1 and checks it against ops::add.
void check_elementwise(const Tensor& out_layout, const Tensor& a, const Tensor& b, const std::string& what) {
  Tensor out = out_layout;
  const ElementwisePlan plan = make_elementwise_plan({&out, &a, &b});
  ASSERT_EQ(plan.numel, out.numel()) << what;
  for (bool narrow : {true, false}) {
    OffsetCalc<3> calc = plan.dims.calc<3>();
    if (!narrow) calc.narrow = false;
    std::set<int64_t> seen;
    auto* po = reinterpret_cast<double*>(plan.data[0]);
    const auto* pa = reinterpret_cast<const double*>(plan.data[1]);
    const auto* pb = reinterpret_cast<const double*>(plan.data[2]);
    int64_t prev = -1;
    bool ordered = true;
    for (int64_t e = 0; e < plan.numel; ++e) {
      int64_t off[3];
      calc.get(e, off);
      seen.insert(off[0]);
      po[off[0]] = pa[off[1]] + pb[off[2]];
      ordered = ordered && off[0] > prev;
      prev = off[0];
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), out.numel()) << what << ": every output element exactly once";
    if (out.is_contiguous() || out.is_contiguous(MemoryFormat::ChannelsLast)) {
      EXPECT_TRUE(ordered) << what << ": a dense output is written in memory order";
    }
    const std::vector<double> got = out.tolist<double>(), want = ops::add(a, b).tolist<double>();
    EXPECT_EQ(got, want) << what << (narrow ? " (32-bit indexing)" : " (64-bit indexing)");
  }
}

}  // namespace

TEST(CudaPlan, ElementwiseOffsetsMatchNaiveIteration) {
  const Tensor a = f64(Shape{4, 5, 6}, 1), b = f64(Shape{4, 5, 6}, 2);
  check_elementwise(ops::zeros(Shape{4, 5, 6}, DType::F64), a, b, "contiguous");
  check_elementwise(ops::zeros(Shape{4, 5, 6}, DType::F64), transposed(a), strided(b), "transposed + strided inputs");
  check_elementwise(transposed(ops::zeros(Shape{4, 5, 6}, DType::F64)), a, b, "transposed output");
  check_elementwise(ops::zeros(Shape{4, 5, 6}, DType::F64), a, f64(Shape{6}, 3), "broadcast row");
  check_elementwise(ops::zeros(Shape{4, 5, 6}, DType::F64), f64(Shape{4, 1, 6}, 4), f64(Shape{5, 1}, 5), "broadcast both");
  check_elementwise(ops::contiguous(ops::zeros(Shape{2, 3, 4, 5}, DType::F64), MemoryFormat::ChannelsLast),
                    f64(Shape{2, 3, 4, 5}, 6), f64(Shape{3, 1, 1}, 7), "channels-last output, per-channel input");
  check_elementwise(ops::zeros(Shape{}, DType::F64), f64(Shape{}, 8), f64(Shape{}, 9), "0-d");
}

TEST(CudaPlan, ContiguousTensorsCoalesceToOneDim) {
  const Tensor a = f64(Shape{4, 5, 6}, 1), out = ops::zeros(Shape{4, 5, 6}, DType::F64);
  ElementwisePlan p = make_elementwise_plan({&out, &a});
  EXPECT_TRUE(p.contiguous);
  EXPECT_EQ(p.dims.sizes.size(), 1u);
  const Tensor row = f64(Shape{6}, 2);
  p = make_elementwise_plan({&out, &row});
  EXPECT_FALSE(p.contiguous) << "a broadcast input has stride 0";
  const Tensor cl = ops::contiguous(f64(Shape{2, 3, 4, 5}, 3), MemoryFormat::ChannelsLast);
  const Tensor cl_out = ops::contiguous(ops::zeros(Shape{2, 3, 4, 5}, DType::F64), MemoryFormat::ChannelsLast);
  p = make_elementwise_plan({&cl_out, &cl});
  EXPECT_TRUE(p.contiguous) << "two channels-last tensors stream in memory order";
}

TEST(CudaPlan, ReduceAddressingReproducesSumAndArgmax) {
  const std::vector<std::vector<int>> dim_sets = {{0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (const Tensor& x : {f64(Shape{4, 5, 6}, 10), transposed(f64(Shape{4, 5, 6}, 11)), strided(f64(Shape{4, 5, 6}, 12))}) {
    for (const auto& dims : dim_sets) {
      Shape ks = x.shape();
      for (int d : dims) ks[d] = 1;
      Tensor out = ops::zeros(ks, DType::F64);
      const ReducePlan p = make_reduce_plan(x, out, dims);
      const OffsetCalc<2> kept = p.kept.calc<2>();
      const OffsetCalc<1> red = p.red.calc<1>();
      const auto* px = static_cast<const double*>(x.data_ptr());
      auto* po = static_cast<double*>(out.data_ptr());
      std::vector<int64_t> arg(static_cast<size_t>(p.n_out));
      for (int64_t o = 0; o < p.n_out; ++o) {
        int64_t ko[2];
        kept.get(o, ko);
        double s = 0, best = -INFINITY;
        for (int64_t r = 0; r < p.n_red; ++r) {
          int64_t ro[1];
          red.get(r, ro);
          const double v = px[ko[0] + ro[0]];
          s += v;
          if (v > best) best = v, arg[static_cast<size_t>(o)] = r;
        }
        po[ko[1]] = s;
      }
      std::vector<int64_t> d64(dims.begin(), dims.end());
      const std::vector<double> want = ops::sum(x, d64, true).tolist<double>();
      const std::vector<double> got = out.tolist<double>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
      EXPECT_EQ(arg, ops::reduce(OpId::argmax, x, d64, false).tolist<int64_t>()) << "argmax's linear reduced index";
    }
  }
  // layout decision: reducing the fastest dim is "inner"; reducing an outer dim of a contiguous tensor is not
  const Tensor x = f64(Shape{8, 16}, 13);
  Tensor o1 = ops::zeros(Shape{8, 1}, DType::F64), o0 = ops::zeros(Shape{1, 16}, DType::F64);
  EXPECT_TRUE(make_reduce_plan(x, o1, {1}).inner);
  EXPECT_FALSE(make_reduce_plan(x, o0, {0}).inner);
}

TEST(CudaPlan, GemmOperandMappingReproducesMatmul) {
  // Emulate cuBLASLt: D (N x M, column-major) = op(first) (N x K) @ op(second) (K x M), C[m][n] = D(n, m).
  for (int la = 0; la < 3; ++la)
    for (int lb = 0; lb < 3; ++lb) {
      const int64_t M = 5, K = 7, N = 3;
      auto layout = [](const Tensor& t, int l) { return l == 0 ? t : l == 1 ? transposed(t) : strided(t); };
      const Tensor A = layout(f64(Shape{M, K}, 20), la), B = layout(f64(Shape{K, N}, 21), lb);
      const auto first = gemm_operand(K, N, B.stride(0), B.stride(1));
      const auto second = gemm_operand(M, K, A.stride(0), A.stride(1));
      // a strided slice has no unit stride: gemm() copies it first (not emulated here)
      if ((la == 2 && !second) || (lb == 2 && !first)) continue;
      ASSERT_TRUE(first && second) << la << " " << lb;
      const auto* pa = static_cast<const double*>(A.data_ptr());
      const auto* pb = static_cast<const double*>(B.data_ptr());
      auto at = [](const double* p, const GemmOperand& g, int64_t i, int64_t j) {  // op(X)(i, j)
        return g.trans ? p[j + i * g.ld] : p[i + j * g.ld];
      };
      std::vector<double> C(static_cast<size_t>(M * N));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t m = 0; m < M; ++m) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) s += at(pb, *first, n, k) * at(pa, *second, k, m);
          C[static_cast<size_t>(m * N + n)] = s;
        }
      const std::vector<double> want = ops::matmul(A, B).tolist<double>();
      for (size_t i = 0; i < C.size(); ++i) EXPECT_NEAR(C[i], want[i], 1e-12) << la << " " << lb << " " << i;
    }
  EXPECT_FALSE(gemm_operand(4, 4, 8, 2)) << "no unit stride: the caller copies";
  EXPECT_TRUE(gemm_operand(1, 1, 0, 0)) << "1 x 1: any strides";
}

TEST(CudaPlan, ConvolutionLayoutRetries) {
  using L = std::vector<bool>;  // true: channels-last
  EXPECT_EQ(conv_layout_attempts(true, false), (L{true, false})) << "channels-last F32: then NCHW";
  EXPECT_EQ(conv_layout_attempts(true, true), (L{true, false})) << "channels-last 16-bit: then NCHW";
  EXPECT_EQ(conv_layout_attempts(false, true), (L{false, true})) << "NCHW 16-bit: then channels-last (tensor cores)";
  EXPECT_EQ(conv_layout_attempts(false, false), (L{false})) << "NCHW F32: generic kernels cover it";
}

TEST(CudaRuntime, ErrorsNameTheCallThePlaceAndTheLibraryError) {
  try {
    throw_cuda_error(cudaErrorInvalidValue, "cudaMemcpyAsync(dst, src, n)", "some/file.cpp", 42);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cudaMemcpyAsync(dst, src, n)"), std::string::npos) << m;
    EXPECT_NE(m.find("some/file.cpp:42"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorInvalidValue"), std::string::npos) << m;
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
  }
  try {
    throw_cuda_error(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "f.cpp", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
  }
  try {
    throw_cuda_error(cudaErrorNoKernelImageForDevice, "kernel<<<>>>", "f.cu", 7);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotImplemented);
    EXPECT_NE(std::string(e.what()).find("CMAKE_CUDA_ARCHITECTURES"), std::string::npos) << e.what();
  }
  try {
    throw_cublas_error(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul(...)", "blas.cpp", 9);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("blas.cpp:9"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(warn_cuda_error(cudaErrorCudartUnloading, "cudaFree(p)", "f.cpp", 3));
  EXPECT_NO_THROW(warn_cuda_error(cudaErrorInvalidValue, "cudaFree(p)", "f.cpp", 3));
  EXPECT_THROW(AF_CUDA_CHECK(cudaErrorInvalidValue), Error);
}

TEST(CudaRuntime, WithoutADeviceEverythingSaysSo) {
  EXPECT_TRUE(cuda::is_built());
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present (checked by the gpu tests)";
  EXPECT_FALSE(cuda::unavailable_reason().empty());
  EXPECT_EQ(cuda::caching_allocator(0), nullptr);
  try {
    Tensor t = Tensor::empty(Shape{3}, DType::F32, Device(DeviceType::CUDA, 0));
    FAIL() << "created a CUDA tensor without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::to_device(ops::ones(Shape{2}), Device(DeviceType::CUDA, 0)), Error);
  EXPECT_FALSE(has_kernel(OpId::add, DeviceType::CUDA));
  EXPECT_NO_THROW(cuda::synchronize());
}

#endif  // AMPFORGE_WITH_CUDA
