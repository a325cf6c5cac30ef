#include "ampforge/train/workload.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "ampforge/core/generator.h"
#include "ampforge/nn/init.h"
#include "ampforge/models/registry.h"
#include "ampforge/ops/ops.h"
#include "ampforge/tasks/registry.h"
#include "ampforge/util/error.h"

namespace ampforge::train {

bool has_workload(const std::string& task_kind) { return tasks::task_registry().find(task_kind) != nullptr; }

Workload make_workload(const std::string& model, const WorkloadOptions& o) {
  AF_CHECK(o.batch >= 1, "workload: batch must be >= 1, got {}", o.batch);
  AF_CHECK(o.image_size == 0 || (o.image_size >= 8 && o.image_size <= 4096),
           "workload: image size must be 0 (the model's default) or in [8, 4096], got {}", o.image_size);
  AF_CHECK(o.seq_len >= 1, "workload: sequence length must be >= 1, got {}", o.seq_len);
  const models::ModelEntry& entry = models::model_registry().at(model);
  Workload w;
  w.model = model;
  w.task_kind = entry.task;
  w.samples = o.batch;
  const tasks::TaskEntry* task = tasks::task_registry().find(entry.task);
  if (task == nullptr)
    AF_THROW(NotImplemented, "workload: no synthetic batch for models of task '{}' (model {})", entry.task, model);
  models::ModelOptions mo = entry.defaults;
  if (task->input == tasks::InputKind::TokenIds) mo.image_size = o.seq_len;  // image_size is the length
  else if (o.image_size > 0) mo.image_size = o.image_size;
  manual_seed(o.seed);
  {
    // On the meta device the parameters' values are dropped: skip drawing them (seconds for BERT-base).
    std::optional<nn::init::SkipInitGuard> skip;
    if (o.device.is_meta()) skip.emplace();
    w.module = entry.build(mo);
  }
  w.module->train();
  if (!o.device.is_cpu()) w.module->to(o.device);
  tasks::SyntheticBatchOptions so;
  so.batch = o.batch;
  so.seq_len = o.seq_len;
  so.seed = o.seed;
  so.device = o.device;
  so.channels_last = o.channels_last;
  w.batch = task->synthetic_batch(mo, so);
  w.task = task->make(mo);
  w.input = tasks::input_description(*task, mo);
  return w;
}

}  // namespace ampforge::train
