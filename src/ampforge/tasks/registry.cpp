#include "ampforge/tasks/registry.h"

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

void register_builtin_tasks(TaskRegistry& r) {
  r.add({"classification", InputKind::Images, "cross entropy over classes; accuracy and top-5 accuracy",
         [](const models::ModelOptions&) { return std::make_shared<ClassificationTask>(); },
         classification_synthetic_batch});
  r.add({"masked_lm", InputKind::TokenIds, "BERT's masked language model: 15% of the tokens predicted",
         [](const models::ModelOptions& mo) {
           MaskedLMOptions o;
           o.vocab_size = mo.num_classes;
           return std::make_shared<MaskedLMTask>(o);
         },
         masked_lm_synthetic_batch});
  r.add({"detection", InputKind::Images, "YOLOv8's detection loss (box, class, DFL); mAP50 and mAP50-95",
         [](const models::ModelOptions&) { return std::make_shared<DetectionTask>(); }, detection_synthetic_batch});
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
