// ops/: matmul and linear.
#include "ampforge/ops/ops.h"

namespace ampforge::ops {

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check_defined(a_in, "matmul", "input");
  check_defined(b_in, "matmul", "other");
  check_same_device(a_in, b_in, "matmul");
  check_float(a_in, "matmul", "input");
  check_float(b_in, "matmul", "other");
  AF_CHECK(a_in.dtype() == b_in.dtype(), "matmul: both operands must have the same dtype, got {} and {}",
           dtype_name(a_in.dtype()), dtype_name(b_in.dtype()));
  AF_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: both operands need at least 1 dimension, got shapes {} and {}",
           a_in.shape().str(), b_in.shape().str());
  // Promote 1-D operands as numpy does, then drop the added dims at the end.
  Tensor a = a_in.dim() == 1 ? unsqueeze(a_in, 0) : a_in;
  Tensor b = b_in.dim() == 1 ? unsqueeze(b_in, 1) : b_in;
  const int64_t M = a.size(-2), K = a.size(-1), K2 = b.size(-2), N = b.size(-1);
  AF_CHECK(K == K2, "matmul: inner dimensions differ: {} (shape {}) vs {} (shape {})", K, a_in.shape().str(), K2,
           b_in.shape().str());
  Shape abatch, bbatch;
  for (int i = 0; i < a.dim() - 2; ++i) abatch.push_back(a.shape()[i]);
  for (int i = 0; i < b.dim() - 2; ++i) bbatch.push_back(b.shape()[i]);
  const Shape batch = broadcast_shapes(abatch, bbatch, "matmul");
  const int64_t nb = shape_numel(batch);
  // Fold batch dims into one: expand each operand to the broadcast batch, then view as 3-D.
  auto fold = [&](const Tensor& t, int64_t r, int64_t c) {
    Shape full = batch;
    full.push_back(r);
    full.push_back(c);
    Tensor e = expand(t, full);
    Shape s3{nb, r, c};
    auto st = view_strides(e, s3);
    if (!st) {
      e = contiguous(e);
      st = view_strides(e, s3);
    }
    return e.as_strided_raw(s3, *st, e.offset());
  };
  Tensor a3 = fold(a, M, K), b3 = fold(b, K, N);
  Tensor out3 = Tensor::empty(Shape{nb, M, N}, a.dtype(), a.device());
  dispatch(OpId::matmul, a.device(), {a3, b3}, {out3});
  Shape os = batch;
  if (a_in.dim() > 1) os.push_back(M);
  if (b_in.dim() > 1) os.push_back(N);
  return out3.as_strided_raw(os, contiguous_strides(os), 0);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_defined(x, "linear", "input");
  check_defined(w, "linear", "weight");
  check_same_device(x, w, "linear");
  check_float(x, "linear", "input");
  AF_CHECK(w.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got shape {}", w.shape().str());
  AF_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1),
           "linear: input's last dimension ({}) must equal in_features ({}); input shape {}, weight shape {}",
           x.dim() >= 1 ? x.size(-1) : 0, w.size(1), x.shape().str(), w.shape().str());
  AF_CHECK(x.dtype() == w.dtype(), "linear: input and weight dtypes differ ({} vs {})", dtype_name(x.dtype()),
           dtype_name(w.dtype()));
  if (bias.defined()) {
    check_same_device(x, bias, "linear");
    AF_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), "linear: bias must have shape [{}], got {}", w.size(0),
             bias.shape().str());
    AF_CHECK(bias.dtype() == x.dtype(), "linear: bias dtype {} differs from input dtype {}", dtype_name(bias.dtype()),
             dtype_name(x.dtype()));
  }
  const int64_t K = w.size(1), N = w.size(0);
  // Rows: the product of x's leading dims (x.numel() / K would be 0 for K == 0 whatever the rows).
  int64_t M = 1;
  for (int i = 0; i + 1 < x.dim(); ++i) M *= x.size(i);
  Tensor x2 = x.dim() == 2 ? x : reshape(x, Shape{M, K});
  Tensor out = Tensor::empty(Shape{M, N}, x.dtype(), x.device());
  if (bias.defined())
    dispatch(OpId::linear, x.device(), {x2, w, bias}, {out});
  else
    dispatch(OpId::linear, x.device(), {x2, w}, {out});
  Shape os = x.shape();
  os[os.size() - 1] = N;
  return out.as_strided_raw(os, contiguous_strides(os), 0);
}

}  // namespace ampforge::ops
