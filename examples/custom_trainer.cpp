// Bring your own model, data and loss: a user-defined nn::Module, data::Dataset and tasks::Task trained by
// ampforge's Trainer (mixed precision, schedules, checkpoints, progress come with it). Run with no
// arguments; exits 0 when the model learned (test accuracy above 90%), 1 otherwise.
#include <cmath>
#include <cstdio>

#include "ampforge/ampforge.h"
namespace af = ampforge;

// Points on three concentric rings; the class is the ring.
class Rings final : public af::data::Dataset {
 public:
  Rings(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  int64_t size() const override { return n_; }
  af::Shape example_shape() const override { return {2}; }
  int64_t num_classes() const override { return 3; }
  void get(int64_t i, float* xy) const override {
    const auto w = af::philox4x32(seed_, static_cast<uint64_t>(i));
    const double angle = w[0] / 4294967296.0 * 2 * M_PI;
    const double radius = 1.0 + static_cast<double>(label(i)) + 0.3 * (w[1] / 4294967296.0 - 0.5);
    xy[0] = static_cast<float>(radius * std::cos(angle));
    xy[1] = static_cast<float>(radius * std::sin(angle));
  }
  int64_t label(int64_t i) const override { return af::philox4x32(seed_ + 1, static_cast<uint64_t>(i))[0] % 3; }
  std::string name() const override { return "rings"; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// A two-layer perceptron with a GELU.
class Net final : public af::nn::Module {
 public:
  Net() : Module("Net") {
    hidden = register_module("hidden", std::make_shared<af::nn::Linear>(2, 64));
    out = register_module("out", std::make_shared<af::nn::Linear>(64, 3));
  }
  af::Tensor forward(const af::Tensor& x) override { return (*out)(af::gelu((*hidden)(x))); }
  std::shared_ptr<af::nn::Linear> hidden, out;
};

// The loss is the user's: a multi-class hinge (Crammer-Singer) loss, max(0, 1 + best wrong score - true
// score), averaged; evaluation reports accuracy.
class HingeTask final : public af::tasks::Task {
 public:
  std::string name() const override { return "hinge-classification"; }
  af::Tensor loss(af::nn::Module& model, const af::data::Batch& b) override {
    af::Tensor scores = model(b.x).to(af::DType::F32);  // (N, 3)
    af::Tensor classes = af::arange(0, 3, 1, af::DType::I64, scores.device()).reshape({1, 3});
    af::Tensor is_true = af::eq(classes, b.y.reshape({-1, 1}));  // (N, 3)
    af::Tensor truth = af::sum(af::where(is_true, scores, af::zeros_like(scores)), {1});
    af::Tensor wrong = af::amax(af::where(is_true, af::full(scores.shape(), -1e9, scores.dtype(), scores.device()), scores), {1});
    return af::mean(af::relu(af::add(af::sub(wrong, truth), 1.0)));
  }
  class Accuracy final : public af::tasks::Evaluator {
   public:
    void add(af::nn::Module& model, const af::data::Batch& b) override {
      correct_ += af::sum(af::eq(af::argmax(model(b.x), 1), b.y).to(af::DType::F32)).item();
      total_ += static_cast<double>(b.y.numel());
    }
    af::tasks::Metrics result() override { return {{"accuracy", correct_ / total_, true}}; }

   private:
    double correct_ = 0, total_ = 0;
  };
  std::unique_ptr<af::tasks::Evaluator> evaluator() const override { return std::make_unique<Accuracy>(); }
  std::string primary_metric() const override { return "accuracy"; }
};

int main() {
  af::manual_seed(0);
  af::train::TrainerOptions opt;
  opt.epochs = 8;
  opt.precision = af::DType::BF16;          // autocast, as torch.autocast(dtype=torch.bfloat16)
  opt.schedule.kind = af::optim::Schedule::Cosine;
  opt.schedule.warmup_steps = 10;
  opt.loader.batch_size = 64;
  opt.loader.normalize = false;
  opt.eval_loader = opt.loader;
  opt.progress = false;
  af::train::Trainer trainer(std::make_shared<Net>(), std::make_shared<HingeTask>(),
                             [](af::nn::Module& m) {
                               // AdamW with no weight decay on the biases (optim/param_groups.h).
                               return std::make_unique<af::optim::AdamW>(af::optim::decay_groups(m, 0.01),
                                                                        af::optim::AdamWOptions{.lr = 1e-2});
                             },
                             opt);
  const af::train::TrainResult r =
      trainer.fit(std::make_shared<Rings>(4096, 1), std::make_shared<Rings>(1024, 2));
  const double acc = af::tasks::metric_value(r.eval, "accuracy");
  std::printf("custom_trainer: %lld steps, final loss %.4f, test accuracy %.2f%%\n",
              static_cast<long long>(r.steps), r.final_train_loss, 100.0 * acc);
  return acc > 0.9 ? 0 : 1;
}
