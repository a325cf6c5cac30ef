// The search behind `ampforge memory fit`: the largest batch size whose training step fits a memory budget,
// and where the memory goes at that batch. docs/MEMORY.md ("Fit finder") describes the command.
//
// A probe runs a training step at one batch size under the budget and says whether it fitted. Here, a probe
// is only a callback. That keeps this file free of anything above memory/: the CLI's probe runs the
// trainer's own step (train/step.h), and the tests use made-up memory models.
//
// Search (fit_search), keeping "lo fits, hi fails" until hi = lo + 1:
//   - grow: batch 1, 2, 4, ... (capped at max_batch) until a probe fails. Small batches are cheap, and a
//     probe that runs out of memory stops there, so the failing probe at 2 lo costs less than a full one.
//   - predict: memory is close to linear in the batch, so the next probe is where the two largest fitting
//     probes say the budget runs out (their live bytes per example, and the headroom at the larger one);
//   - check: then one probe a window w further out, on the other side: w covers the prediction's error
//     (reserved memory grows in whole granules), so the two usually bracket the answer to within w;
//   - bisect: bisection finishes, and takes over whenever there is no usable prediction.
// So the costly probes near the answer are typically four or five instead of log2(answer). With
// FitSearchOptions::quick they are also cheaper (one training step), and one full probe confirms the answer.
// The answer is exact for the probes: `best` fitted and `best + 1` was probed and did not (unless
// `limited`: max_batch itself fitted). If memory use were not monotonic in the batch size, the result would
// still satisfy that, but a larger batch elsewhere might fit too.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/memory/provider.h"

namespace ampforge::memory {

// Bytes measured by a probe that fitted. "Live" bytes are requested sizes (the allocator's `requested`
// figure: what an ideal allocator would hold); "reserved" is what the budget is charged.
struct FitMeasure {
  int64_t parameters = 0;       // parameters and module buffers (e.g. BatchNorm's running statistics)
  int64_t gradients = 0;        // the flat gradient buffers
  int64_t optimizer_state = 0;  // moments / momentum, and F32 master weights in master-weight mode
  int64_t inputs = 0;           // the batch itself (images and labels)
  int64_t activations = 0;      // live bytes the forward pass adds (saved for backward, logits, loss, autocast's
                                // 16-bit weight copies): the largest over the probe's steps
  int64_t peak_live = 0;        // the most bytes live at once during the probe
  int64_t peak_reserved = 0;    // the most bytes reserved at once (charged to the budget)
};

// The breakdown of peak reserved memory at one batch size. Every part is >= 0 and they sum to `total`.
struct FitBreakdown {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0, inputs = 0, activations = 0;
  int64_t workspace = 0;      // the rest of peak live: transients above the saved activations (gradients of
                              // activations in backward, the optimizer's temporaries, scaler state, ...)
  int64_t fragmentation = 0;  // peak reserved - peak live: memory reserved but never live at the peak
  int64_t total = 0;          // peak reserved
};
FitBreakdown fit_breakdown(const FitMeasure& m);

struct FitProbe {
  int64_t batch = 0;
  bool fits = false;
  bool full = true;           // a full probe (every step), or a quick one (the first step only)
  double seconds = 0;
  int64_t peak_live = 0;      // over the probe (for a failed probe: up to the failure)
  int64_t peak_reserved = 0;
  int64_t peak_allocated = 0;  // rounded block sizes (AllocatorStats::allocated), for comparing devices
  int64_t step_peak_allocated = 0;  // the same during the training steps only (0 when building failed)
  FitMeasure measure;         // when it fits
  std::string oom_report;     // when it does not: the OutOfMemory error's report
};

struct FitSearchOptions {
  int64_t budget = 0;                 // bytes; used to predict where the budget runs out
  int64_t max_batch = 65536;          // never probe above this
  int64_t granule = kHostGranule;     // reserved memory grows in these steps (the prediction's resolution)
  bool interpolate = true;            // false: growth and bisection only
  // Search with quick probes and confirm the answer with a full one. Sound because a full probe starts
  // with exactly the quick probe's work on an identical fresh allocator: a quick failure is a full failure.
  // If the confirmation fails (the later steps need more), full probes search down from it: 1, 2, 4, ...
  // below until one fits, then bisection.
  bool quick = false;
};

struct FitResult {
  int64_t best = 0;             // the largest batch that fitted; 0 when batch 1 did not
  int64_t first_failing = 0;    // the smallest batch that failed (best + 1 unless limited); 0 when none failed
  bool limited = false;         // max_batch fitted: the budget may hold a larger batch
  std::vector<FitProbe> probes;  // in the order they ran
  // The probe at `best` / at `first_failing`, or nullptr.
  const FitProbe* best_probe() const;
  const FitProbe* failing_probe() const;
};

// Runs one probe: a full one (every step) or, when `full` is false, a quick one (the first step only).
using FitProbeFn = std::function<FitProbe(int64_t batch, bool full)>;
// Called after each probe; `phase` is "grow", "predict", "check", "bisect", "confirm" or "down".
using FitProgressFn = std::function<void(const FitProbe& probe, const char* phase)>;

// Throws InvalidArgument for max_batch < 1 or budget < 0.
FitResult fit_search(const FitProbeFn& probe, const FitSearchOptions& options, const FitProgressFn& progress = {});

// JSON of the search (probes, best, breakdown in bytes) and the human text of a breakdown.
nlohmann::json fit_result_to_json(const FitResult& r, int64_t budget);
std::string fit_breakdown_format(const FitBreakdown& b, int64_t budget);

}  // namespace ampforge::memory
