// Image (or any) classification: the model maps batch.x to (N, classes) logits, batch.y holds (N) I64
// class indices. Training loss: cross-entropy with optional label smoothing (PyTorch's
// `label_smoothing`: the target is (1 - s) on the class and s / classes everywhere). Evaluation:
// cross-entropy without smoothing ("loss"), top-1 ("accuracy") and top-k accuracy ("top5_accuracy" for
// k = 5, reported when the model has at least k classes).
//
// Top-k counts a prediction correct when fewer than k classes score strictly higher than the true one
// (ties resolved in the prediction's favour; torch.topk's choice among equal scores is unspecified).
#pragma once

#include "ampforge/models/registry.h"
#include "ampforge/tasks/task.h"

namespace ampforge::tasks {

struct ClassificationOptions {
  double label_smoothing = 0.0;  // training loss only, in [0, 1)
  int64_t top_k = 5;             // the second accuracy reported (0: none)
};

class ClassificationTask final : public Task {
 public:
  explicit ClassificationTask(ClassificationOptions opt = {});
  std::string name() const override { return "classification"; }
  Tensor loss(nn::Module& model, const data::Batch& batch) override;
  std::unique_ptr<Evaluator> evaluator() const override;
  std::string primary_metric() const override { return "accuracy"; }
  const ClassificationOptions& options() const { return opt_; }

 private:
  ClassificationOptions opt_;
};

// A synthetic batch for a model built with `mo` (the bench, memory planning: tasks/registry.h):
// N(0, 1) images in the model's input shape (what normalised inputs look like) and labels spread
// over its classes.
data::Batch classification_synthetic_batch(const models::ModelOptions& mo, const SyntheticBatchOptions& o);

}  // namespace ampforge::tasks
