// Differentiable matmul and linear.
#include "ampforge/autograd/autocast.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge {

using autograd::Grads;
using autograd::SavedTensor;
using autograd::needs_grad;
using autograd::record;

namespace {
Tensor mT(const Tensor& t) {  // transpose of the last two dims (a view)
  std::vector<int64_t> p(t.dim());
  for (int i = 0; i < t.dim(); ++i) p[i] = i;
  std::swap(p[t.dim() - 1], p[t.dim() - 2]);
  return ops::permute(t, p);
}
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  Tensor a = a_in, b = b_in;
  autograd::autocast_inputs(OpId::matmul, {&a, &b});
  Tensor out = ops::matmul(a, b);
  if (!needs_grad({&a, &b})) return out;
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  record("MatmulBackward", {a, b}, {out}, [ga, gb, A = SavedTensor(a), B = SavedTensor(b)](const Grads& g) -> Grads {
    Tensor aa = A.get(), bb = B.get(), gg = g[0];
    // Promote 1-D operands as the forward did, so the formulas below are the 2-D/batched ones.
    Tensor a2 = aa.dim() == 1 ? ops::unsqueeze(aa, 0) : aa;
    Tensor b2 = bb.dim() == 1 ? ops::unsqueeze(bb, 1) : bb;
    Shape ab, bbt;
    for (int i = 0; i + 2 < a2.dim(); ++i) ab.push_back(a2.shape()[i]);
    for (int i = 0; i + 2 < b2.dim(); ++i) bbt.push_back(b2.shape()[i]);
    Shape ps = broadcast_shapes(ab, bbt, "matmul backward");
    ps.push_back(a2.size(-2));
    ps.push_back(b2.size(-1));
    Tensor g2 = ops::reshape(gg, ps);
    Tensor gA, gB;
    if (ga) gA = ops::sum_to(ops::matmul(g2, mT(b2)), a2.shape());
    if (gb) gB = ops::sum_to(ops::matmul(mT(a2), g2), b2.shape());
    if (ga && aa.dim() == 1) gA = ops::reshape(gA, aa.shape());
    if (gb && bb.dim() == 1) gB = ops::reshape(gB, bb.shape());
    return {gA, gB};
  });
  return out;
}

Tensor linear(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in) {
  Tensor x = x_in, w = w_in, b = b_in;
  autograd::autocast_inputs(OpId::linear, {&x, &w, &b});
  Tensor out = ops::linear(x, w, b);
  if (!needs_grad({&x, &w, &b})) return out;
  const bool gx = x.requires_grad(), gw = w.requires_grad(), gbias = b.defined() && b.requires_grad();
  record("LinearBackward", {x, w, b}, {out},
         [gx, gw, gbias, X = SavedTensor(gw ? x : Tensor()), W = SavedTensor(gx ? w : Tensor())](const Grads& g) -> Grads {
           const Tensor& gy = g[0];
           const int64_t N = gy.size(-1);
           Tensor gy2 = ops::reshape(gy, Shape{-1, N});
           Tensor gX, gW, gB;
           if (gx) {
             Tensor w = W.get();
             gX = ops::reshape(ops::matmul(gy2, w), [&] {
               Shape s = gy.shape();
               s[s.size() - 1] = w.size(1);
               return s;
             }());
           }
           if (gw) {
             Tensor x = X.get();
             Tensor x2 = ops::reshape(x, Shape{-1, x.size(-1)});
             gW = ops::matmul(mT(gy2), x2);
           }
           if (gbias) gB = ops::sum(gy2, {0});
           return {gX, gW, gB};
         });
  return out;
}

}  // namespace ampforge
