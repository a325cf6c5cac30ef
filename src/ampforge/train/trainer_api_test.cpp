// The Trainer as a C++ user drives it: their own Module, Dataset and Task (loss + metrics), gradient
// accumulation, parameter groups, label smoothing and schedules, and the classification task's metrics.
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <cmath>
#include <filesystem>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/generator.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/models/models.h"
#include "ampforge/nn/layers.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/optim/param_groups.h"
#include "ampforge/tasks/classification.h"
#include "ampforge/train/recipe.h"
#include "ampforge/train/trainer.h"

using namespace ampforge;

namespace {

// Two-dimensional points; the class is whether x0 + x1 > 0.
class PointsDataset final : public data::Dataset {
 public:
  PointsDataset(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return Shape{2}; }
  int64_t num_classes() const override { return 2; }
  void get(int64_t i, float* dst) const override {
    auto w = philox4x32(seed_, static_cast<uint64_t>(i));
    dst[0] = static_cast<float>(w[0]) / 4294967296.0f * 2.0f - 1.0f;
    dst[1] = static_cast<float>(w[1]) / 4294967296.0f * 2.0f - 1.0f;
  }
  int64_t label(int64_t i) const override {
    float p[2];
    get(i, p);
    return p[0] + p[1] > 0 ? 1 : 0;
  }
  std::string name() const override { return "points"; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// A user's model: Linear - ReLU - Linear, no normalisation (so micro-batches do not change the maths).
class Mlp final : public nn::Module {
 public:
  Mlp() : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(2, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 2));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(relu((*fc1)(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// A user's task: the Brier score (squared error between softmax probabilities and the one-hot label) as
// the loss, and its own accuracy metric.
class BrierTask final : public tasks::Task {
 public:
  std::string name() const override { return "brier"; }
  Tensor loss(nn::Module& model, const data::Batch& b) override {
    Tensor p = softmax(model(b.x).to(DType::F32), 1);
    Tensor cls = ops::arange(0, 2, 1, DType::I64, p.device()).reshape({1, 2});
    Tensor onehot = eq(cls, b.y.reshape({-1, 1})).to(DType::F32);
    Tensor d = sub(p, onehot);
    return mean(mul(d, d));
  }
  class Eval final : public tasks::Evaluator {
   public:
    void add(nn::Module& model, const data::Batch& b) override {
      correct += sum(eq(argmax(model(b.x), 1), b.y).to(DType::F32)).item();
      total += static_cast<double>(b.y.numel());
    }
    tasks::Metrics result() override { return {{"hit_rate", correct / total, true}}; }
    double correct = 0, total = 0;
  };
  std::unique_ptr<tasks::Evaluator> evaluator() const override { return std::make_unique<Eval>(); }
  std::string primary_metric() const override { return "hit_rate"; }
};

train::TrainerOptions quiet_options() {
  train::TrainerOptions o;
  o.progress = false;
  o.verbose = false;
  o.loader.batch_size = 32;
  o.loader.normalize = false;
  o.eval_loader = o.loader;
  o.eval_loader.batch_size = 256;
  return o;
}

train::OptimizerFactory adamw(double lr) {
  return [lr](nn::Module& m) {
    optim::AdamWOptions ao;
    ao.lr = lr;
    return std::make_unique<optim::AdamW>(m.parameters(), ao);
  };
}

}  // namespace

TEST(TrainerApi, UserModuleDatasetAndLossTrain) {
  manual_seed(1);
  auto model = std::make_shared<Mlp>();
  train::TrainerOptions o = quiet_options();
  o.epochs = 3;
  train::Trainer trainer(model, std::make_shared<BrierTask>(), adamw(1e-2), o);
  const train::TrainResult r =
      trainer.fit(std::make_shared<PointsDataset>(1024, 11), std::make_shared<PointsDataset>(512, 12));
  EXPECT_EQ(r.task, "brier");
  EXPECT_EQ(r.primary_metric, "hit_rate");
  EXPECT_EQ(r.epochs_completed, 3);
  ASSERT_EQ(r.epoch_eval.size(), 3u);
  const double hit = tasks::metric_value(r.eval, "hit_rate");
  EXPECT_GT(hit, 0.9) << "a linearly separable problem";
  EXPECT_LT(r.losses.back(), r.losses.front());
  EXPECT_EQ(r.test_accuracy, 0.0) << "no 'accuracy' metric in this task";
  EXPECT_THROW(trainer.fit(std::make_shared<PointsDataset>(8, 1), nullptr), Error) << "fit runs once";
}

// Ctrl-C during an evaluation (the evaluator asks for the stop, as the signal's watcher would): the evaluation
// stops at the next batch, its partial metrics are not reported, and the epoch's checkpoint is already written.
class StopDuringEvalTask final : public tasks::Task {
 public:
  std::string name() const override { return "brier"; }
  Tensor loss(nn::Module& model, const data::Batch& b) override { return inner_.loss(model, b); }
  class Eval final : public tasks::Evaluator {
   public:
    explicit Eval(int* batches) : batches_(batches) {}
    void add(nn::Module&, const data::Batch&) override {
      ++*batches_;
      train::stop_requested().store(true);
    }
    tasks::Metrics result() override { return {{"hit_rate", 1.0, true}}; }
    int* batches_;
  };
  std::unique_ptr<tasks::Evaluator> evaluator() const override { return std::make_unique<Eval>(&batches); }
  std::string primary_metric() const override { return "hit_rate"; }
  mutable int batches = 0;
  BrierTask inner_;
};

TEST(TrainerApi, CtrlCDuringTheEvaluationStopsItAndKeepsTheEpochsCheckpoint) {
  manual_seed(3);
  const std::filesystem::path ck = std::filesystem::temp_directory_path() /
                                   ("ampforge_stop_eval_" + std::to_string(::getpid()) + ".safetensors");
  auto task = std::make_shared<StopDuringEvalTask>();
  train::TrainerOptions o = quiet_options();
  o.epochs = 3;
  o.eval_loader.batch_size = 64;  // 8 evaluation batches
  o.save = ck.string();
  train::Trainer trainer(std::make_shared<Mlp>(), task, adamw(1e-2), o);
  const train::TrainResult r =
      trainer.fit(std::make_shared<PointsDataset>(256, 11), std::make_shared<PointsDataset>(512, 12));
  EXPECT_EQ(task->batches, 1) << "the evaluation went on after the stop";
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.stopped_reason, "interrupted");
  EXPECT_EQ(r.epochs_completed, 1);
  EXPECT_TRUE(r.eval.empty()) << "metrics of one batch of eight reported";
  EXPECT_TRUE(r.epoch_eval.empty());
  const SafetensorsFile f = load_safetensors(ck.string());
  EXPECT_EQ(f.metadata.at("position"), R"({"batch_in_epoch":0,"epoch":1,"global_step":8})");
  std::filesystem::remove(ck);
  // The request stays: a fit that starts after it runs no step and writes nothing.
  train::Trainer again(std::make_shared<Mlp>(), std::make_shared<BrierTask>(), adamw(1e-2), o);
  const train::TrainResult r2 = again.fit(std::make_shared<PointsDataset>(256, 11), nullptr);
  EXPECT_TRUE(r2.interrupted);
  EXPECT_EQ(r2.steps, 0);
  EXPECT_FALSE(std::filesystem::exists(ck));
  train::stop_requested().store(false);
}

// The stop signals' message says what will happen: before fit() (data still being prepared) no step will run. Each
// test sends a signal no other test of this binary sends, a first time, so the binary also passes in one process.
bool wait_for_stop_request() {
  for (int i = 0; i < 500 && !train::stop_requested().load(); ++i) ::usleep(10000);
  return train::stop_requested().load();
}

TEST(TrainerApi, StopSignalBeforeTrainingSaysNoStepWillRun) {
  train::install_stop_signals();
  testing::internal::CaptureStderr();
  ::kill(::getpid(), SIGTERM);  // to the process: the watcher thread takes it
  ASSERT_TRUE(wait_for_stop_request());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("SIGTERM: stopping before training starts (SIGTERM again to stop at once)"), std::string::npos)
      << err;
  train::Trainer trainer(std::make_shared<Mlp>(), std::make_shared<BrierTask>(), adamw(1e-2), quiet_options());
  const train::TrainResult r = trainer.fit(std::make_shared<PointsDataset>(256, 11), nullptr);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.steps, 0);
  EXPECT_EQ(train::stop_signal(), SIGTERM);
  train::stop_requested().store(false);
}

// Sends SIGINT (Ctrl-C) from its second loss, and waits until the stop is asked for: the step in progress is the last.
class SignalAtSecondStepTask final : public tasks::Task {
 public:
  std::string name() const override { return "brier"; }
  Tensor loss(nn::Module& model, const data::Batch& b) override {
    if (++calls == 2) {
      ::kill(::getpid(), SIGINT);
      EXPECT_TRUE(wait_for_stop_request());
    }
    return inner_.loss(model, b);
  }
  std::unique_ptr<tasks::Evaluator> evaluator() const override { return inner_.evaluator(); }
  std::string primary_metric() const override { return "hit_rate"; }
  int calls = 0;
  BrierTask inner_;
};

TEST(TrainerApi, StopSignalDuringTrainingFinishesTheStep) {
  train::install_stop_signals();
  testing::internal::CaptureStderr();
  auto task = std::make_shared<SignalAtSecondStepTask>();
  train::Trainer trainer(std::make_shared<Mlp>(), task, adamw(1e-2), quiet_options());
  const train::TrainResult r = trainer.fit(std::make_shared<PointsDataset>(512, 11), nullptr);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("interrupted: stopping after this step (Ctrl-C again to stop at once)"), std::string::npos)
      << err;
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.steps, 2);
  train::stop_requested().store(false);
}

TEST(TrainerApi, AccumulatedMicroBatchesGiveTheFullBatchStep) {
  // 4 steps of batch 32 against 4 steps of 2 x 16 accumulated: the same examples in the same order (the
  // order depends on (seed, epoch) only), so the same mean loss and gradient up to rounding.
  auto run = [](int64_t batch, int64_t accumulate) {
    manual_seed(2);
    train::TrainerOptions o = quiet_options();
    o.loader.batch_size = batch;
    o.accumulate = accumulate;
    o.max_steps = 4;
    train::Trainer t(std::make_shared<Mlp>(), std::make_shared<tasks::ClassificationTask>(), adamw(1e-2), o);
    return t.fit(std::make_shared<PointsDataset>(512, 3), nullptr);
  };
  const train::TrainResult full = run(32, 1), acc = run(16, 2), uneven = run(16, 1);
  ASSERT_EQ(full.losses.size(), 4u);
  ASSERT_EQ(acc.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(acc.losses[i], full.losses[i], 1e-5) << "step " << i;
  EXPECT_GT(std::abs(uneven.losses[3] - full.losses[3]), 1e-4) << "half batches without accumulation differ";
  EXPECT_EQ(acc.train_samples_per_sec > 0, true);
}

TEST(TrainerApi, AccumulationCountsOptimizerStepsPerEpoch) {
  // 10 batches of 16 per epoch, 4 per step: steps of 4, 4, 2 batches.
  manual_seed(3);
  train::TrainerOptions o = quiet_options();
  o.loader.batch_size = 16;
  o.accumulate = 4;
  o.epochs = 2;
  train::Trainer t(std::make_shared<Mlp>(), std::make_shared<tasks::ClassificationTask>(), adamw(1e-2), o);
  const train::TrainResult r = t.fit(std::make_shared<PointsDataset>(160, 4), nullptr);
  EXPECT_EQ(r.steps, 6);
  EXPECT_EQ(t.optimizer().steps(), 6);
}

TEST(TrainerApi, OptionErrorsNameTheOption) {
  auto make = [](train::TrainerOptions o) {
    train::Trainer t(std::make_shared<Mlp>(), std::make_shared<tasks::ClassificationTask>(), adamw(1e-2), o);
  };
  train::TrainerOptions o = quiet_options();
  o.accumulate = 0;
  try {
    make(o);
    FAIL() << "accumulate 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TrainerOptions::accumulate"), std::string::npos) << e.what();
  }
  o = quiet_options();
  o.master_weights = true;
  EXPECT_THROW(make(o), Error);
  EXPECT_THROW(train::Trainer(std::make_shared<Mlp>(), nullptr, adamw(1e-2), quiet_options()), Error);
}

TEST(ClassificationTask, TopKCountsClassesScoringHigherThanTheTruth) {
  // Logits for 3 rows over 6 classes; true classes 0, 1, 5.
  class Fixed final : public nn::Module {
   public:
    Fixed() : Module("Fixed") {}
    Tensor forward(const Tensor&) override {
      return Tensor::from_vector<float>({9, 1, 2, 3, 4, 5,     // class 0 is top-1
                                         6, 5, 4, 3, 2, 1,     // class 1 is second
                                         6, 5, 4, 3, 2, 1},    // class 5 is last (rank 5)
                                        {3, 6});
    }
  } model;
  tasks::ClassificationOptions co;
  co.top_k = 5;
  tasks::ClassificationTask task(co);
  auto ev = task.evaluator();
  data::Batch b{ops::zeros({3, 1}), Tensor::from_vector<int64_t>({0, 1, 5}), Tensor()};
  ev->add(model, b);
  const tasks::Metrics m = ev->result();
  EXPECT_NEAR(tasks::metric_value(m, "accuracy"), 1.0 / 3, 1e-12);
  EXPECT_NEAR(tasks::metric_value(m, "top5_accuracy"), 2.0 / 3, 1e-12);
  EXPECT_GT(tasks::metric_value(m, "loss"), 0);
}

TEST(ClassificationTask, LabelSmoothingChangesOnlyTheTrainingLoss) {
  class Fixed final : public nn::Module {
   public:
    Fixed() : Module("Fixed") {}
    Tensor forward(const Tensor&) override { return Tensor::from_vector<float>({2, 0, -1, 0.5f, 0.5f, 3}, {2, 3}); }
  } model;
  data::Batch b{ops::zeros({2, 1}), Tensor::from_vector<int64_t>({0, 2}), Tensor()};
  tasks::ClassificationTask plain, smooth({.label_smoothing = 0.1});
  const double lp = plain.loss(model, b).item(), ls = smooth.loss(model, b).item();
  // PyTorch: loss = (1 - s) * nll + s * mean_c(-log p_c), per row, averaged.
  const double l0[3] = {2, 0, -1}, l1[3] = {0.5, 0.5, 3};
  auto row = [](const double* l, int y, double s) {
    const double lse = std::log(std::exp(l[0]) + std::exp(l[1]) + std::exp(l[2]));
    double uniform = 0;
    for (int c = 0; c < 3; ++c) uniform += (lse - l[c]) / 3;
    return (1 - s) * (lse - l[y]) + s * uniform;
  };
  EXPECT_NEAR(lp, (row(l0, 0, 0) + row(l1, 2, 0)) / 2, 1e-6);
  EXPECT_NEAR(ls, (row(l0, 0, 0.1) + row(l1, 2, 0.1)) / 2, 1e-6);
  EXPECT_THROW(tasks::ClassificationTask({.label_smoothing = 1.0}), Error);
}

TEST(ParamGroups, NoDecayOnBiasesAndNormWeights) {
  auto seq = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 4, 3), std::make_shared<nn::BatchNorm2d>(4), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(16, 2)});
  const auto groups = optim::decay_groups(*seq, 0.05);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.05);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  ASSERT_EQ(groups[0].params.size(), 2u);  // conv weight, linear weight
  EXPECT_EQ(groups[0].params[0].dim(), 4);
  EXPECT_EQ(groups[0].params[1].dim(), 2);
  EXPECT_EQ(groups[1].params.size(), 4u);  // conv bias, bn weight, bn bias, linear bias
  optim::SGD opt(groups, {.lr = 0.1, .weight_decay = 0.5});
  EXPECT_EQ(opt.param_groups()[0].weight_decay, 0.05);
  EXPECT_EQ(opt.param_groups()[1].weight_decay, 0.0);
}

TEST(LRSchedule, LinearWarmupThenLinearDecayToZero) {
  auto p = ops::zeros({2});
  p.requires_grad_(true);
  optim::SGD opt(std::vector<Tensor>{p}, {.lr = 1.0});
  optim::ScheduleOptions so;
  so.kind = optim::Schedule::Linear;
  so.total_steps = 10;
  so.warmup_steps = 2;
  optim::LRScheduler s(opt, so);
  EXPECT_DOUBLE_EQ(s.factor(0), 0.5);  // warm-up: (step + 1) / warmup
  EXPECT_DOUBLE_EQ(s.factor(1), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(2), 1.0);  // decay starts at the end of the warm-up
  EXPECT_DOUBLE_EQ(s.factor(6), 0.5);
  EXPECT_DOUBLE_EQ(s.factor(10), 0.0);
  EXPECT_DOUBLE_EQ(s.factor(12), 0.0);
  so.total_steps = 2;
  EXPECT_THROW(optim::LRScheduler(opt, so), Error);
  EXPECT_EQ(optim::schedule_from_string("linear"), optim::Schedule::Linear);
}

TEST(LRSchedule, WarmupStartsEachGroupAtItsOwnLrAndRampsMomentum) {
  // Ultralytics' warm-up: the bias group from 0.1 down to its lr, the others from 0 up; SGD momentum 0.8 -> 0.937.
  auto b = ops::zeros({2}), w = ops::zeros({2});
  b.requires_grad_(true);
  w.requires_grad_(true);
  optim::SGD opt({{{b}, 0.01, 0, 0.1}, {{w}, 0.01, 5e-4, 0}}, {.lr = 0.01, .momentum = 0.937, .nesterov = true});
  optim::ScheduleOptions so;
  so.kind = optim::Schedule::Linear;
  so.total_steps = 14;
  so.warmup_steps = 4;
  so.final_factor = 0.01;
  so.warmup_momentum = 0.8;
  optim::LRScheduler s(opt, so);
  s.apply(0);  // ramp 1/4
  EXPECT_NEAR(opt.param_groups()[0].lr, 0.1 + (0.01 - 0.1) * 0.25, 1e-15);
  EXPECT_NEAR(opt.param_groups()[1].lr, 0.01 * 0.25, 1e-15);
  EXPECT_NEAR(opt.momentum(), 0.8 + (0.937 - 0.8) * 0.25, 1e-15);
  s.apply(4);  // warm-up over: both groups on the schedule, momentum at its own value
  EXPECT_NEAR(opt.param_groups()[0].lr, 0.01, 1e-15);
  EXPECT_NEAR(opt.param_groups()[1].lr, 0.01, 1e-15);
  EXPECT_NEAR(opt.momentum(), 0.937, 1e-15);
  s.apply(14);  // the end of a linear decay to lrf
  EXPECT_NEAR(opt.param_groups()[1].lr, 0.01 * 0.01, 1e-15);
  // Momentum warm-up needs momentum; AdamW has none.
  optim::AdamW adam(std::vector<Tensor>{w}, {});
  EXPECT_THROW(optim::LRScheduler(adam, so), Error);
}

TEST(ParamGroups, UltralyticsGroupsOfYolov8nAreTheirCounts) {
  // Ultralytics logs for YOLOv8n: "57 weight(decay=0.0), 64 weight(decay=0.0005), 63 bias(decay=0.0)".
  auto m = models::create("yolov8n");
  const auto g = optim::ultralytics_groups(*m, 5e-4, 0.1);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].params.size(), 63u) << "biases";
  // Ultralytics counts the frozen DFL conv among its 64 (it never gets a gradient); here it stays out.
  EXPECT_EQ(g[1].params.size(), 63u) << "weights with decay";
  EXPECT_EQ(g[2].params.size(), 57u) << "BatchNorm weights";
  EXPECT_EQ(g[0].weight_decay, 0.0);
  EXPECT_EQ(g[0].warmup_start_lr, 0.1);
  EXPECT_EQ(g[1].weight_decay, 5e-4);
  EXPECT_EQ(g[2].weight_decay, 0.0);
  EXPECT_EQ(g[2].warmup_start_lr, 0.0);
  for (const auto& grp : g)
    for (const Tensor& p : grp.params) EXPECT_TRUE(p.requires_grad()) << "the frozen DFL conv stays out";
}

TEST(Recipe, DetectionAutoValuesFollowUltralytics) {
  train::TrainConfig c;
  c.model = "yolov8n";
  c.dataset = "detection";
  c.batch_size = 16;
  c.epochs = 3;
  // 2000 images: ceil(2000 / 64) x 3 = 96 iterations <= 10,000 -> AdamW, lr round(0.002 * 5 / (4 + 10), 6).
  train::TrainConfig r = train::resolve_auto(c, tasks::TrainingRecipe::Ultralytics, 2000, 125, 10);
  EXPECT_EQ(r.optimizer, "adamw");
  EXPECT_DOUBLE_EQ(r.lr, 0.000714);
  EXPECT_EQ(r.warmup_bias_lr, 0.0);
  EXPECT_EQ(r.accumulate, 4);  // round(64 / 16)
  // nw = max(round(3 x 125), 100) = 375 batches = 94 steps of 4, within the run's 32 x 3 = 96 steps.
  EXPECT_EQ(r.warmup_steps, 94);
  EXPECT_EQ(r.schedule, "linear");
  EXPECT_DOUBLE_EQ(r.lrf, 0.01);
  EXPECT_DOUBLE_EQ(r.clip_grad_norm, 10.0);
  EXPECT_EQ(r.ema, "on");
  EXPECT_DOUBLE_EQ(r.momentum, 0.937);
  EXPECT_DOUBLE_EQ(r.weight_decay, 5e-4);
  EXPECT_EQ(r.mosaic, 0.0) << "3 epochs <= close_mosaic 10: no epoch would be without mosaic";
  // COCO-sized: 118,287 images x 100 epochs -> SGD lr 0.01 nesterov; 80 classes would give AdamW 0.000119.
  r = train::resolve_auto(c, tasks::TrainingRecipe::Ultralytics, 118287, 7393, 80);
  EXPECT_EQ(r.optimizer, "adamw") << "3 epochs of COCO: 5,547 iterations";
  EXPECT_DOUBLE_EQ(r.lr, 0.000119);
  c.epochs = 100;
  r = train::resolve_auto(c, tasks::TrainingRecipe::Ultralytics, 118287, 7393, 80);
  EXPECT_EQ(r.optimizer, "sgd");
  EXPECT_DOUBLE_EQ(r.lr, 0.01);
  EXPECT_TRUE(r.nesterov);
  EXPECT_DOUBLE_EQ(r.warmup_bias_lr, 0.1);
  EXPECT_EQ(r.mosaic, 1.0) << "Ultralytics' mosaic 1.0 when epochs > close_mosaic";
  c.close_mosaic = 100;
  EXPECT_EQ(train::resolve_auto(c, tasks::TrainingRecipe::Ultralytics, 2000, 125, 10).mosaic, 0.0);
  c.close_mosaic = 10;
  // Given values are kept; other tasks get the plain defaults.
  c.optimizer = "sgd";
  c.lr = 0.02;
  c.accumulate = 1;
  c.ema = "off";
  r = train::resolve_auto(c, tasks::TrainingRecipe::Ultralytics, 2000, 125, 10);
  EXPECT_EQ(r.optimizer, "sgd");
  EXPECT_DOUBLE_EQ(r.lr, 0.02);
  EXPECT_EQ(r.accumulate, 1);
  EXPECT_EQ(r.ema, "off");
  c.mosaic = 0.25;
  EXPECT_EQ(train::resolve_auto(c, tasks::TrainingRecipe::Ultralytics, 2000, 125, 10).mosaic, 0.25);
  train::TrainConfig plain;
  r = train::resolve_auto(plain, tasks::TrainingRecipe::Plain, 60000, 469, 10);
  EXPECT_EQ(r.mosaic, 0.0);
  EXPECT_EQ(r.optimizer, "adamw");
  EXPECT_EQ(r.accumulate, 1);
  EXPECT_EQ(r.schedule, "cosine");
  EXPECT_EQ(r.ema, "off");
  EXPECT_EQ(r.warmup_steps, 0);
  EXPECT_DOUBLE_EQ(r.clip_grad_norm, 0.0);
  EXPECT_DOUBLE_EQ(r.lrf, 0.0);
}

TEST(TrainerApi, SummedAccumulationAddsTheMicroBatchGradients) {
  // Ultralytics' accumulation: the micro-batches' gradients add up. With SGD (no momentum, no decay) the first
  // step's update is lr x gradient, so summing 2 micro-batches moves the weights twice as far as averaging them.
  auto run = [](bool sum) {
    manual_seed(4);
    auto model = std::make_shared<Mlp>();
    const Tensor before = ops::clone(model->fc2->weight).detach();
    train::TrainerOptions o = quiet_options();
    o.loader.batch_size = 16;
    o.loader.shuffle = false;
    o.accumulate = 2;
    o.accumulate_sum = sum;
    o.max_steps = 1;
    train::Trainer t(model, std::make_shared<tasks::ClassificationTask>(),
                     [](nn::Module& m) { return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1}); },
                     o);
    t.fit(std::make_shared<PointsDataset>(64, 5), nullptr);
    return ops::sub(model->fc2->weight.detach(), before).tolist<float>();
  };
  const std::vector<float> mean = run(false), sum = run(true);
  double worst = 0, largest = 0;
  for (size_t i = 0; i < mean.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(sum[i]) - 2.0 * mean[i]));
    largest = std::max(largest, std::abs(static_cast<double>(mean[i])));
  }
  EXPECT_GT(largest, 1e-4) << "the step moved the weights";
  EXPECT_LE(worst, 1e-3 * largest) << "summed: twice the averaged step (up to the weights' F32 rounding)";
}

// Evaluating the weight average swaps it into the model and writes the model's own weights back: with
// --master-weights the F32 masters must survive that (they did not: the next step restarted them from the BF16
// parameters). Training with an evaluation after every epoch then gives the same losses as training without.
TEST(TrainerApi, EvaluatingTheWeightAverageKeepsTheMasterWeights) {
  auto run = [](bool evaluate) {
    manual_seed(9);
    train::TrainerOptions o = quiet_options();
    o.precision = DType::BF16;
    o.master_weights = true;
    o.ema = {true, 0.9, 0};
    o.epochs = 3;
    train::Trainer t(std::make_shared<Mlp>(), std::make_shared<BrierTask>(), adamw(1e-3), o);
    return t.fit(std::make_shared<PointsDataset>(256, 7),
                 evaluate ? std::make_shared<PointsDataset>(64, 8) : nullptr).losses;
  };
  const std::vector<double> plain = run(false), evaluated = run(true);
  ASSERT_EQ(plain.size(), 24u);
  EXPECT_EQ(evaluated, plain);
}

TEST(TrainerApi, WeightAverageIsEvaluatedSavedAndResumed) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ampforge_ema_" + std::to_string(::getpid()) + ".safetensors")).string();
  auto options = [&](int64_t steps) {
    train::TrainerOptions o = quiet_options();
    o.max_steps = steps;
    o.ema = {true, 0.9, 0};  // constant decay: easy to follow
    o.save = path;
    return o;
  };
  manual_seed(6);
  auto model = std::make_shared<Mlp>();
  train::Trainer first(model, std::make_shared<BrierTask>(), adamw(1e-2), options(3));
  const train::TrainResult r1 = first.fit(std::make_shared<PointsDataset>(256, 7), std::make_shared<PointsDataset>(64, 8));
  EXPECT_EQ(r1.ema_updates, 3);
  const SafetensorsFile f = load_safetensors(path);
  EXPECT_EQ(f.metadata.at("ema_updates"), "3");
  ASSERT_TRUE(f.contains("ema.fc2.weight"));
  ASSERT_TRUE(f.contains("model.fc2.weight"));
  const std::vector<float> avg = f.at("ema.fc2.weight").tolist<float>(), cur = f.at("model.fc2.weight").tolist<float>();
  double diff = 0;
  for (size_t i = 0; i < avg.size(); ++i) diff = std::max(diff, std::abs(static_cast<double>(avg[i]) - cur[i]));
  EXPECT_GT(diff, 0.0) << "the average lags the weights";
  // Resumed: the average comes back and keeps counting.
  auto again = std::make_shared<Mlp>();
  train::TrainerOptions o = options(5);
  o.resume = path;
  train::Trainer second(again, std::make_shared<BrierTask>(), adamw(1e-2), o);
  const train::TrainResult r2 = second.fit(std::make_shared<PointsDataset>(256, 7), std::make_shared<PointsDataset>(64, 8));
  EXPECT_EQ(r2.ema_updates, 5);
  std::filesystem::remove(path);
}
