// Detection evaluation (unit): NMS, mAP and the per-class table on hand-worked cases, and the task's errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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
  // IoU >= 0.65: recall stops at 0.5 (precisions 1, 1/2, 1/3). Ultralytics 8.4's sentinel (0.5, 0) after the last
  // recall drops the envelope to 0 at 0.5 (np.interp reads the last of the equal points): 0.49 + (1 + 0) / 200 = 0.495
  // (Ultralytics' compute_ap gives 0.495; earlier 8.x interpolated down to (1, 0): 0.58).
  const double ap_lo = 0.49 + 1.0 / 200;
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

TEST(DetectionEval, ATopMissReadsTheEnvelopeAtRecallZeroAsNumpyDoes) {
  // One box; a miss (0.9) above the hit (0.8): recall 0, 1 and precision 0, 1/2. mrec = 0, 0, 1, 1 and the envelope
  // 1, 1/2, 1/2, 0: np.interp at x = 0 takes the last of the equal zeros (1/2, not the leading 1), so AP =
  // 99 x 0.01 x 1/2 + (1/2) / 200 = 0.4975.
  DetectionMetrics m(1);
  m.add_image({{50, 50, 60, 60, 0.9f, 0}, {0, 0, 10, 10, 0.8f, 0}}, {{0, 0, 10, 10, 1, 0}});
  EXPECT_NEAR(m.map50(), 0.4975, 1e-12);
  EXPECT_EQ(np_interp(0.0, {0, 0, 1}, {1, 0.5, 0}, 9, 9), 0.5);
  EXPECT_EQ(np_interp(-1, {0, 1}, {1, 0}, 7, 8), 7);
  EXPECT_EQ(np_interp(2, {0, 1}, {1, 0}, 7, 8), 8);
  EXPECT_EQ(np_interp(0.25, {0, 1}, {1, 0}, 7, 8), 0.75);
}

TEST(DetectionEval, PerClassTableOnAHandWorkedCase) {
  // Image 1: cat A, dogs B and C; image 2: cat D. Predictions: cat on A (0.9) and on D (0.8), both exact; dog on B
  // (0.7, exact), dog on C with IoU 0.72 (0.6: a match for IoU 0.50 ... 0.70 only), a dog in image 2 (0.95: a miss).
  DetectionMetrics m(3);  // class 2 has no box: no row
  m.add_image({{0, 0, 10, 10, 0.9f, 0}, {20, 20, 30, 30, 0.7f, 1}, {40, 40, 50, 47.2f, 0.6f, 1}},
              {{0, 0, 10, 10, 1, 0}, {20, 20, 30, 30, 1, 1}, {40, 40, 50, 50, 1, 1}});
  m.add_image({{0, 0, 10, 10, 0.8f, 0}, {60, 60, 70, 70, 0.95f, 1}}, {{0, 0, 10, 10, 1, 0}});
  // cat: recall 1/2, 1 at precision 1 for every threshold: 0.995 (the closing half trapezoid).
  // dog, IoU <= 0.70: recall 0, 1/2, 1, precision 0, 1/2, 2/3: envelope 2/3 from recall 0 (the top miss) to 1:
  //   0.995 x 2/3. IoU >= 0.75: recall 0, 1/2, 1/2, precision 0, 1/2, 1/3: 1/2 up to recall 0.5, where the
  //   sentinel after the last recall reads 0: 0.49 x 1/2 + (1/2 + 0) / 200 = 0.2475 (Ultralytics 8.4's compute_ap).
  const double dog50 = 0.995 * 2 / 3, dog_hi = 0.49 / 2 + 0.5 / 200;
  // Precision and recall at IoU 0.5: below confidence 0.6 cat has P = R = 1 (F1 1) and dog P = 2/3, R = 1
  // (F1 0.8); above it both are lower (dog: 0 above 0.95, at most 0.5 down to 0.7, rising to 0.8 at 0.6), so the
  // smoothed mean F1 is highest from confidence 0 on, and the first maximum is 0.
  const DetectionMetrics::Summary s = m.summary();
  ASSERT_EQ(s.classes.size(), 2u);
  EXPECT_EQ(s.confidence, 0.0);
  const auto& cat = s.classes[0];
  const auto& dog = s.classes[1];
  EXPECT_EQ(cat.cls, 0);
  EXPECT_EQ(cat.images, 2);
  EXPECT_EQ(cat.instances, 2);
  EXPECT_NEAR(cat.precision, 1, 1e-12);
  EXPECT_NEAR(cat.recall, 1, 1e-12);
  EXPECT_NEAR(cat.map50, 0.995, 1e-12);
  EXPECT_NEAR(cat.map50_95, 0.995, 1e-12);
  EXPECT_EQ(dog.cls, 1);
  EXPECT_EQ(dog.images, 1);
  EXPECT_EQ(dog.instances, 2);
  EXPECT_NEAR(dog.precision, 2.0 / 3, 1e-12);
  EXPECT_NEAR(dog.recall, 1, 1e-12);
  EXPECT_NEAR(dog.map50, dog50, 1e-12);
  EXPECT_NEAR(dog.map50_95, (5 * dog50 + 5 * dog_hi) / 10, 1e-12);
  EXPECT_NEAR(m.map50(), (0.995 + dog50) / 2, 1e-12);  // the table's rows are the mAP's classes

  // The details: JSON with the documented keys, names from the data, "class<i>" past them; a table for people.
  const EvalDetails d = per_class_details(m, {"cat"});
  const auto j = nlohmann::json::parse(d.json);
  ASSERT_EQ(j.at("per_class").size(), 2u);
  const auto& row = j["per_class"][1];
  for (const char* key : {"class", "name", "images", "instances", "precision", "recall", "map50", "map50_95"})
    EXPECT_TRUE(row.contains(key)) << key;
  EXPECT_EQ(row.size(), 8u);
  EXPECT_EQ(j["per_class"][0]["name"], "cat");
  EXPECT_EQ(row["name"], "class1");
  EXPECT_EQ(row["images"], 1);
  EXPECT_DOUBLE_EQ(row["map50"].get<double>(), dog.map50);
  EXPECT_EQ(j.at("per_class_confidence"), 0.0);
  EXPECT_NE(d.text.find("mAP50-95"), std::string::npos) << d.text;
  EXPECT_NE(d.text.find("all"), std::string::npos) << d.text;
  EXPECT_NE(d.text.find("class1"), std::string::npos) << d.text;
}

TEST(DetectionEval, PrecisionAndRecallAreReadWhereTheSmoothedF1Peaks) {
  // One box; a hit at 0.9, a miss at 0.1. Over confidence c: recall 0 above 0.9, else 1; precision 1 above 0.9,
  // falling linearly to 1/2 at 0.1 (np.interp between the two predictions). F1 is 0 above 0.9 and rises with c
  // below it, so the 101-point mean is highest for the last window that stays at or below 0.9: points k - 50 ...
  // k + 50 of c = k / 999 with k + 50 = 899 (899/999 <= 0.9 < 900/999), k = 849.
  DetectionMetrics m(1);
  m.add_image({{0, 0, 10, 10, 0.9f, 0}, {50, 50, 60, 60, 0.1f, 0}}, {{0, 0, 10, 10, 1, 0}});
  const DetectionMetrics::Summary s = m.summary();
  ASSERT_EQ(s.classes.size(), 1u);
  EXPECT_NEAR(s.confidence, 849.0 / 999, 1e-12);
  const double c9 = static_cast<double>(0.9f), c1 = static_cast<double>(0.1f);  // the scores as stored (float)
  EXPECT_NEAR(s.classes[0].precision, 1 - 0.5 * (c9 - 849.0 / 999) / (c9 - c1), 1e-12);
  EXPECT_NEAR(s.classes[0].recall, 1, 1e-12);
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
