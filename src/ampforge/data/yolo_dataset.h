// Object-detection data in the YOLO format (Ultralytics' layout), and a detection set composed from Fashion-MNIST.
//
// Layout: a split is a folder of images (.png/.jpg/.jpeg) ".../images/<split>/<name>.<ext>" whose labels are
// ".../labels/<split>/<name>.txt" (the last "images" component replaced by "labels"), one object per line:
// "class cx cy w h", the box normalised to [0, 1] by the image's width and height. A missing label file is an
// image without objects (Ultralytics' rule). A data file names the splits and classes (a small YAML subset):
//   path: /data/set          # optional root of the relative paths below (default: the data file's folder)
//   train: images/train
//   val: images/val
//   names: [shirt, shoe]     # or a block of "  0: shirt" lines; `nc: 2` alone is accepted too
// Errors name the file and line: a wrong field count, a class outside [0, nc), coordinates outside [0, 1] (or a
// non-positive size), a number that does not parse, an image that does not decode, an empty split.
//
// Examples are letterboxed (Ultralytics' LetterBox: scale min(S/h, S/w), centred, padded with 114/255) to
// S x S, as (3, S, S) floats in [0, 1]; with augmentation, a horizontal flip with probability fliplr and an HSV
// jitter, both drawn from the example's key. The boxes follow the same transform (Dataset::targets).
//
// Mosaic (training, DetectionDatasetOptions::mosaic; Ultralytics' Mosaic of 4 images, then its random_perspective
// with scale and translate only): with probability `mosaic`, example i (top left) and three images drawn from the
// example's key (uniform, with replacement), each resized as the letterbox does (no padding), fill the quadrants
// around a centre (xc, yc) drawn in [S/2, 3S/2) of a 2S x 2S canvas of 114 gray (Ultralytics' _mosaic4 placement);
// boxes are clipped to the canvas. The canvas comes back to S x S by x' = a (x - S) + t: a in [1 - scale,
// 1 + scale], t in [0.5 -+ translate] S per axis (bilinear, 114 outside), boxes mapped and clipped to the image,
// and a box survives only with w, h > 2 pixels, area > 0.1 of its mapped unclipped area and aspect < 100
// (Ultralytics' box_candidates). Then the HSV jitter (the whole image, the gray too, as Ultralytics) and the flip,
// from the same draws as without mosaic. Every draw comes from the example's key, so a mosaic is a function of
// (seed, epoch, example): any number of workers, exact resume. From epoch close_mosaic_epoch on (Ultralytics'
// close_mosaic) no example is a mosaic. Differences from Ultralytics: pixels are sampled at their centres
// ((u + 0.5) maps to (x + 0.5)), so boxes and pixels agree to the subpixel (cv2.warpAffine maps integer pixel
// positions: a shift of 0.5 (1 - 1/a) pixels against the boxes); the three images come from the whole split,
// not from a buffer of recent ones; images keep the letterbox's rounding of their size (Ultralytics' LoadImage
// rounds up); examples that are not mosaics get no scale/translate jitter (Ultralytics applies
// random_perspective to every training image).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ampforge/data/dataset.h"
#include "ampforge/data/image.h"

namespace ampforge::data {

struct DetectionBox {
  int64_t cls = 0;
  float cx = 0, cy = 0, w = 0, h = 0;  // normalised by the image's width and height
};

// One label file. Errors (InvalidArgument) name "path:line". A missing file: Io error naming it.
std::vector<DetectionBox> read_yolo_labels(const std::string& path, int64_t num_classes);

// The label file of an image: the last "/images/" of the path replaced by "/labels/", the extension by ".txt".
std::string yolo_label_path(const std::string& image_path);

struct DetectionDataSpec {
  std::string train, val;          // absolute image folders
  std::vector<std::string> names;  // class names (size = number of classes)
};

// Reads the data file (see above). Errors name the file and line.
DetectionDataSpec read_detection_data_file(const std::string& path);

struct DetectionDatasetOptions {
  int64_t image_size = 320;  // S: examples are (3, S, S)
  bool augment = false;      // training: random horizontal flips and HSV jitter
  double fliplr = 0.5;
  // Ultralytics' RandomHSV gains (default.yaml): each example's hue, saturation and value are multiplied by
  // 1 + U(-1, 1) * gain (hue wraps, saturation and value are clipped). Computed in float HSV, not with
  // OpenCV's 8-bit lookup tables. 0 turns a channel's jitter off.
  double hsv_h = 0.015, hsv_s = 0.7, hsv_v = 0.4;
  // Mosaic (see above), with augment only: the probability per example; no mosaic from epoch close_mosaic_epoch
  // (0-based) on, < 0: in every epoch; Ultralytics' scale and translate for the way back to S x S.
  double mosaic = 0;
  int64_t close_mosaic_epoch = -1;
  double mosaic_scale = 0.5, mosaic_translate = 0.1;
  std::string name = "detection";
};

class YoloDetectionDataset final : public Dataset {
 public:
  // Scans `images_dir` (sorted file names), reads and checks every label file and every image header.
  // Throws when the split holds no image.
  YoloDetectionDataset(const std::string& images_dir, std::vector<std::string> class_names,
                       DetectionDatasetOptions opt = {});
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Shape example_shape() const override { return Shape{3, opt_.image_size, opt_.image_size}; }
  int64_t num_classes() const override { return static_cast<int64_t>(names_.size()); }
  void get(int64_t i, float* dst) const override { get(i, dst, ExampleContext{0, 0, i}); }
  void get(int64_t i, float* dst, const ExampleContext& ctx) const override;
  int64_t label(int64_t i) const override;  // the first object's class (0 without objects): for the loader only
  std::string name() const override { return opt_.name; }
  // A mosaic holds the boxes of up to four images.
  int64_t max_targets() const override { return mosaic_possible() ? 4 * max_boxes_ : max_boxes_; }
  void targets(int64_t i, const ExampleContext& ctx, float* rows) const override;

  const std::vector<std::string>& class_names() const { return names_; }
  const std::string& file(int64_t i) const { return files_[static_cast<size_t>(i)]; }
  const std::vector<DetectionBox>& boxes(int64_t i) const { return boxes_[static_cast<size_t>(i)]; }
  // The letterbox of image i: scale and padding (left, top) in pixels of the S x S example.
  struct Letterbox {
    double scale = 1;
    int64_t new_w = 0, new_h = 0, left = 0, top = 0;
  };
  Letterbox letterbox(int64_t i) const;
  // What the example's key makes of it: a mosaic or not, its images and geometry (see above).
  struct MosaicPlan {
    bool on = false;
    std::array<int64_t, 4> images{};  // top left (the example), top right, bottom left, bottom right
    int64_t xc = 0, yc = 0;            // the centre in the 2S x 2S canvas
    double scale = 1, tx = 0, ty = 0;  // back to S x S: x' = scale (x - S) + tx, y' = scale (y - S) + ty
  };
  MosaicPlan mosaic_plan(int64_t i, const ExampleContext& ctx) const;
  int64_t image_width(int64_t i) const { return sizes_[static_cast<size_t>(i)].second; }
  int64_t image_height(int64_t i) const { return sizes_[static_cast<size_t>(i)].first; }

 private:
  struct Augmentation {
    bool flip = false;
    double gain_h = 1, gain_s = 1, gain_v = 1;
  };
  Augmentation augmentation(const ExampleContext& ctx) const;  // a function of ctx.key only
  bool flipped(const ExampleContext& ctx) const { return augmentation(ctx).flip; }
  bool mosaic_possible() const { return opt_.augment && opt_.mosaic > 0; }
  Image load_resized(int64_t i) const;  // decoded and resized to the letterbox's new_w x new_h
  // A mosaic's boxes in pixels of the S x S example before the flip: (class, x1, y1, x2, y2).
  std::vector<std::array<double, 5>> mosaic_boxes(const MosaicPlan& plan) const;
  void get_mosaic(const MosaicPlan& plan, const ExampleContext& ctx, float* dst) const;
  std::vector<std::string> files_, names_;
  std::vector<std::vector<DetectionBox>> boxes_;
  std::vector<std::pair<int64_t, int64_t>> sizes_;  // (h, w)
  int64_t max_boxes_ = 0;
  DetectionDatasetOptions opt_;
};

struct ComposeDetectionOptions {
  int64_t train_images = 4000, val_images = 500;
  int64_t canvas = 160;              // square canvases
  int64_t min_items = 1, max_items = 6;
  double min_scale = 1.0, max_scale = 2.5;  // item side = 28 * scale pixels
  uint64_t seed = 0;
  std::string fashion_mnist_dir = default_fashion_mnist_dir();
};

// Writes a detection set composed from Fashion-MNIST into `out_dir` in the YOLO format: images/{train,val}/*.png
// (gray), labels/{train,val}/*.txt and data.yaml (the 10 Fashion-MNIST class names). Each canvas holds
// min..max items at random positions and scales (bilinear), placed so that no two boxes overlap by more than
// IoU 0.3 (up to 50 tries per item); each box is the bounding box of the item's non-zero pixels. Deterministic
// in the seed: item i of image j comes from the Philox stream of (seed, split, j). Train items come from the
// Fashion-MNIST training split, val items from its test split. Returns the data file's path.
std::string compose_fashion_mnist_detection(const std::string& out_dir, const ComposeDetectionOptions& opt = {});

// The class names of Fashion-MNIST, in label order.
const std::vector<std::string>& fashion_mnist_class_names();

}  // namespace ampforge::data
