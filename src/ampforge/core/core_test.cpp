// Unit tests of core: dtypes, half conversions, shapes, tensors, views, dispatch errors, Philox.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/core/generator.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;

TEST(DType, TableAndPromotion) {
  EXPECT_EQ(dtype_size(DType::F16), 2);
  EXPECT_EQ(dtype_size(DType::F64), 8);
  EXPECT_EQ(dtype_from_string("bf16"), DType::BF16);
  EXPECT_THROW(dtype_from_string("f8"), Error);
  EXPECT_EQ(promote_types(DType::F16, DType::BF16), DType::F32);
  EXPECT_EQ(promote_types(DType::I64, DType::F16), DType::F16);
  EXPECT_EQ(promote_types(DType::I32, DType::I64), DType::I64);
}

TEST(Philox, KnownAnswer) {
  // Random123 known-answer test: philox4x32-10, counter 0, key 0.
  auto w = philox4x32(0, 0);
  EXPECT_EQ(w[0], 0x6627e8d5u);
  EXPECT_EQ(w[1], 0xe169c58du);
  EXPECT_EQ(w[2], 0xbc57ac4cu);
  EXPECT_EQ(w[3], 0x9b00dbd8u);
}

// The block form (vector lanes) gives philox4x32's words, counters crossing 2^32 included.
TEST(Philox, BlocksMatchTheScalarForm) {
  for (const uint64_t seed : {uint64_t{0}, uint64_t{0x0123456789abcdefull}}) {
    for (const uint64_t ctr0 : {uint64_t{0}, uint64_t{977}, (uint64_t{1} << 32) - 10}) {
      uint32_t v[4 * 64];
      philox4x32_blocks<64>(seed, ctr0, v);
      for (int b = 0; b < 64; ++b) {
        const auto s = philox4x32(seed, ctr0 + static_cast<uint64_t>(b));
        for (int k = 0; k < 4; ++k) ASSERT_EQ(v[4 * b + k], s[static_cast<size_t>(k)]) << seed << " " << ctr0 << " " << b;
      }
    }
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = arange(0, 24, 1, DType::F32).reshape({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_FALSE(p.is_contiguous());
  Tensor c = p.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  auto v = c.tolist<float>();
  EXPECT_EQ(v[1], 4.0f);  // p[0,0,1] = t[0,1,0] = 4
  Tensor n = t.narrow(2, 1, 2);
  EXPECT_EQ(n.tolist<float>()[0], 1.0f);
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(p.view({24}), Error);
  EXPECT_EQ(p.reshape({24}).numel(), 24);
}

TEST(Tensor, ChannelsLast) {
  Tensor t = Tensor::empty({2, 3, 4, 5}, DType::F32, kCPU, MemoryFormat::ChannelsLast);
  EXPECT_TRUE(t.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(t.suggest_memory_format(), MemoryFormat::ChannelsLast);
  Tensor x = randn({2, 3, 4, 5});
  Tensor cl = x.contiguous(MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.tolist<float>(), x.tolist<float>());
  Tensor y = relu(cl);
  EXPECT_EQ(y.suggest_memory_format(), MemoryFormat::ChannelsLast);
}

// Channel slices of a channels-last image (YOLOv8's C2f split, the slices of a concatenation's gradient) are dense in
// neither layout; elementwise results of them stay channels-last, so that the next op does not meet a mix of layouts
// (which copies, or adds at a third of the speed), as PyTorch keeps the inputs' stride order.
TEST(Tensor, ElementwiseOnChannelSlicesOfChannelsLastStaysChannelsLast) {
  Tensor x = randn({2, 8, 3, 5}).contiguous(MemoryFormat::ChannelsLast);
  Tensor a = x.narrow(1, 0, 4), b = x.narrow(1, 4, 4);
  ASSERT_FALSE(a.is_contiguous());
  ASSERT_FALSE(a.is_contiguous(MemoryFormat::ChannelsLast));
  for (const Tensor& y : {add(a, b), mul(a, b), relu(a)}) {
    EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast));
    EXPECT_FALSE(y.is_contiguous());
  }
  // Values read through the strides are unchanged by the layout.
  const std::vector<float> s = add(a, b).contiguous().tolist<float>();
  const std::vector<float> av = a.contiguous().tolist<float>(), bv = b.contiguous().tolist<float>();
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i], av[i] + bv[i]);
  // An NCHW-contiguous slice stays NCHW.
  Tensor n = randn({2, 8, 3, 5}).narrow(1, 0, 4);
  EXPECT_TRUE(add(n, n).is_contiguous());
}

TEST(Tensor, BadInputIsAnError) {
  Tensor a = zeros({2, 3}), b = zeros({4, 3});
  try {
    add(a, b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("add"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos);
  }
  EXPECT_THROW(a.sum({2}), Error);
  EXPECT_THROW(zeros({-1, 2}), Error);
  EXPECT_THROW(matmul(zeros({2, 3}), zeros({4, 5})), Error);
}

TEST(Dispatch, UnregisteredDeviceIsAClearError) {
  try {
    Tensor::empty({2}, DType::F32, Device::parse("cuda:0"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos);
  }
}

TEST(Autograd, SimpleChain) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3}).requires_grad_();
  Tensor y = sum(mul(x, x));
  y.backward();
  EXPECT_EQ(x.grad().tolist<float>(), (std::vector<float>{2, 4, 6}));
  EXPECT_THROW(y.backward(), Error);  // graph freed
}

TEST(Autograd, BroadcastAndAccumulate) {
  Tensor w = ones({3}).requires_grad_();
  Tensor x = ones({2, 3});
  Tensor y = sum(mul(x, w));
  y.backward();
  y = sum(mul(x, w));
  y.backward();
  EXPECT_EQ(w.grad().tolist<float>(), (std::vector<float>{4, 4, 4}));
}

TEST(Autograd, MatmulGrad) {
  Tensor a = randn({3, 4}).requires_grad_();
  Tensor b = randn({4, 5}).requires_grad_();
  sum(matmul(a, b)).backward();
  // d/da sum(a@b) = ones(3,5) @ b^T -> row sums of b
  auto gb = b.sum({1}).tolist<float>();
  auto ga = a.grad().tolist<float>();
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(ga[i * 4 + k], gb[k], 1e-5);
}

// ---- type promotion (PyTorch's result_type: 0-dim operands count only from a higher category) ---------
TEST(TypePromotion, ZeroDimOperandsFollowPyTorch) {
  // Each row checked against torch.result_type in PyTorch 1.13.
  struct Row {
    DType a;
    bool a_zero_dim;
    DType b;
    bool b_zero_dim;
    DType want;
  };
  const Row rows[] = {
      {DType::F16, false, DType::F32, true, DType::F16},    // activations * an F32 scalar tensor stay f16
      {DType::BF16, false, DType::F16, true, DType::BF16},
      {DType::I64, false, DType::F32, true, DType::F32},    // a higher category counts
      {DType::I32, false, DType::F64, true, DType::F64},
      {DType::I32, false, DType::I64, true, DType::I32},    // same category: the dimensioned one wins
      {DType::U8, false, DType::I32, true, DType::U8},
      {DType::Bool, false, DType::I64, true, DType::I64},
      {DType::F32, false, DType::F64, true, DType::F32},
      {DType::F32, true, DType::F16, true, DType::F32},     // both 0-dim: ordinary promotion
      {DType::F16, false, DType::BF16, false, DType::F32},  // both dimensioned: ordinary promotion
      {DType::F16, false, DType::F32, false, DType::F32},
  };
  for (const Row& r : rows) {
    const Tensor a = ops::zeros(r.a_zero_dim ? Shape{} : Shape{3}, r.a);
    const Tensor b = ops::zeros(r.b_zero_dim ? Shape{} : Shape{3}, r.b);
    EXPECT_EQ(ops::result_type(a, b), r.want) << dtype_name(r.a) << " " << dtype_name(r.b);
    EXPECT_EQ(ops::result_type(b, a), r.want) << dtype_name(r.b) << " " << dtype_name(r.a);
    if (r.want != DType::Bool) {
      EXPECT_EQ(add(a, b).dtype(), r.want) << dtype_name(r.a) << " + " << dtype_name(r.b);
    }
    EXPECT_EQ(ops::compare(OpId::lt, a, b).dtype(), DType::Bool);
  }
  // The F32 0-dim value is rounded to f16 once, as PyTorch's kernels read it in the common dtype.
  const Tensor h = ops::to_dtype(Tensor::from_vector<float>({1, 2, 3}), DType::F16);
  EXPECT_EQ(ops::to_dtype(mul(h, full({}, 0.5)), DType::F32).tolist<float>(), (std::vector<float>{0.5f, 1, 1.5f}));
}

TEST(TypePromotion, FractionalScalarsDoNotTruncateIntegerTensors) {
  // torch.tensor([1, 3]) * 0.5 is float32 [0.5, 1.5]; a fractional scalar must not be truncated to 0.
  const Tensor i = Tensor::from_vector<int64_t>({1, 3});
  const Tensor h = mul(i, 0.5);
  EXPECT_EQ(h.dtype(), DType::F32);
  EXPECT_EQ(h.tolist<float>(), (std::vector<float>{0.5f, 1.5f}));
  EXPECT_EQ(add(i, 0.25).tolist<float>(), (std::vector<float>{1.25f, 3.25f}));
  // An integral value keeps integer arithmetic (torch's `t * 2`; a double cannot tell 2 from 2.0).
  EXPECT_EQ(mul(i, 2.0).dtype(), DType::I64);
  EXPECT_EQ(mul(i, 2.0).tolist<int64_t>(), (std::vector<int64_t>{2, 6}));
  // Floating tensors keep their dtype whatever the scalar (a scalar never promotes within a category).
  EXPECT_EQ(mul(ops::zeros({2}, DType::F16), 1e5).dtype(), DType::F16);
}

namespace {
std::atomic<int> g_copies{0};
void* count_copies(OpId op, const KernelArgs&) {
  if (op == OpId::copy) g_copies.fetch_add(1);
  return nullptr;
}
void no_end(void*) {}
}  // namespace

TEST(TypePromotion, MixedDtypeBinariesConvertInTheLoopNotByCopy) {
  // f16/bf16 operands of an F32 result are read as they are: no full-size F32 copy (a `copy` kernel) first.
  for (DType lowp : {DType::F16, DType::BF16}) {
    const Tensor x = ops::to_dtype(randn({3, 70, 11}), lowp);         // odd sizes: tails and broadcasting
    const Tensor y = randn({70, 1});
    const Tensor xs = ops::to_dtype(randn({3, 70, 11}), lowp).transpose(0, 2);  // strided
    const Tensor xs32 = ops::to_dtype(xs, DType::F32);
    const DispatchObserver obs{count_copies, no_end};
    g_copies = 0;
    set_dispatch_observer(&obs);
    const Tensor s = add(x, y), d = div(y, x), m = maximum(xs, xs32), c = lt(x, y);
    set_dispatch_observer(nullptr);
    EXPECT_EQ(g_copies.load(), 0) << dtype_name(lowp);
    // Same values as converting first.
    const Tensor xf = ops::to_dtype(x, DType::F32);
    EXPECT_EQ(s.dtype(), DType::F32);
    EXPECT_EQ(s.tolist<float>(), add(xf, y).tolist<float>());
    EXPECT_EQ(d.tolist<float>(), div(y, xf).tolist<float>());
    EXPECT_EQ(m.tolist<float>(), xs32.tolist<float>());
    EXPECT_EQ(c.tolist<int64_t>(), lt(xf, y).tolist<int64_t>());
    // In place into F32 from a 16-bit operand.
    Tensor acc = ops::zeros({3, 70, 11});
    ops::add_(acc, x);
    EXPECT_EQ(acc.tolist<float>(), xf.tolist<float>());
  }
}
