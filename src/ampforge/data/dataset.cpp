#include "ampforge/data/dataset.h"

#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "ampforge/core/generator.h"
#include "ampforge/data/idx.h"
#include "ampforge/util/error.h"

namespace ampforge::data {

std::string default_fashion_mnist_dir() {
  const char* env = std::getenv("AMPFORGE_FASHION_MNIST_DIR");
  return env && *env ? std::string(env) : std::string(kDefaultFashionMnistDir);
}

namespace {
std::string find_idx(const std::string& dir, const std::string& stem) {
  for (const char* ext : {"", ".gz"}) {
    std::string p = dir + "/" + stem + ext;
    if (std::filesystem::exists(p)) return p;
  }
  AF_THROW(Io, "data directory '{}' has no '{}' or '{}.gz' (for Fashion-MNIST on Debian: apt-get install "
           "dataset-fashion-mnist, which installs into {})", dir, stem, stem, kDefaultFashionMnistDir);
}
}  // namespace

MnistDataset::MnistDataset(const std::string& dir, bool train, std::string display_name) : name_(std::move(display_name)) {
  if (!std::filesystem::is_directory(dir))
    AF_THROW(Io, "data directory '{}' does not exist{}", dir,
             dir == kDefaultFashionMnistDir ? " (install it with: apt-get install dataset-fashion-mnist)" : "");
  const std::string prefix = train ? "train" : "t10k";
  images_path_ = find_idx(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_idx(dir, prefix + "-labels-idx1-ubyte");
  IdxArray img = read_idx_u8(images_path_);
  IdxArray lab = read_idx_u8(labels_path);
  if (img.shape.size() != 3) AF_THROW(Io, "'{}': expected 3 dimensions (N, rows, cols), got {}", images_path_, img.shape.size());
  if (lab.shape.size() != 1) AF_THROW(Io, "'{}': expected 1 dimension (N), got {}", labels_path, lab.shape.size());
  if (img.shape[0] != lab.shape[0])
    AF_THROW(Io, "'{}' has {} images but '{}' has {} labels", images_path_, img.shape[0], labels_path, lab.shape[0]);
  for (uint8_t l : lab.data)
    if (l >= 10) AF_THROW(Io, "'{}' contains label {} (expected 0..9)", labels_path, l);
  n_ = img.shape[0];
  rows_ = img.shape[1];
  cols_ = img.shape[2];
  images_ = std::move(img.data);
  labels_ = std::move(lab.data);
  // Mean and std of this split's pixels. The trainer normalises both splits with the training split's.
  double s = 0, s2 = 0;
  for (uint8_t v : images_) {
    s += v;
    s2 += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(images_.size());
  const double mean = s / n / 255.0, var = s2 / n / (255.0 * 255.0) - mean * mean;
  norm_ = {{static_cast<float>(mean)}, {static_cast<float>(std::sqrt(std::max(var, 1e-12)))}};
}

void MnistDataset::get(int64_t i, float* dst) const {
  const uint8_t* src = images_.data() + i * rows_ * cols_;
  for (int64_t k = 0; k < rows_ * cols_; ++k) dst[k] = static_cast<float>(src[k]) * (1.0f / 255.0f);
}

SyntheticDataset::SyntheticDataset(int64_t size, Shape shape, int64_t classes, uint64_t seed)
    : n_(size), classes_(classes), shape_(shape), seed_(seed) {
  AF_CHECK(size > 0 && classes > 0, "synthetic dataset: size and classes must be positive");
  check_sizes_nonnegative(shape, "synthetic dataset");
}

int64_t SyntheticDataset::label(int64_t i) const {
  auto w = philox4x32(seed_ ^ 0x1abe1ULL, static_cast<uint64_t>(i));
  return static_cast<int64_t>(w[0] % static_cast<uint32_t>(classes_));
}

namespace {
// kNormal[j] = Phi^-1((j + 0.5) / 4096): 4096 equiprobable Gaussian levels, symmetric (mean exactly 0,
// variance 0.99968, |values| <= 3.67).
const std::array<float, 4096>& normal_levels() {
  static const std::array<float, 4096> table = [] {
    std::array<float, 4096> t{};
    for (int j = 0; j < 2048; ++j) {
      const double p = (j + 0.5) / 4096.0;
      double x = 0;  // Newton on Phi(x) - p; from 0 it converges monotonically (Phi is convex for x < 0)
      for (int it = 0; it < 100; ++it) {
        const double f = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
        const double step = f / (std::exp(-0.5 * x * x) / std::sqrt(2.0 * 3.141592653589793));
        x -= step;
        if (std::abs(step) < 1e-13) break;
      }
      t[static_cast<size_t>(j)] = static_cast<float>(x);
      t[static_cast<size_t>(4095 - j)] = static_cast<float>(-x);
    }
    return t;
  }();
  return table;
}
}  // namespace

void SyntheticDataset::get(int64_t i, float* dst) const {
  const int64_t n = shape_numel(shape_);
  const std::array<float, 4096>& levels = normal_levels();
  const uint64_t base = static_cast<uint64_t>(i) << 32;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const auto w = philox4x32(seed_, base + static_cast<uint64_t>(k / 8));
    for (int j = 0; j < 4; ++j) {
      dst[k + 2 * j] = levels[(w[static_cast<size_t>(j)] >> 4) & 4095u];
      dst[k + 2 * j + 1] = levels[w[static_cast<size_t>(j)] >> 20];
    }
  }
  if (k < n) {
    const auto w = philox4x32(seed_, base + static_cast<uint64_t>(k / 8));
    for (int j = 0; k + j < n; ++j)
      dst[k + j] = levels[(j % 2 ? w[static_cast<size_t>(j / 2)] >> 20 : w[static_cast<size_t>(j / 2)] >> 4) & 4095u];
  }
  // Learnable but not trivial: the label moves the mean of the first channel by 3 * label / classes.
  const float shift = 3.0f * static_cast<float>(label(i)) / static_cast<float>(classes_);
  const int64_t plane = n / std::max<int64_t>(shape_.size() > 0 ? shape_[0] : 1, 1);
  for (int64_t q = 0; q < plane; ++q) dst[q] += shift;
}

}  // namespace ampforge::data
