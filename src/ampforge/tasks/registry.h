// The task kinds by name: what a model's registry entry names (models::ModelEntry::task), and what the programs
// above tasks/ (the bench's workloads, memory planning, export, `ampforge models`) need to know about a task
// without naming it: the kind of input its models take, a Task with default options for a model, and one
// synthetic batch of the right shapes. Adding a task: its files in tasks/ and one registration line in
// registry.cpp's register_builtin_tasks (or task_registry().add() from a program or a test, before first use).
//
//   const tasks::TaskEntry& t = tasks::task_registry().at(models::model_registry().at("yolov8n").task);
//   if (t.input == tasks::InputKind::TokenIds) ...
//
// Thread safety: add() before the registry is used from several threads; lookups are read-only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/core/device.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/data/dataset_factory.h"
#include "ampforge/models/registry.h"
#include "ampforge/tasks/task.h"

namespace ampforge::tasks {

// The published training recipe whose defaults a task's models get for the options a user leaves on "auto"
// (train/recipe.h resolve_auto and make_optimizer say what each sets).
enum class TrainingRecipe {
  Plain,        // AdamW, cosine schedule, no warm-up, no clipping, no weight average: the simple baseline
  Ultralytics,  // Ultralytics 8.x (YOLOv8): optimizer=auto, three parameter groups, warm-ups, accumulation to a
                // nominal batch with summed gradients, clip 10, EMA, mosaic
};

// What training knows of the data when it makes the task (TaskEntry::make_for_training).
struct TrainingContext {
  models::ModelOptions model;                       // what the model was built with
  const data::DatasetSplits* data = nullptr;        // the run's data: class names, token vocabulary
  double label_smoothing = 0;                       // --label-smoothing (tasks with a class loss)
};

struct TaskEntry {
  std::string name;  // what ModelEntry::task holds: "classification"
  InputKind input = InputKind::Images;
  std::string description;  // one line
  // The task with its default options, for a model built with `mo` (the bench and memory planning time its loss).
  std::function<std::shared_ptr<Task>(const models::ModelOptions& mo)> make;
  // One batch of synthetic data for a model built with `mo`, as the task's loss reads it.
  std::function<data::Batch(const models::ModelOptions& mo, const SyntheticBatchOptions& o)> synthetic_batch;
  // The data sets (data/dataset_factory.h names) its models train on; the first is the default.
  std::vector<std::string> datasets{"synthetic"};
  TrainingRecipe recipe = TrainingRecipe::Plain;
  // > 0: the evaluation batch's upper bound (an evaluator that keeps every image's outputs of a batch).
  int64_t eval_batch_cap = 0;
  // The task for training, from the run's facts; unset: make(ctx.model).
  std::function<std::shared_ptr<Task>(const TrainingContext& ctx)> make_for_training;
};

class TaskRegistry {
 public:
  // Throws InvalidArgument when the name is empty or taken, or `make` or `synthetic_batch` is unset.
  void add(TaskEntry entry);
  // Throws InvalidArgument naming the known tasks when `name` is unknown.
  const TaskEntry& at(const std::string& name) const;
  const TaskEntry* find(const std::string& name) const;  // nullptr when unknown
  const std::vector<TaskEntry>& entries() const { return entries_; }

 private:
  std::vector<TaskEntry> entries_;
};

// The built-in tasks: classification, masked_lm, detection.
void register_builtin_tasks(TaskRegistry& registry);

// The process-wide registry, holding the built-in tasks (built on first use).
TaskRegistry& task_registry();

// The task of a registered model (its entry's `task`, looked up here).
const TaskEntry& task_of(const models::ModelEntry& model);

// The input of a model built with `mo` for people: "3x224x224" or "seq 128".
std::string input_description(const TaskEntry& task, const models::ModelOptions& mo);

// The task training uses: make_for_training(ctx), or make(ctx.model) when the entry has none.
std::shared_ptr<Task> make_training_task(const TaskEntry& task, const TrainingContext& ctx);

// Whether the task's models train on data set `dataset`.
bool trains_on(const TaskEntry& task, const std::string& dataset);

}  // namespace ampforge::tasks
