// The task registry (tasks/registry.h) as a newcomer uses it: a task defined here, outside the library (its
// loss, its metric, its synthetic batch), and a model that names it, registered at run time; then trained through
// the public Trainer and timed through `ampforge bench`'s workload path (train/workload.h, train/benchmark.h),
// with no change to train/ or cli/. And the built-in entries: what the programs above tasks/ ask of them.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/generator.h"
#include "ampforge/data/dataset.h"
#include "ampforge/models/registry.h"
#include "ampforge/nn/layers.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/tasks/registry.h"
#include "ampforge/train/benchmark.h"
#include "ampforge/train/recipe.h"
#include "ampforge/train/trainer.h"
#include "ampforge/train/workload.h"

using namespace ampforge;

namespace {

// A binary task: one logit per example, logistic loss against label 0/1, accuracy of the logit's sign.
class BinaryEvaluator final : public tasks::Evaluator {
 public:
  void add(nn::Module& model, const data::Batch& b) override {
    const Tensor logit = reshape(model.forward(b.x), {b.x.size(0)});
    const Tensor predicted = to(gt(logit, ops::zeros({}, DType::F32, logit.device())), DType::I64);
    correct_ += sum(to(eq(predicted, b.y), DType::F32)).item();
    n_ += static_cast<double>(b.x.size(0));
  }
  tasks::Metrics result() override { return {{"binary_accuracy", n_ > 0 ? correct_ / n_ : 0.0, true}}; }

 private:
  double correct_ = 0, n_ = 0;
};

class BinaryTask final : public tasks::Task {
 public:
  std::string name() const override { return "binary"; }
  Tensor loss(nn::Module& model, const data::Batch& b) override {
    const Tensor logit = reshape(model.forward(b.x), {b.x.size(0)});
    return binary_cross_entropy_with_logits(logit, to(b.y, DType::F32));
  }
  std::unique_ptr<tasks::Evaluator> evaluator() const override { return std::make_unique<BinaryEvaluator>(); }
  std::string primary_metric() const override { return "binary_accuracy"; }
};

data::Batch binary_synthetic_batch(const models::ModelOptions& mo, const tasks::SyntheticBatchOptions& o) {
  Generator gen(o.seed + 1);
  data::Batch b;
  b.x = randn({o.batch, mo.in_channels, mo.image_size, mo.image_size}, DType::F32, kCPU, &gen);
  std::vector<int64_t> y(static_cast<size_t>(o.batch));
  for (int64_t i = 0; i < o.batch; ++i) y[static_cast<size_t>(i)] = i % 2;
  b.y = Tensor::from_vector(y);
  return b;
}

// Registered once per process (the registries refuse a second registration of a name).
void register_binary_task_and_model() {
  static const bool done = [] {
    tasks::task_registry().add({"binary", tasks::InputKind::Images, "logistic loss on one logit (a test's task)",
                                [](const models::ModelOptions&) { return std::make_shared<BinaryTask>(); },
                                binary_synthetic_batch});
    models::ModelEntry e;
    e.name = "test-logit";
    e.task = "binary";
    e.description = "flatten + one linear logit (a test's model)";
    e.defaults = {1, 2, 4};  // 1 channel, 2 classes, 4x4 images
    e.build = [](const models::ModelOptions& o) -> nn::ModulePtr {
      auto seq = std::make_shared<nn::Sequential>();
      seq->push_back(std::make_shared<nn::Flatten>());
      seq->push_back(std::make_shared<nn::Linear>(o.in_channels * o.image_size * o.image_size, 1));
      return seq;
    };
    models::model_registry().add(std::move(e));
    return true;
  }();
  (void)done;
}

}  // namespace

TEST(TaskRegistry, BuiltInTasksSayWhatTheirModelsTake) {
  const auto& reg = tasks::task_registry();
  EXPECT_EQ(reg.at("classification").input, tasks::InputKind::Images);
  EXPECT_EQ(reg.at("detection").input, tasks::InputKind::Images);
  EXPECT_EQ(reg.at("masked_lm").input, tasks::InputKind::TokenIds);
  // Every registered model's task is registered (a model naming an unknown task would fail in bench and export).
  for (const auto& m : models::model_registry().entries()) EXPECT_NE(reg.find(m.task), nullptr) << m.name;
  try {
    reg.at("segmentation");
    FAIL() << "an unknown task must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown task 'segmentation' (registered: classification"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(tasks::input_description(reg.at("masked_lm"), {1, 30522, 128}), "seq 128");
  EXPECT_EQ(tasks::input_description(reg.at("classification"), {3, 1000, 224}), "3x224x224");
  tasks::TaskRegistry mine;
  EXPECT_THROW(mine.add({"", tasks::InputKind::Images, "", nullptr, nullptr}), Error);
  EXPECT_THROW(mine.add({"x", tasks::InputKind::Images, "", nullptr, binary_synthetic_batch}), Error) << "no make";
}

TEST(TaskRegistry, ATaskDefinedOutsideTheLibraryTrainsThroughTheTrainer) {
  register_binary_task_and_model();
  const models::ModelEntry& entry = models::model_registry().at("test-logit");
  const tasks::TaskEntry& task = tasks::task_of(entry);
  EXPECT_EQ(task.name, "binary");
  manual_seed(3);
  nn::ModulePtr model = entry.build(entry.defaults);
  train::TrainerOptions o;
  o.epochs = 4;
  o.loader.batch_size = 32;
  o.loader.workers = 0;
  o.loader.normalize = false;
  o.eval_loader = o.loader;
  o.eval_loader.shuffle = false;
  o.progress = o.verbose = false;
  train::Trainer trainer(model, task.make(entry.defaults),
                         [](nn::Module& m) {
                           optim::SGDOptions so;
                           so.lr = 0.1;
                           so.momentum = 0.9;
                           return std::make_unique<optim::SGD>(m.parameters(), so);
                         },
                         o);
  // The synthetic set's label shifts the first channel's mean: learnable by one logit.
  auto train_set = std::make_shared<data::SyntheticDataset>(512, Shape{1, 4, 4}, 2, 11);
  auto test_set = std::make_shared<data::SyntheticDataset>(256, Shape{1, 4, 4}, 2, 12);
  const train::TrainResult r = trainer.fit(train_set, test_set);
  ASSERT_FALSE(r.losses.empty());
  EXPECT_LT(r.losses.back(), r.losses.front()) << "the task's loss is what the loop minimised";
  const double acc = tasks::metric_value(r.eval, "binary_accuracy");
  EXPECT_GT(acc, 0.75) << "the task's own metric, reported by the loop";
}

TEST(TaskRegistry, ATaskDefinedOutsideTheLibraryRunsThroughTheBenchWorkloadPath) {
  register_binary_task_and_model();
  EXPECT_TRUE(train::has_workload("binary"));
  train::WorkloadOptions wo;
  wo.batch = 16;
  train::Workload w = train::make_workload("test-logit", wo);
  EXPECT_EQ(w.task_kind, "binary");
  EXPECT_EQ(w.task->name(), "binary");
  EXPECT_EQ(w.input, "1x4x4");
  EXPECT_EQ(w.batch.x.shape(), (Shape{16, 1, 4, 4}));
  train::BenchmarkOptions bo;
  bo.warmup = 1;
  bo.steps = 2;
  const train::BenchmarkResult r = train::benchmark_training(w, bo);
  EXPECT_EQ(r.step_seconds.size(), 2u);
  EXPECT_GT(r.samples_per_sec, 0);
  EXPECT_TRUE(std::isfinite(r.last_loss));
  EXPECT_NEAR(r.last_loss, std::log(2.0), 0.5) << "a logistic loss near log 2 for an untrained logit";
}

// `ampforge train`'s own path (train/recipe.h): the task's data sets, recipe and factory come from its entry, so a
// task the library has never heard of trains by name with no change to train/.
TEST(TaskRegistry, ATaskDefinedOutsideTheLibraryTrainsByNameThroughTheRecipe) {
  register_binary_task_and_model();
  train::TrainConfig c;
  c.model = "test-logit";
  c.dataset = "synthetic";  // the entry's default list
  c.synthetic_classes = 2;
  c.synthetic_size = 512;
  c.epochs = 3;
  c.batch_size = 32;
  c.lr = 0.05;
  c.workers = 0;
  c.progress = c.verbose = false;
  const train::TrainResult r = train::train(c);
  EXPECT_EQ(r.task, "binary");
  EXPECT_EQ(r.primary_metric, "binary_accuracy");
  EXPECT_GT(tasks::metric_value(r.eval, "binary_accuracy"), 0.7);
  c.dataset = "fashion-mnist";
  try {
    train::train(c);
    FAIL() << "a data set the task does not list must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--model test-logit is a binary model"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--dataset must be synthetic, got 'fashion-mnist'"), std::string::npos)
        << e.what();
  }
}

// A task that needs a model interface (models/task_models.h) refuses another model when the Trainer is made, before
// any step, naming the interface.
TEST(TaskRegistry, AModelWithoutTheTasksInterfaceIsRefusedBeforeTraining) {
  register_binary_task_and_model();
  const models::ModelEntry& entry = models::model_registry().at("test-logit");
  train::TrainerOptions o;
  o.progress = o.verbose = false;
  auto adamw = [](nn::Module& m) { return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions{}); };
  for (const char* task : {"detection", "masked_lm"}) {
    const tasks::TaskEntry& t = tasks::task_registry().at(task);
    try {
      const models::ModelOptions task_options{1, 30522, 16};  // a vocabulary the masked-LM task accepts
      train::Trainer trainer(entry.build(entry.defaults), t.make(task_options), adamw, o);
      FAIL() << task << " accepted a model without its interface";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      const std::string want = t.input == tasks::InputKind::TokenIds ? "models::MaskedLanguageModel" : "models::Detector";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  // The built-in models implement their task's interface.
  for (const char* name : {"yolov8n", "bert-tiny"}) {
    const models::ModelEntry& m = models::model_registry().at(name);
    nn::ModulePtr model = m.build(m.defaults);
    EXPECT_EQ(tasks::task_of(m).make(m.defaults)->model_mismatch(*model), "") << name;
  }
}
