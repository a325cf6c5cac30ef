// Learning-rate schedules, as functions of the step count, applied to every group's lr (each group
// keeps its own base lr): step decay, cosine annealing, linear warm-up (composable with either).
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
  int64_t warmup_steps = 0;  // linear warm-up from 0 to the base lr over the first steps
};

Schedule schedule_from_string(const std::string& s);  // "constant" | "step" | "cosine" | "linear"
const char* schedule_name(Schedule s);

class LRScheduler {
 public:
  LRScheduler(Optimizer& opt, ScheduleOptions o);
  // Sets every group's lr for optimizer step `step` (0-based).
  void apply(int64_t step);
  // The multiplier of the base lr at a step (for logging/tests).
  double factor(int64_t step) const;

 private:
  Optimizer& opt_;
  ScheduleOptions o_;
  std::vector<double> base_;
};

}  // namespace ampforge::optim
