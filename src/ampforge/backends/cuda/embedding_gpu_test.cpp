// CUDA embedding and embedding_backward against the CPU kernels: F32/F16/BF16 weights (and an integer
// weight, which the forward copies bit for bit), I64 and I32 indices, repeated indices, padding_idx,
// rows no index names, many indices into a large table (several radix-sort tiles), no indices at all,
// bit-identical backward results from run to run, and the deferred error for an index out of range.
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ampforge/backends/cuda/gpu_testutil.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

// Indices with repeats: position i names row (i * 7 + i / 3) % V, so rows repeat and some stay unused.
Tensor make_indices(const Shape& s, int64_t V, DType dt, int64_t hot_row = -1) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < shape_numel(s); ++i) v.push_back(hot_row >= 0 && i % 3 == 0 ? hot_row : (i * 7 + i / 3) % V);
  return ops::to_dtype(Tensor::from_vector<int64_t>(v, s), dt);
}

}  // namespace

TEST(CudaEmbedding, ForwardMatchesCpu) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (DType it : {DType::I64, DType::I32}) {
      const int64_t V = 50, D = 33;
      Tensor w = random_cpu(Shape{V, D}, dt, 500);
      Tensor idx = make_indices(Shape{3, 7}, V, it);
      const std::string what = "embedding " + std::string(dtype_name(dt)) + " indices " + std::string(dtype_name(it));
      expect_identical(ops::embedding(to_cuda(idx), to_cuda(w)), ops::embedding(idx, w), what);  // a copy: exact
      expect_identical(ops::embedding(to_cuda(idx), to_cuda(w), 4), ops::embedding(idx, w, 4), what + " padding_idx");
    }
  // An integer weight: rows are copied bit for bit.
  Tensor wi = ops::to_dtype(ops::mul_scalar(random_cpu(Shape{9, 5}, DType::F32, 501), 100.0), DType::I64);
  Tensor idx = make_indices(Shape{11}, 9, DType::I64);
  expect_identical(ops::embedding(to_cuda(idx), to_cuda(wi)), ops::embedding(idx, wi), "embedding of an I64 weight");
}

TEST(CudaEmbedding, BackwardMatchesCpu) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (DType it : {DType::I64, DType::I32})
      for (int64_t padding_idx : {int64_t{-1}, int64_t{5}}) {
        const int64_t V = 50, D = 33;
        Tensor idx = make_indices(Shape{4, 9}, V, it, /*hot_row=*/5);
        Tensor g = random_cpu(Shape{4, 9, D}, dt, 510);
        const std::string what = "embedding_backward " + std::string(dtype_name(dt)) + " indices " +
                                 std::string(dtype_name(it)) + " padding_idx " + std::to_string(padding_idx);
        Tensor cpu = ops::embedding_backward(g, idx, V, padding_idx);
        Tensor gpu = ops::embedding_backward(to_cuda(g), to_cuda(idx), V, padding_idx);
        expect_matches_cpu(gpu, cpu, what);
        // Each row adds its gradients in position order in float, as the CPU does: F32 is exact.
        if (dt == DType::F32) expect_identical(gpu, cpu, what + " (bitwise)");
      }
}

TEST(CudaEmbedding, LargeTableManyIndicesAndNoIndices) {
  AF_SKIP_WITHOUT_CUDA();
  const int64_t V = 3001, D = 17;
  Tensor idx = make_indices(Shape{5000}, V, DType::I64, /*hot_row=*/1234);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor g = random_cpu(Shape{5000, D}, dt, 520);
    Tensor gc = to_cuda(g), ic = to_cuda(idx);
    Tensor first = ops::embedding_backward(gc, ic, V, 0);
    expect_matches_cpu(first, ops::embedding_backward(g, idx, V, 0), "embedding_backward large");
    expect_identical(first, to_cpu(ops::embedding_backward(gc, ic, V, 0)), "embedding_backward twice");
  }
  // No indices: an all-zero gradient.
  Tensor none = Tensor::from_vector<int64_t>({}, Shape{0});
  Tensor g0 = random_cpu(Shape{0, 6}, DType::F32, 521);
  expect_identical(ops::embedding_backward(to_cuda(g0), to_cuda(none), 4, -1), ops::zeros(Shape{4, 6}),
                   "embedding_backward without indices");
  EXPECT_EQ(ops::embedding(to_cuda(none), to_cuda(random_cpu(Shape{4, 6}, DType::F32, 522))).shape(), (Shape{0, 6}));
}

TEST(CudaEmbedding, OutOfRangeIndexIsReportedAtTheNextSync) {
  AF_SKIP_WITHOUT_CUDA();
  Tensor w = to_cuda(random_cpu(Shape{4, 3}, DType::F32, 530));
  Tensor idx = to_cuda(Tensor::from_vector<int64_t>({0, 1, 7, 2}));
  Tensor out = ops::embedding(idx, w);  // no host sync: cannot throw here
  try {
    (void)out.tolist<float>();
    FAIL() << "expected the out-of-range index to be reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("embedding"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(cuda::synchronize(0));  // reported once
  Tensor g = to_cuda(random_cpu(Shape{4, 3}, DType::F32, 531));
  Tensor gw = ops::embedding_backward(g, to_cuda(Tensor::from_vector<int64_t>({0, -1, 3, 3})), 4);
  EXPECT_THROW(cuda::synchronize(0), Error);
  EXPECT_NO_THROW(cuda::synchronize(0));
  EXPECT_NEAR(to_cuda(ops::ones(Shape{2})).tolist<float>()[1], 1.0f, 0.0f);  // the device is usable again
}
