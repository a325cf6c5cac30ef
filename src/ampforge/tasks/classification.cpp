#include "ampforge/tasks/classification.h"

#include "ampforge/autograd/functions.h"
#include "ampforge/core/generator.h"
#include "ampforge/ops/ops.h"
#include "ampforge/tasks/device_sum.h"
#include "ampforge/util/error.h"

namespace ampforge::tasks {

namespace {

void check_batch(const Tensor& logits, const data::Batch& b) {
  AF_CHECK(logits.dim() == 2, "classification: the model must return (N, classes) logits, got shape {}",
           logits.shape().str());
  AF_CHECK(b.y.defined() && b.y.dim() == 1 && b.y.shape()[0] == logits.shape()[0],
           "classification: labels must be (N) class indices matching the {} logits rows", logits.shape()[0]);
}

// Sums over evaluation batches, read once in result().
class ClassificationEvaluator final : public Evaluator {
 public:
  explicit ClassificationEvaluator(int64_t top_k) : k_(top_k) {}

  void add(nn::Module& model, const data::Batch& b) override {
    Tensor logits = model(b.x);
    check_batch(logits, b);
    logits = logits.to(DType::F32);
    const int64_t n = logits.shape()[0], classes = logits.shape()[1];
    CrossEntropyAttrs ce;
    ce.reduction = Reduction::Sum;
    loss_.add(cross_entropy(logits, b.y, ce));
    top1_.add(sum(eq(argmax(logits, 1), b.y).to(DType::F32)));
    if (k_ > 1 && classes >= k_) {
      // Rank of the true class = number of classes scoring strictly higher; correct when rank < k.
      Tensor classes_row = ops::arange(0, static_cast<double>(classes), 1, DType::I64, logits.device()).reshape({1, classes});
      Tensor is_true = eq(classes_row, b.y.reshape({n, 1}));                                    // (N, C) Bool
      Tensor true_score = sum(where(is_true, logits, zeros_like(logits)), {1}, true);            // (N, 1)
      Tensor rank = sum(gt(logits, true_score).to(DType::F32), {1});                            // (N)
      Tensor k = ops::full({}, static_cast<double>(k_), DType::F32, logits.device());
      topk_.add(sum(lt(rank, k).to(DType::F32)));
    }
    total_ += n;
  }

  Metrics result() override {
    Metrics m;
    if (total_ == 0) return m;
    const double n = static_cast<double>(total_);
    m.push_back({"loss", loss_.value() / n, false});
    m.push_back({"accuracy", top1_.value() / n, true});
    if (topk_.used()) m.push_back({"top" + std::to_string(k_) + "_accuracy", topk_.value() / n, true});
    return m;
  }

 private:
  int64_t k_, total_ = 0;
  DeviceSum loss_, top1_, topk_;
};

}  // namespace

ClassificationTask::ClassificationTask(ClassificationOptions opt) : opt_(opt) {
  AF_CHECK(opt_.label_smoothing >= 0 && opt_.label_smoothing < 1, "label smoothing must be in [0, 1), got {}",
           opt_.label_smoothing);
  AF_CHECK(opt_.top_k >= 0, "top-k must be >= 0, got {}", opt_.top_k);
}

Tensor ClassificationTask::loss(nn::Module& model, const data::Batch& b) {
  Tensor logits = model(b.x);
  check_batch(logits, b);
  CrossEntropyAttrs ce;
  ce.label_smoothing = opt_.label_smoothing;
  return cross_entropy(logits, b.y, ce);
}

std::unique_ptr<Evaluator> ClassificationTask::evaluator() const {
  return std::make_unique<ClassificationEvaluator>(opt_.top_k);
}

namespace {
// Where values are drawn: on the CPU and then moved, except on the meta device, where values do not exist (a
// batch of 256 224x224 images would cost a second of drawing for nothing).
Device draw_device(const SyntheticBatchOptions& o) { return o.device.is_meta() ? o.device : kCPU; }
}  // namespace

data::Batch classification_synthetic_batch(const models::ModelOptions& mo, const SyntheticBatchOptions& o) {
  Generator gen(o.seed + 1);
  Tensor x = randn({o.batch, mo.in_channels, mo.image_size, mo.image_size}, DType::F32, draw_device(o), &gen);
  if (o.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  std::vector<int64_t> labels(static_cast<size_t>(o.batch));
  // A stride coprime with typical class counts, so a small batch still sees different classes.
  for (int64_t i = 0; i < o.batch; ++i) labels[static_cast<size_t>(i)] = (i * 379 + 11) % mo.num_classes;
  data::Batch b;
  b.x = x.device() != o.device ? x.to(o.device) : x;
  b.y = Tensor::from_vector(labels);
  if (!o.device.is_cpu()) b.y = b.y.to(o.device);
  return b;
}

}  // namespace ampforge::tasks
