// CUDA elementwise kernels against the CPU kernels: transfers, fill, copy/cast, arange, every unary,
// binary, comparison and backward op, where; F32/F16/BF16 (and I32/I64 where the op takes integers);
// contiguous, transposed, sliced and broadcast operands. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <tuple>

#include "ampforge/backends/cuda/gpu_testutil.h"
#include "ampforge/core/attrs.h"
#include "ampforge/memory/caching_allocator.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

const DType kFloats[] = {DType::F32, DType::F16, DType::BF16};

// x in the layouts the kernels distinguish, built on x's device (a transfer makes tensors dense, so a
// CUDA layout must be made on the device): contiguous, transposed (non-contiguous), a strided slice.
std::vector<std::pair<std::string, Tensor>> layouts(const Tensor& x) {
  std::vector<std::pair<std::string, Tensor>> v;
  v.push_back({"contiguous", x});
  v.push_back({"transposed", ops::permute(ops::contiguous(ops::permute(x, {1, 0})), {1, 0})});
  Tensor wide = ops::zeros(Shape{x.size(0), x.size(1) * 2}, x.dtype(), x.device());
  Tensor sl = ops::slice(wide, 1, 0, x.size(1) * 2, 2);
  ops::copy_(sl, x);
  v.push_back({"strided", sl});
  return v;
}

// The same layouts of the same values on the CPU and on cuda:0.
std::vector<std::tuple<std::string, Tensor, Tensor>> layout_pairs(const Tensor& cpu) {
  const auto c = layouts(cpu), g = layouts(to_cuda(cpu));
  std::vector<std::tuple<std::string, Tensor, Tensor>> v;
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(g[i].second.strides(), c[i].second.strides()) << c[i].first;
    v.emplace_back(c[i].first, c[i].second, g[i].second);
  }
  return v;
}

}  // namespace

TEST(CudaTransfer, RoundTripEveryDtypeAndLayout) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8, DType::Bool}) {
    Tensor x = ops::to_dtype(random_cpu(Shape{37, 53}, DType::F32, 1, 5.0), dt);
    for (auto& [name, t] : layouts(x)) {  // CPU layouts to the device (made dense there) ...
      Tensor d = to_cuda(t);
      EXPECT_TRUE(d.device().is_cuda());
      expect_identical(d, ops::contiguous(t), std::string("round trip ") + name);
    }
    for (auto& [name, c, g] : layout_pairs(x))  // ... and device layouts back to the CPU
      expect_identical(to_cpu(g), c, std::string("from a device layout ") + name);
  }
  // channels-last survives the transfer in both directions
  Tensor img = ops::contiguous(random_cpu(Shape{2, 3, 4, 5}, DType::F32, 2), MemoryFormat::ChannelsLast);
  Tensor d = to_cuda(img);
  EXPECT_TRUE(d.is_contiguous(MemoryFormat::ChannelsLast));
  expect_identical(d, img, "channels_last");
  // empty and 0-d tensors
  expect_identical(to_cuda(ops::zeros(Shape{0, 3})), ops::zeros(Shape{0, 3}), "empty");
  EXPECT_EQ(to_cuda(ops::full(Shape{}, 2.5)).item(), 2.5);
}

TEST(CudaTransfer, LargeTensorAndAllocatorReuse) {
  AF_SKIP_WITHOUT_CUDA();
  Tensor x = random_cpu(Shape{1 << 22}, DType::F32, 3);
  for (int i = 0; i < 3; ++i) expect_identical(to_cuda(x), x, "4M floats, iteration " + std::to_string(i));
  memory::CachingAllocator* a = cuda::caching_allocator(0);
  ASSERT_NE(a, nullptr);
  const memory::AllocatorStats st = a->stats();
  EXPECT_GT(st.num_allocs, 0);
  EXPECT_GT(st.cache_hits, 0) << "the second and third 16 MiB tensors reuse the first one's block";
}

TEST(CudaElementwise, FillCopyCastArange) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8, DType::Bool})
    for (double v : {0.0, 1.0, -2.5, 3.1415926}) {
      if (dt == DType::U8 && v < 0) continue;  // not representable (UB in C++)
      Tensor c = ops::full(Shape{5, 7}, v, dt, kCuda0);
      expect_identical(c, ops::full(Shape{5, 7}, v, dt), "fill " + std::to_string(v));
    }
  // every cast pair, from values that every dtype can hold approximately
  const Tensor base = ops::mul_scalar(random_cpu(Shape{64, 33}, DType::F32, 4), 20.0);
  for (DType from : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8, DType::Bool}) {
    Tensor src = ops::to_dtype(from == DType::U8 ? absolute(base) : base, from);
    for (DType to : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8, DType::Bool}) {
      if (to == DType::U8 && from != DType::U8 && from != DType::Bool) continue;  // negative values: C++ UB on the CPU
      for (auto& [name, c, g] : layout_pairs(src)) {
        Tensor got = ops::to_dtype(g, to);
        expect_identical(got, ops::to_dtype(c, to),
                         std::string("cast ") + std::string(dtype_name(from)) + "->" + std::string(dtype_name(to)) + " " + name);
      }
    }
  }
  for (DType dt : {DType::F32, DType::I64, DType::BF16})
    expect_identical(ops::arange(-3, 17, 0.5, dt, kCuda0), ops::arange(-3, 17, 0.5, dt), "arange");
  // copy_ into a non-contiguous CUDA view with broadcasting
  Tensor dst = ops::zeros(Shape{6, 8}, DType::F32, kCuda0);
  Tensor row = random_cpu(Shape{8}, DType::F32, 5);
  ops::copy_(ops::slice(dst, 0, 0, 6, 2), to_cuda(row));
  Tensor cdst = ops::zeros(Shape{6, 8});
  ops::copy_(ops::slice(cdst, 0, 0, 6, 2), row);
  expect_identical(dst, cdst, "copy_ broadcast into a strided view");
}

TEST(CudaElementwise, UnaryOps) {
  AF_SKIP_WITHOUT_CUDA();
  struct U {
    OpId op;
    const void* attrs;
    bool positive;  // needs x > 0
  };
  static const ScalarAttrs add_s{1.75}, mul_s{-0.5}, pow_s{3.0}, sq{2.0}, pow_frac{0.5};
  static const ClampAttrs clamp_both{-0.5, 0.75, true, true}, clamp_min{0.1, 0, true, false};
  static const GeluAttrs gelu_erf{GeluApprox::None}, gelu_tanh{GeluApprox::Tanh};
  const U ops_list[] = {
      {OpId::neg, nullptr, false},      {OpId::abs, nullptr, false},       {OpId::sign, nullptr, false},
      {OpId::exp, nullptr, false},      {OpId::log, nullptr, true},        {OpId::sqrt, nullptr, true},
      {OpId::rsqrt, nullptr, true},     {OpId::relu, nullptr, false},      {OpId::gelu, &gelu_erf, false},
      {OpId::gelu, &gelu_tanh, false},  {OpId::silu, nullptr, false},      {OpId::sigmoid, nullptr, false},
      {OpId::tanh, nullptr, false},     {OpId::atan, nullptr, false},      {OpId::add_scalar, &add_s, false}, {OpId::mul_scalar, &mul_s, false},
      {OpId::pow_scalar, &pow_s, false}, {OpId::pow_scalar, &sq, false},    {OpId::pow_scalar, &pow_frac, true},
      {OpId::clamp, &clamp_both, false}, {OpId::clamp, &clamp_min, false},
  };
  for (DType dt : kFloats)
    for (const U& u : ops_list) {
      Tensor x = random_cpu(Shape{67, 45}, dt, 10 + static_cast<int>(u.op), 2.0);
      if (u.positive) x = ops::add_scalar(absolute(x), 0.05);
      for (auto& [name, c, g] : layout_pairs(x))
        expect_matches_cpu(ops::unary(u.op, g, u.attrs), ops::unary(u.op, c, u.attrs),
                           std::string(op_name(u.op)) + " " + name);
    }
  // integer tensors
  for (DType dt : {DType::I32, DType::I64}) {
    Tensor x = ops::to_dtype(ops::mul_scalar(random_cpu(Shape{31, 9}, DType::F32, 7), 50.0), dt);
    for (OpId op : {OpId::neg, OpId::abs, OpId::sign})
      expect_identical(ops::unary(op, to_cuda(x)), ops::unary(op, x), std::string(op_name(op)) + " int");
    expect_identical(ops::add_scalar(to_cuda(x), 3), ops::add_scalar(x, 3), "add_scalar int");
    expect_identical(ops::mul_scalar(to_cuda(x), -2), ops::mul_scalar(x, -2), "mul_scalar int");
    expect_identical(ops::clamp(to_cuda(x), -10.0, 20.0), ops::clamp(x, -10.0, 20.0), "clamp int");
  }
  // a long vectorisable tensor with a tail that is not a multiple of the vector width
  Tensor big = random_cpu(Shape{(1 << 20) + 3}, DType::F16, 8);
  expect_matches_cpu(ops::unary(OpId::tanh, to_cuda(big)), ops::unary(OpId::tanh, big), "tanh 1M+3 F16");
}

TEST(CudaElementwise, BinaryOpsWithBroadcasting) {
  AF_SKIP_WITHOUT_CUDA();
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{40, 30}, {40, 30}}, {{40, 30}, {30}}, {{40, 1}, {1, 30}}, {{2, 3, 4, 5}, {3, 1, 5}}, {{7}, {}}, {{0, 3}, {3}}};
  const OpId binops[] = {OpId::add, OpId::sub, OpId::mul, OpId::div, OpId::pow, OpId::maximum, OpId::minimum};
  for (DType dt : kFloats)
    for (OpId op : binops)
      for (const auto& [sa, sb] : shapes) {
        Tensor a = random_cpu(sa, dt, 20, 2.0), b = random_cpu(sb, dt, 21, 2.0);
        if (op == OpId::pow) a = ops::add_scalar(absolute(a), 0.1);
        if (op == OpId::div) b = ops::add_scalar(absolute(b), 0.5);
        expect_matches_cpu(ops::binary(op, to_cuda(a), to_cuda(b)), ops::binary(op, a, b),
                           std::string(op_name(op)) + " " + sa.str() + " with " + sb.str());
      }
  // transposed operand, NaN propagation of maximum, integer arithmetic
  Tensor a = random_cpu(Shape{33, 17}, DType::F32, 22);
  Tensor b = random_cpu(Shape{33, 17}, DType::F32, 23);
  for (auto& [name, c, g] : layout_pairs(a)) {
    expect_matches_cpu(ops::add(g, to_cuda(b)), ops::add(c, b), "add " + name);
    expect_matches_cpu(ops::mul(to_cuda(b), g), ops::mul(b, c), "mul " + name + " second");
  }
  Tensor n = Tensor::from_vector<float>({NAN, 1.0f, 2.0f, NAN});
  Tensor m = Tensor::from_vector<float>({1.0f, NAN, 0.5f, NAN});
  expect_matches_cpu(ops::binary(OpId::maximum, to_cuda(n), to_cuda(m)), ops::binary(OpId::maximum, n, m), "maximum NaN");
  for (DType dt : {DType::I32, DType::I64}) {
    Tensor x = ops::to_dtype(ops::mul_scalar(random_cpu(Shape{12, 5}, DType::F32, 24), 30.0), dt);
    Tensor y = ops::to_dtype(ops::mul_scalar(random_cpu(Shape{5}, DType::F32, 25), 30.0), dt);
    for (OpId op : {OpId::add, OpId::sub, OpId::mul, OpId::maximum, OpId::minimum})
      expect_identical(ops::binary(op, to_cuda(x), to_cuda(y)), ops::binary(op, x, y), std::string(op_name(op)) + " int");
  }
  // in place on a CUDA tensor
  Tensor acc = to_cuda(a);
  ops::add_(acc, to_cuda(b));
  expect_matches_cpu(acc, ops::add(a, b), "add_");
}

TEST(CudaElementwise, ComparisonsAndWhere) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32}) {
    Tensor a = ops::to_dtype(ops::mul_scalar(random_cpu(Shape{19, 23}, DType::F32, 30), 3.0), dt);
    // b is row 3 of a, broadcast over the rows: that row compares equal everywhere
    Tensor b = ops::contiguous(ops::slice(a, 0, 3, 4, 1)).reshape(Shape{23});
    for (OpId op : {OpId::eq, OpId::ne, OpId::lt, OpId::le, OpId::gt, OpId::ge})
      expect_identical(ops::compare(op, to_cuda(a), to_cuda(b)), ops::compare(op, a, b),
                       std::string(op_name(op)) + " " + std::string(dtype_name(dt)));
    Tensor cond = ops::compare(OpId::gt, a, b);
    expect_identical(ops::where(to_cuda(cond), to_cuda(a), to_cuda(b)), ops::where(cond, a, b), "where");
  }
  Tensor bools = ops::compare(OpId::gt, random_cpu(Shape{10}, DType::F32, 32), ops::zeros(Shape{}));
  expect_identical(ops::compare(OpId::eq, to_cuda(bools), to_cuda(bools)), ops::compare(OpId::eq, bools, bools), "eq bool");
}

TEST(CudaElementwise, BackwardOps) {
  AF_SKIP_WITHOUT_CUDA();
  static const GeluAttrs gelu_erf{GeluApprox::None}, gelu_tanh{GeluApprox::Tanh};
  static const ClampAttrs clamp{-0.5, 0.75, true, true};
  const std::pair<OpId, const void*> list[] = {
      {OpId::relu_backward, nullptr},    {OpId::gelu_backward, &gelu_erf}, {OpId::gelu_backward, &gelu_tanh},
      {OpId::silu_backward, nullptr},    {OpId::sigmoid_backward, nullptr}, {OpId::tanh_backward, nullptr},
      {OpId::clamp_backward, &clamp}};
  for (DType dt : kFloats)
    for (const auto& [op, attrs] : list) {
      Tensor g = random_cpu(Shape{29, 31}, dt, 40), s = random_cpu(Shape{29, 31}, dt, 41, 1.5);
      expect_matches_cpu(ops::pointwise_backward(op, to_cuda(g), to_cuda(s), attrs), ops::pointwise_backward(op, g, s, attrs),
                         op_name(op));
    }
}

TEST(CudaElementwise, MismatchedDevicesAreRejected) {
  AF_SKIP_WITHOUT_CUDA();
  Tensor a = ops::ones(Shape{3}), b = ops::ones(Shape{3}, DType::F32, kCuda0);
  EXPECT_THROW(ops::add(a, b), Error);
}
