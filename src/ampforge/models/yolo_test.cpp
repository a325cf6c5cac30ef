// YOLOv8 structure (unit): the yaml's parameter counts through the registry, Ultralytics' state-dict names,
// measured strides, Detect's bias init, the frozen DFL, output layouts in train and eval mode, level sizes for
// sizes that are not multiples of 32, configurable classes, and errors for bad options and inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "ampforge/autograd/node.h"
#include "ampforge/models/registry.h"
#include "ampforge/models/yolo.h"
#include "ampforge/nn/init.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
using namespace ampforge::models;

TEST(Yolo, RegistryCountsAreTheYamlSummaries) {
  // yolov8.yaml: "YOLOv8n summary: 225 layers, 3157200 parameters"; "YOLOv8s ... 11166560 parameters".
  EXPECT_EQ(parameter_counts(model_registry().at("yolov8n"))[0].count, 3157200);
  EXPECT_EQ(parameter_counts(model_registry().at("yolov8s"))[0].count, 11166560);
  const ModelEntry& e = model_registry().at("yolov8n");
  EXPECT_EQ(e.task, "detection");
  EXPECT_EQ(e.defaults.num_classes, 80);
  EXPECT_EQ(e.defaults.image_size, 640);
}

TEST(Yolo, StateDictNamesAreUltralytics) {
  nn::init::SkipInitGuard skip;
  auto m = yolov8('n');
  std::set<std::string> keys;
  for (const auto& [k, t] : m->state_dict()) keys.insert(k);
  for (const char* k : {"model.0.conv.weight", "model.0.bn.running_mean", "model.2.m.0.cv1.bn.running_var",
                        "model.4.m.1.cv2.conv.weight", "model.9.cv2.bn.bias", "model.22.cv2.0.2.bias",
                        "model.22.cv3.2.1.conv.weight", "model.22.dfl.conv.weight", "model.21.cv1.bn.num_batches_tracked"})
    EXPECT_TRUE(keys.count(k)) << k;
  EXPECT_EQ(m->state_dict().front().first, "model.0.conv.weight");
  EXPECT_EQ(m->state_dict().back().first, "model.22.dfl.conv.weight");
  // 16 frozen parameters: the yaml's "3157184 gradients".
  int64_t trainable = 0;
  for (const Tensor& p : m->parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  EXPECT_EQ(trainable, 3157184);
}

TEST(Yolo, StridesBiasInitAndFrozenDfl) {
  auto m = yolov8('n');
  EXPECT_EQ(m->strides(), (std::vector<double>{8, 16, 32}));
  const double want[] = {-11.5366, -10.1503, -8.7641};  // MODELS.md §A.3 for nc = 80
  for (size_t i = 0; i < 3; ++i) {
    auto* cls = dynamic_cast<nn::Conv2d*>(m->detect->cls_branches[i]->children().back().second.get());
    auto* box = dynamic_cast<nn::Conv2d*>(m->detect->box_branches[i]->children().back().second.get());
    ASSERT_TRUE(cls && box);
    for (double v : cls->bias.tolist<double>()) EXPECT_NEAR(v, want[i], 1e-4);
    for (double v : box->bias.tolist<double>()) EXPECT_EQ(v, 2.0);  // Ultralytics 8.4's Detect.bias_init
  }
  const Tensor w = m->detect->dfl->conv->weight;
  EXPECT_FALSE(w.requires_grad());
  EXPECT_EQ(w.shape(), Shape({1, 16, 1, 1}));
  const std::vector<double> bins = w.tolist<double>();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(bins[static_cast<size_t>(i)], i);
  // BN options of initialize_weights.
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<YoloConv>(m->model->children()[0].second)->bn->options.eps, 1e-3);
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<YoloConv>(m->model->children()[0].second)->bn->options.momentum, 0.03);
}

TEST(Yolo, OutputsInTrainAndEvalModeAndLevelSizes) {
  auto m = yolov8('n', 3);
  const Tensor x = ops::mul_scalar(ops::ones({1, 3, 96, 160}), 0.5);  // not a multiple of 32 in width
  const auto sizes = m->level_sizes(96, 160);
  ASSERT_EQ(sizes.size(), 3u);
  EXPECT_EQ(sizes[0], (std::pair<int64_t, int64_t>{12, 20}));
  EXPECT_EQ(sizes[2], (std::pair<int64_t, int64_t>{3, 5}));
  const int64_t A = 12 * 20 + 6 * 10 + 3 * 5;
  autograd::NoGradGuard ng;
  const auto levels = m->forward_levels(x);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(levels[i].shape()[2], sizes[i].first);
    EXPECT_EQ(levels[i].shape()[3], sizes[i].second);
    EXPECT_EQ(levels[i].shape()[1], 64 + 3);
  }
  EXPECT_EQ((*m)(x).shape(), Shape({1, 67, A}));
  m->eval();
  const Tensor y = (*m)(x);
  ASSERT_EQ(y.shape(), Shape({1, 7, A}));
  // Decoded: positive widths/heights in pixels, probabilities in (0, 1), centres near their anchors.
  const std::vector<double> v = y.tolist<double>();
  for (int64_t a = 0; a < A; ++a) {
    EXPECT_GT(v[static_cast<size_t>(2 * A + a)], 0);
    EXPECT_GT(v[static_cast<size_t>(3 * A + a)], 0);
    for (int64_t c = 4; c < 7; ++c) {
      const double p = v[static_cast<size_t>(c * A + a)];
      EXPECT_TRUE(p > 0 && p < 1) << p;
    }
  }
  // Anchor 0 is the cell (0, 0) of stride 8: its decoded centre is within 16 bins x 8 px of (4, 4).
  EXPECT_LT(std::abs(v[0] - 4), 8 * 16);
}

TEST(Yolo, ClassesAreConfigurable) {
  nn::init::SkipInitGuard skip;
  // The class count changes only the three class branches (cv3), whose width is c3 = max(ch0, min(nc, 100)).
  const int64_t n80 = yolov8('n', 80)->num_parameters(), n10 = yolov8('n', 10)->num_parameters();
  // yolov8n: ch0 = 64, so c3 is 80 for 80 classes and 64 for 10; recount the cv3 branches for both.
  auto cv3 = [](int64_t nc) {
    const int64_t c3 = std::max<int64_t>(64, std::min<int64_t>(nc, 100));
    int64_t total = 0;
    for (int64_t ch : {64, 128, 256}) total += ch * c3 * 9 + 2 * c3 + c3 * c3 * 9 + 2 * c3 + c3 * nc + nc;
    return total;
  };
  EXPECT_EQ(n80 - n10, cv3(80) - cv3(10));
  ModelOptions o;
  o.num_classes = 10;
  o.in_channels = 1;
  EXPECT_EQ(create("yolov8n", o)->state_dict().front().second.shape(), Shape({16, 1, 3, 3}));
}

TEST(Yolo, BadOptionsAndInputsAreErrors) {
  EXPECT_THROW(yolov8_scale('q'), Error);
  nn::init::SkipInitGuard skip;
  EXPECT_THROW(yolov8('n', 0), Error);
  auto m = yolov8('n');
  autograd::NoGradGuard ng;
  EXPECT_THROW(m->forward_levels(ops::zeros({1, 1, 64, 64})), Error);  // 1 channel into a 3-channel model
}
