// Internal to autograd/ and its tests: scaled_dot_product_attention's two paths (functions.h declares the
// public function, which picks the fused `attention` op when ops::attention_applies() and the composite
// otherwise). The tests compare the two.
#pragma once

#include "ampforge/core/tensor.h"

namespace ampforge::detail {

// The composite path: matmul, where, softmax (materialises the (..., Tq, Tk) scores). Same arguments,
// validation and autocast as scaled_dot_product_attention.
Tensor scaled_dot_product_attention_composite(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                              bool causal, double scale);

}  // namespace ampforge::detail
