// YOLO-format detection data and the Fashion-MNIST detection set (see yolo_dataset.h).
#include "ampforge/data/yolo_dataset.h"

#include <png.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampforge/data/data_loader.h"
#include "ampforge/data/image.h"
#include "ampforge/data/transforms.h"

namespace ampforge::data {

namespace fs = std::filesystem;

namespace {

// The most classes a data file may declare (Open Images has 601, LVIS 1,203).
constexpr long kMaxClasses = 100000;

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string strip_quotes(std::string s) {
  s = trim(s);
  if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front()) s = s.substr(1, s.size() - 2);
  return s;
}

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

}  // namespace

std::string yolo_label_path(const std::string& image_path) {
  std::string p = image_path;
  const auto pos = p.rfind("/images/");
  if (pos != std::string::npos) p.replace(pos, 8, "/labels/");
  return fs::path(p).replace_extension(".txt").string();
}

std::vector<DetectionBox> read_yolo_labels(const std::string& path, int64_t num_classes) {
  std::ifstream in(path);
  if (!in) AF_THROW(Io, "cannot read the label file {}", path);
  std::vector<DetectionBox> out;
  std::string line;
  int64_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    const std::string t = trim(line);
    if (t.empty()) continue;
    std::istringstream ss(t);
    std::vector<std::string> f;
    for (std::string w; ss >> w;) f.push_back(w);
    AF_CHECK(f.size() == 5, "{}:{}: expected 5 fields 'class cx cy w h', got {}: '{}'", path, no, f.size(), t);
    double v[5];
    for (int k = 0; k < 5; ++k) {
      char* end = nullptr;
      v[k] = std::strtod(f[static_cast<size_t>(k)].c_str(), &end);
      AF_CHECK(end && *end == '\0' && std::isfinite(v[k]), "{}:{}: field {} is not a number: '{}'", path, no, k + 1,
               f[static_cast<size_t>(k)]);
    }
    AF_CHECK(v[0] == std::floor(v[0]) && v[0] >= 0 && v[0] < static_cast<double>(num_classes),
             "{}:{}: class {} is outside [0, {})", path, no, f[0], num_classes);
    for (int k = 1; k < 5; ++k)
      AF_CHECK(v[k] >= 0 && v[k] <= 1, "{}:{}: coordinate {} = {} is outside [0, 1] (boxes are normalised cx cy w h)",
               path, no, k, f[static_cast<size_t>(k)]);
    const DetectionBox box{static_cast<int64_t>(v[0]), static_cast<float>(v[1]), static_cast<float>(v[2]),
                           static_cast<float>(v[3]), static_cast<float>(v[4])};
    // On the stored floats: a size below float's range (1e-50) is zero there (found by tests/fuzz/yolo_labels).
    AF_CHECK(box.w > 0 && box.h > 0, "{}:{}: the box has a zero width or height ('{}' x '{}')", path, no, f[3], f[4]);
    out.push_back(box);
  }
  return out;
}

DetectionDataSpec read_detection_data_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) AF_THROW(Io, "cannot read the data file {}", path);
  std::string root = fs::absolute(path).parent_path().string(), train, val;
  std::vector<std::string> names;
  int64_t nc = -1;
  bool in_names_block = false;
  std::string line;
  int64_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    const auto hash = line.find('#');
    const std::string raw = hash == std::string::npos ? line : line.substr(0, hash);
    const std::string t = trim(raw);
    if (t.empty()) continue;
    const bool indented = raw.find_first_not_of(" \t") > 0;
    const auto colon = t.find(':');
    AF_CHECK(colon != std::string::npos, "{}:{}: expected 'key: value', got '{}'", path, no, t);
    const std::string key = trim(t.substr(0, colon)), value = trim(t.substr(colon + 1));
    if (indented && in_names_block) {  // "  0: shirt"
      char* end = nullptr;
      const long idx = std::strtol(key.c_str(), &end, 10);
      AF_CHECK(end && *end == '\0' && idx == static_cast<long>(names.size()),
               "{}:{}: expected class index {} in the names block, got '{}'", path, no, names.size(), key);
      names.push_back(strip_quotes(value));
      continue;
    }
    in_names_block = false;
    if (key == "path") {
      root = fs::path(strip_quotes(value)).is_absolute() ? strip_quotes(value)
                                                         : (fs::absolute(path).parent_path() / strip_quotes(value)).string();
    } else if (key == "train") {
      train = strip_quotes(value);
    } else if (key == "val") {
      val = strip_quotes(value);
    } else if (key == "nc") {
      char* end = nullptr;
      errno = 0;
      nc = std::strtol(value.c_str(), &end, 10);
      // Bounded: nc without names makes that many class names (a typo of 10^18 must not exhaust memory).
      AF_CHECK(end && *end == '\0' && errno == 0 && nc > 0 && nc <= kMaxClasses, "{}:{}: nc must be an integer in "
               "[1, {}], got '{}'", path, no, kMaxClasses, value);
    } else if (key == "names") {
      if (value.empty()) {
        in_names_block = true;
      } else {
        AF_CHECK(value.front() == '[' && value.back() == ']', "{}:{}: names must be a [a, b, ...] list or a block of "
                 "'index: name' lines, got '{}'", path, no, value);
        std::stringstream ss(value.substr(1, value.size() - 2));
        for (std::string item; std::getline(ss, item, ',');)
          if (!trim(item).empty()) names.push_back(strip_quotes(item));
      }
    }  // other keys (test, download, ...) are ignored, as Ultralytics ignores what it does not use
  }
  if (names.empty() && nc > 0)
    for (int64_t i = 0; i < nc; ++i) names.push_back("class" + std::to_string(i));
  AF_CHECK(!names.empty(), "{}: the data file names no classes (names: [...] or nc: N)", path);
  AF_CHECK(nc < 0 || nc == static_cast<int64_t>(names.size()), "{}: nc is {} but {} names are given", path, nc,
           names.size());
  AF_CHECK(!train.empty() && !val.empty(), "{}: the data file needs both 'train:' and 'val:'", path);
  auto resolve = [&](const std::string& p) { return fs::path(p).is_absolute() ? p : (fs::path(root) / p).string(); };
  return {resolve(train), resolve(val), names};
}

// ---- the dataset --------------------------------------------------------------------------------------------------
YoloDetectionDataset::YoloDetectionDataset(const std::string& images_dir, std::vector<std::string> class_names,
                                           DetectionDatasetOptions opt)
    : names_(std::move(class_names)), opt_(std::move(opt)) {
  AF_CHECK(!names_.empty(), "YoloDetectionDataset: no class names for {}", images_dir);
  AF_CHECK(opt_.image_size >= 32 && opt_.image_size % 32 == 0,
           "YoloDetectionDataset: the image size must be a positive multiple of 32, got {}", opt_.image_size);
  AF_CHECK(opt_.mosaic >= 0 && opt_.mosaic <= 1, "YoloDetectionDataset: the mosaic probability must be in [0, 1], got {}",
           opt_.mosaic);
  // scale < 1 keeps the factor a positive; translate <= 0.5 keeps the centre of the canvas inside the example.
  AF_CHECK(opt_.mosaic_scale >= 0 && opt_.mosaic_scale < 1, "YoloDetectionDataset: the mosaic scale must be in [0, 1), "
           "got {}", opt_.mosaic_scale);
  AF_CHECK(opt_.mosaic_translate >= 0 && opt_.mosaic_translate <= 0.5, "YoloDetectionDataset: the mosaic translate "
           "must be in [0, 0.5], got {}", opt_.mosaic_translate);
  std::error_code ec;
  AF_CHECK(fs::is_directory(images_dir, ec), "YoloDetectionDataset: {} is not a folder of images", images_dir);
  for (const auto& e : fs::directory_iterator(images_dir))
    if (e.is_regular_file() && is_image_file(e.path())) files_.push_back(e.path().string());
  std::sort(files_.begin(), files_.end());
  AF_CHECK(!files_.empty(), "YoloDetectionDataset: the split {} is empty (no .png/.jpg/.jpeg files)", images_dir);
  for (const std::string& f : files_) {
    const std::string lp = yolo_label_path(f);
    boxes_.push_back(fs::exists(lp) ? read_yolo_labels(lp, num_classes()) : std::vector<DetectionBox>{});
    max_boxes_ = std::max<int64_t>(max_boxes_, static_cast<int64_t>(boxes_.back().size()));
    const std::vector<uint8_t> bytes = read_file_bytes(f);
    const ImageInfo info = read_image_info(bytes.data(), bytes.size(), f);  // throws naming the file
    sizes_.emplace_back(info.height, info.width);
  }
  max_boxes_ = std::max<int64_t>(max_boxes_, 1);  // a batch of empty images still has a (B, 1, 5) target tensor
}

int64_t YoloDetectionDataset::label(int64_t i) const {
  const auto& b = boxes_[static_cast<size_t>(i)];
  return b.empty() ? 0 : b.front().cls;
}

YoloDetectionDataset::Letterbox YoloDetectionDataset::letterbox(int64_t i) const {
  // Ultralytics' LetterBox (auto=False, center=True): r = min(S/h, S/w), new size round(w r) x round(h r),
  // padding split in two with round(d - 0.1) before and round(d + 0.1) after.
  const auto [h, w] = sizes_[static_cast<size_t>(i)];
  const auto S = static_cast<double>(opt_.image_size);
  Letterbox lb;
  lb.scale = std::min(S / static_cast<double>(h), S / static_cast<double>(w));
  lb.new_w = std::llround(static_cast<double>(w) * lb.scale), lb.new_h = std::llround(static_cast<double>(h) * lb.scale);
  lb.left = std::llround((S - static_cast<double>(lb.new_w)) / 2 - 0.1);
  lb.top = std::llround((S - static_cast<double>(lb.new_h)) / 2 - 0.1);
  return lb;
}

YoloDetectionDataset::Augmentation YoloDetectionDataset::augmentation(const ExampleContext& ctx) const {
  Augmentation a;
  if (!opt_.augment) return a;
  ExampleRng rng(ctx.key);  // draws in a fixed order: flip, then the three gains
  a.flip = rng.uniform() < opt_.fliplr;
  a.gain_h = 1 + rng.uniform(-1, 1) * opt_.hsv_h;
  a.gain_s = 1 + rng.uniform(-1, 1) * opt_.hsv_s;
  a.gain_v = 1 + rng.uniform(-1, 1) * opt_.hsv_v;
  return a;
}

namespace {

// RGB in [0, 1] -> HSV (h in [0, 1), s, v in [0, 1]) -> gains -> RGB. The standard hexcone conversion.
void hsv_jitter(float& r, float& g, float& b, double gh, double gs, double gv) {
  const float mx = std::max({r, g, b}), mn = std::min({r, g, b}), d = mx - mn;
  double h = 0;
  if (d > 0) {
    if (mx == r) h = std::fmod((g - b) / d, 6.0);
    else if (mx == g) h = (b - r) / d + 2.0;
    else h = (r - g) / d + 4.0;
    h /= 6.0;
    if (h < 0) h += 1.0;
  }
  double s = mx > 0 ? d / mx : 0.0, v = mx;
  h = std::fmod(h * gh, 1.0);
  s = std::clamp(s * gs, 0.0, 1.0);
  v = std::clamp(v * gv, 0.0, 1.0);
  const double c = v * s, hp = h * 6.0, x = c * (1 - std::abs(std::fmod(hp, 2.0) - 1)), m = v - c;
  double rr = 0, gg = 0, bb = 0;
  if (hp < 1) rr = c, gg = x;
  else if (hp < 2) rr = x, gg = c;
  else if (hp < 3) gg = c, bb = x;
  else if (hp < 4) gg = x, bb = c;
  else if (hp < 5) rr = x, bb = c;
  else rr = c, bb = x;
  r = static_cast<float>(rr + m), g = static_cast<float>(gg + m), b = static_cast<float>(bb + m);
}

}  // namespace

Image YoloDetectionDataset::load_resized(int64_t i) const {
  const std::string& f = files_[static_cast<size_t>(i)];
  Image img = decode_image_file(f);  // Error(Io) naming the file when it does not decode
  AF_CHECK(img.height == image_height(i) && img.width == image_width(i), "{}: decoded as {}x{}, its header said {}x{}",
           f, img.width, img.height, image_width(i), image_height(i));
  const Letterbox lb = letterbox(i);
  if (lb.new_w != img.width || lb.new_h != img.height) img = resize(img, lb.new_h, lb.new_w);
  return img;
}

// ---- mosaic ---------------------------------------------------------------------------------------------------------
YoloDetectionDataset::MosaicPlan YoloDetectionDataset::mosaic_plan(int64_t i, const ExampleContext& ctx) const {
  MosaicPlan p;
  p.images = {i, i, i, i};
  if (!mosaic_possible() || (opt_.close_mosaic_epoch >= 0 && ctx.epoch >= opt_.close_mosaic_epoch)) return p;
  // A stream of its own (the key with a constant mixed in), so the flip and HSV draws of augmentation() are the
  // same with and without mosaic, and --mosaic 0 changes nothing.
  ExampleRng rng(ctx.key ^ 0x6d6f7361696334ULL);
  p.on = rng.uniform() < opt_.mosaic;
  if (!p.on) return p;
  for (size_t k = 1; k < 4; ++k) p.images[k] = rng.randint(0, size());
  const auto S = static_cast<double>(opt_.image_size);
  // int(random.uniform(S/2, 3S/2)): truncation, the value is positive
  p.xc = static_cast<int64_t>(rng.uniform(S / 2, 3 * S / 2));
  p.yc = static_cast<int64_t>(rng.uniform(S / 2, 3 * S / 2));
  p.scale = rng.uniform(1 - opt_.mosaic_scale, 1 + opt_.mosaic_scale);
  p.tx = rng.uniform(0.5 - opt_.mosaic_translate, 0.5 + opt_.mosaic_translate) * S;
  p.ty = rng.uniform(0.5 - opt_.mosaic_translate, 0.5 + opt_.mosaic_translate) * S;
  return p;
}

namespace {

// Where tile k (an image of w x h) goes in the 2S x 2S canvas: canvas [x1, x2) x [y1, y2) holds the image's pixels
// from (x1 - dx, y1 - dy) on. Ultralytics' _mosaic4: the tiles meet at (xc, yc), each image against the centre
// (top left: its bottom-right corner there), cut by the canvas.
struct Tile {
  int64_t x1, y1, x2, y2, dx, dy;
};

Tile mosaic_tile(size_t k, int64_t xc, int64_t yc, int64_t w, int64_t h, int64_t S2) {
  const bool right = k == 1 || k == 3, bottom = k >= 2;
  const int64_t left_edge = right ? xc : xc - w, top_edge = bottom ? yc : yc - h;  // the image's corner
  return {std::max<int64_t>(left_edge, 0), std::max<int64_t>(top_edge, 0), std::min(left_edge + w, S2),
          std::min(top_edge + h, S2), left_edge, top_edge};
}

}  // namespace

std::vector<std::array<double, 5>> YoloDetectionDataset::mosaic_boxes(const MosaicPlan& plan) const {
  const int64_t S = opt_.image_size, S2 = 2 * S;
  const auto Sd = static_cast<double>(S), S2d = static_cast<double>(S2);
  std::vector<std::array<double, 5>> out;
  for (size_t k = 0; k < 4; ++k) {
    const int64_t j = plan.images[k];
    const Letterbox lb = letterbox(j);
    const Tile t = mosaic_tile(k, plan.xc, plan.yc, lb.new_w, lb.new_h, S2);
    const auto w = static_cast<double>(lb.new_w), h = static_cast<double>(lb.new_h);
    for (const DetectionBox& b : boxes_[static_cast<size_t>(j)]) {
      // In the canvas, clipped to it (Ultralytics' _cat_labels); a box left with no area is gone.
      const double x1 = std::clamp((b.cx - b.w / 2.0) * w + static_cast<double>(t.dx), 0.0, S2d);
      const double x2 = std::clamp((b.cx + b.w / 2.0) * w + static_cast<double>(t.dx), 0.0, S2d);
      const double y1 = std::clamp((b.cy - b.h / 2.0) * h + static_cast<double>(t.dy), 0.0, S2d);
      const double y2 = std::clamp((b.cy + b.h / 2.0) * h + static_cast<double>(t.dy), 0.0, S2d);
      if (!(x2 > x1 && y2 > y1)) continue;
      // Back to S x S, clipped to the example; box_candidates(wh_thr 2, ar_thr 100, area_thr 0.1) against the
      // mapped box before the clip.
      const double w1 = (x2 - x1) * plan.scale, h1 = (y2 - y1) * plan.scale;
      auto mx = [&](double x) { return std::clamp(plan.scale * (x - Sd) + plan.tx, 0.0, Sd); };
      auto my = [&](double y) { return std::clamp(plan.scale * (y - Sd) + plan.ty, 0.0, Sd); };
      const double u1 = mx(x1), u2 = mx(x2), v1 = my(y1), v2 = my(y2);
      const double w2 = u2 - u1, h2 = v2 - v1;
      const double ar = std::max(w2 / (h2 + 1e-16), h2 / (w2 + 1e-16));
      if (w2 > 2 && h2 > 2 && w2 * h2 / (w1 * h1 + 1e-16) > 0.1 && ar < 100)
        out.push_back({static_cast<double>(b.cls), u1, v1, u2, v2});
    }
  }
  return out;
}

void YoloDetectionDataset::get_mosaic(const MosaicPlan& plan, const ExampleContext& ctx, float* dst) const {
  const int64_t S = opt_.image_size, S2 = 2 * S, plane = S * S;
  std::vector<uint8_t> canvas(static_cast<size_t>(S2 * S2 * 3), 114);
  for (size_t k = 0; k < 4; ++k) {
    const Image img = load_resized(plan.images[k]);
    const Tile t = mosaic_tile(k, plan.xc, plan.yc, img.width, img.height, S2);
    for (int64_t y = t.y1; y < t.y2; ++y)
      std::copy_n(img.at(y - t.dy, t.x1 - t.dx), (t.x2 - t.x1) * 3, canvas.data() + (y * S2 + t.x1) * 3);
  }
  const Augmentation aug = augmentation(ctx);
  const bool jitter = aug.gain_h != 1 || aug.gain_s != 1 || aug.gain_v != 1;
  const auto Sd = static_cast<double>(S);
  auto at = [&](int64_t x, int64_t y, int c) {  // the canvas, 114 outside (warpAffine's border value)
    return x >= 0 && x < S2 && y >= 0 && y < S2 ? static_cast<float>(canvas[static_cast<size_t>((y * S2 + x) * 3 + c)])
                                                : 114.0f;
  };
  for (int64_t v = 0; v < S; ++v) {
    // Output pixel centre (u + 0.5, v + 0.5) comes from canvas point (x + 0.5, y + 0.5), x = (u + 0.5 - tx) / a + S
    // - 0.5: the inverse of the boxes' map, so pixels and boxes move together.
    const double ys = (static_cast<double>(v) + 0.5 - plan.ty) / plan.scale + Sd - 0.5;
    const auto y0 = static_cast<int64_t>(std::floor(ys));
    const auto fy = static_cast<float>(ys - static_cast<double>(y0));
    for (int64_t u = 0; u < S; ++u) {
      const double xs = (static_cast<double>(u) + 0.5 - plan.tx) / plan.scale + Sd - 0.5;
      const auto x0 = static_cast<int64_t>(std::floor(xs));
      const auto fx = static_cast<float>(xs - static_cast<double>(x0));
      float rgb[3];
      for (int c = 0; c < 3; ++c) {
        const float top = at(x0, y0, c) * (1 - fx) + at(x0 + 1, y0, c) * fx;
        const float bot = at(x0, y0 + 1, c) * (1 - fx) + at(x0 + 1, y0 + 1, c) * fx;
        rgb[c] = (top * (1 - fy) + bot * fy) / 255.0f;
      }
      if (jitter) hsv_jitter(rgb[0], rgb[1], rgb[2], aug.gain_h, aug.gain_s, aug.gain_v);
      const int64_t q = v * S + (aug.flip ? S - 1 - u : u);
      for (int c = 0; c < 3; ++c) dst[c * plane + q] = rgb[c];
    }
  }
}

void YoloDetectionDataset::get(int64_t i, float* dst, const ExampleContext& ctx) const {
  const MosaicPlan plan = mosaic_plan(i, ctx);
  if (plan.on) return get_mosaic(plan, ctx, dst);
  Image img = load_resized(i);
  const Letterbox lb = letterbox(i);
  const Augmentation aug = augmentation(ctx);
  if (aug.flip) hflip_(img);
  const bool jitter = aug.gain_h != 1 || aug.gain_s != 1 || aug.gain_v != 1;
  const int64_t S = opt_.image_size, plane = S * S;
  // flip the placement too, so a flipped example is the mirror image of the unflipped one
  const int64_t left = aug.flip ? S - lb.new_w - lb.left : lb.left;
  std::fill(dst, dst + 3 * plane, 114.0f / 255.0f);  // the padding stays 114 (not jittered)
  for (int64_t y = 0; y < lb.new_h; ++y)
    for (int64_t x = 0; x < lb.new_w; ++x) {
      const uint8_t* p = img.at(y, x);
      const int64_t q = (y + lb.top) * S + (x + left);
      float rgb[3] = {static_cast<float>(p[0]) / 255.0f, static_cast<float>(p[1]) / 255.0f,
                      static_cast<float>(p[2]) / 255.0f};
      if (jitter) hsv_jitter(rgb[0], rgb[1], rgb[2], aug.gain_h, aug.gain_s, aug.gain_v);
      for (int64_t c = 0; c < 3; ++c) dst[c * plane + q] = rgb[c];
    }
}

void YoloDetectionDataset::targets(int64_t i, const ExampleContext& ctx, float* rows) const {
  const Letterbox lb = letterbox(i);
  const auto S = static_cast<double>(opt_.image_size);
  const bool flip = flipped(ctx);
  const auto& bx = boxes_[static_cast<size_t>(i)];
  std::fill(rows, rows + max_targets() * 5, 0.0f);
  if (const MosaicPlan plan = mosaic_plan(i, ctx); plan.on) {
    const auto boxes = mosaic_boxes(plan);
    for (size_t k = 0; k < boxes.size(); ++k) {
      const auto& b = boxes[k];
      const double x1 = flip ? S - b[3] : b[1], x2 = flip ? S - b[1] : b[3];
      float* r = rows + k * 5;
      r[0] = static_cast<float>(b[0]);
      r[1] = static_cast<float>((x1 + x2) / 2 / S), r[2] = static_cast<float>((b[2] + b[4]) / 2 / S);
      r[3] = static_cast<float>((x2 - x1) / S), r[4] = static_cast<float>((b[4] - b[2]) / S);
    }
    return;
  }
  for (size_t k = 0; k < bx.size(); ++k) {
    const DetectionBox& b = bx[k];
    double cx = (b.cx * static_cast<double>(lb.new_w) + static_cast<double>(lb.left)) / S;
    const double cy = (b.cy * static_cast<double>(lb.new_h) + static_cast<double>(lb.top)) / S;
    if (flip) cx = 1.0 - cx;
    float* r = rows + k * 5;
    r[0] = static_cast<float>(b.cls);
    r[1] = static_cast<float>(cx), r[2] = static_cast<float>(cy);
    r[3] = static_cast<float>(b.w * static_cast<double>(lb.new_w) / S);
    r[4] = static_cast<float>(b.h * static_cast<double>(lb.new_h) / S);
  }
}

// ---- the composed Fashion-MNIST detection set ---------------------------------------------------------------------
const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> n = {"t-shirt/top", "trouser", "pullover", "dress", "coat",
                                             "sandal", "shirt", "sneaker", "bag", "ankle boot"};
  return n;
}

namespace {

void write_gray_png(const std::string& path, const std::vector<uint8_t>& pixels, int64_t w, int64_t h) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(w);
  img.height = static_cast<png_uint_32>(h);
  img.format = PNG_FORMAT_GRAY;
  // libpng's simplified API reports errors through its return value (no longjmp reaches this frame).
  if (!png_image_write_to_file(&img, path.c_str(), 0, pixels.data(), 0, nullptr))
    AF_THROW(Io, "cannot write {}: {}", path, img.message);
}

double box_iou(const double* a, const double* b) {
  const double iw = std::max(0.0, std::min(a[2], b[2]) - std::max(a[0], b[0]));
  const double ih = std::max(0.0, std::min(a[3], b[3]) - std::max(a[1], b[1]));
  const double inter = iw * ih, ua = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
  return ua > 0 ? inter / ua : 0;
}

void compose_split(const MnistDataset& src, const std::string& out, const std::string& split, int64_t count,
                   uint64_t split_id, const ComposeDetectionOptions& opt) {
  const std::string img_dir = out + "/images/" + split, lab_dir = out + "/labels/" + split;
  fs::create_directories(img_dir);
  fs::create_directories(lab_dir);
  const int64_t C = opt.canvas;
  std::vector<float> item(28 * 28), scaled;
  for (int64_t j = 0; j < count; ++j) {
    ExampleRng rng(example_key(opt.seed, static_cast<int64_t>(split_id), j));  // a function of (seed, split, j)
    std::vector<uint8_t> canvas(static_cast<size_t>(C * C), 0);
    std::vector<std::array<double, 4>> placed;
    std::ostringstream labels;
    const int64_t n = rng.randint(opt.min_items, opt.max_items + 1);
    // A canvas is full when items keep finding no free place: stop there, whatever --max-items asked for (the option
    // is a ceiling; a huge one must not spin for hours over a full canvas).
    constexpr int kFullAfter = 20;  // consecutive items that found no place
    int misses = 0;
    for (int64_t k = 0; k < n && misses < kFullAfter; ++k) {
      const int64_t idx = rng.randint(0, src.size());
      src.get(idx, item.data());
      const auto side = static_cast<int64_t>(std::llround(28.0 * rng.uniform(opt.min_scale, opt.max_scale)));
      const int64_t s = std::min(side, C);
      scaled.assign(static_cast<size_t>(s * s), 0.0f);
      resize_planes(item.data(), 1, 28, 28, scaled.data(), s, s);
      // The object's pixels: the bounding box of the non-zero ones (after 8-bit rounding).
      int64_t x0 = s, y0 = s, x1 = -1, y1 = -1;
      for (int64_t y = 0; y < s; ++y)
        for (int64_t x = 0; x < s; ++x)
          if (std::lround(std::clamp(scaled[static_cast<size_t>(y * s + x)], 0.0f, 1.0f) * 255.0f) > 0)
            x0 = std::min(x0, x), y0 = std::min(y0, y), x1 = std::max(x1, x), y1 = std::max(y1, y);
      if (x1 < 0) continue;  // an empty item (never in Fashion-MNIST, but do not label nothing)
      bool ok = false;
      int64_t ox = 0, oy = 0;
      for (int attempt = 0; attempt < 50 && !ok; ++attempt) {
        ox = rng.randint(0, C - s + 1), oy = rng.randint(0, C - s + 1);
        const std::array<double, 4> b{static_cast<double>(ox + x0), static_cast<double>(oy + y0),
                                      static_cast<double>(ox + x1 + 1), static_cast<double>(oy + y1 + 1)};
        ok = true;
        for (const auto& p : placed) ok = ok && box_iou(b.data(), p.data()) <= 0.3;
        if (ok) placed.push_back(b);
      }
      if (!ok) {
        ++misses;
        continue;
      }
      misses = 0;
      for (int64_t y = 0; y < s; ++y)
        for (int64_t x = 0; x < s; ++x) {
          const auto v = static_cast<uint8_t>(std::lround(std::clamp(scaled[static_cast<size_t>(y * s + x)], 0.0f, 1.0f) * 255.0f));
          uint8_t& c = canvas[static_cast<size_t>((oy + y) * C + (ox + x))];
          c = std::max(c, v);  // overlapping items: the brighter pixel
        }
      const auto& b = placed.back();
      labels << fmt::format("{} {:.6f} {:.6f} {:.6f} {:.6f}\n", src.label(idx), (b[0] + b[2]) / 2 / C,
                            (b[1] + b[3]) / 2 / C, (b[2] - b[0]) / C, (b[3] - b[1]) / C);
    }
    const std::string stem = fmt::format("{}_{:06d}", split, j);
    write_gray_png(img_dir + "/" + stem + ".png", canvas, C, C);
    std::ofstream lf(lab_dir + "/" + stem + ".txt");
    lf << labels.str();
    AF_CHECK(lf.good(), "cannot write {}/{}.txt", lab_dir, stem);
  }
}

}  // namespace

std::string compose_fashion_mnist_detection(const std::string& out_dir, const ComposeDetectionOptions& opt) {
  // 8192: a canvas of 64 MiB of 8-bit pixels, 290 times a Fashion-MNIST item's largest side; above it a canvas is not
  // a detection image any model here trains on (and its size in bytes must not overflow).
  AF_CHECK(opt.canvas >= 32 && opt.canvas <= 8192, "make-detection: the canvas must be 32 to 8192 pixels, got {}",
           opt.canvas);
  AF_CHECK(!fs::exists(out_dir) || fs::is_directory(out_dir), "make-detection: '{}' exists and is not a directory",
           out_dir);
  AF_CHECK(opt.min_items >= 1 && opt.max_items >= opt.min_items, "make-detection: need 1 <= min items <= max items");
  AF_CHECK(opt.min_scale > 0 && opt.max_scale >= opt.min_scale, "make-detection: need 0 < min scale <= max scale");
  AF_CHECK(opt.train_images >= 1 && opt.val_images >= 1, "make-detection: both splits need at least one image");
  const MnistDataset train(opt.fashion_mnist_dir, true), test(opt.fashion_mnist_dir, false);
  compose_split(train, out_dir, "train", opt.train_images, 1, opt);
  compose_split(test, out_dir, "val", opt.val_images, 2, opt);
  const std::string data_file = out_dir + "/data.yaml";
  std::ofstream f(data_file);
  f << "# Composed from Fashion-MNIST by `ampforge data make-detection` (seed " << opt.seed << ", canvas " << opt.canvas
    << ")\npath: .\ntrain: images/train\nval: images/val\nnames: [";
  for (size_t i = 0; i < fashion_mnist_class_names().size(); ++i)
    f << (i ? ", " : "") << "'" << fashion_mnist_class_names()[i] << "'";
  f << "]\n";
  AF_CHECK(f.good(), "cannot write {}", data_file);
  return data_file;
}

}  // namespace ampforge::data
