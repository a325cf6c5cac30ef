// Image transforms (contract in transforms.h). The resampler is separable: per axis a table of (first source
// pixel, count, weights) for every output pixel, then a horizontal pass over only the source rows the
// vertical pass reads, into float rows, then the vertical pass, which converts once at the end.
#include "ampforge/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ampforge/core/generator.h"
#include "ampforge/util/error.h"

namespace ampforge::data {

// ---------------------------------------------------------------------------------------------- random

uint32_t ExampleRng::next_u32() {
  if (used_ == 4) {
    words_ = philox4x32(key_, counter_++);
    used_ = 0;
  }
  return words_[static_cast<size_t>(used_++)];
}

double ExampleRng::uniform() {
  const uint64_t a = next_u32(), b = next_u32();
  return static_cast<double>((a << 21) | (b >> 11)) * 0x1p-53;
}

double ExampleRng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

int64_t ExampleRng::randint(int64_t lo, int64_t hi) {
  AF_ASSERT(hi > lo, "randint({}, {}): empty range", lo, hi);
  const uint64_t a = next_u32(), b = next_u32();
  return lo + static_cast<int64_t>(((a << 32) | b) % static_cast<uint64_t>(hi - lo));
}

// ---------------------------------------------------------------------------------------------- resampling

namespace {

struct AxisWeights {
  int64_t out = 0, ksize = 0;
  std::vector<int64_t> first, count;  // (out): the source pixels [first, first + count) of each output pixel
  std::vector<float> w;               // (out, ksize)
};

// Output pixels [0, out) cover the source interval [lo, hi) (pixel-edge coordinates: pixel j spans
// [j, j + 1)); only source pixels in [clip_lo, clip_hi) are read. The triangle filter (bilinear) has a
// support of one source pixel, widened by the scale factor when downscaling (antialiasing, PIL's rule).
AxisWeights axis_weights(double lo, double hi, int64_t out, int64_t clip_lo, int64_t clip_hi) {
  AxisWeights a;
  a.out = out;
  const double scale = (hi - lo) / static_cast<double>(out);
  const double widen = std::max(scale, 1.0), support = widen;
  a.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  a.first.resize(static_cast<size_t>(out));
  a.count.resize(static_cast<size_t>(out));
  a.w.assign(static_cast<size_t>(out * a.ksize), 0.0f);
  std::vector<double> wk(static_cast<size_t>(a.ksize));
  for (int64_t x = 0; x < out; ++x) {
    const double center = lo + (static_cast<double>(x) + 0.5) * scale;
    const int64_t x0 = std::max(clip_lo, static_cast<int64_t>(std::floor(center - support + 0.5)));
    const int64_t x1 = std::min(clip_hi, static_cast<int64_t>(std::floor(center + support + 0.5)));
    const int64_t n = std::clamp<int64_t>(x1 - x0, 0, a.ksize);
    double sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double t = (static_cast<double>(x0 + k) + 0.5 - center) / widen;
      wk[static_cast<size_t>(k)] = std::max(0.0, 1.0 - std::abs(t));
      sum += wk[static_cast<size_t>(k)];
    }
    for (int64_t k = 0; k < n; ++k)
      a.w[static_cast<size_t>(x * a.ksize + k)] = sum > 0 ? static_cast<float>(wk[static_cast<size_t>(k)] / sum) : 0.0f;
    a.first[static_cast<size_t>(x)] = x0;
    a.count[static_cast<size_t>(x)] = n;
  }
  return a;
}

template <class T>
T convert_out(float v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f) + 0.5f);
  } else {
    return v;
  }
}

// Strides in elements of an image with C channels: between channels, pixels of a row, rows.
struct Layout {
  int64_t cs, xs, ys;
};

template <class In, class Out>
void resample(const In* src, Layout s, int64_t C, const AxisWeights& wy, const AxisWeights& wx, Out* dst, Layout d) {
  const int64_t ow = wx.out, oh = wy.out, row = ow * C;
  int64_t r0 = INT64_MAX, r1 = INT64_MIN;
  for (int64_t y = 0; y < oh; ++y)
    if (wy.count[static_cast<size_t>(y)] > 0) {
      r0 = std::min(r0, wy.first[static_cast<size_t>(y)]);
      r1 = std::max(r1, wy.first[static_cast<size_t>(y)] + wy.count[static_cast<size_t>(y)]);
    }
  std::vector<float> rows(r0 < r1 ? static_cast<size_t>((r1 - r0) * row) : 0);  // (source rows, ow, C)
  for (int64_t y = r0; y < r1; ++y) {
    const In* srow = src + y * s.ys;
    float* trow = rows.data() + (y - r0) * row;
    for (int64_t x = 0; x < ow; ++x) {
      const float* w = wx.w.data() + x * wx.ksize;
      const In* sp = srow + wx.first[static_cast<size_t>(x)] * s.xs;
      const int64_t n = wx.count[static_cast<size_t>(x)];
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0;
        for (int64_t k = 0; k < n; ++k) acc += w[k] * static_cast<float>(sp[k * s.xs + c * s.cs]);
        trow[x * C + c] = acc;
      }
    }
  }
  std::vector<float> acc(static_cast<size_t>(row));
  for (int64_t y = 0; y < oh; ++y) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const float* w = wy.w.data() + y * wy.ksize;
    for (int64_t k = 0; k < wy.count[static_cast<size_t>(y)]; ++k) {
      const float* trow = rows.data() + (wy.first[static_cast<size_t>(y)] + k - r0) * row;
      const float wk = w[k];
      for (int64_t q = 0; q < row; ++q) acc[static_cast<size_t>(q)] += wk * trow[q];
    }
    Out* drow = dst + y * d.ys;
    for (int64_t x = 0; x < ow; ++x)
      for (int64_t c = 0; c < C; ++c) drow[x * d.xs + c * d.cs] = convert_out<Out>(acc[static_cast<size_t>(x * C + c)]);
  }
}

Layout hwc(const Image& img) { return {1, img.channels, img.width * img.channels}; }

void check_image(const Image& img, const char* what) {
  AF_CHECK(img.height > 0 && img.width > 0 && img.channels > 0 &&
               img.pixels.size() == static_cast<size_t>(img.height * img.width * img.channels),
           "{}: expected a non-empty image whose pixels hold height x width x channels bytes, got {} x {} x {} with {} "
           "bytes", what, img.height, img.width, img.channels, img.pixels.size());
}

void check_size(int64_t h, int64_t w, const char* what) {
  AF_CHECK(h > 0 && w > 0, "{}: the output size must be positive, got {} x {}", what, h, w);
}

int64_t round_half_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

}  // namespace

Image resize(const Image& src, int64_t height, int64_t width) {
  return resized_crop(src, CropBox{0, 0, src.height, src.width}, height, width);
}

Image resized_crop(const Image& src, const CropBox& b, int64_t height, int64_t width) {
  check_image(src, "resized_crop");
  check_size(height, width, "resized_crop");
  AF_CHECK(b.height > 0 && b.width > 0 && b.top >= 0 && b.left >= 0 && b.top + b.height <= src.height &&
               b.left + b.width <= src.width,
           "resized_crop: the box (top {}, left {}, height {}, width {}) must lie inside the {} x {} image", b.top,
           b.left, b.height, b.width, src.height, src.width);
  Image out(height, width, src.channels);
  const auto wy = axis_weights(static_cast<double>(b.top), static_cast<double>(b.top + b.height), height, b.top,
                               b.top + b.height);
  const auto wx = axis_weights(static_cast<double>(b.left), static_cast<double>(b.left + b.width), width, b.left,
                               b.left + b.width);
  resample(src.pixels.data(), hwc(src), src.channels, wy, wx, out.pixels.data(), hwc(out));
  return out;
}

Image resized_crop(const Image& src, const CropBoxF& b, int64_t height, int64_t width) {
  check_image(src, "resized_crop");
  check_size(height, width, "resized_crop");
  AF_CHECK(b.height > 0 && b.width > 0 && b.top >= 0 && b.left >= 0 && b.top + b.height <= src.height + 1e-6 &&
               b.left + b.width <= src.width + 1e-6,
           "resized_crop: the box (top {}, left {}, height {}, width {}) must lie inside the {} x {} image", b.top,
           b.left, b.height, b.width, src.height, src.width);
  auto clip_lo = [](double v) { return static_cast<int64_t>(std::floor(v + 1e-9)); };
  auto clip_hi = [](double v, int64_t n) { return std::min(n, static_cast<int64_t>(std::ceil(v - 1e-9))); };
  Image out(height, width, src.channels);
  const auto wy = axis_weights(b.top, b.top + b.height, height, clip_lo(b.top), clip_hi(b.top + b.height, src.height));
  const auto wx = axis_weights(b.left, b.left + b.width, width, clip_lo(b.left), clip_hi(b.left + b.width, src.width));
  resample(src.pixels.data(), hwc(src), src.channels, wy, wx, out.pixels.data(), hwc(out));
  return out;
}

Image resize_window(const Image& src, int64_t height, int64_t width, const CropBox& win) {
  check_image(src, "resize_window");
  check_size(height, width, "resize_window");
  AF_CHECK(win.height > 0 && win.width > 0 && win.top >= 0 && win.left >= 0 && win.top + win.height <= height &&
               win.left + win.width <= width,
           "resize_window: the window (top {}, left {}, height {}, width {}) must lie inside the {} x {} result", win.top,
           win.left, win.height, win.width, height, width);
  // The full-size tables, cut to the window's rows and columns.
  auto cut = [](AxisWeights a, int64_t first, int64_t n) {
    AxisWeights c;
    c.out = n;
    c.ksize = a.ksize;
    c.first.assign(a.first.begin() + first, a.first.begin() + first + n);
    c.count.assign(a.count.begin() + first, a.count.begin() + first + n);
    c.w.assign(a.w.begin() + first * a.ksize, a.w.begin() + (first + n) * a.ksize);
    return c;
  };
  const auto wy = cut(axis_weights(0.0, static_cast<double>(src.height), height, 0, src.height), win.top, win.height);
  const auto wx = cut(axis_weights(0.0, static_cast<double>(src.width), width, 0, src.width), win.left, win.width);
  Image out(win.height, win.width, src.channels);
  resample(src.pixels.data(), hwc(src), src.channels, wy, wx, out.pixels.data(), hwc(out));
  return out;
}

Image crop(const Image& src, const CropBox& b) {
  check_image(src, "crop");
  check_size(b.height, b.width, "crop");
  Image out(b.height, b.width, src.channels);  // zero-filled
  const int64_t y0 = std::max<int64_t>(0, -b.top), y1 = std::min(b.height, src.height - b.top);
  const int64_t x0 = std::max<int64_t>(0, -b.left), x1 = std::min(b.width, src.width - b.left);
  for (int64_t y = y0; y < y1; ++y)
    if (x1 > x0) std::copy_n(src.at(b.top + y, b.left + x0), (x1 - x0) * src.channels, out.at(y, x0));
  return out;
}

CropBox center_crop_box(int64_t image_height, int64_t image_width, int64_t height, int64_t width) {
  check_size(height, width, "center_crop");
  // torchvision pads an axis that is too short by (crop - size) // 2 before, then crops at round((n - m) / 2).
  auto pos = [](int64_t n, int64_t m) {
    return m > n ? -((m - n) / 2) : round_half_even(static_cast<double>(n - m) / 2.0);
  };
  return CropBox{pos(image_height, height), pos(image_width, width), height, width};
}

Image center_crop(const Image& src, int64_t height, int64_t width) {
  return crop(src, center_crop_box(src.height, src.width, height, width));
}

void hflip_(Image& img) {
  check_image(img, "hflip");
  const int64_t C = img.channels;
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t a = 0, b = img.width - 1; a < b; ++a, --b) std::swap_ranges(img.at(y, a), img.at(y, a) + C, img.at(y, b));
}

void to_tensor(const Image& img, float* dst) {
  check_image(img, "to_tensor");
  const int64_t C = img.channels, plane = img.height * img.width;
  for (int64_t c = 0; c < C; ++c) {
    const uint8_t* s = img.pixels.data() + c;
    float* d = dst + c * plane;
    for (int64_t q = 0; q < plane; ++q) d[q] = static_cast<float>(s[q * C]) / 255.0f;
  }
}

void resize_planes(const float* src, int64_t channels, int64_t height, int64_t width, float* dst, int64_t out_h,
                   int64_t out_w) {
  AF_CHECK(channels > 0 && height > 0 && width > 0, "resize_planes: empty input ({} x {} x {})", channels, height, width);
  check_size(out_h, out_w, "resize_planes");
  const auto wy = axis_weights(0.0, static_cast<double>(height), out_h, 0, height);
  const auto wx = axis_weights(0.0, static_cast<double>(width), out_w, 0, width);
  resample(src, Layout{height * width, 1, width}, channels, wy, wx, dst, Layout{out_h * out_w, 1, out_w});
}

// ---------------------------------------------------------------------------------------------- transforms

RandomResizedCrop::RandomResizedCrop(int64_t size, std::array<double, 2> scale, std::array<double, 2> ratio)
    : RandomResizedCrop(size, size, scale, ratio) {}

RandomResizedCrop::RandomResizedCrop(int64_t height, int64_t width, std::array<double, 2> scale,
                                     std::array<double, 2> ratio)
    : h_(height), w_(width), scale_(scale), ratio_(ratio) {
  check_size(height, width, "RandomResizedCrop");
  AF_CHECK(scale[0] > 0 && scale[0] <= scale[1], "RandomResizedCrop: scale must be (min, max) with 0 < min <= max, got "
           "({}, {})", scale[0], scale[1]);
  AF_CHECK(ratio[0] > 0 && ratio[0] <= ratio[1], "RandomResizedCrop: ratio must be (min, max) with 0 < min <= max, got "
           "({}, {})", ratio[0], ratio[1]);
}

CropBox RandomResizedCrop::get_params(int64_t H, int64_t W, ExampleRng& rng) const {
  AF_CHECK(H > 0 && W > 0, "RandomResizedCrop: empty image ({} x {})", H, W);
  const double area = static_cast<double>(H) * static_cast<double>(W);
  const double log_r0 = std::log(ratio_[0]), log_r1 = std::log(ratio_[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(scale_[0], scale_[1]);
    const double aspect = std::exp(rng.uniform(log_r0, log_r1));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (w > 0 && w <= W && h > 0 && h <= H) {
      const int64_t top = rng.randint(0, H - h + 1), left = rng.randint(0, W - w + 1);
      return CropBox{top, left, h, w};
    }
  }
  // Fallback: the whole image, narrowed to the ratio range, in the centre.
  const double in_ratio = static_cast<double>(W) / static_cast<double>(H);
  int64_t w = W, h = H;
  if (in_ratio < ratio_[0]) {
    h = round_half_even(static_cast<double>(w) / ratio_[0]);
  } else if (in_ratio > ratio_[1]) {
    w = round_half_even(static_cast<double>(h) * ratio_[1]);
  }
  return CropBox{(H - h) / 2, (W - w) / 2, h, w};
}

Image RandomResizedCrop::operator()(const Image& img, ExampleRng& rng) const {
  return resized_crop(img, get_params(img.height, img.width, rng), h_, w_);
}

Resize::Resize(int64_t size) : size_(size) { AF_CHECK(size > 0, "Resize: size must be positive, got {}", size); }

Resize::Resize(int64_t height, int64_t width) : h_(height), w_(width) { check_size(height, width, "Resize"); }

std::array<int64_t, 2> Resize::output_size(int64_t H, int64_t W) const {
  if (size_ == 0) return {h_, w_};
  const int64_t shorter = std::min(H, W), longer = std::max(H, W);
  const int64_t new_long = static_cast<int64_t>(static_cast<double>(size_ * longer) / static_cast<double>(shorter));
  return W <= H ? std::array<int64_t, 2>{new_long, size_} : std::array<int64_t, 2>{size_, new_long};
}

Image Resize::operator()(const Image& img) const {
  const auto [h, w] = output_size(img.height, img.width);
  return resize(img, h, w);
}

CenterCrop::CenterCrop(int64_t height, int64_t width) : h_(height), w_(width) { check_size(height, width, "CenterCrop"); }

CropBox CenterCrop::box(int64_t H, int64_t W) const { return center_crop_box(H, W, h_, w_); }

Image CenterCrop::operator()(const Image& img) const { return center_crop(img, h_, w_); }

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  AF_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p must be in [0, 1], got {}", p);
}

bool RandomHorizontalFlip::draw(ExampleRng& rng) const { return rng.uniform() < p_; }

void RandomHorizontalFlip::operator()(Image& img, ExampleRng& rng) const {
  if (draw(rng)) hflip_(img);
}

Normalize::Normalize(std::vector<float> mean, std::vector<float> std) : mean_(std::move(mean)) {
  AF_CHECK(!mean_.empty() && !std.empty(), "Normalize: mean and std need at least one value each");
  for (float s : std) {
    AF_CHECK(s > 0 && std::isfinite(s), "Normalize: every std must be positive and finite, got {}", s);
    inv_std_.push_back(1.0f / s);
  }
  for (float m : mean_) AF_CHECK(std::isfinite(m), "Normalize: every mean must be finite, got {}", m);
}

void Normalize::check_channels(int64_t channels, const char* what) const {
  auto ok = [&](size_t n) { return n == 1 || static_cast<int64_t>(n) == channels; };
  AF_CHECK(ok(mean_.size()) && ok(inv_std_.size()),
           "{}: normalisation needs one value or one per channel ({} channels), got {} means and {} stds", what,
           channels, mean_.size(), inv_std_.size());
}

void Normalize::operator()(float* chw, int64_t channels, int64_t plane) const {
  check_channels(channels, "Normalize");
  for (int64_t c = 0; c < channels; ++c) {
    const float m = mean(c), is = inv_std(c);
    float* p = chw + c * plane;
    for (int64_t q = 0; q < plane; ++q) p[q] = (p[q] - m) * is;
  }
}

int64_t eval_resize_size(int64_t crop) {
  AF_CHECK(crop > 0, "eval_resize_size: crop must be positive, got {}", crop);
  return std::lround(static_cast<double>(crop) * 256.0 / 224.0);
}

}  // namespace ampforge::data
