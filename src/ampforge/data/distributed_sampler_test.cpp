// The DataLoader's distributed sampler (LoaderOptions::shard_rank / shard_count): which examples each rank
// reads, and the equivalence data parallel relies on (rank r's batch b is batch b x N + r of one loader).
#include <algorithm>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "ampforge/data/data_loader.h"

namespace ampforge::data {
namespace {

// Labels are the example indices, so a batch's labels say which examples it holds.
class Labelled final : public Dataset {
 public:
  explicit Labelled(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return {1, 2, 2}; }
  int64_t num_classes() const override { return n_; }
  using Dataset::get;
  void get(int64_t, float* dst) const override { std::fill(dst, dst + 4, 0.0f); }
  int64_t label(int64_t i) const override { return i; }
  std::string name() const override { return "labelled"; }

 private:
  int64_t n_;
};

std::vector<std::vector<int64_t>> epoch(int64_t n, int64_t batch, int rank, int ranks, bool drop_last, int64_t e = 3) {
  LoaderOptions o;
  o.batch_size = batch;
  o.seed = 11;
  o.workers = 0;
  o.normalize = false;
  o.drop_last = drop_last;
  o.shard_rank = rank;
  o.shard_count = ranks;
  DataLoader dl(std::make_shared<Labelled>(n), o);
  dl.start_epoch(e);
  std::vector<std::vector<int64_t>> out;
  while (auto b = dl.next()) out.push_back(b->y.tolist<int64_t>());
  EXPECT_EQ(static_cast<int64_t>(out.size()), dl.num_batches());
  return out;
}

TEST(DistributedSampler, RankBatchIsTheSingleLoadersMicroBatch) {
  // 96 examples, batch 8, 3 ranks: 4 global batches of 24.
  const auto single = epoch(96, 8, 0, 1, false);
  ASSERT_EQ(single.size(), 12u);
  for (int r = 0; r < 3; ++r) {
    const auto mine = epoch(96, 8, r, 3, false);
    ASSERT_EQ(mine.size(), 4u);
    for (size_t b = 0; b < mine.size(); ++b) EXPECT_EQ(mine[b], single[b * 3 + static_cast<size_t>(r)]) << r << " " << b;
  }
}

TEST(DistributedSampler, PartialLastBatchIsPaddedEvenlyOrDropped) {
  // 50 examples, batch 8, 4 ranks: one global batch of 32, then 18 left: padded to 20, 5 per rank.
  std::map<int64_t, int> seen;
  for (int r = 0; r < 4; ++r) {
    const auto mine = epoch(50, 8, r, 4, false);
    ASSERT_EQ(mine.size(), 2u);
    EXPECT_EQ(mine[0].size(), 8u);
    EXPECT_EQ(mine[1].size(), 5u);
    for (const auto& b : mine)
      for (int64_t i : b) ++seen[i];
    const auto dropped = epoch(50, 8, r, 4, true);
    EXPECT_EQ(dropped.size(), 1u);
    EXPECT_EQ(dropped[0], mine[0]);
  }
  // Every example once, two of them twice (the padding repeats the start of the epoch's order).
  EXPECT_EQ(seen.size(), 50u);
  int twice = 0;
  for (auto& [i, c] : seen) twice += c == 2;
  EXPECT_EQ(twice, 2);
  const auto first = epoch(50, 8, 0, 4, false)[0];
  EXPECT_EQ(seen[first[0]], 2);
  EXPECT_EQ(seen[first[1]], 2);
}

TEST(DistributedSampler, ShardsAreDisjointAndOrderDependsOnTheEpoch) {
  std::set<int64_t> all;
  for (int r = 0; r < 2; ++r)
    for (const auto& b : epoch(64, 8, r, 2, false))
      for (int64_t i : b) EXPECT_TRUE(all.insert(i).second) << i;
  EXPECT_EQ(all.size(), 64u);
  EXPECT_NE(epoch(64, 8, 0, 2, false, 3), epoch(64, 8, 0, 2, false, 4));
}

TEST(DistributedSampler, BadShardsAreRefused) {
  LoaderOptions o;
  o.shard_rank = 2;
  o.shard_count = 2;
  EXPECT_THROW(DataLoader(std::make_shared<Labelled>(8), o), Error);
  o.shard_rank = 0;
  o.shard_count = 9;
  EXPECT_THROW(DataLoader(std::make_shared<Labelled>(8), o), Error);
}

}  // namespace
}  // namespace ampforge::data
