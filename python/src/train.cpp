// ampforge.train: the C++ Trainer over a Python (or C++) model, data set and loss, and `ampforge train` by names.
//
// Ctrl-C: fit() runs on a thread of its own, started with every asynchronous signal blocked (so are the threads it
// starts: its OpenMP team, the loader's workers), while the calling (main) thread waits without the GIL and, every
// 50 ms, takes it and lets Python run its signal handlers (PyErr_CheckSignals). When a handler raises
// (KeyboardInterrupt), the Trainer's stop flag (train/stop.h) is set: the run finishes its current step, writes its
// checkpoint (when `save` is set) and returns, and then the exception is raised here. A model's Python forward or a
// Python data set runs on the training thread under the GIL, where Python never runs signal handlers, so the
// interrupt never lands in the middle of a step.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common.h"

#include "ampforge/train/recipe.h"
#include "ampforge/train/step.h"
#include "ampforge/train/stop.h"

namespace ampforge::python {

std::shared_ptr<const af::data::Dataset> dataset_from_python(nb::handle obj);  // data.cpp

// Runs fn() on a training thread; see the top of this file. Called with the GIL held.
template <class R>
R run_interruptible(const std::function<R()>& fn) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::optional<R> result;
  std::thread worker;
  {
    const af::ScopedSignalBlock block(af::asynchronous_signals());  // inherited by the thread
    worker = std::thread([&] {
      try {
        result.emplace(fn());
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu);
      done = true;
      cv.notify_all();
    });
  }
  std::optional<nb::python_error> interrupt;
  for (;;) {
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lk(mu);
      if (cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return done; })) break;
    }
    if (!interrupt && PyErr_CheckSignals() != 0) {
      interrupt.emplace();  // takes the raised exception (KeyboardInterrupt, or what the user's handler raised)
      af::train::stop_requested().store(true);
    }
  }
  {
    nb::gil_scoped_release release;
    worker.join();
  }
  if (interrupt) {
    af::train::stop_requested().store(false);
    throw *interrupt;
  }
  if (error) std::rethrow_exception(error);
  return std::move(*result);
}

namespace {

nb::dict metrics_dict(const af::tasks::Metrics& m) {
  nb::dict d;
  for (const auto& x : m) d[x.name.c_str()] = x.value;
  return d;
}

nb::dict result_dict(const af::train::TrainResult& r) {
  nb::dict d;
  d["model"] = r.model, d["dataset"] = r.dataset, d["precision"] = r.precision, d["task"] = r.task;
  d["epochs_completed"] = r.epochs_completed, d["steps"] = r.steps, d["parameters"] = r.parameters;
  d["eval"] = metrics_dict(r.eval);
  nb::list per_epoch;
  for (const auto& m : r.epoch_eval) per_epoch.append(metrics_dict(m));
  d["epoch_eval"] = per_epoch;
  d["primary_metric"] = r.primary_metric;
  d["test_accuracy"] = r.test_accuracy, d["test_loss"] = r.test_loss, d["final_train_loss"] = r.final_train_loss;
  d["epoch_accuracy"] = r.epoch_accuracy;
  d["train_samples_per_sec"] = r.train_samples_per_sec, d["wall_seconds"] = r.wall_seconds;
  d["train_seconds"] = r.train_seconds, d["data_wait_seconds"] = r.data_wait_seconds;
  d["peak_memory_bytes"] = r.peak_memory_bytes, d["device"] = r.device;
  d["losses"] = r.losses;
  d["loss_scale"] = r.loss_scale, d["skipped_steps"] = r.skipped_steps, d["overflow_events"] = r.overflow_events;
  d["interrupted"] = r.interrupted, d["stopped_reason"] = r.stopped_reason, d["checkpoint"] = r.checkpoint;
  return d;
}

// The task of a Python loss: loss(model(x), y) in training; evaluation reports the mean loss and, for (N, C) outputs
// against (N) labels, the accuracy.
class PyLossTask final : public af::tasks::Task {
 public:
  explicit PyLossTask(nb::handle loss) : loss_(loss) {}
  std::string name() const override { return "python_loss"; }
  af::Tensor loss(af::nn::Module& model, const af::data::Batch& batch) override {
    const af::Tensor out = model.forward(batch.x);
    return call(out, batch.y);
  }
  std::unique_ptr<af::tasks::Evaluator> evaluator() const override { return std::make_unique<Eval>(this); }
  std::string primary_metric() const override { return "loss"; }
  std::string cuda_graph_obstacle() const override { return "the loss is a Python function"; }

 private:
  af::Tensor call(const af::Tensor& out, const af::Tensor& y) const {
    nb::gil_scoped_acquire gil;
    nb::object r = nb::borrow<nb::callable>(loss_.get())(out, y);
    if (!nb::isinstance<af::Tensor>(r)) throw nb::type_error("the loss function must return an ampforge Tensor");
    return nb::cast<af::Tensor>(r);
  }
  struct Eval final : af::tasks::Evaluator {
    explicit Eval(const PyLossTask* t) : task(t) {}
    void add(af::nn::Module& model, const af::data::Batch& batch) override {
      const af::Tensor out = model.forward(batch.x);
      const int64_t n = batch.y.numel();
      loss_sum += task->call(out, batch.y).item() * static_cast<double>(n);
      count += n;
      if (out.dim() == 2 && batch.y.dim() == 1 && out.size(0) == n) {
        correct += af::sum(af::eq(af::argmax(out, 1), batch.y).to(af::DType::F64)).item();
        with_accuracy = true;
      }
    }
    af::tasks::Metrics result() override {
      af::tasks::Metrics m{{"loss", count ? loss_sum / static_cast<double>(count) : 0.0, false}};
      if (with_accuracy) m.push_back({"accuracy", count ? correct / static_cast<double>(count) : 0.0, true});
      return m;
    }
    const PyLossTask* task;
    double loss_sum = 0, correct = 0;
    int64_t count = 0;
    bool with_accuracy = false;
  };
  PyObjectRef loss_;
};

struct PyTrainer {
  std::unique_ptr<af::train::Trainer> trainer;
};

// The Trainer's own step (train/step.h) on a batch the caller gives: schedule-free, one micro-batch, classification.
struct TrainStep {
  af::nn::ModulePtr model;
  af::tasks::ClassificationTask task;
  std::unique_ptr<af::optim::Optimizer> opt;
  af::amp::GradScaler scaler;
  af::train::StepOptions options;
};

af::DType precision_from(nb::handle h) {
  if (nb::isinstance<af::DType>(h)) return nb::cast<af::DType>(h);
  return af::dtype_from_string(nb::cast<std::string>(h));
}

}  // namespace

void init_train(nb::module_& m) {
  nb::class_<PyTrainer>(
      m, "Trainer",
      "The C++ training loop over a model (a Python nn.Module subclass or a built-in one), a loss and data sets: "
      "epochs, evaluation, mixed precision (autocast, GradScaler for float16), checkpoints with exact resume, "
      "Ctrl-C (KeyboardInterrupt after the current step, checkpoint written).")
      .def("__init__",
           [](PyTrainer* self, const af::nn::ModulePtr& model, nb::handle loss, const std::string& optimizer,
              double lr, std::optional<double> weight_decay, std::optional<double> momentum, int64_t epochs,
              int64_t batch_size, nb::handle precision, int64_t max_steps, const std::string& schedule,
              int64_t warmup_steps, double clip_grad_norm, double label_smoothing, const std::string& save,
              const std::string& resume, bool progress, bool verbose, std::optional<af::Device> device, int workers,
              uint64_t seed, bool channels_last, int64_t eval_batch_size, std::optional<std::vector<float>> mean,
              std::optional<std::vector<float>> std_) {
             std::shared_ptr<af::tasks::Task> task;
             if (loss.is_none()) {
               af::tasks::ClassificationOptions co;
               co.label_smoothing = label_smoothing;
               task = std::make_shared<af::tasks::ClassificationTask>(co);
             } else {
               if (!PyCallable_Check(loss.ptr())) throw nb::type_error("loss must be None or a callable (out, y) -> loss");
               task = std::make_shared<PyLossTask>(loss);
             }
             af::train::TrainerOptions o;
             o.epochs = epochs, o.max_steps = max_steps, o.precision = precision_from(precision);
             o.save = save, o.resume = resume, o.progress = progress, o.verbose = verbose;
             o.clip_grad_norm = clip_grad_norm;
             o.schedule.kind = af::optim::schedule_from_string(schedule);
             o.schedule.warmup_steps = warmup_steps;
             o.device = device.value_or(af::kCPU);
             o.loader.batch_size = batch_size, o.loader.workers = workers, o.loader.seed = seed;
             o.loader.format = channels_last ? af::MemoryFormat::ChannelsLast : af::MemoryFormat::Contiguous;
             if (mean) o.loader.mean = *mean;
             if (std_) o.loader.std = *std_;
             o.eval_loader = o.loader;
             o.eval_loader.shuffle = false;
             o.eval_loader.batch_size = eval_batch_size;
             af::train::TrainConfig cfg;
             cfg.optimizer = optimizer, cfg.lr = lr;
             cfg.weight_decay = weight_decay.value_or(-1);
             cfg.momentum = momentum.value_or(optimizer == "sgd" ? 0.9 : -1);
             cfg.seed = seed;
             auto factory = [cfg](af::nn::Module& mm) { return af::train::make_optimizer(cfg, mm); };
             new (self) PyTrainer{};
             EngineCall call;
             self->trainer = std::make_unique<af::train::Trainer>(model, task, factory, o);
           },
           nb::arg("model"), nb::arg("loss") = nb::none(), nb::kw_only(), nb::arg("optimizer") = "adamw",
           nb::arg("lr") = 1e-3, nb::arg("weight_decay") = nb::none(), nb::arg("momentum") = nb::none(),
           nb::arg("epochs") = 1, nb::arg("batch_size") = 128, nb::arg("precision") = "fp32",
           nb::arg("max_steps") = -1, nb::arg("schedule") = "constant", nb::arg("warmup_steps") = 0,
           nb::arg("clip_grad_norm") = 0.0, nb::arg("label_smoothing") = 0.0, nb::arg("save") = "",
           nb::arg("resume") = "", nb::arg("progress") = true, nb::arg("verbose") = true,
           nb::arg("device") = nb::none(), nb::arg("workers") = 1, nb::arg("seed") = 0,
           nb::arg("channels_last") = true, nb::arg("eval_batch_size") = 1000, nb::arg("mean") = nb::none(),
           nb::arg("std") = nb::none(),
           "loss None: classification (cross-entropy, accuracy). precision: 'fp32' | 'fp16' (with a GradScaler) | "
           "'bf16'. optimizer: 'adamw' | 'sgd'. mean/std: the loader's normalisation (default: the training set's).")
      .def("fit",
           [](PyTrainer& t, nb::handle train_data, nb::handle eval_data) {
             auto train_ds = dataset_from_python(train_data);
             auto eval_ds = eval_data.is_none() ? nullptr : dataset_from_python(eval_data);
             af::train::Trainer* tr = t.trainer.get();
             const af::train::TrainResult r = run_interruptible<af::train::TrainResult>(
                 [tr, train_ds, eval_ds] { return tr->fit(train_ds, eval_ds); });
             return result_dict(r);
           },
           nb::arg("train_data"), nb::arg("eval_data") = nb::none(),
           "Trains (once per Trainer) and returns the summary as a dict (eval metrics, losses, samples/s, ...).")
      .def_prop_ro("optimizer", [](PyTrainer& t) -> af::optim::Optimizer& { return t.trainer->optimizer(); },
                   nb::rv_policy::reference_internal);

  nb::class_<TrainStep>(m, "TrainStep",
                        "One training step exactly as the Trainer runs it (train/step.h: zero_grad, forward and "
                        "cross-entropy under autocast, loss.item(), scaled backward, scaler step and update), on a "
                        "batch you give: what the Python loop is compared with (python/bench/step_bench.py).")
      .def("__init__",
           [](TrainStep* self, const af::nn::ModulePtr& model, nb::handle precision, const std::string& optimizer,
              double lr) {
             af::train::TrainConfig cfg;
             cfg.optimizer = optimizer, cfg.lr = lr;
             const af::DType p = precision_from(precision);
             new (self) TrainStep{model, af::tasks::ClassificationTask{}, nullptr,
                                  af::amp::GradScaler(af::train::grad_scaler_options(p)), {}};
             self->options.precision = p;
             EngineCall call;
             self->opt = af::train::make_optimizer(cfg, *model);
           },
           nb::arg("model"), nb::arg("precision") = "fp32", nb::arg("optimizer") = "adamw", nb::arg("lr") = 1e-3)
      .def("__call__",
           [](TrainStep& s, const af::Tensor& x, const af::Tensor& y) {
             af::data::Batch b;
             b.x = x, b.y = y;
             EngineCall call;
             return af::train::train_step(*s.model, s.task, *s.opt, s.scaler, b, s.options).loss;
           },
           nb::arg("x"), nb::arg("y"), "Runs one step; returns the loss.");

  m.def("train_by_name",
        [](nb::kwargs kwargs) {
          af::train::TrainConfig cfg;
          cfg.progress = false;
          for (auto [k, v] : kwargs) {
            const std::string key = nb::cast<std::string>(k);
            if (key == "model") cfg.model = nb::cast<std::string>(v);
            else if (key == "dataset") cfg.dataset = nb::cast<std::string>(v);
            else if (key == "data_dir") cfg.data_dir = nb::cast<std::string>(v);
            else if (key == "epochs") cfg.epochs = nb::cast<int64_t>(v);
            else if (key == "max_steps") cfg.max_steps = nb::cast<int64_t>(v);
            else if (key == "batch_size") cfg.batch_size = nb::cast<int64_t>(v);
            else if (key == "lr") cfg.lr = nb::cast<double>(v);
            else if (key == "optimizer") cfg.optimizer = nb::cast<std::string>(v);
            else if (key == "precision") cfg.precision = precision_from(v);
            else if (key == "schedule") cfg.schedule = nb::cast<std::string>(v);
            else if (key == "save") cfg.save = nb::cast<std::string>(v);
            else if (key == "resume") cfg.resume = nb::cast<std::string>(v);
            else if (key == "seed") cfg.seed = nb::cast<uint64_t>(v);
            else if (key == "device") cfg.device = nb::cast<std::string>(v);
            else if (key == "progress") cfg.progress = nb::cast<bool>(v);
            else if (key == "verbose") cfg.verbose = nb::cast<bool>(v);
            else if (key == "synthetic_size") cfg.synthetic_size = nb::cast<int64_t>(v);
            else if (key == "image_size") cfg.image_size = nb::cast<int64_t>(v);
            else if (key == "workers") cfg.workers = nb::cast<int>(v);
            else throw nb::type_error(("train(): unknown option '" + key + "'").c_str());
          }
          const af::train::TrainResult r =
              run_interruptible<af::train::TrainResult>([cfg] { return af::train::train(cfg); });
          return result_dict(r);
        },
        "`ampforge train` as a function: the model, data set and optimizer by name (keywords as the flags, with "
        "'_' for '-'); returns the summary dict.");
}

}  // namespace ampforge::python
