// Datasets: an indexable collection of (image, label) examples kept in memory as bytes or floats.
// The DataLoader (data_loader.h) turns them into batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/core/shape.h"

namespace ampforge::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Shape example_shape() const = 0;  // (C, H, W)
  virtual int64_t num_classes() const = 0;
  // Writes example i as floats in [0, 1] (or the data's own scale) into dst (numel of example_shape),
  // CHW order. Thread-safe (read-only).
  virtual void get(int64_t i, float* dst) const = 0;
  virtual int64_t label(int64_t i) const = 0;
  virtual std::string name() const = 0;
  // Per-channel normalisation constants commonly used for this data (mean, std).
  virtual std::pair<float, float> normalization() const { return {0.0f, 1.0f}; }
};

// Fashion-MNIST or MNIST from a directory holding the four IDX files (optionally .gz):
// train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte.
class MnistDataset final : public Dataset {
 public:
  MnistDataset(const std::string& dir, bool train, std::string display_name = "fashion-mnist");
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return Shape{1, rows_, cols_}; }
  int64_t num_classes() const override { return 10; }
  void get(int64_t i, float* dst) const override;
  int64_t label(int64_t i) const override { return labels_[static_cast<size_t>(i)]; }
  std::string name() const override { return name_; }
  std::pair<float, float> normalization() const override { return norm_; }
  const std::string& images_path() const { return images_path_; }

 private:
  std::string name_, images_path_;
  int64_t n_ = 0, rows_ = 0, cols_ = 0;
  std::vector<uint8_t> images_, labels_;
  std::pair<float, float> norm_;
};

// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Deterministic random data of any example shape: images N(0, 1) from the Philox stream of `seed`,
// labels uniform in [0, classes). Learnable: the label shifts the mean of the first channel.
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t size, Shape example_shape, int64_t classes, uint64_t seed);
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return shape_; }
  int64_t num_classes() const override { return classes_; }
  void get(int64_t i, float* dst) const override;
  int64_t label(int64_t i) const override;
  std::string name() const override { return "synthetic"; }

 private:
  int64_t n_, classes_;
  Shape shape_;
  uint64_t seed_;
};

}  // namespace ampforge::data
