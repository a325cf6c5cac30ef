#include "ampforge/train/nan_policy.h"

#include <cmath>

#include <fmt/format.h>

#include "ampforge/util/error.h"

namespace ampforge::train {

NanPolicy nan_policy_from_string(const std::string& s) {
  if (s == "stop") return NanPolicy::Stop;
  if (s == "skip") return NanPolicy::Skip;
  AF_THROW(InvalidArgument, "--nan-policy must be stop or skip, got '{}'", s);
}


bool NanGuard::observe(double loss, int64_t step, int64_t read_at_step) {
  if (std::isfinite(loss) || scaler_) return !stopped();
  if (policy_ == NanPolicy::Skip) {
    ++skipped_;
    return !stopped();
  }
  if (reason_.empty())
    reason_ = read_at_step < 0 ? fmt::format("non-finite loss ({}) at step {}", loss, step)
                               : fmt::format("non-finite loss ({}) at step {} (the device skipped its update; read "
                                             "at step {})", loss, step, read_at_step);
  return false;
}

}  // namespace ampforge::train
