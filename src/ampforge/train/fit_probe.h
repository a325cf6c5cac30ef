// The probe of `ampforge memory fit` (memory/fit.h searches with it; docs/MEMORY.md, "Fit finder"): training
// steps of a registered model at one batch size in a fresh caching allocator whose capacity is the budget, and
// the memory they used. Also what `ampforge bench --max-batch` and the meta-device check run.
//
// A probe builds the workload (train/workload.h: the model at its registry input or `image_size`, its task, a
// synthetic batch), then the optimizer and GradScaler exactly as `ampforge train` builds them
// (train::make_optimizer, train::grad_scaler_options), and runs train::train_step, the trainer's own step.
// Where:
//   cpu   real steps: the allocator is the ampforge policy over a budgeted host provider, installed as the
//         CPU allocator for the probe (model, batch and step all live in it); the budget is real memory;
//   meta  the same steps on the meta device (backends/meta/meta.h): a fresh MetaSession standing for
//         `stands_for`, with the budget as its capacity; the model is built on the CPU without drawing its
//         values and moved there. No data, no arithmetic: seconds at any batch.
// OutOfMemory anywhere (building included) means "does not fit"; every tensor is dropped before the allocator
// is inspected and the allocator is discarded, so probes do not influence each other.
#pragma once

#include <cstdint>

#include "ampforge/core/device.h"
#include "ampforge/memory/fit.h"
#include "ampforge/train/recipe.h"

namespace ampforge::train {

struct FitProbeSetup {
  TrainConfig cfg;          // model, optimizer, precision, master weights, seed: as `ampforge train` uses them
  Device device = kCPU;     // kCPU or kMeta
  DeviceType stands_for = DeviceType::CUDA;  // meta only: whose allocator rules and kernel scratch are modelled
  int64_t budget = 0;       // bytes (> 0)
  int64_t steps = 2;        // training steps of a full probe (a quick one runs the first only)
  int64_t image_size = 0;   // 0: the model's registry input
  int64_t seq_len = 128;    // masked-LM models
  bool channels_last = true;  // images in channels-last layout (what the data loader delivers)
};

// One probe at `batch`: all `setup.steps` steps when `full`, else the first one. Throws what is not
// OutOfMemory (bad names, a task without a synthetic batch: InvalidArgument / NotImplemented).
// FitProbe::measure holds the breakdown's parts when it fits; peaks always (up to the failure when not).
memory::FitProbe run_fit_probe(const FitProbeSetup& setup, int64_t batch, bool full);

}  // namespace ampforge::train
