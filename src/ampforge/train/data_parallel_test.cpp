// Data parallel's gradient buckets: their layout (reverse parameter order, a small first bucket, the cap,
// group boundaries) and, on a real optimizer, that they are views of the flat gradient buffer covering every
// gradient exactly once.
#include "ampforge/train/data_parallel.h"

#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "ampforge/dist/dist_test_util.h"
#include "ampforge/core/generator.h"
#include "ampforge/dist/environment.h"
#include "ampforge/models/registry.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/optim/param_groups.h"

namespace ampforge::train {
namespace {

// Offsets/ends of consecutive parameters with the given element counts.
void layout(const std::vector<int64_t>& sizes, std::vector<int64_t>& off, std::vector<int64_t>& end) {
  int64_t o = 0;
  for (int64_t n : sizes) {
    off.push_back(o);
    o += n;
    end.push_back(o);
  }
}

// A world of one (MPI as a singleton): the same code path as N ranks.
dist::CommunicatorPtr world_of_one() {
  dist::testing::ScopedEnv env(dist::testing::world_of_one_env());
  return dist::init_process_group(dist::detect_world(), {});
}

DataParallelOptions small_buckets() {
  DataParallelOptions o;
  o.first_bucket_mb = 0.01;
  o.bucket_cap_mb = 0.05;
  return o;
}

TEST(DataParallelBuckets, ReverseOrderSmallFirstBucketThenCap) {
  std::vector<std::vector<int64_t>> off(1), end(1);
  layout({100, 50, 600, 200, 300}, off[0], end[0]);  // F32: 400, 200, 2400, 800, 1200 bytes
  const auto b = assign_buckets(off, end, {4}, 1000, 4000);
  ASSERT_EQ(b.size(), 2u);
  // The last parameter alone (larger than the first bucket's 1000 bytes: a bucket of its own).
  EXPECT_EQ(b[0].first_param, 4u);
  EXPECT_EQ(b[0].last_param, 4u);
  EXPECT_EQ(b[0].begin, 950);
  EXPECT_EQ(b[0].end, 1250);
  // Then everything else fits the 4000-byte cap: 3800 bytes.
  EXPECT_EQ(b[1].first_param, 0u);
  EXPECT_EQ(b[1].last_param, 3u);
  EXPECT_EQ(b[1].begin, 0);
  EXPECT_EQ(b[1].end, 950);
  // A smaller cap splits it, still in reverse order and never above the cap.
  const auto c = assign_buckets(off, end, {4}, 1000, 2500);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[1].first_param, 3u);  // 800 bytes; adding 2400 would pass 2500
  EXPECT_EQ(c[2].first_param, 2u);
  EXPECT_EQ(c[3].first_param, 0u);  // 200 + 400
  for (const auto& x : c) EXPECT_LE(x.end - x.begin, 625) << x.first_param;
}

TEST(DataParallelBuckets, BucketsNeverSpanGroupsAndGroupsGoLastToFirst) {
  std::vector<std::vector<int64_t>> off(2), end(2);
  layout({10, 10}, off[0], end[0]);
  layout({10, 10, 10}, off[1], end[1]);
  const auto b = assign_buckets(off, end, {4, 2}, 1 << 20, 1 << 20);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].group, 1u);
  EXPECT_EQ(b[0].first_param, 0u);
  EXPECT_EQ(b[0].last_param, 2u);
  EXPECT_EQ(b[1].group, 0u);
  EXPECT_EQ(b[1].end - b[1].begin, 20);
}

TEST(DataParallelBuckets, ViewsOfTheOptimizersFlatGradients) {
  AF_REQUIRE_MPI();
  dist::CommunicatorPtr comm = world_of_one();
  nn::ModulePtr model = models::create("resnet-small", {});
  optim::AdamW opt(optim::decay_groups(*model, 0.01), {});
  DataParallel dp(comm, opt, small_buckets());
  std::vector<int> covered;
  int64_t total = 0;
  for (const auto& g : opt.param_groups()) total += g.flat_grads.numel();
  for (const GradBucket& b : dp.buckets()) {
    const Tensor& flat = opt.param_groups()[b.group].flat_grads;
    EXPECT_EQ(b.view.storage(), flat.storage());  // a view, no copy
    EXPECT_EQ(b.view.numel(), b.end - b.begin);
    total -= b.view.numel();
  }
  EXPECT_EQ(total, 0);  // every element of every flat buffer in exactly one bucket (they do not overlap: ranges)
  EXPECT_GT(dp.buckets().size(), 3u);
  // Reducing over a world of one leaves the gradients as they are.
  for (const auto& g : opt.param_groups()) {
    float* p = g.flat_grads.data<float>();
    for (int64_t i = 0; i < g.flat_grads.numel(); ++i) p[i] = static_cast<float>(i % 13) * 0.25f;
  }
  dp.reduce_gradients();
  for (const auto& g : opt.param_groups())
    for (int64_t i = 0; i < g.flat_grads.numel(); ++i)
      ASSERT_EQ(g.flat_grads.data<float>()[i], static_cast<float>(i % 13) * 0.25f);
}

TEST(DataParallelBuckets, BackwardLaunchesBucketsAsTheirGradientsComplete) {
  AF_REQUIRE_MPI();
  dist::CommunicatorPtr comm = world_of_one();
  nn::ModulePtr model = models::create("resnet-small", {});
  optim::AdamW opt(model->parameters(), {});
  DataParallelOptions o = small_buckets();
  DataParallel dp(comm, opt, o);
  const Tensor x = ops::full({2, 1, 28, 28}, 0.5, DType::F32);
  auto backward = [&] { sum(model->forward(x)).backward(); };
  backward();  // not armed: an accumulation micro-step launches nothing
  EXPECT_EQ(dp.buckets_launched_in_backward(), 0);
  dp.arm();
  backward();
  // Every bucket completes inside backward here (every parameter gets a gradient), in bucket order.
  EXPECT_EQ(dp.buckets_launched_in_backward(), static_cast<int64_t>(dp.buckets().size()));
  dp.reduce_gradients();
  // Without overlap nothing starts early.
  o.overlap = false;
  DataParallel late(comm, opt, o);
  late.arm();
  backward();
  EXPECT_EQ(late.buckets_launched_in_backward(), 0);
  late.reduce_gradients();
}

TEST(ShardedOptimizer, StepsItsShardLikeThePlainOptimizerAndLoadsItsPartOfAFullState) {
  // Two copies of one model: a plain AdamW and one sharded as rank 1 of 3, fed the same gradients.
  manual_seed(3);
  nn::ModulePtr a = models::create("cnn", {});
  manual_seed(3);
  nn::ModulePtr b = models::create("cnn", {});
  optim::AdamW plain(a->parameters(), {}), sharded(b->parameters(), {});
  sharded.shard(1, 3);
  const optim::ParamGroup& pg = plain.param_groups()[0];
  const optim::ParamGroup& sg = sharded.param_groups()[0];
  const int64_t n = pg.flat_params.numel();
  EXPECT_EQ(sharded.unpadded_size(0), n);
  EXPECT_EQ(sg.flat_params.numel() % (3 * 16), 0);
  EXPECT_GE(sg.flat_params.numel(), n);
  EXPECT_EQ(sg.shard_size * 3, sg.flat_params.numel());
  EXPECT_EQ(sg.shard_begin, sg.shard_size);
  // The parameters were re-pointed into the padded buffer with their values.
  EXPECT_EQ(std::memcmp(sg.flat_params.data_ptr(), pg.flat_params.data_ptr(), static_cast<size_t>(n) * 4), 0);
  for (int step = 0; step < 3; ++step) {
    float* g = pg.flat_grads.data<float>();
    for (int64_t i = 0; i < n; ++i) g[i] = std::sin(0.001f * static_cast<float>(i + step));
    ops::copy_(sg.shard_grads, ops::narrow(pg.flat_grads, 0, sg.shard_begin, sg.shard_size));
    plain.step();
    sharded.step();
  }
  // The shard moved exactly as the plain optimizer's elements did; the rest did not move.
  EXPECT_EQ(std::memcmp(ops::narrow(sg.flat_params, 0, sg.shard_begin, sg.shard_size).data_ptr(),
                        ops::narrow(pg.flat_params, 0, sg.shard_begin, sg.shard_size).data_ptr(),
                        static_cast<size_t>(sg.shard_size) * 4), 0);
  // Its part of the plain optimizer's full state.
  sharded.load_state_dict(plain.state_dict());
  const Tensor full = plain.state_dict()[0].second;  // group0.exp_avg (state entries come sorted by name)
  const Tensor mine = sharded.state_dict()[0].second;
  ASSERT_EQ(mine.numel(), sg.shard_size);
  EXPECT_EQ(std::memcmp(mine.data_ptr(), ops::narrow(full, 0, sg.shard_begin, sg.shard_size).data_ptr(),
                        static_cast<size_t>(sg.shard_size) * 4), 0);
  EXPECT_THROW(sharded.shard(0, 3), Error);
}

}  // namespace
}  // namespace ampforge::train
