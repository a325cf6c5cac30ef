// Model zoo, built only from nn/. Every model takes (N, C, H, W) images and returns (N, classes) logits.
#pragma once

#include <string>
#include <vector>

#include "ampforge/nn/layers.h"

namespace ampforge::models {

struct ModelOptions {
  int64_t in_channels = 1;
  int64_t num_classes = 10;
  int64_t image_size = 28;  // square inputs; the CNN's classifier depends on it
};

// The small CNN of the training issue (the published "2 conv + pooling + BN" Fashion-MNIST baseline):
//   [conv3x3(C->32, pad 1, no bias) - BN - ReLU - maxpool2] -> [conv3x3(32->64) - BN - ReLU - maxpool2]
//   -> flatten -> linear(64*(S/4)^2 -> 128) - ReLU -> linear(128 -> classes)
// Convs carry no bias: the BatchNorm after them has one.
nn::ModulePtr small_cnn(const ModelOptions& opt = {});

// A small ResNet for 28x28 inputs: conv3x3(C->16) - BN - ReLU, three stages of two BasicBlocks
// (16, 32, 64 channels; stages 2 and 3 stride 2 with 1x1 projection shortcuts), global average pool, linear.
nn::ModulePtr small_resnet(const ModelOptions& opt = {});

// Creates a model by name ("cnn", "resnet-small"); unknown names list the known ones.
nn::ModulePtr create(const std::string& name, const ModelOptions& opt = {});
std::vector<std::string> names();

}  // namespace ampforge::models
