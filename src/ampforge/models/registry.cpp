// The built-in model entries and the registry's lookups (see registry.h).
#include "ampforge/models/registry.h"

#include "ampforge/models/bert.h"
#include "ampforge/models/models.h"
#include "ampforge/models/yolo.h"
#include "ampforge/nn/init.h"

namespace ampforge::models {

void ModelRegistry::add(ModelEntry e) {
  AF_CHECK(!e.name.empty(), "ModelRegistry::add: a model needs a name");
  AF_CHECK(find(e.name) == nullptr, "ModelRegistry::add: model '{}' is already registered", e.name);
  AF_CHECK(static_cast<bool>(e.build), "ModelRegistry::add: model '{}' has no build function", e.name);
  entries_.push_back(std::move(e));
}

const ModelEntry* ModelRegistry::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const ModelEntry& ModelRegistry::at(const std::string& name) const {
  if (const ModelEntry* e = find(name)) return *e;
  std::string known;
  for (const auto& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
  AF_THROW(InvalidArgument, "unknown model '{}': available models are {} (`ampforge models` lists them)", name, known);
}

std::vector<std::string> ModelRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

namespace {

// torchvision's ImageNet configuration: 3x224x224 inputs, 1000 classes.
ModelOptions imagenet() {
  ModelOptions o;
  o.in_channels = 3;
  o.num_classes = 1000;
  o.image_size = 224;
  return o;
}

ResNetOptions resnet_options(const ModelOptions& m) {
  ResNetOptions r;
  r.in_channels = m.in_channels;
  r.num_classes = m.num_classes;
  return r;
}

using ResNetFactory = std::shared_ptr<ResNet> (*)(ResNetOptions);

template <ResNetFactory F>
nn::ModulePtr build_resnet(const ModelOptions& m) {
  return F(resnet_options(m));
}

// resnet18..152 take a const reference; these adapters give the five one signature for the table below.
std::shared_ptr<ResNet> r18(ResNetOptions o) { return resnet18(o); }
std::shared_ptr<ResNet> r34(ResNetOptions o) { return resnet34(o); }
std::shared_ptr<ResNet> r50(ResNetOptions o) { return resnet50(o); }
std::shared_ptr<ResNet> r101(ResNetOptions o) { return resnet101(o); }
std::shared_ptr<ResNet> r152(ResNetOptions o) { return resnet152(o); }

// Ultralytics' COCO configuration: 3x640x640 inputs, 80 classes.
ModelOptions coco() {
  ModelOptions o;
  o.in_channels = 3;
  o.num_classes = 80;
  o.image_size = 640;
  return o;
}

template <char Scale>
nn::ModulePtr build_yolov8(const ModelOptions& m) {
  return yolov8(Scale, m.num_classes, m.in_channels);
}

// BERT by preset: ModelOptions::num_classes is the vocabulary (the text data set's, e.g. a learned WordPiece
// vocabulary), image_size the sequence length (the position table stays 512).
ModelOptions bert_defaults() {
  ModelOptions o;
  o.in_channels = 1;
  o.num_classes = 30522;
  o.image_size = 128;
  return o;
}

ModelEntry bert_entry(const std::string& preset, const std::string& description) {
  auto config = [preset](const ModelOptions& o) {
    BertConfig c = bert_config(preset);
    c.vocab_size = o.num_classes;
    return c;
  };
  ModelEntry e{preset, "masked_lm", description, bert_defaults(),
               [config](const ModelOptions& o) -> nn::ModulePtr { return std::make_shared<BertForMaskedLM>(config(o)); },
               {}, {}};
  e.from_reference_state = [](const nn::NamedTensors& s) { return bert_state_from_hf(s); };
  e.max_input_length = bert_config(preset).max_position_embeddings;
  e.counts = [config] {
    const BertConfig c = config(bert_defaults());
    return std::vector<ParameterCount>{{"BertModel with pooler", BertModel(c, true).num_parameters()},
                                       {"BertForMaskedLM", BertForMaskedLM(c).num_parameters()}};
  };
  return e;
}

}  // namespace

void register_builtin_models(ModelRegistry& r) {
  const ModelOptions small{};  // 1x28x28, 10 classes (Fashion-MNIST)
  r.add({"cnn", "classification",
         "small CNN: 2x (conv3x3-BN-ReLU-maxpool), linear 128, linear (Fashion-MNIST baseline)", small, [](const ModelOptions& o) { return small_cnn(o); }, {}, {}});
  r.add({"resnet-small", "classification", "small ResNet for 28x28: 3 stages of 2 BasicBlocks (16/32/64 channels)",
         small, [](const ModelOptions& o) { return small_resnet(o); }, {}, {}});
  const ModelOptions in1k = imagenet();
  r.add({"resnet18", "classification", "ResNet-18 (torchvision): BasicBlocks 2-2-2-2", in1k, build_resnet<r18>, {}, {}});
  r.add({"resnet34", "classification", "ResNet-34 (torchvision): BasicBlocks 3-4-6-3", in1k, build_resnet<r34>, {}, {}});
  r.add({"resnet50", "classification", "ResNet-50 v1.5 (torchvision): Bottlenecks 3-4-6-3", in1k, build_resnet<r50>,
         {}, {}});
  r.add({"resnet101", "classification", "ResNet-101 v1.5 (torchvision): Bottlenecks 3-4-23-3", in1k,
         build_resnet<r101>, {}, {}});
  r.add({"resnet152", "classification", "ResNet-152 v1.5 (torchvision): Bottlenecks 3-8-36-3", in1k,
         build_resnet<r152>, {}, {}});
  r.add({"resnext50_32x4d", "classification", "ResNeXt-50 32x4d (torchvision): ResNet-50 with 32 groups of width 4",
         in1k, build_resnet<resnext50_32x4d>, {}, {}});
  r.add({"resnext101_32x8d", "classification", "ResNeXt-101 32x8d (torchvision): ResNet-101 with 32 groups of width 8",
         in1k, build_resnet<resnext101_32x8d>, {}, {}});
  r.add({"resnext101_64x4d", "classification", "ResNeXt-101 64x4d (torchvision): ResNet-101 with 64 groups of width 4",
         in1k, build_resnet<resnext101_64x4d>, {}, {}});
  r.add({"wide_resnet50_2", "classification", "Wide ResNet-50-2 (torchvision): ResNet-50 with 2x wide 3x3 convs",
         in1k, build_resnet<wide_resnet50_2>, {}, {}});
  r.add({"wide_resnet101_2", "classification", "Wide ResNet-101-2 (torchvision): ResNet-101 with 2x wide 3x3 convs",
         in1k, build_resnet<wide_resnet101_2>, {}, {}});
  const ModelOptions det = coco();
  r.add({"yolov8n", "detection", "YOLOv8n (Ultralytics): depth 0.33, width 0.25, v8 Detect head (legacy class branch)",
         det, build_yolov8<'n'>, {}, {}});
  r.add({"yolov8s", "detection", "YOLOv8s (Ultralytics): depth 0.33, width 0.50, v8 Detect head (legacy class branch)",
         det, build_yolov8<'s'>, {}, {}});
  r.add({"yolov8m", "detection", "YOLOv8m (Ultralytics): depth 0.67, width 0.75, max 768 channels", det,
         build_yolov8<'m'>, {}, {}});
  r.add({"yolov8l", "detection", "YOLOv8l (Ultralytics): depth 1.00, width 1.00, max 512 channels", det,
         build_yolov8<'l'>, {}, {}});
  r.add({"yolov8x", "detection", "YOLOv8x (Ultralytics): depth 1.00, width 1.25, max 512 channels", det,
         build_yolov8<'x'>, {}, {}});
  r.add(bert_entry("bert-base", "BERT-base masked LM (Hugging Face bert-base-uncased): 12 x 768, 12 heads, tied decoder"));
  r.add(bert_entry("bert-mini", "BERT-Mini masked LM: 4 x 256, 4 heads, intermediate 1024 (HF structure)"));
  r.add(bert_entry("bert-tiny", "BERT-Tiny masked LM: 2 x 128, 2 heads, intermediate 512 (HF structure)"));
}

ModelRegistry& model_registry() {
  static ModelRegistry registry = [] {
    ModelRegistry r;
    register_builtin_models(r);
    return r;
  }();
  return registry;
}

std::vector<ParameterCount> parameter_counts(const ModelEntry& e) {
  nn::init::SkipInitGuard skip;
  if (e.counts) return e.counts();
  return {{"parameters", e.build(e.defaults)->num_parameters()}};
}

nn::ModulePtr create(const std::string& name, const ModelOptions& opt) { return model_registry().at(name).build(opt); }

std::vector<std::string> names() { return model_registry().names(); }

}  // namespace ampforge::models
