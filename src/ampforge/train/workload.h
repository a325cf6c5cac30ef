// Synthetic training workloads by model name: the model (from the registry), the task it trains for, and
// one batch of synthetic data with the shapes and dtypes that task expects, on a device. What
// `ampforge bench` times and what memory planning measures: a real training step of the named model,
// without a data set.
//
// A model's task comes from its registry entry (ModelEntry::task), looked up in the task registry
// (tasks/registry.h), which gives the task with its default options and its synthetic batch (classification:
// N(0, 1) images in the model's input shape and labels spread over its classes; detection: [0, 1) images and four
// boxes per image, Batch::targets; masked_lm: [CLS] ids [SEP] token sequences as floats, masked by the task). A
// task kind nobody registered is refused with NotImplemented.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ampforge/core/device.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/nn/module.h"
#include "ampforge/tasks/task.h"

namespace ampforge::train {

struct WorkloadOptions {
  int64_t batch = 8;           // examples per batch
  int64_t image_size = 0;      // square images; 0: the model's default (registry), e.g. 224 for ResNet-50
  int64_t seq_len = 128;       // tokens per example, for sequence models
  uint64_t seed = 0;           // the data and the model's initialisation
  Device device = kCPU;        // model and batch are placed here (built on the CPU, then moved; on the meta
                               // device they keep their shapes and lose their values)
  bool channels_last = true;   // images in channels-last layout (what the data loader delivers)
};

struct Workload {
  std::string model;                  // the registry name
  std::string task_kind;              // ModelEntry::task
  nn::ModulePtr module;               // in training mode, on options.device, F32 parameters
  std::shared_ptr<tasks::Task> task;  // its loss is what the step backpropagates
  data::Batch batch;                  // on options.device
  int64_t samples = 0;                // examples in `batch`
  std::string input;                  // the input's shape for people: "3x224x224"
};

// Whether make_workload has a synthetic batch for models of this task kind (it is registered).
bool has_workload(const std::string& task_kind);

// Throws InvalidArgument for an unknown model or a bad size, NotImplemented for a task kind that has no
// synthetic batch.
Workload make_workload(const std::string& model, const WorkloadOptions& options);

}  // namespace ampforge::train
