// YOLO-format detection data (unit): label and data-file errors name the file and line, bad images and empty
// splits are errors, letterbox + flip move the boxes with the pixels, the composed Fashion-MNIST set is a
// function of its seed with boxes on the items' pixels, and mosaics are functions of the example key whose boxes
// match their pixels (exactly when unscaled), off after close_mosaic and without effect at probability 0.
#include <gtest/gtest.h>
#include <png.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <functional>
#include <unistd.h>
#include <fstream>

#include "ampforge/data/data_loader.h"
#include "ampforge/data/image.h"
#include "ampforge/data/yolo_dataset.h"

using namespace ampforge;
using namespace ampforge::data;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ampforge_yolo_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(YoloLabels, ErrorsNameFileAndLine) {
  const fs::path d = temp_dir("labels");
  const std::string p = (d / "a.txt").string();
  write(p, "0 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2\n");
  std::string m = error_of([&] { read_yolo_labels(p, 3); });
  EXPECT_NE(m.find(p + ":2"), std::string::npos) << m;
  EXPECT_NE(m.find("5 fields"), std::string::npos) << m;
  write(p, "\n3 0.5 0.5 0.2 0.2\n");
  m = error_of([&] { read_yolo_labels(p, 3); });
  EXPECT_NE(m.find(p + ":2"), std::string::npos) << m;
  EXPECT_NE(m.find("class 3"), std::string::npos) << m;
  write(p, "1 0.5 1.5 0.2 0.2\n");
  m = error_of([&] { read_yolo_labels(p, 3); });
  EXPECT_NE(m.find(p + ":1"), std::string::npos) << m;
  EXPECT_NE(m.find("outside [0, 1]"), std::string::npos) << m;
  for (const char* size : {"0 0.2", "0.2 0", "1e-50 0.2"}) {  // 1e-50: positive, but zero as a float
    write(p, std::string("1 0.5 0.5 ") + size + "\n");
    m = error_of([&] { read_yolo_labels(p, 3); });
    EXPECT_NE(m.find(p + ":1: the box has a zero width or height"), std::string::npos) << m;
  }
  write(p, "1 0.5 x 0.2 0.2\n");
  EXPECT_NE(error_of([&] { read_yolo_labels(p, 3); }).find("not a number"), std::string::npos);
  write(p, "2 0.25 0.5 0.5 0.25\n\n");
  const auto boxes = read_yolo_labels(p, 3);
  ASSERT_EQ(boxes.size(), 1u);
  EXPECT_EQ(boxes[0].cls, 2);
  EXPECT_FLOAT_EQ(boxes[0].w, 0.5f);
  fs::remove_all(d);
}

TEST(YoloData, DataFileBadImagesAndEmptySplits) {
  const fs::path d = temp_dir("data");
  write(d / "data.yaml", "# a set\ntrain: images/train\nval: images/val\nnames:\n  0: cat\n  1: dog\n");
  const DetectionDataSpec spec = read_detection_data_file((d / "data.yaml").string());
  EXPECT_EQ(spec.names, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(spec.train, (d / "images/train").string());
  // nc is bounded (found by fuzzing: nc: 1111...1 saturated strtol and made 2^63 class names).
  write(d / "huge.yaml", "train: a\nval: b\nnc: 11111111111111111111111111\n");
  EXPECT_NE(error_of([&] { read_detection_data_file((d / "huge.yaml").string()); }).find("nc must be an integer in [1, 100000]"),
            std::string::npos);
  write(d / "bad.yaml", "train: a\nval b\n");
  EXPECT_NE(error_of([&] { read_detection_data_file((d / "bad.yaml").string()); }).find("bad.yaml:2"), std::string::npos);
  // an empty split
  fs::create_directories(d / "images/val");
  EXPECT_NE(error_of([&] { YoloDetectionDataset((d / "images/val").string(), spec.names); }).find("empty"),
            std::string::npos);
  // an image that does not decode (a PNG signature, then garbage)
  write(d / "images/train/x.png", std::string("\x89PNG\r\n\x1a\n", 8) + "garbage");
  const std::string m = error_of([&] { YoloDetectionDataset((d / "images/train").string(), spec.names); });
  EXPECT_NE(m.find("x.png"), std::string::npos) << m;
  fs::remove_all(d);
}

TEST(YoloData, ComposedSetIsDeterministicAndLetterboxedBoxesFollowThePixels) {
  // Needs Debian's dataset-fashion-mnist (MnistDataset's error names the missing file).
  const fs::path a = temp_dir("compose_a"), b = temp_dir("compose_b");
  ComposeDetectionOptions o;
  o.train_images = 3, o.val_images = 2, o.canvas = 96, o.seed = 5;
  const std::string file = compose_fashion_mnist_detection(a.string(), o);
  compose_fashion_mnist_detection(b.string(), o);
  for (const char* f : {"images/train/train_000002.png", "labels/train/train_000002.txt", "labels/val/val_000001.txt"})
    EXPECT_EQ(read_file_bytes((a / f).string()), read_file_bytes((b / f).string())) << f;
  const DetectionDataSpec spec = read_detection_data_file(file);
  EXPECT_EQ(spec.names.size(), 10u);
  // Letterbox 96 -> 128: scale 4/3, no padding; a flipped example mirrors pixels and boxes.
  DetectionDatasetOptions dopt;
  dopt.image_size = 128;
  dopt.augment = true;
  dopt.fliplr = 1.0;
  dopt.hsv_h = dopt.hsv_s = dopt.hsv_v = 0;  // flips only
  YoloDetectionDataset flipped(spec.train, spec.names, dopt);
  dopt.augment = false;
  YoloDetectionDataset plain(spec.train, spec.names, dopt);
  ASSERT_EQ(plain.size(), 3);
  const int64_t S = 128, T = plain.max_targets();
  std::vector<float> x0(3 * S * S), x1(3 * S * S), t0(static_cast<size_t>(T * 5)), t1(static_cast<size_t>(T * 5));
  const ExampleContext ctx{123, 0, 0};
  plain.get(0, x0.data(), ctx);
  flipped.get(0, x1.data(), ctx);
  plain.targets(0, ctx, t0.data());
  flipped.targets(0, ctx, t1.data());
  for (int64_t y = 0; y < S; y += 7)
    for (int64_t x = 0; x < S; x += 5) EXPECT_EQ(x0[static_cast<size_t>(y * S + x)], x1[static_cast<size_t>(y * S + S - 1 - x)]);
  ASSERT_GT(plain.boxes(0).size(), 0u);
  for (size_t k = 0; k < plain.boxes(0).size(); ++k) {
    EXPECT_NEAR(t1[k * 5 + 1], 1.0f - t0[k * 5 + 1], 1e-6);
    EXPECT_EQ(t1[k * 5 + 3], t0[k * 5 + 3]);
    // The box holds item pixels (it is their bounding box, scaled by 4/3).
    const float cx = t0[k * 5 + 1] * S, cy = t0[k * 5 + 2] * S, w = t0[k * 5 + 3] * S, h = t0[k * 5 + 4] * S;
    float brightest = 0;
    for (auto y = static_cast<int64_t>(cy - h / 2); y < static_cast<int64_t>(cy + h / 2); ++y)
      for (auto x = static_cast<int64_t>(cx - w / 2); x < static_cast<int64_t>(cx + w / 2); ++x)
        brightest = std::max(brightest, x0[static_cast<size_t>(y * S + x)]);
    EXPECT_GT(brightest, 0.2f) << "box " << k;
  }
  // HSV jitter on a gray image: hue and saturation do nothing, every pixel's value is scaled by one factor of the
  // example key (clipped at 1), and the boxes do not move.
  DetectionDatasetOptions hopt;
  hopt.image_size = 128;
  hopt.augment = true;
  hopt.fliplr = 0;
  YoloDetectionDataset jittered(spec.train, spec.names, hopt);
  std::vector<float> xj(3 * S * S), xk(3 * S * S), tj(static_cast<size_t>(T * 5));
  jittered.get(0, xj.data(), ctx);
  jittered.targets(0, ctx, tj.data());
  EXPECT_EQ(tj, t0);
  double factor = 0;
  for (int64_t q = 0; q < S * S; ++q) {
    const float a = x0[static_cast<size_t>(q)], b = xj[static_cast<size_t>(q)];
    EXPECT_FLOAT_EQ(xj[static_cast<size_t>(q)], xj[static_cast<size_t>(2 * S * S + q)]);  // still gray
    if (a > 0.2f && b < 0.99f) {
      if (factor == 0) factor = b / a;
      EXPECT_NEAR(b / a, factor, 1e-4) << q;
    }
  }
  EXPECT_GT(factor, 0.6 - 1e-6);
  EXPECT_LT(factor, 1.4 + 1e-6);
  EXPECT_NE(factor, 1.0);
  jittered.get(0, xk.data(), ExampleContext{124, 0, 0});
  EXPECT_NE(xj, xk);  // another key, another gain
  jittered.get(0, xk.data(), ctx);
  EXPECT_EQ(xj, xk);  // the same key, the same example
  // The loader fills (B, T, 5) targets from the dataset, zero padded.
  LoaderOptions lo;
  lo.batch_size = 2;
  lo.shuffle = false;
  lo.workers = 0;
  DataLoader loader(std::make_shared<YoloDetectionDataset>(spec.train, spec.names, dopt), lo);
  loader.start_epoch(0);
  const auto batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  ASSERT_TRUE(batch->targets.defined());
  EXPECT_EQ(batch->targets.shape(), Shape({2, T, 5}));
  const std::vector<float> bt = batch->targets.tolist<float>();
  for (int64_t i = 0; i < T * 5; ++i) EXPECT_EQ(bt[static_cast<size_t>(i)], t0[static_cast<size_t>(i)]);
  fs::remove_all(a);
  fs::remove_all(b);
}

// ---- mosaic ---------------------------------------------------------------------------------------------------------
namespace {

// Four 64 x 64 gray images, black with one white rectangle each (image k: class k), at least 6 pixels from the
// edges, so every box is known to the pixel.
constexpr int64_t kS = 64;
const std::array<std::array<int64_t, 4>, 4> kRects = {{{8, 10, 30, 40}, {30, 6, 56, 22}, {6, 36, 20, 58}, {24, 24, 44, 44}}};

std::string make_rect_set(const fs::path& d) {
  fs::create_directories(d / "images/train");
  for (size_t k = 0; k < 4; ++k) {
    const auto& r = kRects[k];
    std::vector<uint8_t> px(kS * kS, 0);
    for (int64_t y = r[1]; y < r[3]; ++y)
      for (int64_t x = r[0]; x < r[2]; ++x) px[static_cast<size_t>(y * kS + x)] = 255;
    png_image img{};
    img.version = PNG_IMAGE_VERSION;
    img.width = img.height = kS;
    img.format = PNG_FORMAT_GRAY;
    const std::string stem = "img" + std::to_string(k);
    EXPECT_TRUE(png_image_write_to_file(&img, (d / "images/train" / (stem + ".png")).c_str(), 0, px.data(), 0, nullptr));
    const double s = kS;
    write(d / "labels/train" / (stem + ".txt"), std::to_string(k) + " " + std::to_string((r[0] + r[2]) / 2.0 / s) + " " +
          std::to_string((r[1] + r[3]) / 2.0 / s) + " " + std::to_string((r[2] - r[0]) / s) + " " +
          std::to_string((r[3] - r[1]) / s) + "\n");
  }
  return (d / "images/train").string();
}

const std::vector<std::string> kNames = {"a", "b", "c", "d"};

DetectionDatasetOptions mosaic_options(double p) {
  DetectionDatasetOptions o;
  o.image_size = kS;
  o.augment = true;
  o.mosaic = p;
  return o;
}

struct Example {
  std::vector<float> x, t;
};

Example example(const YoloDetectionDataset& ds, int64_t i, const ExampleContext& ctx) {
  Example e{std::vector<float>(3 * kS * kS), std::vector<float>(static_cast<size_t>(ds.max_targets() * 5))};
  ds.get(i, e.x.data(), ctx);
  ds.targets(i, ctx, e.t.data());
  return e;
}

ExampleContext context(int64_t epoch, int64_t i) { return {example_key(7, epoch, i), epoch, i}; }

}  // namespace

TEST(YoloMosaic, IsAFunctionOfTheExampleKey) {
  const fs::path d = temp_dir("mosaic_key");
  const std::string dir = make_rect_set(d);
  const auto ds = std::make_shared<YoloDetectionDataset>(dir, kNames, mosaic_options(1.0));
  EXPECT_EQ(ds->max_targets(), 4);  // up to four images' boxes
  for (int64_t i = 0; i < 4; ++i) {
    const auto plan = ds->mosaic_plan(i, context(0, i));
    EXPECT_TRUE(plan.on);
    EXPECT_EQ(plan.images[0], i) << "the example is the top-left tile";
    EXPECT_TRUE(plan.xc >= kS / 2 && plan.xc < 3 * kS / 2 && plan.yc >= kS / 2 && plan.yc < 3 * kS / 2);
    EXPECT_TRUE(plan.scale >= 0.5 && plan.scale < 1.5) << plan.scale;
    const Example a = example(*ds, i, context(0, i)), b = example(*ds, i, context(0, i));
    EXPECT_EQ(a.x, b.x);
    EXPECT_EQ(a.t, b.t);
    EXPECT_NE(a.x, example(*ds, i, context(1, i)).x) << "another epoch, another mosaic";
  }
  // The loader's batches are the same with any number of workers (the mosaic's other images included).
  auto batches = [&](int workers) {
    LoaderOptions lo;
    lo.batch_size = 2;
    lo.seed = 7;
    lo.workers = workers;
    DataLoader loader(ds, lo);
    loader.start_epoch(1);
    std::vector<std::vector<float>> out;
    while (auto b = loader.next()) {
      out.push_back(b->x.tolist<float>());
      out.push_back(b->targets.tolist<float>());
    }
    return out;
  };
  const auto one = batches(0);
  EXPECT_EQ(one.size(), 4u);
  EXPECT_EQ(one, batches(3));
  fs::remove_all(d);
}

TEST(YoloMosaic, OffLeavesExamplesAsTheyWereAndCloseMosaicTurnsItOff) {
  const fs::path d = temp_dir("mosaic_off");
  const std::string dir = make_rect_set(d);
  const YoloDetectionDataset plain(dir, kNames, mosaic_options(0.0));  // flips and HSV jitter on
  DetectionDatasetOptions o = mosaic_options(1.0);
  o.close_mosaic_epoch = 2;  // e.g. --epochs 5 --close-mosaic 3
  const YoloDetectionDataset closing(dir, kNames, o);
  const YoloDetectionDataset half(dir, kNames, mosaic_options(0.5));
  int64_t mosaics = 0, off = 0, plain_equal = 0;
  for (int64_t e = 0; e < 4; ++e)
    for (int64_t i = 0; i < 4; ++i) {
      const Example p = example(plain, i, context(e, i)), c = example(closing, i, context(e, i));
      EXPECT_EQ(closing.mosaic_plan(i, context(e, i)).on, e < 2);
      if (e < 2) {
        EXPECT_NE(p.x, c.x);
        continue;
      }
      // The same pixels and boxes as without mosaic: its draws do not disturb the flip and the HSV gains.
      EXPECT_EQ(p.x, c.x) << e << " " << i;
      ASSERT_EQ(c.t.size(), 4 * p.t.size());
      EXPECT_TRUE(std::equal(p.t.begin(), p.t.end(), c.t.begin()));
      EXPECT_TRUE(std::all_of(c.t.begin() + static_cast<std::ptrdiff_t>(p.t.size()), c.t.end(), [](float v) { return v == 0; }));
    }
  for (int64_t e = 0; e < 100; ++e)
    for (int64_t i = 0; i < 4; ++i) {
      const bool on = half.mosaic_plan(i, context(e, i)).on;
      mosaics += on;
      if (!on && e < 5) ++off, plain_equal += example(half, i, context(e, i)).x == example(plain, i, context(e, i)).x;
    }
  EXPECT_GT(mosaics, 160);  // 400 draws at 0.5: 200 +- 10 (sd)
  EXPECT_LT(mosaics, 240);
  EXPECT_GT(off, 0);
  EXPECT_EQ(plain_equal, off) << "an example the draw leaves alone is the example without mosaic";
  // Validation data never get one; bad values are errors.
  o.augment = false;
  EXPECT_FALSE(YoloDetectionDataset(dir, kNames, o).mosaic_plan(0, context(0, 0)).on);
  EXPECT_EQ(YoloDetectionDataset(dir, kNames, o).max_targets(), 1);
  o.mosaic = 1.5;
  EXPECT_NE(error_of([&] { YoloDetectionDataset(dir, kNames, o); }).find("mosaic probability"), std::string::npos);
  o.mosaic = 1, o.mosaic_scale = 1;
  EXPECT_NE(error_of([&] { YoloDetectionDataset(dir, kNames, o); }).find("mosaic scale"), std::string::npos);
  fs::remove_all(d);
}

TEST(YoloMosaic, PixelsAndBoxesOfAnUnscaledMosaicAreTheCanvasCentre) {
  // scale 0 and translate 0: the way back to S x S is exactly the canvas' window [S/2, 3S/2)^2, so every pixel is
  // known: canvas point (x, y) lies in the quadrant of (xc, yc) whose image has its corner at the centre.
  const fs::path d = temp_dir("mosaic_exact");
  const std::string dir = make_rect_set(d);
  DetectionDatasetOptions o = mosaic_options(1.0);
  o.mosaic_scale = o.mosaic_translate = 0;
  o.fliplr = 0;
  o.hsv_h = o.hsv_s = o.hsv_v = 0;
  const YoloDetectionDataset ds(dir, kNames, o);
  int64_t clipped = 0, dropped = 0, kept = 0;
  for (int64_t e = 0; e < 12; ++e)
    for (int64_t i = 0; i < 4; ++i) {
      const ExampleContext ctx = context(e, i);
      const auto plan = ds.mosaic_plan(i, ctx);
      ASSERT_TRUE(plan.on);
      ASSERT_EQ(plan.scale, 1.0);
      const Example ex = example(ds, i, ctx);
      auto origin = [&](int64_t k) {  // the top-left corner of tile k's image in the canvas
        return std::pair<int64_t, int64_t>{k % 2 ? plan.xc : plan.xc - kS, k / 2 ? plan.yc : plan.yc - kS};
      };
      for (int64_t v = 0; v < kS; ++v)
        for (int64_t u = 0; u < kS; ++u) {
          const int64_t x = u + kS / 2, y = v + kS / 2, k = (y >= plan.yc ? 2 : 0) + (x >= plan.xc ? 1 : 0);
          const auto [ox, oy] = origin(k);
          const int64_t sx = x - ox, sy = y - oy;
          const auto& r = kRects[static_cast<size_t>(plan.images[static_cast<size_t>(k)])];
          const float want = sx < 0 || sx >= kS || sy < 0 || sy >= kS ? 114.0f / 255
                             : sx >= r[0] && sx < r[2] && sy >= r[1] && sy < r[3] ? 1.0f : 0.0f;
          for (int64_t c = 0; c < 3; ++c)
            ASSERT_EQ(ex.x[static_cast<size_t>(c * kS * kS + v * kS + u)], want) << e << " " << i << " " << u << "," << v;
        }
      // Boxes: the rectangle in the canvas (clipped to it), moved by -S/2, clipped to the example, kept when
      // w, h > 2 and it keeps > 10% of its canvas area.
      size_t row = 0;
      for (int64_t k = 0; k < 4; ++k) {
        const int64_t j = plan.images[static_cast<size_t>(k)];
        const auto& r = kRects[static_cast<size_t>(j)];
        const auto [ox, oy] = origin(k);
        auto canvas = [](int64_t v) { return std::clamp<int64_t>(v, 0, 2 * kS); };
        auto out = [](int64_t v) { return std::clamp<int64_t>(v - kS / 2, 0, kS); };
        const int64_t cx1 = canvas(r[0] + ox), cx2 = canvas(r[2] + ox), cy1 = canvas(r[1] + oy), cy2 = canvas(r[3] + oy);
        const int64_t x1 = out(cx1), x2 = out(cx2), y1 = out(cy1), y2 = out(cy2);
        if (cx2 <= cx1 || cy2 <= cy1) continue;
        const bool keep = x2 - x1 > 2 && y2 - y1 > 2 && (x2 - x1) * (y2 - y1) * 10 > (cx2 - cx1) * (cy2 - cy1);
        const bool whole = x1 == r[0] + ox - kS / 2 && x2 == r[2] + ox - kS / 2 && y1 == r[1] + oy - kS / 2 &&
                           y2 == r[3] + oy - kS / 2;
        if (!keep) {
          ++dropped;
          continue;
        }
        ++kept, clipped += !whole;
        ASSERT_LT(row, 4u);
        const float* t = ex.t.data() + row++ * 5;
        EXPECT_EQ(t[0], static_cast<float>(j));
        EXPECT_NEAR(t[1], (x1 + x2) / 2.0 / kS, 1e-6);
        EXPECT_NEAR(t[2], (y1 + y2) / 2.0 / kS, 1e-6);
        EXPECT_NEAR(t[3], static_cast<double>(x2 - x1) / kS, 1e-6);
        EXPECT_NEAR(t[4], static_cast<double>(y2 - y1) / kS, 1e-6);
      }
      for (size_t q = row * 5; q < ex.t.size(); ++q) EXPECT_EQ(ex.t[q], 0.0f) << "padding";
    }
  // The case covers whole boxes, boxes cut by the window and boxes dropped for what little was left.
  EXPECT_GT(kept, clipped);
  EXPECT_GT(clipped, 0);
  EXPECT_GT(dropped, 0);
  fs::remove_all(d);
}

TEST(YoloMosaic, ScaledAndFlippedBoxesStayInsideAndCoverTheirPixels) {
  // The default scale (0.5 .. 1.5) and translate (+-0.1), flips on, no HSV jitter: every box lies inside the
  // example, the pixels 1 pixel inside its edges are the white rectangle, those 1.5 to 2.5 pixels outside are not
  // (black or the gray fill: 6 pixels of black surround each rectangle in its image), and nearly every white
  // pixel is in a box (what is not belongs to the boxes dropped as too small).
  const fs::path d = temp_dir("mosaic_scaled");
  const std::string dir = make_rect_set(d);
  DetectionDatasetOptions o = mosaic_options(1.0);
  o.hsv_h = o.hsv_s = o.hsv_v = 0;
  const YoloDetectionDataset ds(dir, kNames, o);
  o.fliplr = 0;
  const YoloDetectionDataset unflipped(dir, kNames, o);
  int64_t white = 0, white_boxed = 0, boxes = 0, flipped = 0;
  for (int64_t e = 0; e < 15; ++e)
    for (int64_t i = 0; i < 4; ++i) {
      const Example ex = example(ds, i, context(e, i));
      flipped += ex.x != example(unflipped, i, context(e, i)).x;
      std::vector<std::array<double, 4>> bx;
      for (size_t k = 0; k < 4; ++k) {
        const float* t = ex.t.data() + k * 5;
        if (t[3] == 0) continue;
        const double x1 = (t[1] - t[3] / 2) * kS, x2 = (t[1] + t[3] / 2) * kS, y1 = (t[2] - t[4] / 2) * kS,
                     y2 = (t[2] + t[4] / 2) * kS;
        EXPECT_TRUE(x1 >= -1e-4 && x2 <= kS + 1e-4 && y1 >= -1e-4 && y2 <= kS + 1e-4) << x1 << " " << x2;
        EXPECT_TRUE(x2 - x1 > 2 && y2 - y1 > 2);
        bx.push_back({x1, y1, x2, y2});
      }
      boxes += static_cast<int64_t>(bx.size());
      auto inside = [&](double px, double py, double grow) {
        for (const auto& b : bx)
          if (px > b[0] - grow && px < b[2] + grow && py > b[1] - grow && py < b[3] + grow) return true;
        return false;
      };
      for (int64_t v = 0; v < kS; ++v)
        for (int64_t u = 0; u < kS; ++u) {
          const float val = ex.x[static_cast<size_t>(v * kS + u)];
          const double px = static_cast<double>(u) + 0.5, py = static_cast<double>(v) + 0.5;
          if (val > 0.999f) ++white, white_boxed += inside(px, py, 0.5);
          for (const auto& b : bx) {
            if (px >= b[0] + 1 && px <= b[2] - 1 && py >= b[1] + 1 && py <= b[3] - 1) {
              EXPECT_GT(val, 0.999f) << "inside a box at " << u << "," << v;
            }
            const bool ring = px > b[0] - 2.5 && px < b[2] + 2.5 && py > b[1] - 2.5 && py < b[3] + 2.5 &&
                              !(px > b[0] - 1.5 && px < b[2] + 1.5 && py > b[1] - 1.5 && py < b[3] + 1.5);
            if (ring && !inside(px, py, 1.5)) {
              EXPECT_LT(val, 0.5f) << "around a box at " << u << "," << v;
            }
          }
        }
    }
  EXPECT_GT(boxes, 60);
  EXPECT_GT(flipped, 10);  // of 60, about half
  EXPECT_LT(flipped, 50);
  EXPECT_GT(static_cast<double>(white_boxed), 0.85 * static_cast<double>(white)) << white_boxed << " / " << white;
  fs::remove_all(d);
}
