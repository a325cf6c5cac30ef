// YOLOv8 detection models (n/s/m/l/x) as Ultralytics 8.x builds them from yolov8.yaml: the same module tree,
// the same state-dict names in the same order ("model.0.conv.weight", "model.2.m.0.cv1.bn.running_var",
// "model.22.cv2.0.2.bias", "model.22.dfl.conv.weight", ...), so Ultralytics weights saved as safetensors load
// by name (nn::load_safetensors).
//
// Facts kept (../shared/docs/specs/MODELS.md §A; Ultralytics conv.py, block.py, head.py, tasks.py, yolov8.yaml):
//   Conv        Conv2d(k, s, pad k/2, no bias) - BatchNorm2d(eps 1e-3, momentum 0.03) - SiLU
//   Bottleneck  Conv(c, c, 3) - Conv(c, c, 3), + x when shortcut (and c_in == c_out)
//   C2f         cv1 = Conv(c1, 2c, 1), chunk in two, n Bottlenecks on the last chunk (e = 1), cv2 = Conv((2+n)c, c2, 1)
//   SPPF        cv1 = Conv(c1, c1/2, 1), MaxPool(5, stride 1, pad 2) three times in series, cv2 = Conv(4 c1/2, c2, 1)
//   Detect      legacy class branch (v8): per level cv2 = Conv 3x3 - Conv 3x3 - Conv2d(c2, 64, 1) (box, 16 bins x 4
//               sides), cv3 = Conv 3x3 - Conv 3x3 - Conv2d(c3, nc, 1); c2 = max(16, ch0/4, 64), c3 = max(ch0, min(nc, 100));
//               DFL = a frozen Conv2d(16, 1, 1) with weights arange(16) (the expected bin)
//   scaling     repeats max(round(n depth), 1) for n > 1; channels make_divisible(min(c, max_channels) width, 8)
//   strides     measured by a forward pass at construction (input / feature-map height: 8, 16, 32)
//   bias init   box bias 2.0 (Ultralytics 8.4; 1.0 in earlier 8.x); class bias log(5 / nc / (640 / stride)^2)
// Counts (80 classes): yolov8n 3,157,200 and yolov8s 11,166,560 parameters, 16 of them the frozen DFL conv.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ampforge/models/task_models.h"
#include "ampforge/nn/layers.h"

namespace ampforge::models {

struct YoloOptions {
  double depth = 0.33;          // the scale's depth multiple
  double width = 0.25;          // the scale's width multiple
  int64_t max_channels = 1024;  // channels are clamped to this before the width multiple
  int64_t num_classes = 80;
  int64_t in_channels = 3;
};

// The scale table of yolov8.yaml: 'n' [0.33, 0.25, 1024], 's' [0.33, 0.50, 1024], 'm' [0.67, 0.75, 768],
// 'l' [1.00, 1.00, 512], 'x' [1.00, 1.25, 512]. Throws InvalidArgument for any other letter.
YoloOptions yolov8_scale(char scale, int64_t num_classes = 80, int64_t in_channels = 3);

// Conv2d(k, stride, pad k/2, no bias) - BatchNorm2d(eps 1e-3, momentum 0.03) - SiLU. Children "conv", "bn".
class YoloConv : public nn::Module {
 public:
  YoloConv(int64_t c_in, int64_t c_out, int64_t k = 1, int64_t stride = 1);
  Tensor forward(const Tensor& x) override;  // (N, c_in, H, W) -> (N, c_out, ceil(H / s), ceil(W / s))
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
};

// Conv 3x3 - Conv 3x3 (hidden channels c_out * e), adding the input when shortcut and c_in == c_out.
class YoloBottleneck : public nn::Module {
 public:
  YoloBottleneck(int64_t c_in, int64_t c_out, bool shortcut, double e = 0.5);
  Tensor forward(const Tensor& x) override;  // (N, c_in, H, W) -> (N, c_out, H, W)
  std::shared_ptr<YoloConv> cv1, cv2;
  bool add;
};

// CSP bottleneck with two convolutions (Ultralytics' C2f). Children "cv1", "cv2", "m" (n Bottlenecks).
class C2f : public nn::Module {
 public:
  C2f(int64_t c_in, int64_t c_out, int64_t n, bool shortcut, double e = 0.5);
  Tensor forward(const Tensor& x) override;  // (N, c_in, H, W) -> (N, c_out, H, W)
  std::shared_ptr<YoloConv> cv1, cv2;
  std::shared_ptr<nn::Sequential> m;  // a ModuleList: children run in turn on the last chunk, each one kept
  int64_t c;                          // hidden channels per chunk
};

// Spatial pyramid pooling, fast. Children "cv1", "cv2", "m" (the pool).
class SPPF : public nn::Module {
 public:
  SPPF(int64_t c_in, int64_t c_out, int64_t k = 5);
  Tensor forward(const Tensor& x) override;  // (N, c_in, H, W) -> (N, c_out, H, W)
  std::shared_ptr<YoloConv> cv1, cv2;
  std::shared_ptr<nn::MaxPool2d> m;
};

// Distribution focal loss integral: softmax over 16 bins per side, then the frozen 1x1 conv (arange(16)).
class DFL : public nn::Module {
 public:
  explicit DFL(int64_t bins = 16);
  // x (B, 4 * bins, A) -> (B, 4, A): the expected bin of each side.
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Conv2d> conv;  // weight (1, bins, 1, 1), requires_grad false
  int64_t bins;
};

// The v8 Detect head with the legacy class branch. Children "cv2", "cv3" (one Sequential per level), "dfl".
class Detect : public nn::Module {
 public:
  static constexpr int64_t kRegMax = 16;
  Detect(int64_t num_classes, const std::vector<int64_t>& channels);
  // feats[i] (B, ch_i, H_i, W_i) -> per level (B, 4 * 16 + nc, H_i, W_i): box distributions then class logits.
  std::vector<Tensor> forward_levels(const std::vector<Tensor>& feats);
  // raw (B, 64 + nc, A), the levels flattened and concatenated; sizes: (H_i, W_i) per level ->
  // (B, 4 + nc, A): boxes as (cx, cy, w, h) in input pixels, then class probabilities (sigmoid).
  Tensor decode(const Tensor& raw, const std::vector<std::pair<int64_t, int64_t>>& sizes);
  // Ultralytics' bias_init: box biases 2.0, class biases log(5 / nc / (640 / stride)^2). Needs strides.
  void bias_init();
  std::vector<std::shared_ptr<nn::Sequential>> box_branches, cls_branches;  // cv2[i], cv3[i]
  std::shared_ptr<DFL> dfl;
  std::vector<double> strides;  // measured by DetectionModel's constructor
  int64_t num_classes, num_outputs;
};

// The model: child "model" holds layers 0..22 of yolov8.yaml (0-9 backbone, 10-21 head, 22 Detect).
// forward(x), x (B, C, H, W) with H and W multiples of 32 (any size >= 32 runs; the anchors follow the maps):
//   training mode -> (B, 64 + nc, A) raw outputs of the three levels, flattened and concatenated (A = sum H_i W_i)
//   eval mode     -> (B, 4 + nc, A) decoded: boxes (cx, cy, w, h) in pixels, class probabilities
class DetectionModel : public Detector {
 public:
  explicit DetectionModel(const YoloOptions& opt = {});
  Tensor forward(const Tensor& x) override;
  // The three level outputs (B, 64 + nc, H_i, W_i) (whatever the mode).
  std::vector<Tensor> forward_levels(const Tensor& x);
  // Training-mode output layout, whatever the mode: (B, 64 + nc, A).
  Tensor forward_raw(const Tensor& x) override;
  Tensor decode(const Tensor& raw, const std::vector<std::pair<int64_t, int64_t>>& sizes) override {
    return detect->decode(raw, sizes);
  }
  // The level sizes (H_i, W_i) the network produces for an input of h x w (each stride-2 conv: ceil(h / 2)).
  std::vector<std::pair<int64_t, int64_t>> level_sizes(int64_t h, int64_t w) const override;
  const std::vector<double>& strides() const override { return detect->strides; }
  int64_t num_classes() const override { return opt_.num_classes; }
  const YoloOptions& options() const { return opt_; }

  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<Detect> detect;  // = model's child "22"

 private:
  YoloOptions opt_;
  std::vector<nn::Module*> layers_;  // model's children, by index
};

std::shared_ptr<DetectionModel> yolov8(char scale, int64_t num_classes = 80, int64_t in_channels = 3);

// Ultralytics' make_anchors: per level (H_i, W_i) and stride, the cell centres (x + offset, y + offset) in grid
// units, row-major (y outer), levels in order -> (A, 2) F32 points and (A, 1) F32 strides, on the CPU.
std::pair<Tensor, Tensor> make_anchors(const std::vector<std::pair<int64_t, int64_t>>& sizes,
                                       const std::vector<double>& strides, double offset = 0.5);

// Flattens and concatenates level outputs (B, no, H_i, W_i) -> (B, no, sum H_i W_i), Ultralytics' order.
Tensor concat_levels(const std::vector<Tensor>& levels);

}  // namespace ampforge::models
