// Detection task: loss and Ultralytics-style evaluation (see detection.h).
#include "ampforge/tasks/detection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/models/yolo.h"

namespace ampforge::tasks {

namespace {

float iou(const Detection& a, const Detection& b) {
  const float iw = std::max(0.0f, std::min(a.x2, b.x2) - std::max(a.x1, b.x1));
  const float ih = std::max(0.0f, std::min(a.y2, b.y2) - std::max(a.y1, b.y1));
  const float inter = iw * ih;
  const float u = (a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter;
  return u > 0 ? inter / u : 0.0f;
}

models::DetectionModel& detection_model(nn::Module& model) {
  auto* m = dynamic_cast<models::DetectionModel*>(&model);
  AF_CHECK(m != nullptr, "detection: the model must be a YOLOv8 DetectionModel (--model yolov8n ...), got {}",
           model.type_name());
  return *m;
}

// Targets of image b (rows (class, cx, cy, w, h) normalised) as pixel boxes of an h x w input.
std::vector<Detection> truth_boxes(const float* rows, int64_t t, int64_t h, int64_t w) {
  std::vector<Detection> out;
  for (int64_t k = 0; k < t; ++k) {
    const float* r = rows + k * 5;
    if (!(r[3] > 0 && r[4] > 0)) continue;  // padding
    const float cx = r[1] * static_cast<float>(w), cy = r[2] * static_cast<float>(h);
    const float bw = r[3] * static_cast<float>(w), bh = r[4] * static_cast<float>(h);
    out.push_back({cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2, 1.0f, static_cast<int64_t>(r[0])});
  }
  return out;
}

}  // namespace

std::vector<Detection> non_max_suppression(const float* d, int64_t nc, int64_t A, const DetectionTaskOptions& opt) {
  std::vector<Detection> cand;
  for (int64_t a = 0; a < A; ++a)
    for (int64_t c = 0; c < nc; ++c) {
      const float s = d[(4 + c) * A + a];
      if (!(s > opt.conf)) continue;
      const float cx = d[a], cy = d[A + a], w = d[2 * A + a], h = d[3 * A + a];
      cand.push_back({cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, s, c});
    }
  std::stable_sort(cand.begin(), cand.end(), [](const Detection& x, const Detection& y) { return x.score > y.score; });
  if (static_cast<int64_t>(cand.size()) > opt.max_nms) cand.resize(static_cast<size_t>(opt.max_nms));
  std::vector<Detection> keep;
  std::vector<bool> dead(cand.size(), false);
  for (size_t i = 0; i < cand.size() && static_cast<int64_t>(keep.size()) < opt.max_det; ++i) {
    if (dead[i]) continue;
    keep.push_back(cand[i]);
    for (size_t j = i + 1; j < cand.size(); ++j)
      if (!dead[j] && cand[j].cls == cand[i].cls && iou(cand[i], cand[j]) > static_cast<float>(opt.nms_iou)) dead[j] = true;
  }
  return keep;
}

void DetectionMetrics::add_image(const std::vector<Detection>& dets, const std::vector<Detection>& truth) {
  ++images_;
  for (const Detection& t : truth) {
    AF_CHECK(t.cls >= 0 && t.cls < nc_, "DetectionMetrics: a ground-truth box has class {}, outside [0, {})", t.cls, nc_);
    ++gt_count_[static_cast<size_t>(t.cls)];
  }
  // Per threshold, (box, prediction) pairs of the same class with IoU >= t, taken greedily in decreasing IoU, each
  // box and each prediction at most once. Ultralytics' match_predictions sorts the same way but then keeps one
  // pair per prediction and per box with two numpy unique passes, which can differ from greedy when a box's best
  // prediction is claimed by another box (rare; not reproduced).
  struct Pair {
    float iou;
    size_t gt, pred;
  };
  std::vector<Pair> pairs;
  for (size_t g = 0; g < truth.size(); ++g)
    for (size_t p = 0; p < dets.size(); ++p)
      if (truth[g].cls == dets[p].cls) {
        const float v = iou(truth[g], dets[p]);
        if (v >= 0.5f) pairs.push_back({v, g, p});
      }
  std::stable_sort(pairs.begin(), pairs.end(), [](const Pair& x, const Pair& y) { return x.iou > y.iou; });
  std::vector<Pred> ps(dets.size());
  for (size_t p = 0; p < dets.size(); ++p) {
    ps[p].score = dets[p].score, ps[p].cls = dets[p].cls;
    std::fill(std::begin(ps[p].tp), std::end(ps[p].tp), false);
  }
  for (int k = 0; k < kThresholds; ++k) {
    const float thr = 0.5f + 0.05f * static_cast<float>(k);
    std::vector<bool> gt_used(truth.size(), false), pred_used(dets.size(), false);
    for (const Pair& pr : pairs) {
      if (pr.iou < thr || gt_used[pr.gt] || pred_used[pr.pred]) continue;
      gt_used[pr.gt] = pred_used[pr.pred] = true;
      ps[pr.pred].tp[k] = true;
    }
  }
  preds_.insert(preds_.end(), ps.begin(), ps.end());
}

double average_precision(const std::vector<double>& recall, const std::vector<double>& precision) {
  std::vector<double> mrec{0.0}, mpre{1.0};
  mrec.insert(mrec.end(), recall.begin(), recall.end());
  mpre.insert(mpre.end(), precision.begin(), precision.end());
  mrec.push_back(1.0), mpre.push_back(0.0);
  for (size_t i = mpre.size() - 1; i > 0; --i) mpre[i - 1] = std::max(mpre[i - 1], mpre[i]);  // envelope
  // np.interp(x, mrec, mpre) at x = 0, 0.01, ..., 1, then np.trapz.
  auto interp = [&](double x) {
    if (x <= mrec.front()) return mpre.front();
    if (x >= mrec.back()) return mpre.back();
    const size_t j = static_cast<size_t>(std::upper_bound(mrec.begin(), mrec.end(), x) - mrec.begin());
    const double x0 = mrec[j - 1], x1 = mrec[j];
    return x1 == x0 ? mpre[j] : mpre[j - 1] + (mpre[j] - mpre[j - 1]) * (x - x0) / (x1 - x0);
  };
  double ap = 0, prev = interp(0.0);
  for (int i = 1; i <= 100; ++i) {
    const double y = interp(i / 100.0);
    ap += (prev + y) / 2 * 0.01;
    prev = y;
  }
  return ap;
}

std::vector<std::vector<double>> DetectionMetrics::ap_per_class() const {
  std::vector<size_t> order(preds_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return preds_[a].score > preds_[b].score; });
  std::vector<std::vector<double>> out;
  for (int64_t c = 0; c < nc_; ++c) {
    const int64_t n = gt_count_[static_cast<size_t>(c)];
    if (n == 0) continue;
    std::vector<double> ap(kThresholds, 0.0);
    for (int k = 0; k < kThresholds; ++k) {
      std::vector<double> rec, prec;
      double tp = 0, fp = 0;
      for (size_t i : order) {
        if (preds_[i].cls != c) continue;
        (preds_[i].tp[k] ? tp : fp) += 1;
        rec.push_back(tp / (static_cast<double>(n) + 1e-16));
        prec.push_back(tp / (tp + fp));
      }
      ap[static_cast<size_t>(k)] = rec.empty() ? 0.0 : average_precision(rec, prec);
    }
    out.push_back(ap);
  }
  return out;
}

double DetectionMetrics::map50() const {
  const auto ap = ap_per_class();
  double s = 0;
  for (const auto& r : ap) s += r[0];
  return ap.empty() ? 0.0 : s / static_cast<double>(ap.size());
}

double DetectionMetrics::map50_95() const {
  const auto ap = ap_per_class();
  double s = 0;
  for (const auto& r : ap)
    for (double v : r) s += v;
  return ap.empty() ? 0.0 : s / static_cast<double>(ap.size() * kThresholds);
}

// ---- the task ----------------------------------------------------------------------------------------------------
DetectionTask::DetectionTask(DetectionTaskOptions opt) : opt_(opt) {
  AF_CHECK(opt_.conf >= 0 && opt_.conf < 1, "DetectionTask: conf must be in [0, 1), got {}", opt_.conf);
  AF_CHECK(opt_.nms_iou > 0 && opt_.nms_iou <= 1, "DetectionTask: the NMS IoU must be in (0, 1], got {}", opt_.nms_iou);
  AF_CHECK(opt_.max_det >= 1, "DetectionTask: max_det must be positive, got {}", opt_.max_det);
}

Tensor DetectionTask::loss(nn::Module& model, const data::Batch& batch) {
  models::DetectionModel& m = detection_model(model);
  AF_CHECK(batch.targets.defined(), "detection: the batch has no targets (use a detection dataset)");
  const int64_t H = batch.x.shape()[2], W = batch.x.shape()[3];
  const Tensor raw = m.forward_raw(batch.x);
  return detection_loss(raw, m.level_sizes(H, W), m.strides(), batch.targets, H, W, opt_.loss).total;
}

namespace {

class DetectionEvaluator final : public Evaluator {
 public:
  explicit DetectionEvaluator(const DetectionTaskOptions& opt) : opt_(opt) {}
  void add(nn::Module& model, const data::Batch& batch) override {
    models::DetectionModel& m = detection_model(model);
    AF_CHECK(batch.targets.defined(), "detection: the batch has no targets (use a detection dataset)");
    if (!metrics_) metrics_ = std::make_unique<DetectionMetrics>(m.num_classes());
    const int64_t B = batch.x.shape()[0], H = batch.x.shape()[2], W = batch.x.shape()[3];
    const auto sizes = m.level_sizes(H, W);
    const Tensor raw = m.forward_raw(batch.x);
    const DetectionLossResult l = detection_loss(raw, sizes, m.strides(), batch.targets, H, W, opt_.loss);
    box_ += l.box, cls_ += l.cls, dfl_ += l.dfl, ++batches_;
    const Tensor dec = contiguous(to(to(m.detect->decode(raw, sizes), kCPU), DType::F32));  // (B, 4 + nc, A)
    const Tensor tg = contiguous(to(to(batch.targets, kCPU), DType::F32));
    const int64_t per = dec.shape()[1] * dec.shape()[2], T = tg.shape()[1];
    for (int64_t b = 0; b < B; ++b) {
      const auto dets = non_max_suppression(dec.data<float>() + b * per, m.num_classes(), dec.shape()[2], opt_);
      metrics_->add_image(dets, truth_boxes(tg.data<float>() + b * T * 5, T, H, W));
    }
  }
  Metrics result() override {
    const double n = std::max<double>(static_cast<double>(batches_), 1);
    Metrics out;
    out.push_back({"loss", (box_ + cls_ + dfl_) / n, false});
    out.push_back({"box_loss", box_ / n, false});
    out.push_back({"cls_loss", cls_ / n, false});
    out.push_back({"dfl_loss", dfl_ / n, false});
    out.push_back({"map50", metrics_ ? metrics_->map50() : 0.0, true});
    out.push_back({"map50_95", metrics_ ? metrics_->map50_95() : 0.0, true});
    return out;
  }

 private:
  DetectionTaskOptions opt_;
  std::unique_ptr<DetectionMetrics> metrics_;
  double box_ = 0, cls_ = 0, dfl_ = 0;
  int64_t batches_ = 0;
};

}  // namespace

std::unique_ptr<Evaluator> DetectionTask::evaluator() const { return std::make_unique<DetectionEvaluator>(opt_); }

}  // namespace ampforge::tasks
