// Detection loss (unit): hand-checkable cases of the assigner and the loss; their golden parity with the PyTorch
// reference is models/yolo_parity_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "ampforge/autograd/functions.h"
#include "ampforge/ops/ops.h"
#include "ampforge/tasks/detection_loss.h"

using namespace ampforge;
using namespace ampforge::tasks;

namespace {

// One 32x32 image, one level of stride 8: 4x4 anchors at (4 + 8i, 4 + 8j), nc classes; raw outputs all zero
// except what the test sets.
Tensor zero_raw(int64_t nc) { return ops::zeros({1, 64 + nc, 16}); }
const std::vector<std::pair<int64_t, int64_t>> kSizes{{4, 4}};
const std::vector<double> kStrides{8};

}  // namespace

TEST(DetectionLoss, NoTargetsGivesOnlyTheClassTerm) {
  // All logits 0: BCE(0, 0) = log 2 per class and anchor; target-score sum clamps to 1; box and DFL are 0.
  Tensor raw = zero_raw(3);
  raw.requires_grad_(true);
  const auto r = detection_loss(raw, kSizes, kStrides, ops::zeros({1, 0, 5}), 32, 32);
  EXPECT_EQ(r.num_foreground, 0);
  EXPECT_EQ(r.box, 0);
  EXPECT_EQ(r.dfl, 0);
  EXPECT_NEAR(r.cls, 0.5 * 16 * 3 * std::log(2.0), 1e-5);
  EXPECT_NEAR(r.total.item(), r.cls * 1, 1e-5);  // times batch 1
  r.total.backward();
  // d/dlogit BCE = sigmoid(0) - 0 = 0.5, times the gain 0.5 and the batch size 1; box logits get nothing.
  const std::vector<double> g = raw.grad().tolist<double>();
  EXPECT_NEAR(g[static_cast<size_t>(64 * 16)], 0.25, 1e-6);
  EXPECT_EQ(g[0], 0);
}

TEST(DetectionLoss, OneBoxAssignsItsCandidatesAndLearns) {
  // One box (8, 8)-(24, 24) (normalised cx 0.5, w 0.5) of class 1: the anchors strictly inside are (12, 12),
  // (12, 20), (20, 12), (20, 20); with uniform bins each prediction is the box anchor +- 7.5 cells.
  const Tensor targets = Tensor::from_vector(std::vector<float>{1, 0.5f, 0.5f, 0.5f, 0.5f}, {1, 1, 5});
  Tensor raw = zero_raw(2);
  raw.requires_grad_(true);
  const auto r = detection_loss(raw, kSizes, kStrides, targets, 32, 32);
  EXPECT_EQ(r.num_foreground, 4);
  EXPECT_GT(r.box, 0);
  EXPECT_GT(r.dfl, 0);
  EXPECT_NEAR(r.total.item(), r.box + r.cls + r.dfl, 1e-4);
  r.total.backward();
  const std::vector<double> g = raw.grad().tolist<double>();
  // Anchor (12, 12) is index 5 (row 1, column 1); anchor 0 (4, 4) is background: its box logits get nothing.
  double fg_box = 0, bg_box = 0;
  for (int64_t c = 0; c < 64; ++c) fg_box += std::abs(g[static_cast<size_t>(c * 16 + 5)]),
                                   bg_box += std::abs(g[static_cast<size_t>(c * 16 + 0)]);
  EXPECT_GT(fg_box, 0);
  EXPECT_EQ(bg_box, 0);
  // The class-1 logit of a foreground anchor is pulled up (its soft target is > 0 ... and BCE's gradient is
  // sigmoid(0) - target < 0.5); class 0 there, and every class at the background, gets +0.25 (target 0).
  EXPECT_LT(g[static_cast<size_t>((64 + 1) * 16 + 5)], 0.25);
  EXPECT_NEAR(g[static_cast<size_t>((64 + 0) * 16 + 5)], 0.25 / std::max(1.0, r.target_score_sum) * 1, 1e-6);
}

TEST(DetectionLoss, AssignerPadsAndEmptyBatches) {
  // M = 0: everything background; labels are nc as Ultralytics' bg_idx.
  const Tensor s = ops::full({1, 4, 2}, 0.5), b = ops::zeros({1, 4, 4}), anc = ops::zeros({4, 2});
  const Assignment a = assign_targets(s, b, anc, ops::zeros({1, 0}), ops::zeros({1, 0, 4}),
                                      Tensor::from_vector(std::vector<bool>{}, {1, 0}));
  EXPECT_EQ(a.target_labels.tolist<int64_t>(), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(a.fg_mask.tolist<int64_t>(), (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(DetectionLoss, BadTargetsAreErrors) {
  const Tensor raw = zero_raw(2);
  // class 2 of 2 classes
  EXPECT_THROW(detection_loss(raw, kSizes, kStrides,
                              Tensor::from_vector(std::vector<float>{2, 0.5f, 0.5f, 0.2f, 0.2f}, {1, 1, 5}), 32, 32),
               Error);
  // rows of 4 values
  EXPECT_THROW(detection_loss(raw, kSizes, kStrides, ops::zeros({1, 1, 4}), 32, 32), Error);
  // level sizes that do not add up to the anchors
  EXPECT_THROW(detection_loss(raw, {{3, 3}}, kStrides, ops::zeros({1, 0, 5}), 32, 32), Error);
}

TEST(DetectionLoss, CiouKnownValues) {
  // Identical boxes: 1. Same centre, same aspect, half the size: IoU 1/4, no distance or aspect term.
  const Tensor a = Tensor::from_vector(std::vector<float>{0, 0, 4, 4, 0, 0, 4, 4}, {2, 4});
  const Tensor b = Tensor::from_vector(std::vector<float>{0, 0, 4, 4, 1, 1, 3, 3}, {2, 4});
  const std::vector<double> v = bbox_ciou(a, b).tolist<double>();
  EXPECT_NEAR(v[0], 1.0, 1e-6);
  EXPECT_NEAR(v[1], 0.25, 1e-6);
  // Disjoint, equal squares 4 apart (centres (2, 2), (10, 2)): IoU 0, rho^2 64, enclosing diagonal^2 12^2 + 4^2.
  const Tensor c = Tensor::from_vector(std::vector<float>{8, 0, 12, 4}, {1, 4});
  EXPECT_NEAR(bbox_ciou(Tensor::from_vector(std::vector<float>{0, 0, 4, 4}, {1, 4}), c).item(), -64.0 / 160.0, 1e-6);
}
