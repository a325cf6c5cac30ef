// The fit finder's search and breakdown (memory/fit.h) on made-up memory models, where the right answer is
// known: the search must return B such that B fits and B + 1 does not, whatever the shape of the curve,
// and in few probes when memory is linear in the batch (the case of real models).
#include "ampforge/memory/fit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <set>

#include "ampforge/util/error.h"

using namespace ampforge;
using namespace ampforge::memory;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGranule = 2 * kMiB;

// A memory model: peak live bytes at a batch size. Reserved is live plus some slack, in whole granules,
// as with expandable segments; a batch fits when reserved stays within the budget.
struct Model {
  std::function<int64_t(int64_t)> live;
  int64_t slack = 0;
  int64_t reserved(int64_t b) const { return (live(b) + slack + kGranule - 1) / kGranule * kGranule; }
  bool fits(int64_t b, int64_t budget) const { return reserved(b) <= budget; }
};

struct SearchRun {
  FitResult result;
  std::set<int64_t> probed;  // full probes
  std::set<int64_t> quick;   // quick probes
};

// `m` is the memory of a full probe; `quick_model` (when set) that of a quick one, with quick searching.
SearchRun search(const Model& m, int64_t budget, int64_t max_batch = 65536, bool interpolate = true,
                 const Model* quick_model = nullptr) {
  SearchRun run;
  FitSearchOptions o;
  o.budget = budget;
  o.max_batch = max_batch;
  o.granule = kGranule;
  o.interpolate = interpolate;
  o.quick = quick_model != nullptr;
  run.result = fit_search(
      [&](int64_t b, bool full) {
        EXPECT_TRUE((full ? run.probed : run.quick).insert(b).second) << "batch " << b << " probed twice";
        EXPECT_GE(b, 1);
        EXPECT_LE(b, max_batch);
        const Model& mm = full ? m : *quick_model;
        FitProbe p;
        p.fits = mm.fits(b, budget);
        p.peak_live = mm.live(b);
        p.peak_reserved = p.fits ? mm.reserved(b) : budget;  // a failed probe stops at the budget
        p.measure.peak_live = p.peak_live;
        p.measure.peak_reserved = p.peak_reserved;
        p.measure.parameters = 1000;
        if (!p.fits) p.oom_report = "out of memory: test";
        return p;
      },
      o);
  return run;
}

// The largest b in [1, max] that fits, by brute force over a monotonic model (binary search on truth).
int64_t truth(const Model& m, int64_t budget, int64_t max_batch) {
  int64_t lo = 0, hi = max_batch + 1;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (m.fits(mid, budget) ? lo : hi) = mid;
  }
  return lo;
}

void expect_exact(const Model& m, int64_t budget, const SearchRun& run, int64_t max_batch = 65536) {
  const FitResult& r = run.result;
  EXPECT_EQ(r.best, truth(m, budget, max_batch));
  ASSERT_GT(r.best, 0);
  ASSERT_NE(r.best_probe(), nullptr);
  EXPECT_TRUE(m.fits(r.best, budget));
  EXPECT_TRUE(run.probed.count(r.best)) << "the answer had no full probe";
  EXPECT_TRUE(r.best_probe()->full);
  if (r.limited) {
    EXPECT_EQ(r.best, max_batch);
  } else {
    // The documented guarantee: B fitted and B + 1 was probed and did not (a quick failure is a full one).
    EXPECT_EQ(r.first_failing, r.best + 1);
    EXPECT_TRUE(run.probed.count(r.best + 1) || run.quick.count(r.best + 1));
    ASSERT_NE(r.failing_probe(), nullptr);
    EXPECT_FALSE(r.failing_probe()->fits);
  }
}

Model linear(int64_t fixed, int64_t per_example, int64_t slack = 0) {
  return {[=](int64_t b) { return fixed + per_example * b; }, slack};
}

}  // namespace

TEST(FitSearch, LinearMemoryIsExactAndFast) {
  // A CNN-like curve: 20 MiB persistent, 600 KB per example; budgets from tiny to 16 GiB (batch ~28000).
  const Model m = linear(20 * kMiB, 600 * 1024, kMiB);
  for (int64_t budget : {64 * kMiB, 100 * kMiB, 512 * kMiB, 3000 * kMiB, 16384 * kMiB}) {
    const SearchRun run = search(m, budget);
    SCOPED_TRACE(budget);
    expect_exact(m, budget, run);
    // After the doublings: the prediction, its window check and bisection inside the window, where
    // bisection alone would need log2(B) probes near the answer.
    int64_t near = 0;  // the expensive probes: within 10% of the answer
    for (const FitProbe& p : run.result.probes) near += p.batch >= run.result.best * 9 / 10 && p.batch < 2 * run.result.best;
    EXPECT_LE(near, 6) << run.result.probes.size() << " probes for batch " << run.result.best;
  }
}

TEST(FitSearch, SetupDominatedSmallBatchesDoNotMisleadThePrediction) {
  // At small batches the peak is the model's setup (flat, 100 MiB), not the step: the per-example figure
  // is 0, then too small; the answer must still be exact.
  const Model m = {[](int64_t b) { return std::max<int64_t>(100 * kMiB, 10 * kMiB + 500 * 1024 * b); }, kMiB};
  for (int64_t budget : {128 * kMiB, 1024 * kMiB, 8192 * kMiB}) {
    const SearchRun run = search(m, budget);
    expect_exact(m, budget, run);
    EXPECT_LE(run.result.probes.size(), 24u);
  }
}

TEST(FitSearch, BisectionOnlyGivesTheSameAnswer) {
  const Model m = linear(20 * kMiB, 600 * 1024, kMiB);
  for (int64_t budget : {64 * kMiB, 512 * kMiB, 16384 * kMiB}) {
    const SearchRun a = search(m, budget, 65536, true);
    const SearchRun b = search(m, budget, 65536, false);
    expect_exact(m, budget, b);
    EXPECT_EQ(a.result.best, b.result.best);
    EXPECT_LE(a.result.probes.size(), b.result.probes.size() + 2);
  }
}

TEST(FitSearch, RandomLinearAndCurvedModelsAreExact) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200; ++i) {
    const int64_t fixed = static_cast<int64_t>(rng() % (64 * kMiB));
    const int64_t per = 1 + static_cast<int64_t>(rng() % (4 * kMiB));
    const int64_t budget = fixed + kGranule + static_cast<int64_t>(rng() % (8192 * kMiB));
    const int kind = i % 4;
    Model m;
    if (kind == 0) m = linear(fixed, per);
    else if (kind == 1)  // grows faster than linear (the prediction overshoots)
      m = {[=](int64_t b) { return fixed + per * b + (per / 64 + 1) * b * b / 16; }, 0};
    else if (kind == 2)  // grows slower than linear (the prediction undershoots)
      m = {[=](int64_t b) { return fixed + static_cast<int64_t>(per * 64 * std::sqrt(static_cast<double>(b))); }, 0};
    else  // steps: flat, then a jump every 100 examples (buffers sized in chunks)
      m = {[=](int64_t b) { return fixed + per * 100 * ((b + 99) / 100); }, 3 * kMiB};
    if (!m.fits(1, budget)) continue;
    const int64_t max_batch = 1 + static_cast<int64_t>(rng() % 100000);
    SCOPED_TRACE(testing::Message() << "model " << i << " kind " << kind << " max " << max_batch);
    const SearchRun run = search(m, budget, max_batch);
    expect_exact(m, budget, run, max_batch);
  }
}

TEST(FitSearch, QuickProbesAreConfirmedByAFullOne) {
  // Quick probes (one step) need a little less than full ones: the quick answer is confirmed, or, when
  // the extra memory of the later steps makes it fail, found again below with full probes.
  for (int64_t extra : {int64_t{0}, kMiB / 2, 8 * kMiB}) {
    const Model quick = linear(20 * kMiB, 600 * 1024, kMiB);
    const Model full = linear(20 * kMiB + extra, 600 * 1024, kMiB);
    for (int64_t budget : {64 * kMiB, 512 * kMiB, 16384 * kMiB}) {
      SCOPED_TRACE(testing::Message() << "extra " << extra << " budget " << budget);
      const SearchRun run = search(full, budget, 65536, true, &quick);
      expect_exact(full, budget, run);
      if (quick.fits(truth(full, budget, 65536) + 1, budget)) {
        EXPECT_GT(run.probed.size(), 1u);  // the confirmation failed: full probes searched again
      } else {
        EXPECT_EQ(run.probed.size(), 1u);  // just the confirmation
        EXPECT_EQ(run.result.probes.back().batch, run.result.best);
      }
    }
  }
  // A full batch 1 that fails where the quick one fitted, and max_batch limits in quick mode.
  const Model quick = linear(kMiB, 1024);
  const Model heavy = linear(100 * kMiB, 1024);
  const SearchRun none = search(heavy, 64 * kMiB, 65536, true, &quick);
  EXPECT_EQ(none.result.best, 0);
  EXPECT_EQ(none.result.first_failing, 1);
  const SearchRun capped = search(quick, 1024 * kMiB, 100, true, &quick);
  EXPECT_TRUE(capped.result.limited);
  EXPECT_EQ(capped.result.best, 100);
  EXPECT_EQ(capped.probed, std::set<int64_t>{100});
}

TEST(FitSearch, BatchOneDoesNotFit) {
  const Model m = linear(100 * kMiB, kMiB);
  const SearchRun run = search(m, 64 * kMiB);
  EXPECT_EQ(run.result.best, 0);
  EXPECT_EQ(run.result.first_failing, 1);
  EXPECT_EQ(run.result.probes.size(), 1u);
  EXPECT_EQ(run.result.best_probe(), nullptr);
  const nlohmann::json j = fit_result_to_json(run.result, 64 * kMiB);
  EXPECT_FALSE(j["fits"].get<bool>());
  EXPECT_EQ(j["batch"], 0);
  EXPECT_TRUE(j["breakdown"].is_null());
  EXPECT_NE(j["oom_report"].get<std::string>().find("out of memory"), std::string::npos);
}

TEST(FitSearch, MaxBatchBoundsTheSearch) {
  const Model m = linear(kMiB, 1024);  // 1 KiB per example: a 1 GiB budget holds about a million
  const SearchRun run = search(m, 1024 * kMiB, 100);
  EXPECT_TRUE(run.result.limited);
  EXPECT_EQ(run.result.best, 100);
  EXPECT_EQ(run.result.first_failing, 0);
  EXPECT_EQ(*run.probed.rbegin(), 100);
  EXPECT_EQ(run.result.probes.back().batch, 100);
  EXPECT_LE(run.result.probes.size(), 8u);  // at most 1 2 4 8 16 32 64 100; the prediction jumps to 100
  EXPECT_TRUE(fit_result_to_json(run.result, 1024 * kMiB)["limited_by_max_batch"].get<bool>());
  const SearchRun one = search(m, 1024 * kMiB, 1);
  EXPECT_EQ(one.result.best, 1);
  EXPECT_TRUE(one.result.limited);
}

TEST(FitSearch, BadOptionsAreInvalidArgument) {
  const Model m = linear(kMiB, 1024);
  try {
    search(m, 64 * kMiB, 0);
    FAIL() << "max_batch 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--max-batch"), std::string::npos);
  }
}

TEST(FitBreakdown, PartsSumToPeakReserved) {
  FitMeasure m;
  m.parameters = 400;
  m.gradients = 400;
  m.optimizer_state = 800;
  m.inputs = 100;
  m.activations = 5000;
  m.peak_live = 7000;
  m.peak_reserved = 8192;
  const FitBreakdown b = fit_breakdown(m);
  EXPECT_EQ(b.workspace, 7000 - 6700);
  EXPECT_EQ(b.fragmentation, 8192 - 7000);
  EXPECT_EQ(b.total, 8192);
  EXPECT_EQ(b.parameters + b.gradients + b.optimizer_state + b.inputs + b.activations + b.workspace +
                b.fragmentation,
            b.total);
  const std::string text = fit_breakdown_format(b, 16384);
  for (const char* row : {"parameters", "gradients", "optimizer state", "activations", "workspace/other",
                          "fragmentation", "total (peak reserved)", "50.0%"})
    EXPECT_NE(text.find(row), std::string::npos) << row << "\n" << text;
}

TEST(FitBreakdown, InconsistentFiguresStillAddUp) {
  FitMeasure m;  // named parts larger than peak live: trimmed from the most derived (activations) first
  m.parameters = 400;
  m.activations = 1000;
  m.peak_live = 1200;
  m.peak_reserved = 1000;  // below live: no negative fragmentation
  const FitBreakdown b = fit_breakdown(m);
  EXPECT_EQ(b.parameters, 400);
  EXPECT_EQ(b.activations, 800);
  EXPECT_EQ(b.workspace, 0);
  EXPECT_EQ(b.fragmentation, 0);
  EXPECT_EQ(b.total, 1200);
  EXPECT_EQ(b.parameters + b.activations + b.workspace + b.fragmentation, b.total);
}
