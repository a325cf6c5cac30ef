// Object detection with YOLOv8 (models/yolo.h): the v8 loss for training (tasks/detection_loss.h) and an
// evaluator with Ultralytics' validation semantics (DetectionValidator, ops.non_max_suppression, metrics.py):
//   decode -> candidates (box, class) with score > conf (multi-label) -> at most 30000 by score -> class-aware
//   greedy NMS at IoU 0.7 -> at most 300 detections per image; matching per IoU threshold 0.50:0.05:0.95 in
//   confidence order (each detection takes the unclaimed same-class box of highest IoU, a hit when that IoU reaches
//   the threshold: Ultralytics 8.4's match_predictions); per class AP = area under the precision envelope, which
//   drops to 0 after the highest recall, sampled at 101 recall points (trapezoid, Ultralytics 8.4's compute_ap); mAP
//   over the classes that have boxes. Checked against Ultralytics itself by models/yolo_parity_test.cpp. Reported: map50, map50_95 (fractions), loss and its parts (box_loss, cls_loss, dfl_loss: mean per
//   batch, gains applied, not multiplied by the batch size — Ultralytics' loss items). The evaluator's details
//   (Evaluator::details) are the per-class table Ultralytics' validator prints: DetectionMetrics::summary().
// Batches carry targets (B, T, 5) rows (class, cx, cy, w, h) normalised to the example (data::Batch::targets).
// The model must implement models::Detector (models/task_models.h), as models::DetectionModel does.
//
// The loss reads back to the host (the assigner, see detection_loss.h), so a CUDA step with it is not graph-capturable.
#pragma once

#include <string>
#include <vector>

#include "ampforge/models/registry.h"
#include "ampforge/models/task_models.h"
#include "ampforge/tasks/detection_loss.h"
#include "ampforge/tasks/task.h"

namespace ampforge::tasks {

struct DetectionTaskOptions {
  DetectionLossOptions loss;
  double conf = 0.001;       // Ultralytics' validation confidence threshold
  double nms_iou = 0.7;
  int64_t max_det = 300;
  int64_t max_nms = 30000;   // candidates kept (by score) before NMS
  std::vector<std::string> class_names;  // for the per-class table; empty (or short): "class<i>"
};

// One detection: xyxy pixels of the model's input, class, score.
struct Detection {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0, score = 0;
  int64_t cls = 0;
};

// decoded (4 + nc, A) of one image (a CPU F32 contiguous view: cx, cy, w, h pixels, then class probabilities)
// -> detections sorted by score (descending), after the threshold, multi-label candidates and class-aware NMS.
std::vector<Detection> non_max_suppression(const float* decoded, int64_t num_classes, int64_t anchors,
                                           const DetectionTaskOptions& opt);

// The accumulator behind the evaluator, usable on its own: add images' detections and ground truth, then ask
// for AP. Boxes in the same pixel coordinates on both sides.
class DetectionMetrics {
 public:
  static constexpr int kThresholds = 10;  // IoU 0.50, 0.55, ..., 0.95
  explicit DetectionMetrics(int64_t num_classes)
      : nc_(num_classes), gt_count_(static_cast<size_t>(num_classes), 0), gt_images_(static_cast<size_t>(num_classes), 0) {}
  // dets in NMS's order (highest score first): matching goes through them in the order given. truth: score unused.
  void add_image(const std::vector<Detection>& dets, const std::vector<Detection>& truth);
  // (classes with at least one box) x kThresholds AP; map50() and map50_95() average it.
  std::vector<std::vector<double>> ap_per_class() const;
  double map50() const;
  double map50_95() const;
  int64_t images() const { return images_; }

  // Ultralytics' per-class summary (metrics.ap_per_class, printed by its validator) for the classes with at least
  // one box, in class order. Precision and recall are read, at IoU 0.5, from curves over the confidence
  // c = np.linspace(0, 1, 1000) (np.interp of each class's cumulative precision and recall in score order; precision 1
  // and recall 0 above its highest score), all at the one confidence whose class-mean F1 = 2PR / (P + R),
  // smoothed by a 101-point box filter (Ultralytics' smooth(f1, 0.1)), is the highest (the first on ties).
  struct ClassSummary {
    int64_t cls = 0;
    int64_t images = 0;     // images with at least one box of the class
    int64_t instances = 0;  // its boxes
    double precision = 0, recall = 0, map50 = 0, map50_95 = 0;
  };
  struct Summary {
    std::vector<ClassSummary> classes;
    double confidence = 0;  // where precision and recall were read
  };
  Summary summary() const;

 private:
  struct Pred {
    float score;
    int64_t cls;
    bool tp[kThresholds];
  };
  int64_t nc_, images_ = 0;
  std::vector<int64_t> gt_count_, gt_images_;  // boxes, and images with a box, per class
  std::vector<Pred> preds_;
};

// The evaluator's details: the per-class table of summary() with "all" first (images evaluated, every box, the mean
// of each column), and as JSON {"per_class": [{"class", "name", "images", "instances", "precision", "recall",
// "map50", "map50_95"}, ...], "per_class_confidence": c}. Names from class_names, else "class<i>".
EvalDetails per_class_details(const DetectionMetrics& metrics, const std::vector<std::string>& class_names);

// Ultralytics' compute_ap: recall and precision in score order -> the area under the monotone precision envelope
// (0 after the last recall), sampled at np.linspace(0, 1, 101), by the trapezoid rule.
double average_precision(const std::vector<double>& recall, const std::vector<double>& precision);

// np.interp(x, xp, fp, left, right) for a non-decreasing xp: left below xp[0], right above xp.back(); on a run of
// equal xp values, the last one's fp (numpy's search takes the last j with xp[j] <= x).
double np_interp(double x, const std::vector<double>& xp, const std::vector<double>& fp, double left, double right);

class DetectionTask final : public Task {
 public:
  explicit DetectionTask(DetectionTaskOptions opt = {});
  std::string name() const override { return "detection"; }
  Tensor loss(nn::Module& model, const data::Batch& batch) override;
  std::unique_ptr<Evaluator> evaluator() const override;
  std::string primary_metric() const override { return "map50"; }
  std::string model_mismatch(nn::Module& model) const override {
    return models::interface_mismatch<models::Detector>(model, name());
  }
  std::string cuda_graph_obstacle() const override {
    return "the detection loss assigns targets to anchors on the host (it copies the predictions there)";
  }
  const DetectionTaskOptions& options() const { return opt_; }

 private:
  DetectionTaskOptions opt_;
};

// A synthetic batch for a model built with `mo` (the bench, memory planning: tasks/registry.h):
// [0, 1) images (YOLO inputs are pixels / 255) and four boxes per image
// (Batch::targets rows: class, cx, cy, w, h, normalised), spread over the canvas and the classes so that the assigner
// finds foreground anchors.
data::Batch detection_synthetic_batch(const models::ModelOptions& mo, const SyntheticBatchOptions& o);

}  // namespace ampforge::tasks
