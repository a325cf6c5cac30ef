// Training on CUDA: a step with GradScaler makes no host synchronisation, a captured CUDA graph of the
// step replays the same losses with one launch, the DataLoader's copy-stream uploads deliver the CPU's
// batches, and `train --device cuda [--cuda-graphs]` learns like the CPU. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "ampforge/ampforge.h"
#include "ampforge/backends/cuda/gpu_testutil.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/models/models.h"
#include "ampforge/tasks/classification.h"
#include "ampforge/train/benchmark.h"
#include "ampforge/train/graph_step.h"
#include "ampforge/train/recipe.h"
#include "ampforge/train/step.h"
#include "ampforge/train/trainer.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

// A classification batch (no detection targets).
data::Batch batch_of(const Tensor& x, const Tensor& y) {
  data::Batch b;
  b.x = x;
  b.y = y;
  return b;
}

struct StepSetup {
  nn::ModulePtr model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<amp::GradScaler> scaler;
  tasks::ClassificationTask task;
  train::StepOptions so;
};

StepSetup make_setup(Device dev, DType precision) {
  manual_seed(3);
  StepSetup s;
  s.model = models::small_cnn({});
  s.model->to(dev);
  s.model->train();
  train::TrainConfig cfg;
  s.opt = train::make_optimizer(cfg, *s.model);
  s.scaler = std::make_unique<amp::GradScaler>(train::grad_scaler_options(precision));
  s.so.precision = precision;
  s.so.read_loss = false;
  return s;
}

std::pair<Tensor, Tensor> batch(int step, Device dev) {
  Generator gen(100 + static_cast<uint64_t>(step));
  Tensor x = ops::randn({32, 1, 28, 28}, DType::F32, kCPU, &gen);
  std::vector<int64_t> labels;
  for (int i = 0; i < 32; ++i) labels.push_back((step + 7 * i) % 10);
  return {ops::to_device(x, dev), ops::to_device(Tensor::from_vector<int64_t>(labels), dev)};
}

}  // namespace

TEST(CudaTrainStep, GradScalerStepMakesNoHostSynchronisation) {
  AF_SKIP_WITHOUT_CUDA();
  StepSetup s = make_setup(kCuda0, DType::F16);
  ASSERT_TRUE(s.opt->device_hyperparams()) << "CUDA parameters: the optimizer keeps its step count on the device";
  std::vector<std::pair<Tensor, Tensor>> data;
  for (int i = 0; i < 6; ++i) data.push_back(batch(i, kCuda0));
  cuda::synchronize();
  train::train_step(*s.model, s.task, *s.opt, *s.scaler, batch_of(data[0].first, data[0].second), s.so);  // warm-up (lazy state)
  cuda::synchronize();
  const uint64_t before = cuda::host_sync_count();
  std::vector<Tensor> losses;
  for (int i = 1; i < 6; ++i)
    losses.push_back(train::train_step(*s.model, s.task, *s.opt, *s.scaler, batch_of(data[i].first, data[i].second), s.so).loss_tensor);
  EXPECT_EQ(cuda::host_sync_count(), before) << "five F16 steps with GradScaler waited on the host";
  cuda::synchronize();
  for (const Tensor& l : losses) EXPECT_TRUE(std::isfinite(l.item()));
}

TEST(CudaGraph, CapturedStepReplaysTheEagerLosses) {
  AF_SKIP_WITHOUT_CUDA();
  const DeterministicCudnn deterministic;
  for (DType precision : {DType::F32, DType::F16}) {
    std::vector<std::pair<Tensor, Tensor>> data;
    for (int i = 0; i < 8; ++i) data.push_back(batch(i, kCuda0));
    // Eager reference.
    std::vector<double> eager;
    {
      StepSetup s = make_setup(kCuda0, precision);
      for (auto& [x, y] : data) eager.push_back(train::train_step(*s.model, s.task, *s.opt, *s.scaler, batch_of(x, y), s.so).loss_tensor.item());
    }
    // Three eager warm-up steps, then capture once and replay for the rest.
    std::vector<double> graphed;
    StepSetup s = make_setup(kCuda0, precision);
    for (int i = 0; i < 3; ++i)
      graphed.push_back(train::train_step(*s.model, s.task, *s.opt, *s.scaler, batch_of(data[i].first, data[i].second), s.so).loss_tensor.item());
    Tensor sx = Tensor::empty(data[0].first.shape(), DType::F32, kCuda0), sy = Tensor::empty(data[0].second.shape(), DType::I64, kCuda0);
    ops::copy_(sx, data[3].first);
    ops::copy_(sy, data[3].second);
    cuda::Graph g(0);
    g.capture_begin();
    Tensor loss = train::train_step(*s.model, s.task, *s.opt, *s.scaler, batch_of(sx, sy), s.so).loss_tensor;
    g.capture_end();
    EXPECT_GT(g.num_kernel_nodes(), 20) << "a CNN training step is many kernels";
    EXPECT_GE(g.num_nodes(), g.num_kernel_nodes());
    g.replay();
    graphed.push_back(loss.item());
    for (int i = 4; i < 8; ++i) {
      ops::copy_(sx, data[i].first);
      ops::copy_(sy, data[i].second);
      g.replay();
      graphed.push_back(loss.item());
    }
    ASSERT_EQ(graphed.size(), eager.size());
    for (size_t i = 0; i < eager.size(); ++i)
      EXPECT_NEAR(graphed[i], eager[i], 1e-6 * std::max(1.0, std::abs(eager[i])))
          << dtype_name(precision) << " step " << i << ": the graph replays the same kernels on the same data";
  }
}

// SGD's momentum is a value inside the captured kernel (it has no device hyperparameter): a changed momentum
// (the scheduler's momentum warm-up) must reach the replayed steps as it reaches eager ones. StepGraph
// captures the step again when it changed.
TEST(CudaGraph, ChangedMomentumReachesTheReplayedSteps) {
  AF_SKIP_WITHOUT_CUDA();
  const DeterministicCudnn deterministic;
  std::vector<std::pair<Tensor, Tensor>> data;
  for (int i = 0; i < 8; ++i) data.push_back(batch(i, kCuda0));
  auto momentum_at = [](int i) { return i < 5 ? 0.9 : i == 5 ? 0.5 : 0.7; };
  auto run = [&](bool graphs) {
    StepSetup s = make_setup(kCuda0, DType::F32);
    s.opt.reset();
    optim::SGDOptions so;
    so.lr = 0.05;
    so.momentum = 0.9;
    s.opt = std::make_unique<optim::SGD>(s.model->parameters(), so);
    train::StepGraph graph;
    std::vector<double> losses;
    for (int i = 0; i < 8; ++i) {
      s.opt->set_momentum(momentum_at(i));
      const data::Batch b = batch_of(data[i].first, data[i].second);
      const std::span<const data::Batch> micro(&b, 1);
      const Tensor loss = graphs && i >= train::StepGraph::kWarmupSteps
                              ? graph.run(*s.model, s.task, *s.opt, *s.scaler, micro, s.so)
                              : train::train_step(*s.model, s.task, *s.opt, *s.scaler, micro, s.so).loss_tensor;
      losses.push_back(loss.item());
    }
    if (graphs) {
      EXPECT_EQ(graph.replays(), 5) << "steps 3 to 7 ran as replays (steps 5 and 6 after a new capture)";
    }
    return losses;
  };
  const std::vector<double> eager = run(false), graphed = run(true);
  ASSERT_EQ(graphed.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i)
    EXPECT_NEAR(graphed[i], eager[i], 1e-6 * std::max(1.0, std::abs(eager[i])))
        << "step " << i << ": momentum " << momentum_at(static_cast<int>(i));
}

TEST(CudaGraph, HostWorkInsideACaptureIsAClearError) {
  AF_SKIP_WITHOUT_CUDA();
  Tensor t = ops::ones({4}, DType::F32, kCuda0);
  cuda::Graph g(0);
  g.capture_begin();
  EXPECT_TRUE(cuda::is_capturing());
  EXPECT_THROW((void)ops::to_device(t, kCPU), Error);
  EXPECT_THROW((void)ops::rand({4}, DType::F32, kCuda0), Error);
  ops::mul_scalar_(t, 2.0);
  g.capture_end();
  EXPECT_FALSE(cuda::is_capturing());
  g.replay();
  g.replay();
  EXPECT_EQ(ops::to_device(t, kCPU).tolist<float>(), std::vector<float>(4, 4.0f));
}

TEST(CudaUploads, DeviceBatchesEqualTheCpuBatches) {
  AF_SKIP_WITHOUT_CUDA();
  auto ds = std::make_shared<data::SyntheticDataset>(300, Shape{1, 28, 28}, 10, 9);
  for (MemoryFormat f : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    for (int workers : {0, 2}) {
      data::LoaderOptions o;
      o.batch_size = 64;
      o.workers = workers;
      o.format = f;
      data::DataLoader cpu(ds, o);
      o.device = kCuda0;
      data::DataLoader gpu(ds, o);
      cpu.start_epoch(1);
      gpu.start_epoch(1);
      int n = 0;
      while (auto c = cpu.next()) {
        auto g = gpu.next();
        ASSERT_TRUE(g.has_value());
        ASSERT_TRUE(g->x.device().is_cuda());
        EXPECT_EQ(g->x.is_contiguous(f), true);
        EXPECT_EQ(to_cpu(g->x).tolist<float>(), ops::contiguous(c->x).tolist<float>());
        EXPECT_EQ(to_cpu(g->y).tolist<int64_t>(), c->y.tolist<int64_t>());
        ++n;
      }
      EXPECT_FALSE(gpu.next().has_value());
      EXPECT_EQ(n, 5);
      // A new epoch with batches still in flight from the previous start: no leak, no crash.
      gpu.start_epoch(2);
      gpu.start_epoch(3);
      EXPECT_TRUE(gpu.next().has_value());
    }
  }
}

TEST(CudaTrainer, LearnsLikeTheCpuWithAndWithoutGraphs) {
  AF_SKIP_WITHOUT_CUDA();
  const DeterministicCudnn deterministic;  // the graphed run is compared with the eager one step by step
  train::TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 1024;
  c.batch_size = 64;
  c.epochs = 2;
  c.progress = false;
  c.verbose = false;
  c.seed = 7;
  c.precision = DType::F16;
  const train::TrainResult cpu = train::train(c);
  c.device = "cuda";
  c.loss_read_interval = 7;
  const train::TrainResult gpu = train::train(c);
  c.cuda_graphs = true;
  const train::TrainResult graphs = train::train(c);
  EXPECT_NEAR(gpu.test_accuracy, cpu.test_accuracy, 0.05);
  EXPECT_NEAR(graphs.test_accuracy, gpu.test_accuracy, 0.02);
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  ASSERT_EQ(graphs.losses.size(), gpu.losses.size());
  for (size_t i = 0; i < gpu.losses.size(); ++i)
    EXPECT_NEAR(graphs.losses[i], gpu.losses[i], 1e-5 * std::max(1.0, std::abs(gpu.losses[i]))) << "step " << i;
  EXPECT_GT(graphs.graph_steps, 0);
  EXPECT_GT(graphs.graph_nodes, 1) << "graphs must reduce launches per step (one graph launch replaces them)";
  // Loss reads every 7 steps, one per epoch end, the evaluation reads: far fewer than one per step.
  EXPECT_LT(gpu.host_syncs, static_cast<int64_t>(gpu.steps) / 2);
}

// `train --device cuda --memory-trace` records the CUDA caching allocator of the training device (its
// header names the device), with step boundaries, and the peak it reports is that allocator's.
TEST(CudaTrainer, MemoryTraceRecordsTheTrainingDevicesAllocator) {
  AF_SKIP_WITHOUT_CUDA();
  const std::string path = ::testing::TempDir() + "cuda_train.memtrace";
  train::TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 256;
  c.batch_size = 64;
  c.epochs = 1;
  c.progress = false;
  c.verbose = false;
  c.device = "cuda";
  c.memory_trace = path;
  const train::TrainResult r = train::train(c);
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  std::string header, line;
  std::getline(in, header);
  std::getline(in, header);
  EXPECT_NE(header.find("cuda:0"), std::string::npos) << header;
  int64_t steps = 0, allocs = 0;
  while (std::getline(in, line)) {
    if (line == "s") ++steps;
    else if (!line.empty() && line[0] == 'a') ++allocs;
  }
  EXPECT_EQ(steps, r.steps);
  EXPECT_GT(allocs, 0);
  const auto st = memory::allocator_stats(Device(DeviceType::CUDA, 0));
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(r.peak_memory_bytes, st->reserved.peak);
}

// The bench's memory columns with --cuda-graphs hold the replayed step's activations (in the graph's private
// pool) beside the weights, gradients and optimizer state, as the eager columns do.
TEST(CudaBench, GraphedStepsMemoryIncludesTheActivations) {
  AF_SKIP_WITHOUT_CUDA();
  auto peak_allocated = [](bool graphs) {
    train::WorkloadOptions wo;
    wo.batch = 64;
    wo.device = kCuda0;
    train::Workload w = train::make_workload("resnet-small", wo);
    train::BenchmarkOptions bo;
    bo.warmup = 3;
    bo.steps = 2;
    bo.cuda_graphs = graphs;
    return train::benchmark_training(w, bo).peak_allocated_bytes;
  };
  const int64_t eager = peak_allocated(false), graphed = peak_allocated(true);
  ASSERT_GT(eager, 0);
  EXPECT_GE(static_cast<double>(graphed), 0.8 * static_cast<double>(eager)) << "eager " << eager;
}
