// Model zoo, built only from nn/. What each model takes and returns is its task's (tasks/registry.h): image
// classifiers (N, C, H, W) -> (N, classes) logits; YOLOv8 images -> per-level head outputs; BERT token ids -> logits.
// By name: registry.h (models::create, models::names, the entries `ampforge models` lists).
#pragma once

#include "ampforge/models/registry.h"
#include "ampforge/models/resnet.h"
#include "ampforge/models/yolo.h"
#include "ampforge/nn/layers.h"

namespace ampforge::models {

// The small CNN of the training issue (the published "2 conv + pooling + BN" Fashion-MNIST baseline):
//   [conv3x3(C->32, pad 1, no bias) - BN - ReLU - maxpool2] -> [conv3x3(32->64) - BN - ReLU - maxpool2]
//   -> flatten -> linear(64*(S/4)^2 -> 128) - ReLU -> linear(128 -> classes)
// Convs carry no bias: the BatchNorm after them has one.
nn::ModulePtr small_cnn(const ModelOptions& opt = {});

// A small ResNet for 28x28 inputs: conv3x3(C->16) - BN - ReLU, three stages of two BasicBlocks
// (16, 32, 64 channels; stages 2 and 3 stride 2 with 1x1 projection shortcuts), global average pool, linear.
nn::ModulePtr small_resnet(const ModelOptions& opt = {});

}  // namespace ampforge::models
