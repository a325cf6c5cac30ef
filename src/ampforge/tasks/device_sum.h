// DeviceSum: a sum over evaluation batches for the tasks' evaluators. On a device it stays there (F32: exact
// for counts below 2^24) and is read once, in value(), so an evaluation adds no host synchronisation per
// batch; on the CPU each addend is read into a double (nothing to save, and the sum is exact).
#pragma once

#include "ampforge/core/tensor.h"
#include "ampforge/ops/ops.h"

namespace ampforge::tasks {

class DeviceSum {
 public:
  // v: a one-element tensor of any floating dtype, on any device (one device per DeviceSum).
  void add(const Tensor& v) {
    if (v.device().is_cpu()) host_ += v.item();
    else dev_ = dev_.defined() ? ops::add(dev_, v) : v;
    used_ = true;
  }
  bool used() const { return used_; }  // whether add() was called
  double value() const { return host_ + (dev_.defined() ? dev_.item() : 0.0); }

 private:
  double host_ = 0;
  Tensor dev_;
  bool used_ = false;
};

}  // namespace ampforge::tasks
