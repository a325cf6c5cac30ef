// Mixed-precision kernels: the fused unscale + non-finite check over a flat gradient buffer, and the
// one-element scale update. Both keep the GradScaler's state in tensors, so no host decision is needed.
#include <atomic>
#include <cmath>

#include "ampforge/backends/cpu/loops.h"
#include "ampforge/backends/cpu/register.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"

namespace ampforge::cpu {
namespace {

// inputs {inv_scale (F32, one element)}, outputs {grad (in place), found_inf (F32, one element; set to 1
// when a non-finite value is seen, never cleared here)}.
void unscale_kernel(const KernelArgs& a) {
  const Tensor& g = a.out(0);
  const float inv = *static_cast<const float*>(a.in(0).data_ptr());
  float* found = static_cast<float*>(a.out(1).data_ptr());
  std::atomic<bool> any{false};
  visit_float(g.dtype(), "amp_unscale", [&](auto tag) {
    using S = decltype(tag);
    using A = compute_t<S>;
    AF_ASSERT(g.is_contiguous(), "amp_unscale: gradients must be contiguous");
    S* p = static_cast<S*>(g.data_ptr());
    parallel_for(g.numel(), 65536, [&](int64_t b, int64_t e) {
      alignas(64) A buf[kChunk];
      bool bad = false;
      for (int64_t c = b; c < e; c += kChunk) {
        const int64_t m = std::min(kChunk, e - c);
        load_n<S, A>(p + c, buf, m);
        // One pass: finite check on the scaled value (x * 0 != 0 exactly for Inf and NaN), then scale.
        A acc = A(0);
        for (int64_t i = 0; i < m; ++i) {
          acc += buf[i] * A(0);
          buf[i] *= static_cast<A>(inv);
        }
        if (acc != acc) bad = true;
        store_n<S, A>(buf, p + c, m);
      }
      if (bad) any.store(true, std::memory_order_relaxed);
    });
  });
  if (any.load()) *found = 1.0f;
}

// inputs {found_inf}, outputs {scale (F32), growth_tracker (I32)}.
void update_scale_kernel(const KernelArgs& a) {
  const auto& at = a.attr<AmpUpdateAttrs>();
  const float found = *static_cast<const float*>(a.in(0).data_ptr());
  float* scale = static_cast<float*>(a.out(0).data_ptr());
  int32_t* tracker = static_cast<int32_t*>(a.out(1).data_ptr());
  if (found != 0.0f) {
    *scale *= static_cast<float>(at.backoff_factor);
    *tracker = 0;
    return;
  }
  const int64_t successful = static_cast<int64_t>(*tracker) + 1;
  if (successful == at.growth_interval) {
    const float grown = *scale * static_cast<float>(at.growth_factor);
    if (std::isfinite(grown)) *scale = grown;
    *tracker = 0;
  } else {
    *tracker = static_cast<int32_t>(successful);
  }
}

}  // namespace

void register_amp_cpu() {
  register_kernel(OpId::amp_unscale, DeviceType::CPU, unscale_kernel);
  register_kernel(OpId::amp_update_scale, DeviceType::CPU, update_scale_kernel);
}

}  // namespace ampforge::cpu
