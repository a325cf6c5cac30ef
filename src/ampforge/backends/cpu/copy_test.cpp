// Unit tests of the CPU copy kernel's layouts: tiled transposes (ragged tiles, outer dims, 2/4/8-byte
// elements, a strided destination, a strided source), broadcast runs and element-strided runs, each against
// an element-by-element reference read through the views' strides.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ampforge/ops/ops.h"
#include "ampforge/util/thread_pool.h"

using namespace ampforge;

namespace {

// The value at every index of `t` (any strides), in row-major index order, read through its strides.
template <class T>
std::vector<T> read_by_strides(const Tensor& t) {
  std::vector<T> out;
  const auto* p = static_cast<const T*>(t.data_ptr());
  std::vector<int64_t> idx(static_cast<size_t>(t.dim()), 0);
  for (int64_t k = 0; k < t.numel(); ++k) {
    int64_t off = 0;
    for (int d = 0; d < t.dim(); ++d) off += idx[static_cast<size_t>(d)] * t.stride(d);
    out.push_back(p[off]);
    for (int d = t.dim() - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < t.size(d)) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  return out;
}

template <class T>
void expect_copy_matches(const Tensor& view, const char* what) {
  const Tensor c = ops::contiguous(view);
  ASSERT_TRUE(c.is_contiguous()) << what;
  EXPECT_EQ(read_by_strides<T>(c), read_by_strides<T>(view)) << what;
}

Tensor iota(const Shape& shape, DType dt) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return ops::to_dtype(ops::reshape(ops::arange(0, static_cast<double>(n), 1, DType::F64), shape), dt);
}

}  // namespace

TEST(CpuCopy, TransposesWithRaggedTilesAndOuterDims) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    // (B, C, A) -> (B, A, C), YOLOv8's head layout, with A and C not multiples of the 32-wide tile.
    const Tensor x = iota({2, 80, 8400 / 8 + 3}, DType::F32);
    expect_copy_matches<float>(x.transpose(1, 2), "(2,80,1053)^T");
    expect_copy_matches<float>(ops::contiguous(x.transpose(1, 2)).transpose(1, 2), "back");
    // NCHW <-> NHWC: the transposed pair is (C, H*W) inside each image.
    const Tensor img = iota({3, 37, 9, 11}, DType::F32);
    expect_copy_matches<float>(ops::permute(img, {0, 2, 3, 1}), "nchw->nhwc");
    // Four dims where the contiguous one is not adjacent to the innermost.
    expect_copy_matches<float>(ops::permute(iota({5, 33, 7, 40}, DType::F32), {0, 3, 2, 1}), "0321");
  }
  set_num_threads(2);
}

TEST(CpuCopy, TransposesTwoAndEightByteElements) {
  const Tensor h = iota({70, 45}, DType::BF16);
  expect_copy_matches<uint16_t>(h.transpose(0, 1), "bf16");
  const Tensor d = iota({3, 50, 41}, DType::F64);
  expect_copy_matches<double>(d.transpose(1, 2), "f64");
  const Tensor l = iota({64, 65}, DType::I64);
  expect_copy_matches<int64_t>(l.transpose(0, 1), "i64");
}

TEST(CpuCopy, TransposeIntoAStridedDestinationLeavesTheRestAlone) {
  // copy_ into a channel slice of a wider tensor (a concatenation's buffer): the columns outside the slice
  // keep their values.
  Tensor dst = ops::full({2, 100, 48}, -1.0, DType::F32);
  const Tensor src = iota({2, 32, 100}, DType::F32);
  ops::copy_(ops::narrow(dst, 2, 8, 32), src.transpose(1, 2));
  const std::vector<float> got = dst.tolist<float>();
  const std::vector<float> s = read_by_strides<float>(src);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t a = 0; a < 100; ++a)
      for (int64_t c = 0; c < 48; ++c) {
        const float v = got[static_cast<size_t>((b * 100 + a) * 48 + c)];
        if (c < 8 || c >= 40) ASSERT_EQ(v, -1.0f) << b << "," << a << "," << c;
        else ASSERT_EQ(v, s[static_cast<size_t>((b * 32 + (c - 8)) * 100 + a)]) << b << "," << a << "," << c;
      }
}

TEST(CpuCopy, StridedViewsBroadcastsAndStridedRuns) {
  // A transpose of a strided view (every other column).
  expect_copy_matches<float>(ops::slice(iota({40, 100}, DType::F32), 1, 0, 100, 2).transpose(0, 1),
                             "transpose of a strided view");
  // A broadcast inner dim (stride 0) and a broadcast outer dim.
  expect_copy_matches<float>(ops::expand(ops::reshape(iota({6, 70}, DType::F32), {6, 70, 1}), {6, 70, 16}),
                             "inner broadcast");
  expect_copy_matches<float>(ops::expand(iota({1, 300}, DType::F32), {9, 300}), "outer broadcast");
  // Every other element (a strided inner run) in 1, 2, 4 and 8-byte types.
  for (DType dt : {DType::U8, DType::BF16, DType::F32, DType::F64}) {
    const Tensor v = ops::slice(iota({5000}, dt), 0, 1, 5000, 2);
    const Tensor c = ops::contiguous(v);
    EXPECT_EQ(ops::to_dtype(c, DType::F64).tolist<double>(), ops::to_dtype(v, DType::F64).tolist<double>()) << dtype_name(dt);
  }
}
