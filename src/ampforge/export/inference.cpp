#include "ampforge/export/inference.h"

#include "ampforge/models/task_models.h"

#include "ampforge/core/checkpoint_format.h"
#include "ampforge/core/safetensors.h"

#include <optional>
#include "ampforge/nn/init.h"
#include "ampforge/nn/state_dict.h"
#include "ampforge/tasks/registry.h"

namespace ampforge::onnx_export {

namespace {
bool takes_tokens(const models::ModelEntry& e) { return tasks::task_of(e).input == tasks::InputKind::TokenIds; }
}  // namespace

InferenceModel load_inference_model(const InferenceModelOptions& given) {
  InferenceModelOptions o = given;
  // A training checkpoint records what its model was built with (core/checkpoint_format.h): the model, its input
  // channels, classes and image size (the sequence length for text models) come from there; flags override.
  std::optional<SafetensorsFile> file;
  std::optional<checkpoint::ModelRecord> record;
  if (!o.checkpoint.empty()) {
    file = load_safetensors(o.checkpoint);
    record = checkpoint::read_model_record(file->metadata, o.checkpoint);
  }
  if (record) {
    AF_CHECK(o.model.empty() || record->model.empty() || o.model == record->model,
             "checkpoint '{}' was saved from model '{}', not '{}' (drop --model, or pass --model {})", o.checkpoint,
             record->model, o.model, record->model);
    if (o.model.empty()) o.model = record->model;
  }
  AF_CHECK(!o.model.empty(), "--model is required: '{}' is not an ampforge training checkpoint that names its model "
           "(a plain state dict, e.g. converted torchvision weights)", o.checkpoint);
  InferenceModel m;
  m.entry = &models::model_registry().at(o.model);
  AF_CHECK(!o.checkpoint.empty() || o.random_init,
           "model '{}' has no weights: pass --checkpoint FILE (from `ampforge train --save`, or a converted state "
           "dict), or --random-init to use the untrained initialisation on purpose (runtime tests)", o.model);
  AF_CHECK(o.checkpoint.empty() || !o.random_init, "--checkpoint and --random-init exclude each other");
  const bool tokens = takes_tokens(*m.entry);
  if (!tokens)
    AF_CHECK(o.seq_len == 0, "--seq-len applies to text models; '{}' ({}) takes images (use --image-size)", o.model,
             m.entry->task);
  if (tokens)
    AF_CHECK(o.image_size == 0 && o.in_channels == 0, "--image-size and --in-channels apply to image models; '{}' "
             "({}) takes token ids (use --seq-len)", o.model, m.entry->task);
  m.options = m.entry->defaults;
  if (record) {  // what training built; the flags below override
    if (record->in_channels > 0) m.options.in_channels = record->in_channels;
    if (record->num_classes > 0) m.options.num_classes = record->num_classes;
    if (record->image_size > 0) {
      if (tokens) m.seq_len = record->image_size;
      else m.options.image_size = record->image_size;
    }
  }
  if (o.seq_len > 0) m.seq_len = o.seq_len;
  if (tokens) {
    m.task = o.task.empty() ? "fill-mask" : o.task;
    AF_CHECK(m.task == "fill-mask" || m.task == "feature-extraction",
             "--task {}: '{}' offers fill-mask (the MLM logits) or feature-extraction (the encoder's last_hidden_state)",
             o.task, o.model);
  } else {
    AF_CHECK(o.task.empty(), "--task {}: applies to text models; '{}' ({}) has one output", o.task, o.model,
             m.entry->task);
  }
  if (o.in_channels > 0) m.options.in_channels = o.in_channels;
  if (o.num_classes > 0) m.options.num_classes = o.num_classes;
  if (o.image_size > 0) m.options.image_size = o.image_size;
  if (o.random_init) {
    manual_seed(o.seed);
    m.model = m.entry->build(m.options);
  } else {
    {
      nn::init::SkipInitGuard skip;  // every value comes from the file
      m.model = m.entry->build(m.options);
    }
    SafetensorsFile& f = *file;
    nn::NamedTensors state;
    if (record) {
      state = checkpoint::model_weights(f.tensors, &m.weights);  // the weight average when the run kept one
    } else {
      state = m.entry->reference_state(f.tensors);  // e.g. a Hugging Face BERT model.safetensors as downloaded
    }
    const nn::LoadReport r = nn::compare_state_dict(*m.model, state);
    AF_CHECK(r.ok(), "checkpoint '{}' does not fit model '{}' ({} input channels, {} classes, image size {}): {}{}",
             o.checkpoint, o.model, m.options.in_channels, m.options.num_classes, m.options.image_size, r.str(),
             r.mismatched_keys.empty() ? ""
             : record && record->num_classes > 0
                 ? " (the checkpoint records what it was trained with: drop --in-channels/--classes/--image-size)"
                 : " (a model trained on other data: pass --in-channels/--classes/--image-size)");
    nn::LoadOptions lo;
    nn::load_state_dict(*m.model, state, lo);
    m.loaded_tensors = static_cast<int64_t>(state.size());
  }
  m.model->eval();
  return m;
}

Signature signature_for(const InferenceModel& m, int64_t batch) {
  const bool tokens = takes_tokens(*m.entry);
  if (tokens && models::model_as_or_null<models::MaskedLanguageModel>(*m.model) != nullptr) {
    // BERT as Hugging Face exports it: input_ids and attention_mask (1 keep, 0 padding), both int64.
    Signature s;
    s.inputs = {{"input_ids", Shape{batch, m.seq_len}, DType::I64}, {"attention_mask", Shape{batch, m.seq_len}, DType::I64}};
    if (m.task == "feature-extraction") {
      s.outputs = {"last_hidden_state"};
      s.run = [](nn::Module& model, const std::vector<Tensor>& in) {
        return std::vector<Tensor>{models::model_as<models::MaskedLanguageModel>(model, "export").encode(in.at(0), in.at(1))};
      };
    } else {
      s.outputs = {"logits"};
      s.run = [](nn::Module& model, const std::vector<Tensor>& in) {
        return std::vector<Tensor>{models::model_as<models::MaskedLanguageModel>(model, "export").logits(in.at(0), in.at(1))};
      };
    }
    return s;
  }
  if (tokens) {
    AF_CHECK(m.task.empty() || m.task == "fill-mask", "--task {}: model '{}' has no separate encoder output", m.task,
             m.entry->name);
    Signature s;
    s.inputs = {{"input_ids", Shape{batch, m.seq_len}, DType::I64}};
    s.outputs = {"logits"};
    s.run = [](nn::Module& model, const std::vector<Tensor>& in) { return std::vector<Tensor>{model.forward(in.at(0))}; };
    return s;
  }
  return image_signature(batch, m.options.in_channels, m.options.image_size);
}

}  // namespace ampforge::onnx_export
