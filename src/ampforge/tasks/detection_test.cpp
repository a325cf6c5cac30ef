// Detection evaluation (unit): NMS and mAP on hand-worked cases, and the task's errors.
#include <gtest/gtest.h>

#include "ampforge/models/yolo.h"
#include "ampforge/nn/init.h"
#include "ampforge/ops/ops.h"
#include "ampforge/tasks/detection.h"

using namespace ampforge;
using namespace ampforge::tasks;

TEST(DetectionEval, NmsIsClassAwareMultiLabelAndThresholded) {
  // 4 anchors, 2 classes; rows cx, cy, w, h, p(class 0), p(class 1).
  const int64_t A = 4;
  const std::vector<float> d = {
      10, 11, 11, 50,            // cx
      10, 10, 10, 50,            // cy
      10, 10, 10, 10,            // w
      10, 10, 10, 10,            // h
      0.9f, 0.8f, 0.0f, 0.0005f,  // class 0: a1 overlaps a0 (IoU 90/110 = 0.82 > 0.7); a3 is below conf
      0.3f, 0.0f, 0.7f, 0.0f,    // class 1: a0's second label is suppressed by a2 (same class, IoU 0.82)
  };
  DetectionTaskOptions opt;
  const auto dets = non_max_suppression(d.data(), 2, A, opt);
  ASSERT_EQ(dets.size(), 2u);
  EXPECT_EQ(dets[0].cls, 0);
  EXPECT_FLOAT_EQ(dets[0].score, 0.9f);
  EXPECT_FLOAT_EQ(dets[0].x1, 5);
  EXPECT_FLOAT_EQ(dets[0].y2, 15);
  EXPECT_EQ(dets[1].cls, 1);
  EXPECT_FLOAT_EQ(dets[1].score, 0.7f);
  opt.max_det = 1;
  EXPECT_EQ(non_max_suppression(d.data(), 2, A, opt).size(), 1u);
}

TEST(DetectionEval, ApOnAHandWorkedCase) {
  // One class, two boxes, three predictions: p1 (0.9) = box 1 (IoU 1), p2 (0.8) hits nothing, p3 (0.7) covers box 2
  // with IoU 0.62 (a match for thresholds 0.50, 0.55, 0.60 only).
  DetectionMetrics m(1);
  const std::vector<Detection> truth = {{20, 20, 30, 30, 1, 0}, {0, 0, 10, 10, 1, 0}};
  const std::vector<Detection> dets = {{20, 20, 30, 30, 0.9f, 0}, {50, 50, 60, 60, 0.8f, 0}, {0, 0, 10, 6.2f, 0.7f, 0}};
  m.add_image(dets, truth);
  // IoU <= 0.60: recall 0.5, 0.5, 1 and precision 1, 1/2, 2/3: envelope 1 up to recall 0.5, then 2/3. Sampled at
  // 0, 0.01, ..., 1 (np.interp takes the right-hand value at 0.5 and 0 at 1) and integrated by trapezoids:
  // 0.49 + (1 + 2/3) / 200 + 0.49 * 2/3 + (2/3) / 200 = 0.828333...
  const double ap_hi = 0.49 + (1 + 2.0 / 3) / 200 + 0.49 * 2.0 / 3 + (2.0 / 3) / 200;
  // IoU >= 0.65: recall 0.5 at precisions 1, 1/2, 1/3: 0.49 + (1 + 1/3) / 200 + (1/3) * 0.5 / 2 = 0.58.
  const double ap_lo = 0.49 + (1 + 1.0 / 3) / 200 + (1.0 / 3) * 0.5 / 2;
  const auto ap = m.ap_per_class();
  ASSERT_EQ(ap.size(), 1u);
  for (int k = 0; k < 10; ++k) EXPECT_NEAR(ap[0][static_cast<size_t>(k)], k < 3 ? ap_hi : ap_lo, 1e-9) << k;
  EXPECT_NEAR(m.map50(), ap_hi, 1e-9);
  EXPECT_NEAR(m.map50_95(), (3 * ap_hi + 7 * ap_lo) / 10, 1e-9);
  // A class without boxes does not count; a perfect detector scores 0.995, not 1: np.interp gives the envelope's
  // closing 0 at recall 1, so the last trapezoid is half (Ultralytics' well-known ceiling).
  DetectionMetrics p(3);
  p.add_image({{0, 0, 10, 10, 0.5f, 2}}, {{0, 0, 10, 10, 1, 2}});
  EXPECT_NEAR(p.map50_95(), 0.995, 1e-9);
}

TEST(DetectionEval, TaskNeedsADetectionModelAndTargets) {
  DetectionTask task;
  EXPECT_EQ(task.primary_metric(), "map50");
  nn::init::SkipInitGuard skip;
  auto m = models::yolov8('n', 2);
  data::Batch b;
  b.x = ops::zeros({1, 3, 64, 64});
  EXPECT_THROW(task.loss(*m, b), Error);  // no targets
  auto lin = std::make_shared<nn::Linear>(2, 2);
  b.targets = ops::zeros({1, 1, 5});
  EXPECT_THROW(task.loss(*lin, b), Error);  // not a DetectionModel
}
