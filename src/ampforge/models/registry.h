// The model registry: every model the CLI (`ampforge train --model`, `ampforge memory fit`, `ampforge models`)
// can name. An entry says what the model is (task, one-line description, default input) and how to build it;
// the training loop only ever sees the built nn::Module, so adding a model is one entry here and never an
// edit of the loop.
//
// Registration is explicit (register_builtin_models, called once by model_registry()); adding a name twice
// throws, asking for an unknown name throws InvalidArgument listing the known ones.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ampforge/nn/module.h"

namespace ampforge::models {

// What the CLI knows about the data when it builds a model by name. Models use what applies to them (the
// ResNets ignore image_size: their pool is adaptive).
struct ModelOptions {
  int64_t in_channels = 1;
  int64_t num_classes = 10;
  int64_t image_size = 28;  // square inputs; the small CNN's classifier depends on it
};

// One labelled parameter count of a model's default configuration. Models with a single meaningful count
// report {"parameters", n}; others say which variant each number counts (BERT: "BertModel with pooler",
// "BertForMaskedLM"), so a reader knows what is being compared.
struct ParameterCount {
  std::string label;
  int64_t count = 0;
};

struct ModelEntry {
  std::string name;         // what --model takes: "resnet50"
  std::string task;         // the kind of training task it is built for: "classification"
  std::string description;  // one line
  ModelOptions defaults;    // the default configuration: input channels, image size, classes
  // Builds the model for `opt` (the trainer passes the dataset's channels, classes and image size).
  std::function<nn::ModulePtr(const ModelOptions& opt)> build;
  // Optional: the labelled counts of the default configuration, each computed by building that variant
  // and counting its parameters. Unset: one count, "parameters", of build(defaults).
  std::function<std::vector<ParameterCount>()> counts;
  // Optional: maps a state dict saved by the reference implementation users download weights from (e.g. a
  // Hugging Face BERT checkpoint's legacy names and tied duplicates) to this model's names. Unset: the names
  // already match (torchvision, Ultralytics). Applied by `train --weights`, `models --load`, export and predict.
  std::function<nn::NamedTensors(const nn::NamedTensors&)> from_reference_state;
  // Token-id models: the longest input sequence (the position table); 0: no limit.
  int64_t max_input_length = 0;

  // from_reference_state(state) when set, else state.
  nn::NamedTensors reference_state(const nn::NamedTensors& state) const {
    return from_reference_state ? from_reference_state(state) : state;
  }
};

class ModelRegistry {
 public:
  // Throws InvalidArgument when the name is empty or already registered, or build is unset.
  void add(ModelEntry entry);
  // Throws InvalidArgument naming the known models when `name` is unknown.
  const ModelEntry& at(const std::string& name) const;
  const ModelEntry* find(const std::string& name) const;  // nullptr when unknown
  const std::vector<ModelEntry>& entries() const { return entries_; }  // in registration order
  std::vector<std::string> names() const;

 private:
  std::vector<ModelEntry> entries_;
};

// The built-in models: cnn, resnet-small, resnet18/34/50/101/152, resnext50_32x4d, resnext101_32x8d,
// resnext101_64x4d, wide_resnet50_2, wide_resnet101_2 (task "classification"); yolov8n/s/m/l/x (task
// "detection"); bert-base, bert-mini, bert-tiny (task "masked_lm": num_classes is the vocabulary, image_size the
// sequence length).
void register_builtin_models(ModelRegistry& registry);

// The process-wide registry, holding the built-in models (built on first use, thread-safe). A program or a
// test adds its own models with model_registry().add(...) before it uses the registry from several threads;
// the entry's task names a task of tasks/registry.h.
ModelRegistry& model_registry();

// The entry's labelled parameter counts, computed honestly: the model is built (default configuration)
// and its parameters counted. The random initialisation is skipped while building (nn::init::SkipInitGuard),
// so listing every model costs allocations only and leaves the default generator untouched.
std::vector<ParameterCount> parameter_counts(const ModelEntry& entry);

// model_registry().at(name).build(opt): unknown names throw InvalidArgument listing the known ones.
nn::ModulePtr create(const std::string& name, const ModelOptions& opt = {});
// model_registry().names(), in registration order.
std::vector<std::string> names();

}  // namespace ampforge::models
