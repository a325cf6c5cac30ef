// Post-accumulate-grad hooks: called once per backward pass, after the leaf's last gradient of that pass is in
// .grad (a leaf used twice gets one call, after both), not for leaves the pass does not reach, not for grad().
#include "ampforge/autograd/hooks.h"

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge::autograd {
namespace {

Tensor leaf(std::vector<float> v) {
  Tensor t = Tensor::from_vector<float>(v);
  t.requires_grad_();
  return t;
}

TEST(PostAccumulateGradHook, CalledOnceAfterTheLastContribution) {
  Tensor a = leaf({1, 2}), b = leaf({3, 4}), unused = leaf({5});
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
