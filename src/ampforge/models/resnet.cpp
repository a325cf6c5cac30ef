// ResNet-18/34/50/101/152 (and torchvision's ResNeXt / wide variants): see resnet.h for the facts kept.
// Modules are registered in torchvision's order, so state_dict() lists the same keys in the same order:
// conv1, bn1, layer1.0.conv1, layer1.0.bn1, ..., layer1.0.downsample.0, layer1.0.downsample.1, ..., fc.
// Shapes below are for a 224x224 input: (N, C, H, W); e is the block's expansion (1 or 4), s its stride.
#include "ampforge/models/resnet.h"

#include <functional>

#include "ampforge/nn/init.h"

namespace ampforge::models {

using namespace ampforge::nn;

namespace {

std::shared_ptr<Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride = 1, int64_t groups = 1) {
  Conv2dOptions o;
  o.stride = stride;
  o.padding = 1;
  o.groups = groups;
  o.bias = false;
  return std::make_shared<Conv2d>(in, out, 3, o);
}

std::shared_ptr<Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride = 1) {
  Conv2dOptions o;
  o.stride = stride;
  o.bias = false;
  return std::make_shared<Conv2d>(in, out, 1, o);
}

}  // namespace

nn::ModulePtr resnet_downsample(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<Sequential>(
      std::initializer_list<ModulePtr>{conv1x1(in, out, stride), std::make_shared<BatchNorm2d>(out)});
}

// ---- BasicBlock: x -> conv3x3(stride) - bn - relu - conv3x3 - bn -> + shortcut(x) -> relu -----------------
BasicBlock::BasicBlock(int64_t in, int64_t planes, int64_t stride, nn::ModulePtr ds) : Module("BasicBlock") {
  conv1 = register_module("conv1", conv3x3(in, planes, stride));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  relu = register_module("relu", std::make_shared<ReLU>());
  conv2 = register_module("conv2", conv3x3(planes, planes));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  if (ds) downsample = register_module("downsample", std::move(ds));
}

Tensor BasicBlock::forward(const Tensor& x) {                 // (N, in, H, W)
  Tensor out = bn1->forward_act((*conv1)(x), NormAct::ReLU);  // (N, planes, H/s, W/s)
  const Tensor identity = downsample ? (*downsample)(x) : x;  // (N, planes, H/s, W/s)
  // relu(bn2(conv2(out)) + identity) as one op (BatchNorm2d::forward_add_act); `relu` stays in the module tree
  // as torchvision's does.
  return bn2->forward_add_act((*conv2)(out), identity, NormAct::ReLU);  // (N, planes, H/s, W/s)
}

// ---- Bottleneck: x -> conv1x1 - bn - relu - conv3x3(stride, groups) - bn - relu - conv1x1 - bn -> + shortcut ---
Bottleneck::Bottleneck(int64_t in, int64_t planes, int64_t stride, nn::ModulePtr ds, int64_t groups,
                       int64_t width_per_group)
    : Module("Bottleneck") {
  const int64_t width = planes * width_per_group / 64 * groups;
  conv1 = register_module("conv1", conv1x1(in, width));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(width));
  conv2 = register_module("conv2", conv3x3(width, width, stride, groups));  // v1.5: the stride is here
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(width));
  conv3 = register_module("conv3", conv1x1(width, planes * kExpansion));
  bn3 = register_module("bn3", std::make_shared<BatchNorm2d>(planes * kExpansion));
  relu = register_module("relu", std::make_shared<ReLU>());
  if (ds) downsample = register_module("downsample", std::move(ds));
}

Tensor Bottleneck::forward(const Tensor& x) {                 // (N, in, H, W)
  Tensor out = bn1->forward_act((*conv1)(x), NormAct::ReLU);  // (N, width, H, W)
  out = bn2->forward_act((*conv2)(out), NormAct::ReLU);       // (N, width, H/s, W/s)
  const Tensor identity = downsample ? (*downsample)(x) : x;  // (N, 4 planes, H/s, W/s)
  // relu(bn3(conv3(out)) + identity) as one op (BatchNorm2d::forward_add_act); `relu` stays in the module tree
  // as torchvision's does.
  return bn3->forward_add_act((*conv3)(out), identity, NormAct::ReLU);  // (N, 4 planes, H/s, W/s)
}

// ---- ResNet ---------------------------------------------------------------------------------------------------
ResNet::ResNet(ResNetBlock block, const std::vector<int64_t>& layers, const ResNetOptions& opt)
    : Module("ResNet"), block_(block), opt_(opt) {
  AF_CHECK(layers.size() == 4, "ResNet: expected 4 stage depths (e.g. {{3, 4, 6, 3}}), got {}", layers.size());
  AF_CHECK(opt.num_classes > 0 && opt.in_channels > 0, "ResNet: num_classes and in_channels must be positive, got {} "
           "and {}", opt.num_classes, opt.in_channels);
  AF_CHECK(opt.groups > 0 && opt.width_per_group > 0, "ResNet: groups and width_per_group must be positive, got {} "
           "and {}", opt.groups, opt.width_per_group);
  AF_CHECK(block == ResNetBlock::Bottleneck || (opt.groups == 1 && opt.width_per_group == 64),
           "ResNet: BasicBlock only supports groups=1 and width_per_group=64, got {} and {}", opt.groups,
           opt.width_per_group);
  for (int64_t n : layers) AF_CHECK(n >= 1, "ResNet: every stage needs at least one block, got {}", n);
  Conv2dOptions stem;
  stem.stride = 2;
  stem.padding = 3;
  stem.bias = false;
  conv1 = register_module("conv1", std::make_shared<Conv2d>(opt.in_channels, 64, 7, stem));  // (N, 64, 112, 112)
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(64));
  relu = register_module("relu", std::make_shared<ReLU>());
  maxpool = register_module("maxpool", std::make_shared<MaxPool2d>(3, 2, 1));  // (N, 64, 56, 56)
  layer1 = register_module("layer1", make_layer(64, layers[0], 1));              // (N, 64 e, 56, 56)
  layer2 = register_module("layer2", make_layer(128, layers[1], 2));             // (N, 128 e, 28, 28)
  layer3 = register_module("layer3", make_layer(256, layers[2], 2));             // (N, 256 e, 14, 14)
  layer4 = register_module("layer4", make_layer(512, layers[3], 2));             // (N, 512 e, 7, 7)
  avgpool = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1, 1));  // (N, 512 e, 1, 1)
  fc = register_module("fc", std::make_shared<Linear>(inplanes_, opt.num_classes));  // (N, classes)

  // torchvision's init loop: every conv kaiming_normal(fan_out, relu), every BN (1, 0) — the BN defaults
  // already are (1, 0); fc keeps Linear's default. Convs are visited in module order, as torchvision's
  // self.modules(), so a given generator state gives one model.
  std::function<void(const Module&)> init_convs = [&](const Module& m) {
    for (auto& [name, child] : m.children()) {
      if (auto* conv = dynamic_cast<Conv2d*>(child.get())) init::kaiming_normal_fan_out_(conv->weight);
      init_convs(*child);
    }
  };
  init_convs(*this);
  if (opt.zero_init_residual) {
    for (auto* stage : {layer1.get(), layer2.get(), layer3.get(), layer4.get()})
      for (auto& [name, b] : stage->children()) {
        if (auto* bottleneck = dynamic_cast<Bottleneck*>(b.get())) init::zeros_(bottleneck->bn3->weight);
        if (auto* basic = dynamic_cast<BasicBlock*>(b.get())) init::zeros_(basic->bn2->weight);
      }
  }
}

std::shared_ptr<Sequential> ResNet::make_layer(int64_t planes, int64_t blocks, int64_t stride) {
  const int64_t expansion = block_ == ResNetBlock::Basic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  auto make = [&](int64_t in, int64_t s, ModulePtr ds) -> ModulePtr {
    if (block_ == ResNetBlock::Basic) return std::make_shared<BasicBlock>(in, planes, s, std::move(ds));
    return std::make_shared<Bottleneck>(in, planes, s, std::move(ds), opt_.groups, opt_.width_per_group);
  };
  auto stage = std::make_shared<Sequential>();
  ModulePtr ds;
  if (stride != 1 || inplanes_ != planes * expansion) ds = resnet_downsample(inplanes_, planes * expansion, stride);
  stage->push_back(make(inplanes_, stride, std::move(ds)));
  inplanes_ = planes * expansion;
  for (int64_t i = 1; i < blocks; ++i) stage->push_back(make(inplanes_, 1, nullptr));
  return stage;
}

Tensor ResNet::forward(const Tensor& x) {                    // (N, C, 224, 224)
  Tensor y = (*maxpool)(bn1->forward_act((*conv1)(x), NormAct::ReLU));      // (N, 64, 56, 56)
  y = (*layer4)((*layer3)((*layer2)((*layer1)(y))));         // (N, 512 e, 7, 7)
  return (*fc)(flatten((*avgpool)(y), 1));                   // (N, classes)
}

// ---- the family ------------------------------------------------------------------------------------------------
std::shared_ptr<ResNet> resnet18(const ResNetOptions& o) {
  return std::make_shared<ResNet>(ResNetBlock::Basic, std::vector<int64_t>{2, 2, 2, 2}, o);
}
std::shared_ptr<ResNet> resnet34(const ResNetOptions& o) {
  return std::make_shared<ResNet>(ResNetBlock::Basic, std::vector<int64_t>{3, 4, 6, 3}, o);
}
std::shared_ptr<ResNet> resnet50(const ResNetOptions& o) {
  return std::make_shared<ResNet>(ResNetBlock::Bottleneck, std::vector<int64_t>{3, 4, 6, 3}, o);
}
std::shared_ptr<ResNet> resnet101(const ResNetOptions& o) {
  return std::make_shared<ResNet>(ResNetBlock::Bottleneck, std::vector<int64_t>{3, 4, 23, 3}, o);
}
std::shared_ptr<ResNet> resnet152(const ResNetOptions& o) {
  return std::make_shared<ResNet>(ResNetBlock::Bottleneck, std::vector<int64_t>{3, 8, 36, 3}, o);
}
std::shared_ptr<ResNet> resnext50_32x4d(ResNetOptions o) {
  o.groups = 32, o.width_per_group = 4;
  return resnet50(o);
}
std::shared_ptr<ResNet> resnext101_32x8d(ResNetOptions o) {
  o.groups = 32, o.width_per_group = 8;
  return resnet101(o);
}
std::shared_ptr<ResNet> resnext101_64x4d(ResNetOptions o) {
  o.groups = 64, o.width_per_group = 4;
  return resnet101(o);
}
std::shared_ptr<ResNet> wide_resnet50_2(ResNetOptions o) {
  o.width_per_group = 128;
  return resnet50(o);
}
std::shared_ptr<ResNet> wide_resnet101_2(ResNetOptions o) {
  o.width_per_group = 128;
  return resnet101(o);
}

}  // namespace ampforge::models
