// NCCL on a GPU (label gpu: skipped without a CUDA device). A world of one rank runs through the whole NCCL
// path: the torchrun-style bootstrap (TCP store on rank 0, the unique id through it), every collective on
// device tensors with the NCCL stream ordered against the compute stream, and a data-parallel training run
// that must equal the same run without data parallel bit for bit (one rank: averaging is the identity).
#include "ampforge/dist/nccl_communicator.h"

#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/gpu_testutil.h"
#include "ampforge/core/generator.h"
#include "ampforge/data/dataset.h"
#include "ampforge/dist/dist_test_util.h"
#include "ampforge/dist/environment.h"
#include "ampforge/models/registry.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/tasks/classification.h"
#include "ampforge/train/trainer.h"

namespace ampforge::dist {
namespace {

CommunicatorPtr world_of_one(double collective_timeout_s = 1800) {
  testing::ScopedEnv env(testing::world_of_one_env());
  InitOptions o;
  o.device = Device(DeviceType::CUDA, 0);
  o.compute_stream = cuda::compute_stream(0);
  o.collective_timeout_s = collective_timeout_s;
  return init_process_group(detect_world(), o);
}

#define AF_REQUIRE_GPU_AND_NCCL()                                                                \
  do {                                                                                           \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason(); \
    ASSERT_TRUE(nccl_status().available) << nccl_status().reason;                                 \
  } while (0)

TEST(DistNccl, CollectivesOnAWorldOfOne) {
  AF_REQUIRE_GPU_AND_NCCL();
  CommunicatorPtr c = world_of_one();
  EXPECT_STREQ(c->backend(), "nccl");
  const Device dev(DeviceType::CUDA, 0);
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    Tensor host = ops::to_dtype(ops::arange(0, 1000, 1, DType::F32), d);
    auto expect_host = [&](const Tensor& x, const char* what) {
      const Tensor back = ops::to_device(x, kCPU);
      EXPECT_EQ(std::memcmp(back.data_ptr(), host.data_ptr(), static_cast<size_t>(host.nbytes())), 0)
          << what << " " << dtype_name(d);
    };
    Tensor t = ops::to_device(host, dev);
    for (ReduceOp op : {ReduceOp::Avg, ReduceOp::Sum, ReduceOp::Max}) {
      WorkPtr w = c->all_reduce(t, op);
      w->wait();  // device-side: the copy below is ordered after it
      expect_host(t, reduce_op_name(op));
      EXPECT_TRUE(w->is_completed());
    }
    // A fresh zero output for each collective, so that each one is checked on its own.
    Tensor out = ops::zeros({1000}, d, dev);
    c->all_gather(t, out)->wait();
    expect_host(out, "all_gather");
    out = ops::zeros({1000}, d, dev);
    c->reduce_scatter(t, out, ReduceOp::Sum)->wait();
    expect_host(out, "reduce_scatter");
    c->broadcast(out, 0)->wait();
    expect_host(out, "broadcast");
  }
  EXPECT_EQ(c->all_gather_u64(42), std::vector<uint64_t>{42});
  c->barrier();
}

// The watchdog (dist/watchdog.h) sees collectives complete through their events: with a limit far below the
// test's length, completed collectives never count against it, and the communicator stays usable.
TEST(DistNccl, CompletedCollectivesNeverTripTheWatchdog) {
  AF_REQUIRE_GPU_AND_NCCL();
  CommunicatorPtr c = world_of_one(0.5);
  Tensor t = ops::ones({1 << 20}, DType::F32, Device(DeviceType::CUDA, 0));
  for (int i = 0; i < 50; ++i) c->all_reduce(t, ReduceOp::Sum)->wait();
  c->barrier();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // three limits after the last one completed
  EXPECT_NO_THROW(c->barrier());
  EXPECT_NO_THROW(c->all_reduce(t, ReduceOp::Avg)->wait());
  EXPECT_EQ(ops::to_device(t, kCPU).data<float>()[0], 1.0f);
}

TEST(DistNccl, DataParallelWorldOfOneEqualsPlainTraining) {
  AF_REQUIRE_GPU_AND_NCCL();
  const testutil::DeterministicCudnn deterministic;  // bit-for-bit equality of the two runs
  auto data = std::make_shared<data::SyntheticDataset>(64, Shape{1, 28, 28}, 10, 1);
  auto run = [&](CommunicatorPtr comm) {
    manual_seed(7);
    train::TrainerOptions o;
    o.device = Device(DeviceType::CUDA, 0);
    o.max_steps = 4;
    o.precision = DType::F16;
    o.loader.batch_size = 16;
    o.loader.workers = 0;
    o.progress = o.verbose = false;
    o.data_parallel.communicator = std::move(comm);
    train::Trainer t(models::create("cnn", {}), std::make_shared<tasks::ClassificationTask>(),
                     [](nn::Module& m) { return std::make_unique<optim::AdamW>(m.parameters()); }, o);
    t.fit(data, nullptr);
    std::vector<Tensor> params;
    for (const Tensor& p : t.model().parameters()) params.push_back(ops::to_device(p.detach(), kCPU));
    return params;
  };
  const std::vector<Tensor> plain = run(nullptr), dp = run(world_of_one());
  ASSERT_EQ(plain.size(), dp.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_EQ(std::memcmp(plain[i].data_ptr(), dp[i].data_ptr(), static_cast<size_t>(plain[i].nbytes())), 0) << i;
}

}  // namespace
}  // namespace ampforge::dist
