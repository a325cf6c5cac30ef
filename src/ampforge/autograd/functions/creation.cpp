// Creation functions of the public API (no autograd history).
#include "ampforge/autograd/functions.h"
#include "ampforge/ops/ops.h"

namespace ampforge {

Tensor zeros(const Shape& shape, DType dtype, Device device) { return ops::zeros(shape, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return ops::ones(shape, dtype, device); }
Tensor full(const Shape& shape, double value, DType dtype, Device device) { return ops::full(shape, value, dtype, device); }
Tensor zeros_like(const Tensor& t) { return ops::zeros_like(t); }
Tensor ones_like(const Tensor& t) { return ops::ones_like(t); }
Tensor arange(double start, double end, double step, DType dtype, Device device) {
  return ops::arange(start, end, step, dtype, device);
}
Tensor rand(const Shape& shape, DType dtype, Device device, Generator* gen) { return ops::rand(shape, dtype, device, gen); }
Tensor randn(const Shape& shape, DType dtype, Device device, Generator* gen) {
  return ops::randn(shape, dtype, device, gen);
}

}  // namespace ampforge
