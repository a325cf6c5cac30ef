// YOLOv8 loss and TaskAlignedAssigner (see detection_loss.h for where each part runs and why).
// Formulas: Ultralytics utils/loss.py (v8DetectionLoss, BboxLoss, DFLoss), utils/tal.py (TaskAlignedAssigner,
// make_anchors, dist2bbox, bbox2dist), utils/metrics.py (bbox_iou with CIoU) — facts in MODELS.md §A.4-A.5.
#include "ampforge/tasks/detection_loss.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/core/runtime.h"
#include "ampforge/models/yolo.h"

namespace ampforge::tasks {

namespace {

constexpr int64_t kRegMax = 16;
constexpr double kPi = 3.14159265358979323846;

std::vector<float> host_floats(const Tensor& t) {
  autograd::NoGradGuard ng;
  Tensor c = contiguous(to(to(t.detach(), kCPU), DType::F32));
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

// Ultralytics' bbox_iou(box1, box2, xywh=False, CIoU=True) for one pair, in F32 as PyTorch evaluates it
// (its operations in its order).
float ciou_host(const float* b1, const float* b2, float eps = 1e-7f) {
  const float w1 = b1[2] - b1[0], h1 = b1[3] - b1[1] + eps;
  const float w2 = b2[2] - b2[0], h2 = b2[3] - b2[1] + eps;
  const float inter = std::max(std::min(b1[2], b2[2]) - std::max(b1[0], b2[0]), 0.0f) *
                      std::max(std::min(b1[3], b2[3]) - std::max(b1[1], b2[1]), 0.0f);
  const float uni = w1 * h1 + w2 * h2 - inter + eps;
  const float iou = inter / uni;
  const float cw = std::max(b1[2], b2[2]) - std::min(b1[0], b2[0]);
  const float ch = std::max(b1[3], b2[3]) - std::min(b1[1], b2[1]);
  const float c2 = cw * cw + ch * ch + eps;
  const float dx = b2[0] + b2[2] - b1[0] - b1[2], dy = b2[1] + b2[3] - b1[1] - b1[3];
  const float rho2 = (dx * dx + dy * dy) / 4.0f;
  const float d = std::atan(w2 / h2) - std::atan(w1 / h1);
  const float v = static_cast<float>(4.0 / (kPi * kPi)) * (d * d);
  const float alpha = v / (1.0f - iou + v + eps);
  return iou - (rho2 / c2 + v * alpha);
}

// The loss on the meta device (the note under DetectionLossResult): the assigner's values do not exist, so its
// outputs are placeholders of their shapes and foreground anchors are assumed (the terms the box and DFL losses
// add exist then, as in any batch with boxes). The differentiable part is the same ops as below, so the step
// allocates what a real one does. Host-side tensors (the assignment, the bin weights before their upload) are
// meta tensors when the meta device stands for the CPU, where they share the allocator; for CUDA they would be
// host memory, and only their device copies (target scores, weights, target boxes, bin weights) are made.
DetectionLossResult meta_loss(const Tensor& raw, const Tensor& pred_scores, const Tensor& pred_bboxes,
                              const Tensor& dist4, const Tensor& anc, const Tensor& st, int64_t M,
                              const DetectionLossOptions& opt) {
  const int64_t B = raw.shape()[0], nc = raw.shape()[1] - 4 * kRegMax, A = raw.shape()[2];
  const Device dev = raw.device();
  const bool host_here = runtime::has_capability(dev, runtime::Capability::HostMemory);
  Assignment as;
  {
    autograd::NoGradGuard ng;
    // The assigner's inputs, as the real path computes them on the device.
    const Tensor ps = sigmoid(to(pred_scores.detach(), DType::F32)), pb = mul(pred_bboxes.detach(), st),
                 ap = mul(anc, st);
    if (host_here) {
      as.target_labels = Tensor::empty({B, A}, DType::I64, dev);
      as.target_bboxes = Tensor::empty({B, A, 4}, DType::F32, dev);
      as.fg_mask = Tensor::empty({B, A}, DType::Bool, dev);
      as.target_gt_idx = Tensor::empty({B, A}, DType::I64, dev);
    }
    as.target_scores = Tensor::empty({B, A, nc}, DType::F32, dev);
  }
  DetectionLossResult r;
  r.target_score_sum = std::nan("");
  r.num_foreground = -1;
  const double tss = 1.0;  // unknown; a scalar divisor costs no memory
  const Tensor cls = binary_cross_entropy_with_logits(pred_scores, as.target_scores, Reduction::Sum) / tss;
  Tensor box = zeros({}, DType::F32, dev), dfl = zeros({}, DType::F32, dev);
  if (M > 0) {
    const Tensor wgt_d = Tensor::empty({B, A}, DType::F32, dev);
    const Tensor tb_d = Tensor::empty({B, A, 4}, DType::F32, dev);
    const Tensor q_d = Tensor::empty({B, A, 4, kRegMax}, DType::F32, dev);
    box = sum(mul(sub(ones({}, DType::F32, dev), bbox_ciou(pred_bboxes, tb_d)), wgt_d)) / tss;
    dfl = neg(sum(mul(log_softmax(dist4, 3), q_d))) / tss;
  }
  Tensor total = (box * opt.box_gain + cls * opt.cls_gain + dfl * opt.dfl_gain) * static_cast<double>(B);
  r.total = reshape(to(total, DType::F32), {});
  r.box = r.cls = r.dfl = std::nan("");
  return r;
}

}  // namespace

Assignment assign_targets(const Tensor& pd_scores, const Tensor& pd_bboxes, const Tensor& anc_points,
                          const Tensor& gt_labels, const Tensor& gt_bboxes, const Tensor& mask_gt,
                          const AssignerOptions& opt) {
  AF_CHECK(pd_scores.dim() == 3, "assign_targets: pd_scores must be (B, A, nc), got {}", pd_scores.shape().str());
  const int64_t B = pd_scores.shape()[0], A = pd_scores.shape()[1], nc = pd_scores.shape()[2];
  AF_CHECK(pd_bboxes.shape() == Shape({B, A, 4}), "assign_targets: pd_bboxes must be ({}, {}, 4), got {}", B, A,
           pd_bboxes.shape().str());
  AF_CHECK(anc_points.shape() == Shape({A, 2}), "assign_targets: anc_points must be ({}, 2), got {}", A,
           anc_points.shape().str());
  AF_CHECK(gt_bboxes.dim() == 3 && gt_bboxes.shape()[0] == B && gt_bboxes.shape()[2] == 4,
           "assign_targets: gt_bboxes must be ({}, M, 4), got {}", B, gt_bboxes.shape().str());
  const int64_t M = gt_bboxes.shape()[1];
  AF_CHECK(gt_labels.shape() == Shape({B, M}) && mask_gt.shape() == Shape({B, M}),
           "assign_targets: gt_labels and mask_gt must be ({}, {}), got {} and {}", B, M, gt_labels.shape().str(),
           mask_gt.shape().str());
  AF_CHECK(opt.topk >= 1, "assign_targets: topk must be positive, got {}", opt.topk);

  std::vector<int64_t> labels(static_cast<size_t>(B * A), 0), gt_idx(static_cast<size_t>(B * A), 0);
  std::vector<float> tboxes(static_cast<size_t>(B * A * 4), 0.0f), tscores(static_cast<size_t>(B * A * nc), 0.0f);
  std::vector<uint8_t> fg(static_cast<size_t>(B * A), 0);
  auto pack = [&]() {
    Assignment r;
    r.target_labels = Tensor::from_vector(labels, {B, A});
    r.target_bboxes = Tensor::from_vector(tboxes, {B, A, 4});
    r.target_scores = Tensor::from_vector(tscores, {B, A, nc});
    std::vector<bool> fgb(fg.begin(), fg.end());
    r.fg_mask = Tensor::from_vector(fgb, {B, A});
    r.target_gt_idx = Tensor::from_vector(gt_idx, {B, A});
    return r;
  };
  if (M == 0) {  // Ultralytics: background everywhere (its labels are then bg_idx = nc)
    std::fill(labels.begin(), labels.end(), nc);
    return pack();
  }
  const std::vector<float> ps = host_floats(pd_scores), pb = host_floats(pd_bboxes), anc = host_floats(anc_points);
  const std::vector<float> gl = host_floats(gt_labels), gb = host_floats(gt_bboxes), mg = host_floats(mask_gt);
  const auto eps = static_cast<float>(opt.eps);
  const auto alpha = static_cast<float>(opt.alpha), beta = static_cast<float>(opt.beta);
  const auto stride_val = static_cast<float>(opt.stride_val);
  const int64_t k = std::min(opt.topk, A);

  std::vector<float> overlaps(static_cast<size_t>(M * A)), align(static_cast<size_t>(M * A));
  std::vector<uint8_t> in_gt(static_cast<size_t>(M * A)), pos(static_cast<size_t>(M * A));
  std::vector<int64_t> order(static_cast<size_t>(A));
  for (int64_t b = 0; b < B; ++b) {
    std::fill(overlaps.begin(), overlaps.end(), 0.0f);
    std::fill(align.begin(), align.end(), 0.0f);
    std::fill(pos.begin(), pos.end(), 0);
    std::fill(in_gt.begin(), in_gt.end(), 0);
    for (int64_t m = 0; m < M; ++m) {
      if (mg[static_cast<size_t>(b * M + m)] == 0.0f) continue;  // padding: topk_mask is false, nothing selected
      const float* g = &gb[static_cast<size_t>((b * M + m) * 4)];
      const auto cls = static_cast<int64_t>(gl[static_cast<size_t>(b * M + m)]);
      AF_CHECK(cls >= 0 && cls < nc, "assign_targets: box {} of image {} has class {}, outside [0, {})", m, b, cls, nc);
      // select_candidates_in_gts (Ultralytics 8.4): the box goes xyxy -> xywh -> xyxy in F32, a side shorter than
      // stride_val becoming stride_val about the centre; the anchors strictly inside that box are the candidates.
      float cw = g[2] - g[0], ch = g[3] - g[1];
      const float ccx = (g[0] + g[2]) / 2, ccy = (g[1] + g[3]) / 2;
      if (cw < stride_val) cw = stride_val;
      if (ch < stride_val) ch = stride_val;
      const float cbox[4] = {ccx - cw / 2, ccy - ch / 2, ccx + cw / 2, ccy + ch / 2};
      for (int64_t a = 0; a < A; ++a) {
        const float ax = anc[static_cast<size_t>(a * 2)], ay = anc[static_cast<size_t>(a * 2 + 1)];
        const float d = std::min(std::min(ax - cbox[0], ay - cbox[1]), std::min(cbox[2] - ax, cbox[3] - ay));
        if (!(d > eps)) continue;  // strictly inside
        const size_t i = static_cast<size_t>(m * A + a);
        in_gt[i] = 1;
        const float ov = std::max(ciou_host(g, &pb[static_cast<size_t>((b * A + a) * 4)]), 0.0f);
        const float sc = ps[static_cast<size_t>((b * A + a) * nc + cls)];
        overlaps[i] = ov;
        align[i] = std::pow(sc, alpha) * std::pow(ov, beta);
      }
      // select_topk_candidates: the k largest metrics (ties: lower anchor index first), then only candidates.
      std::iota(order.begin(), order.end(), 0);
      const float* row = &align[static_cast<size_t>(m * A)];
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int64_t x, int64_t y) { return row[x] > row[y] || (row[x] == row[y] && x < y); });
      for (int64_t j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(m * A + order[static_cast<size_t>(j)]);
        pos[i] = in_gt[i];
      }
    }
    // select_highest_overlaps: an anchor claimed by several boxes keeps the box of highest IoU (over all boxes).
    for (int64_t a = 0; a < A; ++a) {
      int64_t claims = 0;
      for (int64_t m = 0; m < M; ++m) claims += pos[static_cast<size_t>(m * A + a)];
      if (claims > 1) {
        int64_t best = 0;
        for (int64_t m = 1; m < M; ++m)
          if (overlaps[static_cast<size_t>(m * A + a)] > overlaps[static_cast<size_t>(best * A + a)]) best = m;
        for (int64_t m = 0; m < M; ++m) pos[static_cast<size_t>(m * A + a)] = m == best ? 1 : 0;
      }
    }
    // Per box: the largest metric and IoU over its positive anchors (align_metric *= mask_pos).
    std::vector<float> pos_align(static_cast<size_t>(M), 0.0f), pos_ov(static_cast<size_t>(M), 0.0f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t a = 0; a < A; ++a) {
        const size_t i = static_cast<size_t>(m * A + a);
        if (!pos[i]) align[i] = 0.0f;
        pos_align[static_cast<size_t>(m)] = std::max(pos_align[static_cast<size_t>(m)], align[i]);
        pos_ov[static_cast<size_t>(m)] = std::max(pos_ov[static_cast<size_t>(m)], pos[i] ? overlaps[i] : 0.0f);
      }
    for (int64_t a = 0; a < A; ++a) {
      const size_t ba = static_cast<size_t>(b * A + a);
      int64_t idx = 0;
      bool any = false;
      float norm = 0.0f;
      for (int64_t m = 0; m < M; ++m) {
        const size_t i = static_cast<size_t>(m * A + a);
        if (pos[i] && !any) idx = m, any = true;  // argmax of the 0/1 column: the first positive box
        norm = std::max(norm, align[i] * pos_ov[static_cast<size_t>(m)] / (pos_align[static_cast<size_t>(m)] + eps));
      }
      gt_idx[ba] = idx;
      fg[ba] = any ? 1 : 0;
      const auto lab = std::max<int64_t>(static_cast<int64_t>(gl[static_cast<size_t>(b * M + idx)]), 0);
      labels[ba] = lab;
      for (int c = 0; c < 4; ++c) tboxes[ba * 4 + static_cast<size_t>(c)] = gb[static_cast<size_t>((b * M + idx) * 4 + c)];
      if (any) tscores[ba * static_cast<size_t>(nc) + static_cast<size_t>(lab)] = norm;
    }
  }
  return pack();
}

Tensor bbox_ciou(const Tensor& box1, const Tensor& box2, double eps) {
  auto part = [](const Tensor& b, int64_t i) { return squeeze(narrow(b, -1, i, 1), -1); };
  const Tensor b1x1 = part(box1, 0), b1y1 = part(box1, 1), b1x2 = part(box1, 2), b1y2 = part(box1, 3);
  const Tensor b2x1 = part(box2, 0), b2y1 = part(box2, 1), b2x2 = part(box2, 2), b2y2 = part(box2, 3);
  const Tensor w1 = b1x2 - b1x1, h1 = b1y2 - b1y1 + eps;
  const Tensor w2 = b2x2 - b2x1, h2 = b2y2 - b2y1 + eps;
  const Tensor inter = clamp(minimum(b1x2, b2x2) - maximum(b1x1, b2x1), 0.0, std::nullopt) *
                       clamp(minimum(b1y2, b2y2) - maximum(b1y1, b2y1), 0.0, std::nullopt);
  const Tensor uni = w1 * h1 + w2 * h2 - inter + eps;
  const Tensor iou = inter / uni;
  const Tensor cw = maximum(b1x2, b2x2) - minimum(b1x1, b2x1);
  const Tensor ch = maximum(b1y2, b2y2) - minimum(b1y1, b2y1);
  const Tensor c2 = cw * cw + ch * ch + eps;
  const Tensor dx = b2x1 + b2x2 - b1x1 - b1x2, dy = b2y1 + b2y2 - b1y1 - b1y2;
  const Tensor rho2 = (dx * dx + dy * dy) / 4.0;
  const Tensor d = atan(w2 / h2) - atan(w1 / h1);
  const Tensor v = d * d * (4.0 / (kPi * kPi));
  Tensor alpha;
  {
    autograd::NoGradGuard ng;  // Ultralytics computes alpha under torch.no_grad()
    alpha = (v / (neg(iou) + 1.0 + v + eps)).detach();  // v / (1 - iou + v + eps); -iou + 1 is 1 - iou exactly
  }
  return iou - (rho2 / c2 + v * alpha);
}

DetectionLossResult detection_loss(const Tensor& raw, const std::vector<std::pair<int64_t, int64_t>>& sizes,
                                   const std::vector<double>& strides, const Tensor& targets, int64_t image_h,
                                   int64_t image_w, const DetectionLossOptions& opt) {
  AF_CHECK(raw.dim() == 3 && raw.shape()[1] > 4 * kRegMax, "detection_loss: expected raw outputs (B, 64 + nc, A), got {}",
           raw.shape().str());
  const int64_t B = raw.shape()[0], nc = raw.shape()[1] - 4 * kRegMax, A = raw.shape()[2];
  int64_t anchors_total = 0;
  for (const auto& [h, w] : sizes) anchors_total += h * w;
  AF_CHECK(anchors_total == A, "detection_loss: the level sizes give {} anchors, the outputs have {}", anchors_total, A);
  AF_CHECK(targets.dim() == 3 && targets.shape()[0] == B && targets.shape()[2] == 5,
           "detection_loss: targets must be ({}, M, 5) rows (class, cx, cy, w, h), got {}", B, targets.shape().str());
  const int64_t M = targets.shape()[1];
  const Device dev = raw.device();

  // Both made contiguous once here: the softmax and log_softmax of the bins, and the BCE forward and backward,
  // would each copy these transposed views of raw themselves (YOLOv8n b2 640: 4 copies of 4-5 MB per step -> 2).
  const Tensor pred_distri = contiguous(permute(narrow(raw, 1, 0, 4 * kRegMax), {0, 2, 1}));  // (B, A, 64)
  const Tensor pred_scores = contiguous(permute(narrow(raw, 1, 4 * kRegMax, nc), {0, 2, 1}));  // (B, A, nc)
  auto [anc_cpu, st_cpu] = models::make_anchors(sizes, strides, 0.5);               // (A, 2), (A, 1) grid units
  const Tensor anc = to(anc_cpu, dev), st = to(st_cpu, dev);

  // DFL decode: the expected bin of each side's 16-way softmax, then dist2bbox (xyxy, grid units).
  const Tensor dist4 = reshape(pred_distri, {B, A, 4, kRegMax});
  const Tensor proj = to(reshape(arange(0, static_cast<double>(kRegMax), 1, DType::F32), {1, 1, 1, kRegMax}), dev);
  const Tensor ltrb = sum(mul(softmax(dist4, 3), proj), {3});                       // (B, A, 4)
  const Tensor pred_bboxes = cat({sub(anc, narrow(ltrb, 2, 0, 2)), add(anc, narrow(ltrb, 2, 2, 2))}, 2);

  if (dev.is_meta()) return meta_loss(raw, pred_scores, pred_bboxes, dist4, anc, st, M, opt);

  // Targets: (class, cx, cy, w, h) normalised -> xyxy pixels (scale by (w, h, w, h), then xywh2xyxy).
  const std::vector<float> tg = host_floats(targets);
  std::vector<float> gl(static_cast<size_t>(B * M)), gb(static_cast<size_t>(B * M * 4));
  std::vector<bool> mg(static_cast<size_t>(B * M));
  const auto W = static_cast<float>(image_w), H = static_cast<float>(image_h);
  for (int64_t i = 0; i < B * M; ++i) {
    const float* r = &tg[static_cast<size_t>(i * 5)];
    const float cx = r[1] * W, cy = r[2] * H, w = r[3] * W, h = r[4] * H;
    gl[static_cast<size_t>(i)] = r[0];
    gb[static_cast<size_t>(i * 4 + 0)] = cx - w / 2, gb[static_cast<size_t>(i * 4 + 1)] = cy - h / 2;
    gb[static_cast<size_t>(i * 4 + 2)] = cx + w / 2, gb[static_cast<size_t>(i * 4 + 3)] = cy + h / 2;
    mg[static_cast<size_t>(i)] = r[3] > 0 && r[4] > 0;
    if (mg[static_cast<size_t>(i)])
      AF_CHECK(r[0] >= 0 && r[0] < static_cast<float>(nc) && r[0] == std::floor(r[0]),
               "detection_loss: target {} of image {} has class {}, expected an integer in [0, {})", i % std::max<int64_t>(M, 1),
               i / std::max<int64_t>(M, 1), r[0], nc);
  }
  // Assign (no gradient): scores as probabilities, boxes and anchors in pixels. The small-box floor is the second
  // stride (the only one for one level), as v8DetectionLoss builds its TaskAlignedAssigner from the model's strides.
  AssignerOptions assigner = opt.assigner;
  if (!strides.empty()) assigner.stride_val = strides.size() > 1 ? strides[1] : strides[0];
  Assignment as;
  {
    autograd::NoGradGuard ng;
    as = assign_targets(sigmoid(to(pred_scores.detach(), DType::F32)), mul(pred_bboxes.detach(), st),
                        mul(anc, st), Tensor::from_vector(gl, {B, M}), Tensor::from_vector(gb, {B, M, 4}),
                        Tensor::from_vector(mg, {B, M}), assigner);
  }
  const float* ts = as.target_scores.data<float>();
  const float* tb = as.target_bboxes.data<float>();
  const bool* fg = as.fg_mask.data<bool>();
  double score_sum = 0;
  for (int64_t i = 0; i < B * A * nc; ++i) score_sum += ts[i];
  // Ultralytics sums the F32 tensor; the double sum differs from it by rounding only.
  const double tss = std::max(score_sum, 1.0);

  DetectionLossResult r;
  r.target_score_sum = tss;
  const Tensor cls = binary_cross_entropy_with_logits(pred_scores, to(as.target_scores, dev), Reduction::Sum) / tss;
  Tensor box = zeros({}, DType::F32, dev), dfl = zeros({}, DType::F32, dev);
  for (int64_t i = 0; i < B * A; ++i) r.num_foreground += fg[i] ? 1 : 0;
  if (r.num_foreground > 0) {
    // Per-anchor weights (sum of the anchor's target scores, 0 on the background), target boxes in grid units,
    // and the DFL's soft bin targets q (weights folded in: q * weight / 4 for the mean over the 4 sides).
    const float* anc_h = anc_cpu.data<float>();
    const float* st_h = st_cpu.data<float>();
    std::vector<float> wgt(static_cast<size_t>(B * A), 0.0f), tbg(static_cast<size_t>(B * A * 4), 0.0f);
    std::vector<float> q(static_cast<size_t>(B * A * 4 * kRegMax), 0.0f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t a = 0; a < A; ++a) {
        const int64_t ba = b * A + a;
        const float s = st_h[a];
        for (int c = 0; c < 4; ++c) tbg[static_cast<size_t>(ba * 4 + c)] = tb[ba * 4 + c] / s;
        if (!fg[ba]) continue;
        float w = 0;
        for (int64_t c = 0; c < nc; ++c) w += ts[ba * nc + c];
        wgt[static_cast<size_t>(ba)] = w;
        const float* t = &tbg[static_cast<size_t>(ba * 4)];
        const float ax = anc_h[a * 2], ay = anc_h[a * 2 + 1];
        const float side[4] = {ax - t[0], ay - t[1], t[2] - ax, t[3] - ay};  // bbox2dist
        for (int sd = 0; sd < 4; ++sd) {
          const float tv = std::clamp(side[sd], 0.0f, static_cast<float>(kRegMax - 1) - 0.01f);
          const auto tl = static_cast<int64_t>(tv);
          const float wl = static_cast<float>(tl + 1) - tv, wr = 1.0f - wl;
          float* qq = &q[static_cast<size_t>((ba * 4 + sd) * kRegMax)];
          qq[tl] += wl * w / 4.0f;
          qq[tl + 1] += wr * w / 4.0f;
        }
      }
    const Tensor wgt_d = to(Tensor::from_vector(wgt, {B, A}), dev);
    const Tensor tb_d = to(Tensor::from_vector(tbg, {B, A, 4}), dev);
    const Tensor q_d = to(Tensor::from_vector(q, {B, A, 4, kRegMax}), dev);
    box = sum(mul(sub(ones({}, DType::F32, dev), bbox_ciou(pred_bboxes, tb_d)), wgt_d)) / tss;
    dfl = neg(sum(mul(log_softmax(dist4, 3), q_d))) / tss;
  }
  Tensor total = (box * opt.box_gain + cls * opt.cls_gain + dfl * opt.dfl_gain) * static_cast<double>(B);
  r.total = reshape(to(total, DType::F32), {});
  r.box = box.item() * opt.box_gain;
  r.cls = cls.item() * opt.cls_gain;
  r.dfl = dfl.item() * opt.dfl_gain;
  return r;
}

}  // namespace ampforge::tasks
