// The NaN policy: what training does with a non-finite loss when no GradScaler handles it (a scaler
// skips the step and backs off by itself; BF16 and F32 runs have none). Written once for both ways the
// loop learns a loss: at once (host steps: the step then skipped backward and update) or later, read in
// a block from the device (the device already skipped that update).
#pragma once

#include <cstdint>
#include <string>

namespace ampforge::train {

enum class NanPolicy {
  Stop,  // stop training at the first non-finite loss (the default, as a non-finite loss is usually a bug)
  Skip,  // skip that step and go on (counted in skipped())
};
NanPolicy nan_policy_from_string(const std::string& s);  // "stop" | "skip"; else InvalidArgument

class NanGuard {
 public:
  NanGuard(NanPolicy policy, bool scaler_enabled) : policy_(policy), scaler_(scaler_enabled) {}
  // The loss of optimizer step `step` is now known (`read_at_step`: the step at which a device loss was
  // read, -1 for a host loss). Returns false when training must stop; reason() then says why.
  bool observe(double loss, int64_t step, int64_t read_at_step = -1);
  bool stopped() const { return !reason_.empty(); }
  const std::string& reason() const { return reason_; }
  int64_t skipped() const { return skipped_; }

 private:
  NanPolicy policy_;
  bool scaler_;
  std::string reason_;
  int64_t skipped_ = 0;
};

}  // namespace ampforge::train
