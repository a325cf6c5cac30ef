// ops/: GradScaler primitives (state in one-element tensors on the device).
#include "ampforge/ops/ops.h"

namespace ampforge::ops {

void amp_unscale_(const Tensor& grads, const Tensor& inv_scale, const Tensor& found_inf) {
  check_float(grads, "amp_unscale", "grads");
  AF_CHECK(grads.is_contiguous(), "amp_unscale: gradients must be contiguous (flat buffers are)");
  AF_CHECK(inv_scale.numel() == 1 && inv_scale.dtype() == DType::F32, "amp_unscale: inv_scale must be one F32 value");
  AF_CHECK(found_inf.numel() == 1 && found_inf.dtype() == DType::F32, "amp_unscale: found_inf must be one F32 value");
  check_same_device(grads, inv_scale, "amp_unscale");
  check_same_device(grads, found_inf, "amp_unscale");
  dispatch(OpId::amp_unscale, grads.device(), {inv_scale}, {grads, found_inf});
  grads.storage()->bump_version();
  found_inf.storage()->bump_version();
}

void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       const AmpUpdateAttrs& attrs) {
  AF_CHECK(scale.numel() == 1 && scale.dtype() == DType::F32, "amp_update_scale: scale must be one F32 value");
  AF_CHECK(growth_tracker.numel() == 1 && growth_tracker.dtype() == DType::I32,
           "amp_update_scale: growth_tracker must be one I32 value");
  AF_CHECK(found_inf.numel() == 1 && found_inf.dtype() == DType::F32, "amp_update_scale: found_inf must be one F32 value");
  AF_CHECK(attrs.growth_factor > 1.0 && attrs.backoff_factor > 0 && attrs.backoff_factor < 1.0 && attrs.growth_interval > 0,
           "amp_update_scale: need growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0");
  check_same_device(scale, growth_tracker, "amp_update_scale");
  check_same_device(scale, found_inf, "amp_update_scale");
  dispatch(OpId::amp_update_scale, scale.device(), {found_inf}, {scale, growth_tracker}, &attrs);
  scale.storage()->bump_version();
  growth_tracker.storage()->bump_version();
}

}  // namespace ampforge::ops
