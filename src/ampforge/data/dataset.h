// Datasets: an indexable collection of (image, label) examples kept in memory as bytes or floats.
// The DataLoader (data_loader.h) turns them into batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/core/shape.h"

namespace ampforge::data {

// What the DataLoader tells a dataset about the example it asks for. `key` seeds the example's random
// transforms (a Philox key, data/transforms.h ExampleRng): the loader derives it from (seed, epoch, example
// index) only (example_key in data_loader.h), so augmentation is the same for any number of workers.
struct ExampleContext {
  uint64_t key = 0;
  int64_t epoch = 0;
  int64_t index = 0;
};

// Normalisation constants: one value per channel, or one value for every channel.
struct Normalization {
  std::vector<float> mean{0.0f}, std{1.0f};
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Shape example_shape() const = 0;  // (C, H, W)
  virtual int64_t num_classes() const = 0;
  // Writes example i as floats in [0, 1] (or the data's own scale) into dst (numel of example_shape),
  // CHW order. Thread-safe (read-only).
  virtual void get(int64_t i, float* dst) const = 0;
  // The same with the example's augmentation key; what the DataLoader calls (from its worker threads).
  // Datasets with random transforms override it; the default ignores the context.
  virtual void get(int64_t i, float* dst, const ExampleContext& ctx) const {
    (void)ctx;
    get(i, dst);
  }
  virtual int64_t label(int64_t i) const = 0;
  virtual std::string name() const = 0;
  // Per-channel normalisation constants commonly used for this data.
  virtual Normalization normalization() const { return {}; }
  // Detection data (data/yolo_dataset.h): the most objects one example has; 0 for every other dataset. When
  // positive, the DataLoader fills Batch::targets (B, max_targets, 5) from targets().
  virtual int64_t max_targets() const { return 0; }
  // Example i's objects as rows (class, cx, cy, w, h), the box normalised to the example as get(i, dst, ctx)
  // writes it (same ctx, same augmentation); writes max_targets() rows of 5 floats, unused rows all zero.
  virtual void targets(int64_t i, const ExampleContext& ctx, float* rows) const {
    (void)i, (void)ctx, (void)rows;
  }
};

// Fashion-MNIST or MNIST from a directory holding the four IDX files (optionally .gz):
// train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte.
class MnistDataset final : public Dataset {
 public:
  MnistDataset(const std::string& dir, bool train, std::string display_name = "fashion-mnist");
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return Shape{1, rows_, cols_}; }
  int64_t num_classes() const override { return 10; }
  using Dataset::get;
  void get(int64_t i, float* dst) const override;
  int64_t label(int64_t i) const override { return labels_[static_cast<size_t>(i)]; }
  std::string name() const override { return name_; }
  Normalization normalization() const override { return norm_; }
  const std::string& images_path() const { return images_path_; }

 private:
  std::string name_, images_path_;
  int64_t n_ = 0, rows_ = 0, cols_ = 0;
  std::vector<uint8_t> images_, labels_;
  Normalization norm_;
};

// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// The Fashion-MNIST folder used when none is given: $AMPFORGE_FASHION_MNIST_DIR when set and not empty (a
// machine without the Debian package, e.g. the GPU machine, where scripts/gpu-check unpacks it from its kit),
// else kDefaultFashionMnistDir.
std::string default_fashion_mnist_dir();

// Deterministic random data of any example shape: images about N(0, 1), labels uniform in [0, classes).
// Learnable: the label shifts the mean of the first channel. Cheap enough to feed a GPU at ImageNet sizes
// (benchmarks): each value is the Gaussian quantile of one of 4096 equiprobable levels (a table), picked by
// 12 bits of the Philox stream of (seed, example, position), eight values per Philox block, so an example
// depends only on (seed, index) and costs about 15 times less than the Box-Muller transform it replaced
// (bench/data_bench).
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t size, Shape example_shape, int64_t classes, uint64_t seed);
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return shape_; }
  int64_t num_classes() const override { return classes_; }
  using Dataset::get;
  void get(int64_t i, float* dst) const override;
  int64_t label(int64_t i) const override;
  std::string name() const override { return "synthetic"; }

 private:
  int64_t n_, classes_;
  Shape shape_;
  uint64_t seed_;
};

}  // namespace ampforge::data
