// ImageFolderDataset: torchvision's ImageFolder layout (what ImageNet's train/ and val/ folders use):
//   root/<class>/<...>/<file>.jpg|.jpeg|.png
// Classes are the sorted names of root's sub-folders, a label is the class's index; each class folder is
// walked recursively (symbolic links followed) and its files taken in sorted order (directory, then name),
// as torchvision's make_dataset does. Extensions are matched case-insensitively; other files are skipped
// (counted in skipped_files()). The file's bytes, not its extension, decide how it is decoded.
//
// Decoding and the transforms run inside get(), which the DataLoader calls on its worker threads, one file
// per example; nothing is cached. Examples are (3, S, S) floats in [0, 1]; the loader normalises them with
// normalization() (ImageNet's mean/std unless the options say otherwise).
//   train:  RandomResizedCrop(S, scale, ratio) -> RandomHorizontalFlip(hflip_p), keyed by the example's
//           ExampleContext::key (the same crop and flip for any number of workers)
//   eval:   Resize(resize_size or round(S * 256 / 224)) -> CenterCrop(S)
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ampforge/data/dataset.h"
#include "ampforge/data/image.h"
#include "ampforge/data/transforms.h"

namespace ampforge::data {

struct ImageFolderOptions {
  int64_t image_size = 224;  // S
  bool train = true;         // RandomResizedCrop + flip; false: Resize + CenterCrop
  std::array<double, 2> scale{0.08, 1.0};           // train: RandomResizedCrop's area range
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};  // train: its aspect-ratio range
  double hflip_p = 0.5;                              // train: flip probability
  int64_t resize_size = 0;  // eval: the shorter side before the center crop; 0: eval_resize_size(S)
  std::vector<float> mean = kImageNetMean, std = kImageNetStd;  // what normalization() reports
  // Decode JPEGs at 1/2, 1/4 or 1/8 of their size (libjpeg's DCT scaling) when the crop box (train) or the
  // resized image (eval) stays at least as large as the output: several times faster on large photos, at
  // the cost of pixels that differ slightly from a full decode + resize. The crop box and flip are the
  // same either way (drawn from the full-size header).
  bool reduced_jpeg_decode = false;

  static ImageFolderOptions train_defaults(int64_t image_size) {
    ImageFolderOptions o;
    o.image_size = image_size;
    return o;
  }
  static ImageFolderOptions eval_defaults(int64_t image_size) {
    ImageFolderOptions o;
    o.image_size = image_size;
    o.train = false;
    return o;
  }
};

class ImageFolderDataset final : public Dataset {
 public:
  // Scans `root`. Error(Io) if it is missing, has no class folder, or a class folder holds no image file.
  explicit ImageFolderDataset(const std::string& root, ImageFolderOptions opt = {});

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Shape example_shape() const override { return Shape{3, opt_.image_size, opt_.image_size}; }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  // Without a context: key 0 (deterministic; the eval transforms draw nothing).
  void get(int64_t i, float* dst) const override;
  void get(int64_t i, float* dst, const ExampleContext& ctx) const override;
  int64_t label(int64_t i) const override { return labels_[static_cast<size_t>(i)]; }
  std::string name() const override { return "image-folder"; }
  Normalization normalization() const override { return {opt_.mean, opt_.std}; }

  // Example i decoded and transformed, as 8-bit RGB (S, S, 3): what get() converts to floats.
  Image transformed(int64_t i, const ExampleContext& ctx) const;

  const std::string& root() const { return root_; }
  const std::vector<std::string>& classes() const { return classes_; }
  std::string path(int64_t i) const;  // root/<class>/...
  int64_t skipped_files() const { return skipped_; }
  const ImageFolderOptions& options() const { return opt_; }

 private:
  std::string root_;
  ImageFolderOptions opt_;
  std::vector<std::string> classes_;
  std::string rel_paths_;                // every file's path relative to root, back to back
  std::vector<uint64_t> path_offsets_;   // (size + 1) offsets into rel_paths_
  std::vector<int32_t> labels_;
  int64_t skipped_ = 0;
  RandomResizedCrop rrc_;
  RandomHorizontalFlip flip_;
  Resize resize_;
  CenterCrop center_;
};

}  // namespace ampforge::data
