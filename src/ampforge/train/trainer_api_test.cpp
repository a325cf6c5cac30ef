// The Trainer as a C++ user drives it: their own Module, Dataset and Task (loss + metrics), gradient
// accumulation, parameter groups, label smoothing and schedules, and the classification task's metrics.
#include <gtest/gtest.h>

#include <cmath>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/generator.h"
#include "ampforge/nn/layers.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/optim/param_groups.h"
#include "ampforge/tasks/classification.h"
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
    EXPECT_NE(std::string(e.what()).find("--accumulate"), std::string::npos) << e.what();
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
  data::Batch b{ops::zeros({3, 1}), Tensor::from_vector<int64_t>({0, 1, 5})};
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
  data::Batch b{ops::zeros({2, 1}), Tensor::from_vector<int64_t>({0, 2})};
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
