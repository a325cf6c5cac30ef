// The whole public API in one include. Installed as <prefix>/include/ampforge/ampforge.h; self-contained
// (examples/*.cpp include nothing else of ampforge, and the install test builds them against an installation).
#pragma once

#include "ampforge/amp/autocast.h"
#include "ampforge/amp/grad_scaler.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/core/generator.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/core/tensor.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/data/dataset.h"
#include "ampforge/memory/global.h"
#include "ampforge/models/models.h"
#include "ampforge/nn/layers.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/optim/lr_scheduler.h"
#include "ampforge/profiler/profiler.h"
#include "ampforge/train/trainer.h"
#include "ampforge/util/thread_pool.h"
