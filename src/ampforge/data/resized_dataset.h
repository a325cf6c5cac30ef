// ResizedDataset: another dataset's examples resampled to (channels, height, width), so that models built
// for 3-channel images of some size (the torchvision ResNets) train on a small built-in set, e.g.
// ResizedDataset(fashion_mnist, 3, 32): Fashion-MNIST as 3 x 32 x 32.
//  - Resampling: data/transforms.h's bilinear filter (antialiased when downscaling), on floats.
//  - A one-channel base is replicated to every channel (as torchvision's Grayscale(3) / convert("RGB"));
//    otherwise the base must already have `channels` channels.
//  - Augmentation: the base's get is called with the same ExampleContext, so a base with random transforms
//    keeps its determinism.
//  - normalization(): measured on the resized examples, not copied from the base: interpolation smooths
//    (Fashion-MNIST at 32 x 32 has a 5% smaller std than at 28 x 28, and a 2% smaller mean from the
//    border weights). Per-channel mean and std over up to kStatsExamples examples spread evenly over the
//    set, computed once on the first call (thread-safe) and deterministic.
#pragma once

#include <memory>
#include <mutex>

#include "ampforge/data/dataset.h"

namespace ampforge::data {

class ResizedDataset final : public Dataset {
 public:
  static constexpr int64_t kStatsExamples = 2048;
  ResizedDataset(std::shared_ptr<const Dataset> base, int64_t channels, int64_t size)
      : ResizedDataset(std::move(base), channels, size, size) {}
  ResizedDataset(std::shared_ptr<const Dataset> base, int64_t channels, int64_t height, int64_t width);

  int64_t size() const override { return base_->size(); }
  Shape example_shape() const override { return Shape{channels_, height_, width_}; }
  int64_t num_classes() const override { return base_->num_classes(); }
  void get(int64_t i, float* dst) const override { get(i, dst, ExampleContext{}); }
  void get(int64_t i, float* dst, const ExampleContext& ctx) const override;
  int64_t label(int64_t i) const override { return base_->label(i); }
  std::string name() const override { return base_->name(); }
  Normalization normalization() const override;
  const Dataset& base() const { return *base_; }

 private:
  std::shared_ptr<const Dataset> base_;
  int64_t channels_, height_, width_;
  int64_t base_c_ = 0, base_h_ = 0, base_w_ = 0;
  mutable std::once_flag stats_once_;
  mutable Normalization stats_;
};

}  // namespace ampforge::data
