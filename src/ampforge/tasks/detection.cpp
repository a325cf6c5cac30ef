// Detection task: loss and Ultralytics-style evaluation (see detection.h).
#include "ampforge/tasks/detection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/core/generator.h"
#include "ampforge/models/yolo.h"

namespace ampforge::tasks {

namespace {

// IoU in F32 as torchvision's NMS kernel (eps 0) and Ultralytics' box_iou (eps 1e-7, added to the union) compute it.
float iou(const Detection& a, const Detection& b, float eps = 0.0f) {
  const float iw = std::max(0.0f, std::min(a.x2, b.x2) - std::max(a.x1, b.x1));
  const float ih = std::max(0.0f, std::min(a.y2, b.y2) - std::max(a.y1, b.y1));
  const float inter = iw * ih;
  const float u = (a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter + eps;
  return u > 0 ? inter / u : 0.0f;
}

// The validator's IoU thresholds, torch.linspace(0.5, 0.95, 10) in F32: the floats nearest 0.50, 0.55, ..., 0.95
// (0.5f + 0.05f * 9 would be one ulp above 0.95f).
float iou_threshold(int k) { return static_cast<float>(0.5 + 0.05 * k); }

// np.linspace(0, 1, n): i * (1 / (n - 1)), the last point exactly 1 (i / (n - 1) differs from it by an ulp at some i,
// which matters where np.interp reads a step of the precision envelope).
double linspace01(int i, int n) { return i == n - 1 ? 1.0 : static_cast<double>(i) * (1.0 / (n - 1)); }

models::Detector& detector(nn::Module& model) { return models::model_as<models::Detector>(model, "detection"); }

// Targets of image b (rows (class, cx, cy, w, h) normalised) as pixel boxes of an h x w input.
// As DetectionValidator._prepare_batch: xywh2xyxy of the normalised box, then times the image size.
std::vector<Detection> truth_boxes(const float* rows, int64_t t, int64_t h, int64_t w) {
  std::vector<Detection> out;
  const auto W = static_cast<float>(w), H = static_cast<float>(h);
  for (int64_t k = 0; k < t; ++k) {
    const float* r = rows + k * 5;
    if (!(r[3] > 0 && r[4] > 0)) continue;  // padding
    const float hw = r[3] / 2, hh = r[4] / 2;
    out.push_back({(r[1] - hw) * W, (r[2] - hh) * H, (r[1] + hw) * W, (r[2] + hh) * H, 1.0f, static_cast<int64_t>(r[0])});
  }
  return out;
}

}  // namespace

// Ultralytics' non_max_suppression as its validator calls it (multi_label, class-aware, torchvision.ops.nms): the
// score threshold compares in F32 (PyTorch casts the Python float to the tensor's dtype), the IoU threshold in double
// (torchvision's kernel takes a double). Ultralytics separates the classes by shifting each box by class x 7680 px
// before torchvision's IoU; here the IoU is of the unshifted boxes and pairs of different classes are skipped: the
// same decisions except where the shift's rounding (at most ~5e-4 px per coordinate) moves an IoU across the
// threshold.
std::vector<Detection> non_max_suppression(const float* d, int64_t nc, int64_t A, const DetectionTaskOptions& opt) {
  std::vector<Detection> cand;
  const auto conf = static_cast<float>(opt.conf);
  for (int64_t a = 0; a < A; ++a)
    for (int64_t c = 0; c < nc; ++c) {
      const float s = d[(4 + c) * A + a];
      if (!(s > conf)) continue;
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
      if (!dead[j] && cand[j].cls == cand[i].cls && static_cast<double>(iou(cand[i], cand[j])) > opt.nms_iou) dead[j] = true;
  }
  return keep;
}

void DetectionMetrics::add_image(const std::vector<Detection>& dets, const std::vector<Detection>& truth) {
  ++images_;
  std::vector<bool> seen(static_cast<size_t>(nc_), false);
  for (const Detection& t : truth) {
    AF_CHECK(t.cls >= 0 && t.cls < nc_, "DetectionMetrics: a ground-truth box has class {}, outside [0, {})", t.cls, nc_);
    ++gt_count_[static_cast<size_t>(t.cls)];
    if (!seen[static_cast<size_t>(t.cls)]) seen[static_cast<size_t>(t.cls)] = true, ++gt_images_[static_cast<size_t>(t.cls)];
  }
  // Ultralytics 8.4's match_predictions: the detections in the order given (the validator passes NMS's output,
  // highest confidence first); each one takes, per threshold, the unclaimed box of its class with the highest IoU
  // (the first on ties; IoU box_iou's, eps 1e-7), and is a hit, claiming that box, when the IoU reaches the threshold.
  // Detections with no same-class IoU >= 0.5 are misses at every threshold.
  const size_t G = truth.size(), D = dets.size();
  std::vector<float> ious(G * D, 0.0f);  // (G, D), 0 across classes
  for (size_t g = 0; g < G; ++g)
    for (size_t p = 0; p < D; ++p)
      if (truth[g].cls == dets[p].cls) ious[g * D + p] = iou(truth[g], dets[p], 1e-7f);
  std::vector<Pred> ps(D);
  std::vector<bool> claimed(G * kThresholds, false);  // (G, kThresholds)
  for (size_t p = 0; p < D; ++p) {
    ps[p].score = dets[p].score, ps[p].cls = dets[p].cls;
    std::fill(std::begin(ps[p].tp), std::end(ps[p].tp), false);
    bool any = false;
    for (size_t g = 0; g < G; ++g) any = any || ious[g * D + p] >= iou_threshold(0);
    if (!any) continue;
    for (int k = 0; k < kThresholds; ++k) {
      size_t best = 0;
      float best_v = -1.0f;
      for (size_t g = 0; g < G; ++g) {
        const float v = claimed[g * kThresholds + static_cast<size_t>(k)] ? 0.0f : ious[g * D + p];
        if (v > best_v) best_v = v, best = g;
      }
      if (best_v >= iou_threshold(k)) ps[p].tp[k] = true, claimed[best * kThresholds + static_cast<size_t>(k)] = true;
    }
  }
  preds_.insert(preds_.end(), ps.begin(), ps.end());
}

double np_interp(double x, const std::vector<double>& xp, const std::vector<double>& fp, double left, double right) {
  if (x < xp.front()) return left;
  if (x > xp.back()) return right;
  const size_t j = static_cast<size_t>(std::upper_bound(xp.begin(), xp.end(), x) - xp.begin()) - 1;  // xp[j] <= x
  if (j + 1 == xp.size() || xp[j] == x) return fp[j];
  const double slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
  return slope * (x - xp[j]) + fp[j];
}

double average_precision(const std::vector<double>& recall, const std::vector<double>& precision) {
  // Ultralytics 8.4's compute_ap: sentinels (0, 1) in front and (last recall, 0), (1, 0) behind, so the precision
  // falls to 0 right after the highest recall reached (earlier 8.x versions interpolated from there down to (1, 0)).
  std::vector<double> mrec{0.0}, mpre{1.0};
  mrec.insert(mrec.end(), recall.begin(), recall.end());
  mpre.insert(mpre.end(), precision.begin(), precision.end());
  mrec.push_back(recall.empty() ? 1.0 : recall.back()), mpre.push_back(0.0);
  mrec.push_back(1.0), mpre.push_back(0.0);
  for (size_t i = mpre.size() - 1; i > 0; --i) mpre[i - 1] = std::max(mpre[i - 1], mpre[i]);  // envelope
  // np.interp(x, mrec, mpre) at x = np.linspace(0, 1, 101), then the trapezoid rule. Where recall repeats (a miss
  // after a hit, the sentinel), numpy reads the last of the equal points (at x = 0 after a top miss: the envelope
  // there, not the leading 1).
  auto interp = [&](double x) { return np_interp(x, mrec, mpre, mpre.front(), mpre.back()); };
  double ap = 0, x_prev = 0.0, prev = interp(0.0);
  for (int i = 1; i <= 100; ++i) {
    const double x = linspace01(i, 101), y = interp(x);
    ap += (x - x_prev) * (prev + y) / 2;
    x_prev = x, prev = y;
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

DetectionMetrics::Summary DetectionMetrics::summary() const {
  const std::vector<std::vector<double>> ap = ap_per_class();  // rows: the classes with boxes, in class order
  std::vector<size_t> order(preds_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return preds_[a].score > preds_[b].score; });
  constexpr int kPoints = 1000;  // np.linspace(0, 1, 1000)
  Summary out;
  std::vector<std::vector<double>> pc, rc;  // per class with boxes: precision and recall at each confidence point
  for (int64_t c = 0; c < nc_; ++c) {
    const int64_t n = gt_count_[static_cast<size_t>(c)];
    if (n == 0) continue;
    const std::vector<double>& row = ap[out.classes.size()];
    ClassSummary cs;
    cs.cls = c, cs.images = gt_images_[static_cast<size_t>(c)], cs.instances = n;
    cs.map50 = row[0];
    cs.map50_95 = std::accumulate(row.begin(), row.end(), 0.0) / static_cast<double>(kThresholds);
    out.classes.push_back(cs);
    // Curves over -confidence (increasing, as np.interp needs) at IoU 0.5; a class without predictions keeps
    // all-zero curves (Ultralytics' zero rows), which still count in the mean F1.
    std::vector<double> neg_conf, rec, prec;
    double tp = 0, fp = 0;
    for (size_t i : order) {
      if (preds_[i].cls != c) continue;
      (preds_[i].tp[0] ? tp : fp) += 1;
      neg_conf.push_back(-static_cast<double>(preds_[i].score));
      rec.push_back(tp / (static_cast<double>(n) + 1e-16));
      prec.push_back(tp / (tp + fp));
    }
    std::vector<double> p(kPoints, 0.0), r(kPoints, 0.0);
    if (!neg_conf.empty())
      for (int k = 0; k < kPoints; ++k) {
        const double x = -linspace01(k, kPoints);
        p[static_cast<size_t>(k)] = np_interp(x, neg_conf, prec, 1.0, prec.back());
        r[static_cast<size_t>(k)] = np_interp(x, neg_conf, rec, 0.0, rec.back());
      }
    pc.push_back(std::move(p));
    rc.push_back(std::move(r));
  }
  if (out.classes.empty()) return out;
  std::vector<double> f1(kPoints, 0.0);
  for (size_t c = 0; c < pc.size(); ++c)
    for (size_t k = 0; k < kPoints; ++k) f1[k] += 2 * pc[c][k] * rc[c][k] / (pc[c][k] + rc[c][k] + 1e-16);
  for (double& v : f1) v /= static_cast<double>(pc.size());
  // smooth(y, 0.1): a box filter of nf = round(1000 * 0.1 * 2) // 2 + 1 = 101 points over y padded with its end
  // values. Each window is summed on its own in one order, so equal windows give equal sums (ties stay ties).
  constexpr int kHalf = 50;
  size_t best = 0;
  double best_v = -1;
  for (int k = 0; k < kPoints; ++k) {
    double sum = 0;
    for (int j = -kHalf; j <= kHalf; ++j) sum += f1[static_cast<size_t>(std::clamp(k + j, 0, kPoints - 1))] * (1.0 / (2 * kHalf + 1));
    if (sum > best_v) best_v = sum, best = static_cast<size_t>(k);
  }
  out.confidence = linspace01(static_cast<int>(best), kPoints);
  for (size_t c = 0; c < out.classes.size(); ++c) out.classes[c].precision = pc[c][best], out.classes[c].recall = rc[c][best];
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

// The per-class table, as Ultralytics' validator prints it after training (classes with boxes only).
EvalDetails per_class_details(const DetectionMetrics& metrics, const std::vector<std::string>& class_names) {
  const DetectionMetrics::Summary s = metrics.summary();
  auto name = [&](int64_t c) {
    return c < static_cast<int64_t>(class_names.size()) ? class_names[static_cast<size_t>(c)]
                                                        : "class" + std::to_string(c);
  };
  nlohmann::json rows = nlohmann::json::array();
  size_t width = 5;
  int64_t instances = 0;
  double mp = 0, mr = 0, m50 = 0, m5095 = 0;
  for (const auto& c : s.classes) {
    rows.push_back({{"class", c.cls}, {"name", name(c.cls)}, {"images", c.images}, {"instances", c.instances},
                    {"precision", c.precision}, {"recall", c.recall}, {"map50", c.map50}, {"map50_95", c.map50_95}});
    width = std::max(width, name(c.cls).size());
    instances += c.instances;
    mp += c.precision, mr += c.recall, m50 += c.map50, m5095 += c.map50_95;
  }
  const double n = std::max<double>(static_cast<double>(s.classes.size()), 1);
  std::string text = fmt::format("per class ({} images; precision and recall at IoU 0.5 and confidence {:.3f}, where "
                                 "the class-mean F1 peaks):\n", metrics.images(), s.confidence);
  auto line = [&](const std::string& nm, int64_t images, int64_t inst, double p, double r, double a, double b) {
    text += fmt::format("  {:<{}}  {:>7}  {:>9}  {:>9.3f}  {:>6.3f}  {:>6.3f}  {:>8.3f}\n", nm, width, images, inst, p,
                        r, a, b);
  };
  text += fmt::format("  {:<{}}  {:>7}  {:>9}  {:>9}  {:>6}  {:>6}  {:>8}\n", "class", width, "images", "instances",
                      "precision", "recall", "mAP50", "mAP50-95");
  line("all", metrics.images(), instances, mp / n, mr / n, m50 / n, m5095 / n);
  for (const auto& c : s.classes)
    line(name(c.cls), c.images, c.instances, c.precision, c.recall, c.map50, c.map50_95);
  nlohmann::json j = {{"per_class", rows}, {"per_class_confidence", s.confidence}};
  return {j.dump(), text};
}

// ---- the task ----------------------------------------------------------------------------------------------------
DetectionTask::DetectionTask(DetectionTaskOptions opt) : opt_(opt) {
  AF_CHECK(opt_.conf >= 0 && opt_.conf < 1, "DetectionTask: conf must be in [0, 1), got {}", opt_.conf);
  AF_CHECK(opt_.nms_iou > 0 && opt_.nms_iou <= 1, "DetectionTask: the NMS IoU must be in (0, 1], got {}", opt_.nms_iou);
  AF_CHECK(opt_.max_det >= 1, "DetectionTask: max_det must be positive, got {}", opt_.max_det);
}

Tensor DetectionTask::loss(nn::Module& model, const data::Batch& batch) {
  models::Detector& m = detector(model);
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
    models::Detector& m = detector(model);
    AF_CHECK(batch.targets.defined(), "detection: the batch has no targets (use a detection dataset)");
    if (!metrics_) metrics_ = std::make_unique<DetectionMetrics>(m.num_classes());
    const int64_t B = batch.x.shape()[0], H = batch.x.shape()[2], W = batch.x.shape()[3];
    const auto sizes = m.level_sizes(H, W);
    const Tensor raw = m.forward_raw(batch.x);
    const DetectionLossResult l = detection_loss(raw, sizes, m.strides(), batch.targets, H, W, opt_.loss);
    box_ += l.box, cls_ += l.cls, dfl_ += l.dfl, ++batches_;
    const Tensor dec = contiguous(to(to(m.decode(raw, sizes), kCPU), DType::F32));  // (B, 4 + nc, A)
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
  EvalDetails details() override { return metrics_ ? per_class_details(*metrics_, opt_.class_names) : EvalDetails{}; }

 private:
  DetectionTaskOptions opt_;
  std::unique_ptr<DetectionMetrics> metrics_;
  double box_ = 0, cls_ = 0, dfl_ = 0;
  int64_t batches_ = 0;
};

}  // namespace

std::unique_ptr<Evaluator> DetectionTask::evaluator() const { return std::make_unique<DetectionEvaluator>(opt_); }

namespace {
// Where values are drawn: on the CPU and then moved, except on the meta device, where values do not exist (a
// batch of 256 224x224 images would cost a second of drawing for nothing).
Device draw_device(const SyntheticBatchOptions& o) { return o.device.is_meta() ? o.device : kCPU; }
}  // namespace

data::Batch detection_synthetic_batch(const models::ModelOptions& mo, const SyntheticBatchOptions& o) {
  constexpr int64_t kTargets = 4;
  Generator gen(o.seed + 1);
  Tensor x = rand({o.batch, mo.in_channels, mo.image_size, mo.image_size}, DType::F32, draw_device(o), &gen);
  if (o.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  const Tensor u = rand({o.batch, kTargets, 4}, DType::F32, kCPU, &gen);
  Tensor t = Tensor::empty({o.batch, kTargets, 5}, DType::F32);
  const float* r = u.data<float>();
  float* rows = t.data<float>();
  for (int64_t i = 0; i < o.batch * kTargets; ++i) {
    rows[5 * i + 0] = static_cast<float>((i * 7 + 3) % mo.num_classes);
    rows[5 * i + 1] = 0.2f + 0.6f * r[4 * i + 0];   // centre in [0.2, 0.8)
    rows[5 * i + 2] = 0.2f + 0.6f * r[4 * i + 1];
    rows[5 * i + 3] = 0.05f + 0.3f * r[4 * i + 2];  // size in [0.05, 0.35)
    rows[5 * i + 4] = 0.05f + 0.3f * r[4 * i + 3];
  }
  data::Batch b;
  b.x = x.device() != o.device ? x.to(o.device) : x;
  b.targets = !o.device.is_cpu() ? t.to(o.device) : t;
  return b;
}

}  // namespace ampforge::tasks
