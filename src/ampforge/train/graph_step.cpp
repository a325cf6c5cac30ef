#include "ampforge/train/graph_step.h"

#include <fmt/format.h>

#include "ampforge/autograd/node.h"
#include "ampforge/core/runtime.h"
#include "ampforge/nn/layers.h"
#include "ampforge/ops/ops.h"
#include "ampforge/tasks/task.h"
#include "ampforge/util/error.h"

namespace ampforge::train {

namespace {
// Every tensor of a batch that the step reads. Batch fields added later (token masks, box targets) join
// here, and only here.
std::vector<Tensor> batch_tensors(const data::Batch& b) { return {b.x, b.y, b.targets}; }

bool same_layout(const Tensor& a, const Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || (a.shape() == b.shape() && a.dtype() == b.dtype()));
}

// The first Dropout with p > 0 in `m` or below it, by its path ("encoder.layer.0.attention.dropout"), or "".
std::string first_dropout(const nn::Module& m, const std::string& path) {
  if (const auto* d = dynamic_cast<const nn::Dropout*>(&m); d != nullptr && d->p > 0)
    return path.empty() ? "the model" : path;
  for (const auto& [name, child] : m.children())
    if (std::string found = first_dropout(*child, path.empty() ? name : path + "." + name); !found.empty())
      return found;
  return {};
}
}  // namespace

std::string cuda_graph_obstacle(nn::Module& model, const tasks::Task& task) {
  if (std::string why = task.cuda_graph_obstacle(); !why.empty()) return why;
  if (std::string where = first_dropout(model, ""); !where.empty())
    return fmt::format("{} is a Dropout (p > 0): a captured step would replay the same random mask at every step",
                       where);
  return {};
}

StepGraph::StepGraph() = default;
StepGraph::~StepGraph() = default;

bool StepGraph::fits(std::span<const data::Batch> micro) const {
  if (inputs_.empty()) return true;
  if (micro.size() != inputs_.size()) return false;
  for (size_t i = 0; i < micro.size(); ++i) {
    const auto a = batch_tensors(micro[i]), s = batch_tensors(inputs_[i]);
    for (size_t k = 0; k < a.size(); ++k)
      if (!same_layout(a[k], s[k])) return false;
  }
  return true;
}

Tensor StepGraph::run(nn::Module& model, tasks::Task& task, optim::Optimizer& opt, amp::GradScaler& scaler,
                      std::span<const data::Batch> micro, const StepOptions& options) {
  AF_CHECK(!options.read_loss, "StepGraph: a captured step cannot read its loss (set read_loss = false)");
  AF_CHECK(fits(micro), "StepGraph: the batches differ in count or shape from the captured step");
  const Device dev = micro.front().x.device();
  AF_CHECK(dev.is_cuda(), "StepGraph: CUDA graphs need batches on a CUDA device, got {}", dev.str());
  if (inputs_.empty()) {
    for (const data::Batch& b : micro) {
      data::Batch s;
      s.x = Tensor::empty(b.x.shape(), b.x.dtype(), dev, b.x.suggest_memory_format());
      if (b.y.defined()) s.y = Tensor::empty(b.y.shape(), b.y.dtype(), dev, b.y.suggest_memory_format());
      if (b.targets.defined()) s.targets = Tensor::empty(b.targets.shape(), b.targets.dtype(), dev);
      inputs_.push_back(std::move(s));
    }
  }
  for (size_t i = 0; i < micro.size(); ++i) {
    autograd::NoGradGuard ng;
    const auto src = batch_tensors(micro[i]), dst = batch_tensors(inputs_[i]);
    for (size_t k = 0; k < src.size(); ++k)
      if (src[k].defined()) ops::copy_(dst[k], src[k]);
  }
  if (options.schedule != nullptr) options.schedule->apply(options.global_step);
  opt.sync_hyperparams();  // the lr reaches the captured step through the device hyperparameters
  // SGD's momentum has no device hyperparameter: the captured kernel keeps the value it had at capture. When it
  // changed since (the scheduler's momentum warm-up, set_momentum), the graph is stale: capture the step again.
  if (graph_ && opt.momentum() != momentum_) {
    loss_ = Tensor();  // the old graph's output goes back to its pool before ~Graph empties the pool
    graph_.reset();
  }
  if (!graph_) {
    // Capture: the step is recorded, not run; the replay below runs it.
    StepOptions gopts = options;
    gopts.schedule = nullptr;
    std::unique_ptr<runtime::Graph> graph = runtime::device_runtime(dev).graph(dev.index);
    graph->capture_begin();
    const StepResult captured = train_step(model, task, opt, scaler, inputs_, gopts);
    graph->capture_end();
    loss_ = captured.loss_tensor;
    momentum_ = opt.momentum();
    nodes_ = graph->num_nodes();
    kernels_ = graph->num_kernel_nodes();
    graph_ = std::move(graph);
  }
  graph_->replay();
  ++replays_;
  return loss_;
}

int64_t StepGraph::pool_reserved_bytes() const { return graph_ ? graph_->pool_reserved_bytes() : 0; }

int64_t StepGraph::pool_peak_allocated_bytes() const { return graph_ ? graph_->pool_peak_allocated_bytes() : 0; }

}  // namespace ampforge::train
