// The YOLOv8 detection loss with Ultralytics' v8DetectionLoss semantics (../shared/docs/specs/MODELS.md §A.4, A.5;
// ultralytics/utils/loss.py and tal.py): anchors from the feature maps, DFL decode, TaskAlignedAssigner, BCE on
// soft targets, CIoU and DFL on foreground anchors weighted by the target scores, all divided by the batch-wide
// target-score sum, gains box 7.5 / cls 0.5 / dfl 1.5, times the batch size.
//
// Where it runs. The differentiable part (decode, BCE, CIoU, DFL) is tensor ops on the predictions' device.
// The assigner has no gradient and is a data-dependent selection (top-k per box, argmax over boxes, scatter);
// it is computed on the host (CPU, F32, plain loops, assign_targets below) from detached copies of the
// predicted scores and boxes, and its results (the soft class targets, the per-anchor box-loss weights and the
// DFL bin weights) go back to the device as constant tensors. Why the host: the number of boxes varies per
// batch and the loop is O(B * boxes * anchors) with tiny per-box work, so a device version would be a dozen
// small launches for a few microseconds of arithmetic, and the step must read the box count anyway. The cost
// is one device-to-host copy of (B, A, nc + 4) values per step, which makes the detection loss the one task
// loss that reads back (tasks/task.h): a CUDA step with it cannot be captured in a CUDA graph.
//
// Foreground selection without gather. Ultralytics indexes the foreground anchors (pred[fg_mask]); here the
// box and DFL terms are computed for every anchor and multiplied by a weight that is zero on the background
// (the same sums: every background term is finite, so its zero weight contributes exactly 0 and no gradient).
// The DFL's two cross-entropies with weights (floor(t) + 1 - t, t - floor(t)) are one soft-target
// cross-entropy over the 16 bins, -sum_k q_k log softmax(p)_k, with q built on the host.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge::tasks {

struct AssignerOptions {
  int64_t topk = 10;    // the v8 loss's override (the class default is 13)
  double alpha = 0.5;   // score exponent (class default 1.0)
  double beta = 6.0;    // IoU exponent
  double eps = 1e-9;
  // Ultralytics 8.4's stride_val: when candidate anchors are selected, a box side shorter than this is taken as this
  // long about the box's centre (small objects keep candidates). Ultralytics uses the second stride (the first when
  // there is one level); detection_loss sets it so from the strides it is given. 16: strides 8, 16, 32.
  double stride_val = 16;
};

// The assigner's outputs, CPU tensors: B images, A anchors, nc classes.
struct Assignment {
  Tensor target_labels;  // (B, A) I64: the assigned box's class (0 for background, as Ultralytics' clamp)
  Tensor target_bboxes;  // (B, A, 4) F32 xyxy pixels: the assigned box (box 0 of the image for background)
  Tensor target_scores;  // (B, A, nc) F32: one-hot x normalised alignment metric (zeros for background)
  Tensor fg_mask;        // (B, A) Bool
  Tensor target_gt_idx;  // (B, A) I64: index of the assigned box in the image's list
};

// Ultralytics' TaskAlignedAssigner.forward, computed on the host in F32 (any device and float dtype is accepted
// and copied; nothing is differentiated). Shapes:
//   pd_scores (B, A, nc) probabilities (sigmoid of the logits); pd_bboxes (B, A, 4) xyxy pixels;
//   anc_points (A, 2) pixels; gt_labels (B, M) class indices (any numeric dtype); gt_bboxes (B, M, 4) xyxy pixels;
//   mask_gt (B, M) Bool: which rows are real boxes (M may be 0).
// Candidates: anchors strictly inside a box (min(l, t, r, b) > eps), a side shorter than stride_val taken as
// stride_val about the centre for this test only; metric score^alpha * max(CIoU, 0)^beta against the box itself;
// top-k per box (ties broken by the lower anchor index); an anchor claimed by several boxes keeps the one with the
// highest IoU (first on ties); scores normalised per box by max IoU / max metric.
Assignment assign_targets(const Tensor& pd_scores, const Tensor& pd_bboxes, const Tensor& anc_points,
                          const Tensor& gt_labels, const Tensor& gt_bboxes, const Tensor& mask_gt,
                          const AssignerOptions& opt = {});

// Complete IoU of xyxy boxes (Ultralytics' bbox_iou(..., xywh=False, CIoU=True): eps added to the heights):
// box1, box2 (..., 4) broadcastable -> (...). Differentiable in both; the trade-off factor alpha is detached
// (computed under no_grad, as Ultralytics).
Tensor bbox_ciou(const Tensor& box1, const Tensor& box2, double eps = 1e-7);

struct DetectionLossOptions {
  double box_gain = 7.5, cls_gain = 0.5, dfl_gain = 1.5;
  AssignerOptions assigner;
};

struct DetectionLossResult {
  Tensor total;         // () F32, differentiable: (box + cls + dfl) * B — what the trainer backpropagates
  double box = 0, cls = 0, dfl = 0;  // the three parts after their gains (Ultralytics' loss.detach())
  int64_t num_foreground = 0;        // assigned anchors in the batch
  double target_score_sum = 0;       // max(sum of target scores, 1)
};
// On the meta device (backends/meta/meta.h) nothing has values and the assigner cannot run: the loss is built
// with the same tensor ops on placeholders of the assignment's shapes, assuming the batch has boxes and
// foreground anchors (the common case; the box and DFL terms then exist). `total` is a meta tensor; box, cls,
// dfl and target_score_sum are NaN and num_foreground is -1 (unknown).

// raw: the model's training output (B, 64 + nc, A) (models::DetectionModel::forward in training mode, any float
// dtype, any device); sizes: (H_i, W_i) per level and strides (8, 16, 32) with sum H_i W_i = A;
// targets: (B, M, 5) F32 rows (class, cx, cy, w, h) with the box normalised to [0, 1] by the image width/height;
// rows with w <= 0 or h <= 0 are padding (M may be 0); image_h, image_w: the input size in pixels.
DetectionLossResult detection_loss(const Tensor& raw, const std::vector<std::pair<int64_t, int64_t>>& sizes,
                                   const std::vector<double>& strides, const Tensor& targets, int64_t image_h,
                                   int64_t image_w, const DetectionLossOptions& opt = {});

}  // namespace ampforge::tasks
