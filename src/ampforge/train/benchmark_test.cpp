// The bench's workloads and step timing (train/workload.h, train/benchmark.h) on the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "ampforge/memory/global.h"
#include "ampforge/train/benchmark.h"
#include "ampforge/train/workload.h"
#include "ampforge/util/error.h"

namespace ampforge::train {

TEST(Workload, ClassificationBatchHasTheModelsInputShapeAndLabelsInRange) {
  WorkloadOptions o;
  o.batch = 5;
  o.image_size = 64;
  const Workload w = make_workload("resnet18", o);
  EXPECT_EQ(w.task_kind, "classification");
  EXPECT_EQ(w.samples, 5);
  EXPECT_EQ(w.batch.x.shape(), (Shape{5, 3, 64, 64}));
  EXPECT_TRUE(w.batch.x.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(w.input, "3x64x64");
  ASSERT_EQ(w.batch.y.shape(), (Shape{5}));
  for (int64_t i = 0; i < 5; ++i) {
    const int64_t label = w.batch.y.data<int64_t>()[i];
    EXPECT_GE(label, 0);
    EXPECT_LT(label, 1000);
  }
  EXPECT_TRUE(w.module->is_training());
  // The model's default size is used when none is given.
  o.image_size = 0;
  o.batch = 2;
  EXPECT_EQ(make_workload("cnn", o).batch.x.shape(), (Shape{2, 1, 28, 28}));
}

TEST(Workload, DetectionBatchHasBoxesAndItsStepTrains) {
  memory::install_host_caching_allocator();
  WorkloadOptions o;
  o.batch = 2;
  o.image_size = 64;
  Workload w = make_workload("yolov8n", o);
  EXPECT_EQ(w.task_kind, "detection");
  EXPECT_TRUE(has_workload("detection"));
  EXPECT_FALSE(has_workload("no-such-task"));
  EXPECT_EQ(w.batch.x.shape(), (Shape{2, 3, 64, 64}));
  ASSERT_EQ(w.batch.targets.shape(), (Shape{2, 4, 5}));
  const float* t = w.batch.targets.data<float>();
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_GE(t[5 * i], 0);
    EXPECT_LT(t[5 * i], 80);
    for (int k = 1; k < 5; ++k) {
      EXPECT_GT(t[5 * i + k], 0);
      EXPECT_LT(t[5 * i + k], 1);
    }
  }
  BenchmarkOptions bo;
  bo.warmup = 0;
  bo.steps = 1;
  const BenchmarkResult r = benchmark_training(w, bo);
  EXPECT_TRUE(std::isfinite(r.last_loss));
  EXPECT_GT(r.last_loss, 0);
  EXPECT_EQ(r.parameters, 3157200);
}

TEST(Workload, MaskedLMBatchIsFramedTokenIdsAndItsStepTrains) {
  memory::install_host_caching_allocator();
  WorkloadOptions o;
  o.batch = 2;
  o.seq_len = 16;
  Workload w = make_workload("bert-tiny", o);
  EXPECT_EQ(w.task_kind, "masked_lm");
  EXPECT_EQ(w.input, "seq 16");
  ASSERT_EQ(w.batch.x.shape(), (Shape{2, 16}));
  const float* ids = w.batch.x.data<float>();
  for (int64_t b = 0; b < 2; ++b) {
    EXPECT_EQ(ids[b * 16], 101) << "[CLS]";
    EXPECT_EQ(ids[b * 16 + 15], 102) << "[SEP]";
    for (int64_t t = 1; t < 15; ++t) {
      EXPECT_GE(ids[b * 16 + t], 104);
      EXPECT_LT(ids[b * 16 + t], 30522);
    }
  }
  BenchmarkOptions bo;
  bo.warmup = 0;
  bo.steps = 1;
  const BenchmarkResult r = benchmark_training(w, bo);
  EXPECT_TRUE(std::isfinite(r.last_loss));
  EXPECT_GT(r.last_loss, 0);
}

TEST(Workload, BadOptionsAndUnknownModelsAreClearErrors) {
  WorkloadOptions o;
  EXPECT_THROW(make_workload("no-such-model", o), Error);
  o.batch = 0;
  EXPECT_THROW(make_workload("cnn", o), Error);
  o.batch = 2;
  o.image_size = 3;
  EXPECT_THROW(make_workload("cnn", o), Error);
}

TEST(Benchmark, TimesEveryStepAndMeasuresThePeakAfterWarmup) {
  memory::install_host_caching_allocator();
  WorkloadOptions wo;
  wo.batch = 8;
  Workload w = make_workload("cnn", wo);
  BenchmarkOptions bo;
  bo.warmup = 1;
  bo.steps = 3;
  int calls = 0, last_done = 0, last_total = 0;
  bo.on_step = [&](int done, int total) {
    ++calls;
    last_done = done;
    last_total = total;
  };
  const BenchmarkResult r = benchmark_training(w, bo);
  ASSERT_EQ(r.step_seconds.size(), 3u);
  for (double s : r.step_seconds) EXPECT_GT(s, 0);
  EXPECT_GT(r.median_seconds, 0);
  EXPECT_NEAR(r.samples_per_sec, 8.0 / r.median_seconds, 1e-9);
  EXPECT_NEAR(r.mean_samples_per_sec, 8.0 / r.mean_seconds, 1e-9);
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(last_done, 4);
  EXPECT_EQ(last_total, 4);
  EXPECT_EQ(r.timer, "host clock");
  EXPECT_GT(r.peak_allocated_bytes, 0);
  EXPECT_GE(r.peak_reserved_bytes, r.peak_allocated_bytes);
  EXPECT_EQ(r.parameters, 421738);
  EXPECT_TRUE(std::isfinite(r.last_loss));
}

TEST(Benchmark, LowPrecisionStepsRunAndCudaOnlyModesAreRefusedOnTheCpu) {
  memory::install_host_caching_allocator();
  for (const char* p : {"bf16", "fp16"}) {
    Workload w = make_workload("cnn", WorkloadOptions{.batch = 4});
    BenchmarkOptions bo;
    bo.precision = bench_precision_from_string(p);
    bo.warmup = 0;
    bo.steps = 1;
    const BenchmarkResult r = benchmark_training(w, bo);
    EXPECT_TRUE(std::isfinite(r.last_loss)) << p;
  }
  Workload w = make_workload("cnn", WorkloadOptions{.batch = 4});
  BenchmarkOptions tf32;
  tf32.precision = BenchPrecision::TF32;
  EXPECT_THROW(benchmark_training(w, tf32), Error);
  BenchmarkOptions graphs;
  graphs.cuda_graphs = true;
  EXPECT_THROW(benchmark_training(w, graphs), Error);
  BenchmarkOptions zero;
  zero.steps = 0;
  EXPECT_THROW(benchmark_training(w, zero), Error);
  EXPECT_THROW(bench_precision_from_string("fp8"), Error);
  EXPECT_STREQ(bench_precision_name(BenchPrecision::TF32), "tf32");
}

}  // namespace ampforge::train
