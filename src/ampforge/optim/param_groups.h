// Parameter groups for the usual recipes: no weight decay on biases and normalisation weights.
#pragma once

#include <vector>

#include "ampforge/nn/module.h"
#include "ampforge/optim/optimizer.h"

namespace ampforge::optim {

// Two groups over `model`'s parameters, in registration order within each: {decayed, weight_decay} and
// {not decayed, 0}. A parameter is not decayed when it has at most one dimension — biases and the
// weights of BatchNorm/LayerNorm — the rule of NVIDIA's ResNet recipe ("no WD on BN") and of Hugging
// Face's BERT recipe (no decay on bias and LayerNorm.weight); embeddings and conv/linear weights decay.
// An empty group is left out. `lr` < 0 keeps the optimizer's default lr for both groups.
std::vector<ParamGroupSpec> decay_groups(const nn::Module& model, double weight_decay, double lr = -1);

// Ultralytics' three groups (build_optimizer), in its order: {biases: no decay, warm-up from warmup_bias_lr},
// {other weights: weight_decay}, {normalisation weights: no decay, warm-up from 0}. A bias is a parameter named
// "*.bias"; a normalisation weight any other parameter of at most one dimension (BatchNorm's weight); frozen
// parameters (requires_grad false, e.g. YOLOv8's DFL conv) are left out. `weight_decay` is the value to use:
// Ultralytics scales its 5e-4 by batch x accumulate / nbs (64) before passing it. Empty groups are left out.
std::vector<ParamGroupSpec> ultralytics_groups(const nn::Module& model, double weight_decay, double warmup_bias_lr,
                                               double lr = -1);

}  // namespace ampforge::optim
