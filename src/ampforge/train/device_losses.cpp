#include "ampforge/train/device_losses.h"

#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"

namespace ampforge::train {

DeviceLosses::DeviceLosses(Device dev, int64_t capacity)
    : buf_(ops::zeros({capacity}, DType::F32, dev)), cap_(capacity) {
  AF_CHECK(capacity >= 1, "loss read interval must be >= 1, got {}", capacity);
}

bool DeviceLosses::add(const Tensor& loss) {
  AF_ASSERT(n_ < cap_, "DeviceLosses: block full; read() it first");
  autograd::NoGradGuard ng;
  ops::copy_(ops::narrow(buf_, 0, n_, 1), loss.reshape({1}).to(DType::F32));
  return ++n_ == cap_;
}

std::vector<double> DeviceLosses::read() {
  std::vector<double> out;
  if (n_ == 0) return out;
  Tensor host = ops::to_device(ops::narrow(buf_, 0, 0, n_), kCPU);
  const float* v = host.data<float>();
  out.assign(v, v + n_);
  n_ = 0;
  return out;
}

}  // namespace ampforge::train
