// The ResNet family as torchvision builds it (torchvision.models.resnet, "ResNet v1.5"): the same module
// tree, the same state-dict names in the same order, the same initialisation, so torchvision weights saved
// as safetensors load by name with no renaming (nn::load_state_dict_report / nn::load_safetensors).
//
// Facts (../shared/docs/specs/MODELS.md §C):
//   stem     conv1 7x7/2 (C -> 64, no bias) - bn1 - relu - maxpool 3x3/2 pad 1
//   stages   layer1..layer4 of BasicBlock (expansion 1) or Bottleneck (expansion 4) blocks, planes
//            64/128/256/512, first block of layer2..4 with stride 2; Bottleneck strides its 3x3 conv (v1.5)
//   shortcut downsample = conv1x1(stride, no bias) + BN where the stride is not 1 or the channels change
//   head     AdaptiveAvgPool2d(1) - flatten - fc Linear(512 * expansion -> classes)
//   init     convs kaiming_normal(fan_out, relu); BN weight 1, bias 0; fc keeps nn::Linear's default;
//            zero_init_residual zeroes the last BN weight of every block (bn3 / bn2)
// Every model takes (N, C, H, W) images (any H, W >= 1: the pool is adaptive) and returns (N, classes) logits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ampforge/nn/layers.h"

namespace ampforge::models {

struct ResNetOptions {
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  bool zero_init_residual = false;
  // ResNeXt / wide ResNet (Bottleneck only): the 3x3 conv has groups * (planes * width_per_group / 64)
  // channels in `groups` groups. BasicBlock accepts only groups 1, width 64 (torchvision's rule).
  int64_t groups = 1;
  int64_t width_per_group = 64;
};

// Bottleneck's and BasicBlock's shared shortcut: conv1x1(in -> out, stride) + BN, named "0" and "1".
nn::ModulePtr resnet_downsample(int64_t in_channels, int64_t out_channels, int64_t stride);

// 3x3 - 3x3 residual block of ResNet-18/34 (expansion 1).
class BasicBlock : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  // in_channels -> planes; downsample is null or resnet_downsample(in_channels, planes, stride).
  BasicBlock(int64_t in_channels, int64_t planes, int64_t stride, nn::ModulePtr downsample);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::ReLU> relu;
  nn::ModulePtr downsample;  // null when the shortcut is the identity
};

// 1x1 - 3x3 (stride) - 1x1 residual block of ResNet-50/101/152 (expansion 4).
class Bottleneck : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  // in_channels -> planes * 4, width = planes * width_per_group / 64 * groups inside.
  Bottleneck(int64_t in_channels, int64_t planes, int64_t stride, nn::ModulePtr downsample, int64_t groups,
             int64_t width_per_group);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<nn::ReLU> relu;
  nn::ModulePtr downsample;  // null when the shortcut is the identity
};

enum class ResNetBlock { Basic, Bottleneck };

class ResNet : public nn::Module {
 public:
  // layers: blocks per stage, e.g. {3, 4, 6, 3} for ResNet-50.
  ResNet(ResNetBlock block, const std::vector<int64_t>& layers, const ResNetOptions& opt = {});
  Tensor forward(const Tensor& x) override;  // (N, C, H, W) -> (N, classes)

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::ReLU> relu;
  std::shared_ptr<nn::MaxPool2d> maxpool;
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Linear> fc;

 private:
  std::shared_ptr<nn::Sequential> make_layer(int64_t planes, int64_t blocks, int64_t stride);
  ResNetBlock block_;
  ResNetOptions opt_;
  int64_t inplanes_ = 64;
};

std::shared_ptr<ResNet> resnet18(const ResNetOptions& opt = {});
std::shared_ptr<ResNet> resnet34(const ResNetOptions& opt = {});
std::shared_ptr<ResNet> resnet50(const ResNetOptions& opt = {});
std::shared_ptr<ResNet> resnet101(const ResNetOptions& opt = {});
std::shared_ptr<ResNet> resnet152(const ResNetOptions& opt = {});
// torchvision's ResNeXt and wide ResNets: ResNet-50/101 layouts with groups / width_per_group preset
// (opt's groups and width_per_group are overwritten).
std::shared_ptr<ResNet> resnext50_32x4d(ResNetOptions opt = {});
std::shared_ptr<ResNet> resnext101_32x8d(ResNetOptions opt = {});
std::shared_ptr<ResNet> resnext101_64x4d(ResNetOptions opt = {});
std::shared_ptr<ResNet> wide_resnet50_2(ResNetOptions opt = {});
std::shared_ptr<ResNet> wide_resnet101_2(ResNetOptions opt = {});

}  // namespace ampforge::models
