#include "ampforge/tasks/registry.h"

#include <algorithm>

#include <fmt/format.h>

#include "ampforge/tasks/classification.h"
#include "ampforge/tasks/detection.h"
#include "ampforge/tasks/masked_lm.h"
#include "ampforge/util/error.h"

namespace ampforge::tasks {

void TaskRegistry::add(TaskEntry e) {
  AF_CHECK(!e.name.empty(), "TaskRegistry::add: a task needs a name");
  AF_CHECK(find(e.name) == nullptr, "TaskRegistry::add: task '{}' is already registered", e.name);
  AF_CHECK(static_cast<bool>(e.make) && static_cast<bool>(e.synthetic_batch),
           "TaskRegistry::add: task '{}' needs make and synthetic_batch", e.name);
  AF_CHECK(!e.datasets.empty(), "TaskRegistry::add: task '{}' names no data set its models train on", e.name);
  AF_CHECK(e.eval_batch_cap >= 0, "TaskRegistry::add: task '{}': eval_batch_cap must be >= 0", e.name);
  entries_.push_back(std::move(e));
}

const TaskEntry* TaskRegistry::find(const std::string& name) const {
  for (const TaskEntry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const TaskEntry& TaskRegistry::at(const std::string& name) const {
  if (const TaskEntry* e = find(name)) return *e;
  std::string known;
  for (const TaskEntry& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
  AF_THROW(InvalidArgument, "unknown task '{}' (registered: {})", name, known);
}

namespace {

std::shared_ptr<Task> classification_for_training(const TrainingContext& ctx) {
  ClassificationOptions o;
  o.label_smoothing = ctx.label_smoothing;
  return std::make_shared<ClassificationTask>(o);
}

// The data's special ids and the training split's unigram statistics (the context-free baseline metric).
std::shared_ptr<Task> masked_lm_for_training(const TrainingContext& ctx) {
  AF_CHECK(ctx.data && ctx.data->tokens, "a masked-LM task trains on token-id data (--dataset text or synthetic)");
  const data::TokenVocabulary& t = *ctx.data->tokens;
  MaskedLMOptions o;
  o.vocab_size = t.size;
  o.pad_id = t.pad_id, o.cls_id = t.cls_id, o.sep_id = t.sep_id, o.mask_id = t.mask_id;
  if (t.training_stream) o.unigram_log_probs = unigram_log_probs(*t.training_stream, t.size);
  return std::make_shared<MaskedLMTask>(o);
}

std::shared_ptr<Task> detection_for_training(const TrainingContext& ctx) {
  DetectionTaskOptions o;
  if (ctx.data) o.class_names = ctx.data->class_names;  // the data file's names, for the per-class table
  return std::make_shared<DetectionTask>(o);
}

}  // namespace

void register_builtin_tasks(TaskRegistry& r) {
  TaskEntry cls{"classification", InputKind::Images, "cross entropy over classes; accuracy and top-5 accuracy",
                [](const models::ModelOptions&) { return std::make_shared<ClassificationTask>(); },
                classification_synthetic_batch};
  cls.datasets = {"fashion-mnist", "mnist", "image-folder", "synthetic"};
  cls.make_for_training = classification_for_training;
  r.add(std::move(cls));

  TaskEntry mlm{"masked_lm", InputKind::TokenIds, "BERT's masked language model: 15% of the tokens predicted",
                [](const models::ModelOptions& mo) {
                  MaskedLMOptions o;
                  o.vocab_size = mo.num_classes;
                  return std::make_shared<MaskedLMTask>(o);
                },
                masked_lm_synthetic_batch};
  mlm.datasets = {"text", "synthetic"};
  mlm.make_for_training = masked_lm_for_training;
  r.add(std::move(mlm));

  TaskEntry det{"detection", InputKind::Images, "YOLOv8's detection loss (box, class, DFL); mAP50 and mAP50-95",
                [](const models::ModelOptions&) { return std::make_shared<DetectionTask>(); },
                detection_synthetic_batch};
  det.datasets = {"detection"};
  det.recipe = TrainingRecipe::Ultralytics;
  det.eval_batch_cap = 32;  // the evaluator keeps every image's predictions of a batch until NMS
  det.make_for_training = detection_for_training;
  r.add(std::move(det));
}

TaskRegistry& task_registry() {
  static TaskRegistry registry = [] {
    TaskRegistry r;
    register_builtin_tasks(r);
    return r;
  }();
  return registry;
}

const TaskEntry& task_of(const models::ModelEntry& model) { return task_registry().at(model.task); }

std::string input_description(const TaskEntry& task, const models::ModelOptions& mo) {
  if (task.input == InputKind::TokenIds) return fmt::format("seq {}", mo.image_size);
  return fmt::format("{}x{}x{}", mo.in_channels, mo.image_size, mo.image_size);
}

}  // namespace ampforge::tasks

namespace ampforge::tasks {

std::shared_ptr<Task> make_training_task(const TaskEntry& task, const TrainingContext& ctx) {
  std::shared_ptr<Task> t = task.make_for_training ? task.make_for_training(ctx) : task.make(ctx.model);
  AF_CHECK(t != nullptr, "task '{}': its factory returned no task", task.name);
  return t;
}

bool trains_on(const TaskEntry& task, const std::string& dataset) {
  return std::find(task.datasets.begin(), task.datasets.end(), dataset) != task.datasets.end();
}

}  // namespace ampforge::tasks
