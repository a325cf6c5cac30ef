// Autograd semantics PyTorch users rely on: one gradient accumulator per leaf (a leaf used k times gets
// one accumulation and its hooks see the sum), tensor hooks on leaves and intermediate tensors,
// post-accumulate hooks (where data-parallel training starts its reductions), retain_grad, and a gradient
// on the wrong device being an error rather than passed along.
#include "ampforge/autograd/hooks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;

namespace {
std::vector<float> values(const Tensor& t) { return t.tolist<float>(); }
}  // namespace

TEST(AutogradLeaf, OneAccumulatorSharedByEveryUse) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3}).requires_grad_();
  Tensor a = mul(x, 2.0);
  Tensor b = mul(x, 3.0);
  ASSERT_TRUE(a.grad_fn() && b.grad_fn());
  ASSERT_TRUE(a.grad_fn()->next_edges[0].fn && b.grad_fn()->next_edges[0].fn);
  EXPECT_EQ(a.grad_fn()->next_edges[0].fn.get(), b.grad_fn()->next_edges[0].fn.get())
      << "each use of a leaf made its own AccumulateGrad";
  EXPECT_EQ(a.grad_fn()->next_edges[0].fn.get(), autograd::grad_accumulator(x).get());
}

TEST(AutogradLeaf, HookSeesTheSumOfAllUsesOnce) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3}).requires_grad_();
  int calls = 0;
  std::vector<float> seen;
  x.register_hook([&](const Tensor& g) {
    ++calls;
    seen = values(g);
    return Tensor();
  });
  // Three uses: d/dx (2x + 3x + x*x) = 5 + 2x.
  sum(add(add(mul(x, 2.0), mul(x, 3.0)), mul(x, x))).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<float>{7, 9, 11}));
  EXPECT_EQ(values(x.grad()), (std::vector<float>{7, 9, 11}));
}

TEST(AutogradLeaf, HookCanReplaceTheGradientBeforeAccumulation) {
  Tensor x = Tensor::from_vector<float>({1, 2}).requires_grad_();
  const uint64_t h = x.register_hook([](const Tensor& g) { return mul(g, 10.0); });
  sum(mul(x, x)).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<float>{20, 40}));
  EXPECT_TRUE(x.remove_hook(h));
  EXPECT_FALSE(x.remove_hook(h));
  sum(mul(x, x)).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<float>{22, 44}));  // accumulated, no longer scaled
}

TEST(AutogradLeaf, HookShapeMismatchIsAnError) {
  Tensor x = Tensor::from_vector<float>({1, 2}).requires_grad_();
  x.register_hook([](const Tensor&) { return ones({3}); });
  EXPECT_THROW(sum(mul(x, x)).backward(), Error);
}

TEST(AutogradLeaf, PostAccumulateHookRunsOnceAfterTheGradientIsComplete) {
  Tensor w = Tensor::from_vector<float>({1, 2}).requires_grad_();
  std::vector<std::vector<float>> at_hook;
  w.register_post_accumulate_grad_hook([&](const Tensor& p) {
    EXPECT_TRUE(p.is_same(w));
    at_hook.push_back(values(p.grad()));
  });
  Tensor x = Tensor::from_vector<float>({3, 5});
  sum(add(mul(w, x), mul(w, w))).backward();  // two uses: one call with x + 2w
  ASSERT_EQ(at_hook.size(), 1u);
  EXPECT_EQ(at_hook[0], (std::vector<float>{5, 9}));
  sum(mul(w, x)).backward();  // accumulates: the hook sees the running total
  ASSERT_EQ(at_hook.size(), 2u);
  EXPECT_EQ(at_hook[1], (std::vector<float>{8, 14}));
  Tensor y = mul(w, 2.0);
  EXPECT_THROW(y.register_post_accumulate_grad_hook([](const Tensor&) {}), Error);
}

TEST(AutogradNonLeaf, HookModifiesTheGradientFlowingUpstream) {
  Tensor x = Tensor::from_vector<float>({1, 2}).requires_grad_();
  Tensor y = mul(x, 3.0);
  std::vector<float> seen;
  y.register_hook([&](const Tensor& g) {
    seen = values(g);
    return mul(g, 2.0);
  });
  sum(mul(y, y)).backward();  // dL/dy = 2y = {6, 12}; doubled; dy/dx = 3
  EXPECT_EQ(seen, (std::vector<float>{6, 12}));
  EXPECT_EQ(values(x.grad()), (std::vector<float>{36, 72}));
}

TEST(AutogradNonLeaf, RetainGradKeepsTheIntermediateGradient) {
  Tensor x = Tensor::from_vector<float>({1, 2}).requires_grad_();
  Tensor y = mul(x, 3.0);
  Tensor z = mul(x, 4.0);
  y.retain_grad();
  EXPECT_TRUE(y.retains_grad());
  EXPECT_FALSE(z.retains_grad());
  Tensor loss = sum(add(mul(y, y), z));
  loss.backward(Tensor(), /*retain_graph=*/true);
  ASSERT_TRUE(y.grad().defined());
  EXPECT_EQ(values(y.grad()), (std::vector<float>{6, 12}));
  EXPECT_FALSE(z.grad().defined());
  loss.backward();  // a second pass adds
  EXPECT_EQ(values(y.grad()), (std::vector<float>{12, 24}));
  Tensor c = ones({2});
  EXPECT_THROW(c.retain_grad(), Error);
  EXPECT_THROW(c.register_hook([](const Tensor& g) { return g; }), Error);
}

TEST(AutogradNonLeaf, RetainGradRunsAfterTheHooks) {
  Tensor x = Tensor::from_vector<float>({1}).requires_grad_();
  Tensor y = mul(x, 1.0);
  y.retain_grad();
  y.register_hook([](const Tensor& g) { return mul(g, 5.0); });
  sum(y).backward();
  EXPECT_EQ(values(y.grad()), (std::vector<float>{5}));
}

// Gradients meeting at one input are summed into the first one in place when nothing else refers to it (engine.cpp,
// sole_owner). A gradient handed to two inputs (an add's backward gives both the same tensor) must stay as it was:
// here `a` collects the add's gradient, which q's branch also holds, plus 3 * w2 from a second use; q's gradient, and
// so p2's, must still be w.
TEST(AutogradEngine, SummingIntoASharedGradientLeavesItsOtherUsersAlone) {
  Tensor p = Tensor::from_vector<float>({1, 2, 3}).requires_grad_();
  Tensor p2 = Tensor::from_vector<float>({4, 5, 6}).requires_grad_();
  const Tensor w = Tensor::from_vector<float>({1, 10, 100}), w2 = Tensor::from_vector<float>({2, 20, 200});
  Tensor q = mul(p2, 1.0);
  Tensor a = mul(p, 1.0);
  Tensor s = add(a, q);
  Tensor a3 = mul(a, 3.0);
  add(sum(mul(s, w)), sum(mul(a3, w2))).backward();
  EXPECT_EQ(values(p2.grad()), (std::vector<float>{1, 10, 100}));
  EXPECT_EQ(values(p.grad()), (std::vector<float>{7, 70, 700}));
  // The same input twice from one node (x + x: both operands are the same tensor), and a chain of in-place sums.
  Tensor x = Tensor::from_vector<float>({1, 2}).requires_grad_();
  Tensor u = mul(x, 1.0);
  sum(add(add(add(u, u), mul(u, 2.0)), u)).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<float>{5, 5}));
}

TEST(AutogradEngine, GradientOnAnotherDeviceIsAnError) {
  // A user-written backward that returns its gradient on the wrong device (labelled CUDA: no GPU is
  // needed, the engine must refuse before anything touches the memory).
  Tensor x = Tensor::from_vector<float>({1, 2}).requires_grad_();
  Tensor out = Tensor::empty({2});
  static float host[2] = {1, 1};
  autograd::record("WrongDeviceBackward", {x}, {out}, [](const autograd::Grads&) {
    return autograd::Grads{Tensor::from_blob(host, {2}, DType::F32, Device(DeviceType::CUDA, 0))};
  });
  try {
    autograd::grad({out}, {x}, {ones({2})});
    FAIL() << "a gradient on cuda:0 for a cpu input was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("WrongDeviceBackward"), std::string::npos) << m;
    EXPECT_NE(m.find("expected device cpu but got cuda:0"), std::string::npos) << m;
  }
}

// The scoped handles of autograd/hooks.h (data parallel uses them).
namespace ampforge::autograd {
namespace {

Tensor hooked_leaf(std::vector<float> v) {
  Tensor t = Tensor::from_vector<float>(v);
  t.requires_grad_();
  return t;
}

TEST(PostAccumulateGradHook, CalledOnceAfterTheLastContribution) {
  Tensor a = hooked_leaf({1, 2}), b = hooked_leaf({3, 4}), unused = hooked_leaf({5});
  std::vector<std::string> calls;
  std::vector<float> a_grad_seen;
  auto ha = register_post_accumulate_grad_hook(a, [&](const Tensor& t) {
    calls.push_back("a");
    a_grad_seen = t.grad().tolist<float>();
  });
  auto hb = register_post_accumulate_grad_hook(b, [&](const Tensor&) { calls.push_back("b"); });
  auto hu = register_post_accumulate_grad_hook(unused, [&](const Tensor&) { calls.push_back("unused"); });
  // a is used twice (two gradient sinks): d/da sum(a * b + a) = b + 1.
  Tensor loss = sum(add(mul(a, b), a));
  loss.backward();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "a"), 1);
  EXPECT_EQ(a_grad_seen, (std::vector<float>{4, 5}));  // both contributions were in .grad already
  // A second pass accumulates and calls again; grad() calls nothing.
  sum(mul(a, b)).backward();
  EXPECT_EQ(calls.size(), 4u);
  EXPECT_EQ(a_grad_seen, (std::vector<float>{7, 9}));
  grad({sum(mul(a, b))}, {a}, {});
  EXPECT_EQ(calls.size(), 4u);
  // A removed hook is not called.
  ha.reset();
  sum(mul(a, b)).backward();
  EXPECT_EQ(calls.size(), 5u);
  EXPECT_EQ(calls.back(), "b");
}

TEST(PostAccumulateGradHook, OnlyLeavesThatRequireGrad) {
  Tensor t = Tensor::from_vector<float>({1});
  EXPECT_THROW(register_post_accumulate_grad_hook(t, [](const Tensor&) {}), Error);
}

}  // namespace
}  // namespace ampforge::autograd
