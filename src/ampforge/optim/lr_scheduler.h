// Learning-rate schedules, as functions of the step count, applied to every group's lr (each group
// keeps its own base lr): step decay, cosine annealing, linear decay, and a linear warm-up composable with
// any of them. The warm-up ramps each group from its ParamGroup::warmup_start_lr (0 by default; Ultralytics
// starts its bias group at 0.1) to the scheduled lr, and optionally SGD's momentum from warmup_momentum to the
// optimizer's own (Ultralytics: 0.8 -> 0.937).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampforge/optim/optimizer.h"

namespace ampforge::optim {

enum class Schedule { Constant, Step, Cosine, Linear };

struct ScheduleOptions {
  Schedule kind = Schedule::Constant;
  int64_t total_steps = 0;   // cosine: anneal to min_lr over this many steps; linear: decay to 0 at it
  int64_t step_size = 0;     // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  double min_lr = 0;         // cosine floor (eta_min)
  // Linear and cosine decay to this fraction of the base lr instead of to 0 (Ultralytics' lrf, 0.01).
  double final_factor = 0;
  int64_t warmup_steps = 0;  // linear warm-up from each group's warmup_start_lr to the scheduled lr
  double warmup_momentum = -1;  // >= 0: SGD's momentum ramps from this to its own value during warm-up
};

Schedule schedule_from_string(const std::string& s);  // "constant" | "step" | "cosine" | "linear"

class LRScheduler {
 public:
  LRScheduler(Optimizer& opt, ScheduleOptions o);
  // Sets every group's lr for optimizer step `step` (0-based).
  void apply(int64_t step);
  // The multiplier of the base lr at a step, warm-up included, for a group whose warm-up starts at 0 (for
  // logging/tests).
  double factor(int64_t step) const;
  // The schedule's multiplier alone (no warm-up).
  double decay(int64_t step) const;
  // The warm-up's progress at a step: (step + 1) / warmup_steps during it, 1 afterwards.
  double warmup_ramp(int64_t step) const;

 private:
  Optimizer& opt_;
  ScheduleOptions o_;
  std::vector<double> base_, start_;
  double momentum_ = -1;  // the optimizer's momentum (the warm-up's target); < 0: none
};

}  // namespace ampforge::optim
