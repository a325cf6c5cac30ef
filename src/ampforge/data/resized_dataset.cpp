// ResizedDataset (contract in resized_dataset.h).
#include "ampforge/data/resized_dataset.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ampforge/data/transforms.h"
#include "ampforge/util/error.h"

namespace ampforge::data {

ResizedDataset::ResizedDataset(std::shared_ptr<const Dataset> base, int64_t channels, int64_t height, int64_t width)
    : base_(std::move(base)), channels_(channels), height_(height), width_(width) {
  AF_CHECK(base_ != nullptr, "ResizedDataset: no base dataset");
  AF_CHECK(channels > 0 && height > 0 && width > 0, "ResizedDataset: the output ({}, {}, {}) must be positive",
           channels, height, width);
  const Shape s = base_->example_shape();
  AF_CHECK(s.size() == 3, "ResizedDataset: the base dataset '{}' must give (C, H, W) examples, got {} dimensions",
           base_->name(), s.size());
  base_c_ = s[0];
  base_h_ = s[1];
  base_w_ = s[2];
  AF_CHECK(base_c_ == 1 || base_c_ == channels, "ResizedDataset: the base dataset '{}' has {} channels; expected 1 "
           "(replicated) or {}", base_->name(), base_c_, channels);
  AF_CHECK(base_h_ > 0 && base_w_ > 0, "ResizedDataset: the base dataset '{}' has empty examples", base_->name());
}

void ResizedDataset::get(int64_t i, float* dst, const ExampleContext& ctx) const {
  const int64_t plane = height_ * width_;
  if (base_c_ == channels_ && base_h_ == height_ && base_w_ == width_) {
    base_->get(i, dst, ctx);
    return;
  }
  std::vector<float> src(static_cast<size_t>(base_c_ * base_h_ * base_w_));
  base_->get(i, src.data(), ctx);
  if (base_h_ == height_ && base_w_ == width_)
    std::copy(src.begin(), src.end(), dst);
  else
    resize_planes(src.data(), base_c_, base_h_, base_w_, dst, height_, width_);
  if (base_c_ == 1)
    for (int64_t c = 1; c < channels_; ++c) std::copy_n(dst, plane, dst + c * plane);
}

Normalization ResizedDataset::normalization() const {
  std::call_once(stats_once_, [this] {
    const int64_t n = size(), plane = height_ * width_, count = std::min(n, kStatsExamples);
    std::vector<double> s(static_cast<size_t>(channels_)), s2(static_cast<size_t>(channels_));
    std::vector<float> x(static_cast<size_t>(channels_ * plane));
    for (int64_t k = 0; k < count; ++k) {
      get(k * n / count, x.data());
      for (int64_t c = 0; c < channels_; ++c) {
        double a = 0, b = 0;  // per example first, so that the sums keep their precision
        for (int64_t q = 0; q < plane; ++q) {
          const double v = x[static_cast<size_t>(c * plane + q)];
          a += v;
          b += v * v;
        }
        s[static_cast<size_t>(c)] += a;
        s2[static_cast<size_t>(c)] += b;
      }
    }
    const double total = static_cast<double>(count * plane);
    stats_.mean.clear();
    stats_.std.clear();
    for (int64_t c = 0; c < channels_; ++c) {
      const double m = s[static_cast<size_t>(c)] / total, var = s2[static_cast<size_t>(c)] / total - m * m;
      stats_.mean.push_back(static_cast<float>(m));
      stats_.std.push_back(static_cast<float>(std::sqrt(std::max(var, 1e-12))));
    }
  });
  return stats_;
}

}  // namespace ampforge::data
