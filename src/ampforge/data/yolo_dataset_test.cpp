// YOLO-format detection data (unit): label and data-file errors name the file and line, bad images and empty
// splits are errors, letterbox + flip move the boxes with the pixels, and the composed Fashion-MNIST set is a
// function of its seed with boxes on the items' pixels.
#include <gtest/gtest.h>

#include <algorithm>
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
