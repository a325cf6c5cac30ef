// Image transforms with torchvision's names and semantics: RandomResizedCrop, Resize, CenterCrop,
// RandomHorizontalFlip, ToTensor (to_tensor), Normalize. They work on 8-bit images (data/image.h) as
// torchvision's PIL path does, so a pipeline reads like its torchvision.transforms.Compose:
//   train: RandomResizedCrop(224) -> RandomHorizontalFlip() -> to_tensor -> Normalize(ImageNet)
//   eval:  Resize(256) -> CenterCrop(224) -> to_tensor -> Normalize(ImageNet)
//
// Resampling is bilinear with PIL's (and torchvision's antialias=True) filter: a triangle over the source
// pixel centres, widened by the scale factor when downscaling so every source pixel contributes
// (antialiasing), with the weights renormalised at the borders; upscaling is plain bilinear with half-pixel
// centres (align_corners=False). Differences from PIL, all within one 8-bit level: PIL rounds to 8 bits
// between its horizontal and vertical passes and uses fixed-point weights; here both passes run in float
// and the result is rounded once.
//
// Randomness comes only from an ExampleRng, a Philox stream under the example's key (ExampleContext::key,
// which the DataLoader derives from (seed, epoch, example index)), so an example's augmentation depends on
// nothing else: not on the worker that builds it, nor on the examples before it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "ampforge/data/image.h"

namespace ampforge::data {

// ImageNet's per-channel statistics (RGB), torchvision's constants.
inline const std::vector<float> kImageNetMean{0.485f, 0.456f, 0.406f};
inline const std::vector<float> kImageNetStd{0.229f, 0.224f, 0.225f};

// A Philox-4x32 stream: words (key, counter 0), (key, counter 1), ... four at a time.
class ExampleRng {
 public:
  explicit ExampleRng(uint64_t key) : key_(key) {}
  uint32_t next_u32();
  double uniform();                       // [0, 1), 53 bits
  double uniform(double lo, double hi);   // [lo, hi)
  int64_t randint(int64_t lo, int64_t hi);  // [lo, hi), as torch.randint(lo, hi)

 private:
  uint64_t key_, counter_ = 0;
  std::array<uint32_t, 4> words_{};
  int used_ = 4;
};

// A rectangle in pixels (torchvision's (i, j, h, w)).
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox&) const = default;
};

// ---- functional forms (torchvision.transforms.functional)

// The whole image resampled to (height, width).
Image resize(const Image& src, int64_t height, int64_t width);
// F.resized_crop: the box (inside the image) cut out, then resampled to (height, width), in one pass.
Image resized_crop(const Image& src, const CropBox& box, int64_t height, int64_t width);
// The same for a box in fractional pixel coordinates (a box mapped onto a downscaled JPEG decode): the
// source pixels the box overlaps are read.
struct CropBoxF {
  double top = 0, left = 0, height = 0, width = 0;
};
Image resized_crop(const Image& src, const CropBoxF& box, int64_t height, int64_t width);
// crop(resize(src, height, width), window) for a window inside the (height, width) result, computing only
// the window's pixels (the eval path's Resize + CenterCrop in one pass).
Image resize_window(const Image& src, int64_t height, int64_t width, const CropBox& window);
// F.crop: the box, which may reach outside the image; pixels outside are 0 (torchvision pads with zeros).
Image crop(const Image& src, const CropBox& box);
// F.center_crop: the (height, width) box at torchvision's position (round((H - h) / 2), round((W - w) / 2)),
// zero-padded when larger than the image.
CropBox center_crop_box(int64_t image_height, int64_t image_width, int64_t height, int64_t width);
Image center_crop(const Image& src, int64_t height, int64_t width);
// F.hflip, in place.
void hflip_(Image& img);
// F.to_tensor: (C, H, W) floats v / 255 into dst (C * H * W floats).
void to_tensor(const Image& img, float* dst);
// The same resampling on float planes: src (channels, height, width) -> dst (channels, out_h, out_w).
void resize_planes(const float* src, int64_t channels, int64_t height, int64_t width, float* dst, int64_t out_h,
                   int64_t out_w);

// ---- transform objects (torchvision.transforms)

// Crops a random box of area fraction in `scale` and aspect ratio (w / h) in `ratio` (log-uniform), then
// resizes it to (height, width). torchvision's get_params: 10 attempts, then the central fallback crop
// (the whole image clamped to the ratio range).
class RandomResizedCrop {
 public:
  explicit RandomResizedCrop(int64_t size, std::array<double, 2> scale = {0.08, 1.0},
                             std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0});
  RandomResizedCrop(int64_t height, int64_t width, std::array<double, 2> scale, std::array<double, 2> ratio);
  CropBox get_params(int64_t image_height, int64_t image_width, ExampleRng& rng) const;
  Image operator()(const Image& img, ExampleRng& rng) const;
  int64_t height() const { return h_; }
  int64_t width() const { return w_; }

 private:
  int64_t h_, w_;
  std::array<double, 2> scale_, ratio_;
};

// Resize(size): the shorter side becomes `size`, the longer int(size * long / short) (torchvision's
// truncation); Resize(height, width): exactly that size.
class Resize {
 public:
  explicit Resize(int64_t size);
  Resize(int64_t height, int64_t width);
  std::array<int64_t, 2> output_size(int64_t image_height, int64_t image_width) const;  // (h, w)
  Image operator()(const Image& img) const;

 private:
  int64_t size_ = 0, h_ = 0, w_ = 0;
};

class CenterCrop {
 public:
  explicit CenterCrop(int64_t size) : CenterCrop(size, size) {}
  CenterCrop(int64_t height, int64_t width);
  CropBox box(int64_t image_height, int64_t image_width) const;
  Image operator()(const Image& img) const;

 private:
  int64_t h_, w_;
};

// Flips with probability p (one uniform draw, flipped when it is < p, as torch.rand(1) < p).
class RandomHorizontalFlip {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  bool draw(ExampleRng& rng) const;
  void operator()(Image& img, ExampleRng& rng) const;

 private:
  double p_;
};

// (x - mean[c]) * (1 / std[c]) per channel of (C, H, W) floats, in place. One value means every channel.
// Multiplying by the reciprocal (not dividing, as torchvision does) matches the DataLoader's arithmetic
// bit for bit; the two differ by at most one float ulp.
class Normalize {
 public:
  Normalize(std::vector<float> mean, std::vector<float> std);
  void operator()(float* chw, int64_t channels, int64_t plane) const;
  float mean(int64_t c) const { return mean_.size() == 1 ? mean_[0] : mean_[static_cast<size_t>(c)]; }
  float inv_std(int64_t c) const { return inv_std_.size() == 1 ? inv_std_[0] : inv_std_[static_cast<size_t>(c)]; }
  // Checks that the constants fit `channels` (one value, or one per channel); `what` names the caller.
  void check_channels(int64_t channels, const char* what) const;

 private:
  std::vector<float> mean_, inv_std_;
};

// The eval resize for a center crop of `crop`: round(crop * 256 / 224), i.e. 256 for 224 (torchvision's
// ImageNet recipe).
int64_t eval_resize_size(int64_t crop);

}  // namespace ampforge::data
