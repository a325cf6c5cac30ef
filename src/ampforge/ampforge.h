// The whole public API in one include.
#pragma once

#include "ampforge/amp/autocast.h"
#include "ampforge/amp/grad_scaler.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/core/generator.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/core/tensor.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/data/dataset.h"
#include "ampforge/models/models.h"
#include "ampforge/nn/layers.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/optim/lr_scheduler.h"
#include "ampforge/train/trainer.h"
#include "ampforge/util/thread_pool.h"
