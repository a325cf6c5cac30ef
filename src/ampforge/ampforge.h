// The whole public API in one include. Installed as <prefix>/include/ampforge/ampforge.h; self-contained
// (examples/*.cpp include nothing else of ampforge, and the install test builds them against an installation).
//
// Two layers of tensor functions: ampforge::add, ampforge::conv2d, ... (autograd/functions.h) are what models,
// losses and training loops call, as a PyTorch user calls torch.add: they record the backward and follow
// autocast. ops::add, ops::conv2d, ... (ops/ops.h) are the primitives below them, with neither: what backward
// formulas, optimizers and kernels' callers use, where no history may be recorded.
#pragma once

#include "ampforge/amp/autocast.h"
#include "ampforge/amp/grad_scaler.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/core/generator.h"
#include "ampforge/core/runtime.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/core/tensor.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/data/dataset.h"
#include "ampforge/data/image.h"
#include "ampforge/data/image_folder.h"
#include "ampforge/data/resized_dataset.h"
#include "ampforge/data/transforms.h"
#include "ampforge/memory/global.h"
#include "ampforge/models/models.h"
#include "ampforge/nn/layers.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/lr_scheduler.h"
#include "ampforge/optim/param_groups.h"
#include "ampforge/profiler/profiler.h"
#include "ampforge/tasks/classification.h"
#include "ampforge/tasks/task.h"
#include "ampforge/train/recipe.h"
#include "ampforge/train/trainer.h"
#include "ampforge/util/signals.h"
#include "ampforge/util/thread_pool.h"
