// Report arithmetic on synthetic activity streams whose answers are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ampforge/profiler/report.h"

namespace ampforge::profiler {
namespace {

HostRange range(int64_t tid, const char* name, RangeKind kind, int64_t b, int64_t e, uint32_t corr = 0) {
  return {tid, name, kind, b, e, corr};
}
DeviceActivity kernel(const char* name, int64_t stream, int64_t b, int64_t e, uint32_t corr) {
  DeviceActivity a;
  a.kind = ActivityKind::Kernel;
  a.name = name;
  a.stream = stream;
  a.begin_ns = b;
  a.end_ns = e;
  a.correlation_id = corr;
  return a;
}
DeviceActivity copy(CopyKind k, int64_t b, int64_t e, int64_t bytes, uint32_t corr) {
  DeviceActivity a;
  a.kind = ActivityKind::Memcpy;
  a.copy = k;
  a.begin_ns = b;
  a.end_ns = e;
  a.bytes = bytes;
  a.correlation_id = corr;
  return a;
}

// Window [0, 1000). Device activities (all on stream 0, no two overlap):
//   HtoD [0,100) 1000 B (corr 4), gemm [100,300) (1), gemm [300,400) (2), relu [500,550) (3),
//   DtoH [600,650) 500 B (5), memset [650,660) 64 B (6).
// Device time = 100+200+100+50+50+10 = 510 = busy; idle = [400,500) + [550,600) + [660,1000) = 490.
// Host: tid 1 launches inside ops; tid 2 waits for data [420,480); tid 3 syncs [470,490) and [550,620).
//   idle & data = [420,480) = 60; idle & sync - data = [480,490) + [550,600) = 60; launch-bound = 370.
// Pending (API begin -> activity begin): [50,100) [150,300) [450,500) [0,0) [560,600) [590,650);
//   busy & pending = [50,100) + [150,300) + [600,650) = 50 + 150 + 50 = 250.
ProfileData device_stream() {
  ProfileData d;
  d.windows = {{0, 1000}};
  d.device_observed = true;
  d.activities = {copy(CopyKind::HtoD, 0, 100, 1000, 4),   kernel("gemm", 0, 100, 300, 1),
                  kernel("gemm", 0, 300, 400, 2),          kernel("relu_kernel", 0, 500, 550, 3),
                  copy(CopyKind::DtoH, 600, 650, 500, 5)};
  DeviceActivity ms;
  ms.kind = ActivityKind::Memset;
  ms.begin_ns = 650;
  ms.end_ns = 660;
  ms.bytes = 64;
  ms.correlation_id = 6;
  d.activities.push_back(ms);
  d.ranges = {
      range(1, "matmul", RangeKind::Op, 40, 70),          range(1, "cudaLaunchKernel", RangeKind::CudaApi, 50, 60, 1),
      range(1, "matmul", RangeKind::Op, 140, 200),        range(1, "cudaLaunchKernel", RangeKind::CudaApi, 150, 160, 2),
      range(1, "relu", RangeKind::Op, 440, 470),          range(1, "cudaLaunchKernel", RangeKind::CudaApi, 450, 455, 3),
      range(1, "cudaMemcpyAsync", RangeKind::CudaApi, 0, 5, 4),
      range(1, "cudaMemcpyAsync", RangeKind::CudaApi, 560, 565, 5),
      range(1, "cudaMemsetAsync", RangeKind::CudaApi, 590, 595, 6),
      range(2, "data", RangeKind::DataWait, 420, 480),
      range(3, "cudaStreamSynchronize", RangeKind::Sync, 470, 490),
      range(3, "cudaStreamSynchronize", RangeKind::Sync, 550, 620),
  };
  return d;
}

TEST(ProfilerReport, KernelTotalsAndCopyShare) {
  const Report r = compute_report(device_stream());
  EXPECT_EQ(r.wall_ns, 1000);
  EXPECT_EQ(r.device_ns, 510);
  ASSERT_EQ(r.kernels.size(), 2u);
  const TimeStat& g = r.kernels[0];
  EXPECT_EQ(g.name, "gemm");
  EXPECT_EQ(g.calls, 2);
  EXPECT_EQ(g.total_ns, 300);
  EXPECT_EQ(g.min_ns, 100);
  EXPECT_EQ(g.max_ns, 200);
  EXPECT_DOUBLE_EQ(g.mean_ns(), 150.0);
  EXPECT_DOUBLE_EQ(g.percent, 100.0 * 300 / 510);
  EXPECT_EQ(g.op, "matmul");
  EXPECT_EQ(r.kernels[1].op, "relu");

  ASSERT_EQ(r.memory_ops.size(), 3u);
  EXPECT_EQ(r.memory_ops[0].kind, "HtoD");
  EXPECT_EQ(r.memory_ops[0].bytes, 1000);
  EXPECT_DOUBLE_EQ(r.memory_ops[0].bandwidth_gbps, 10.0);  // 1000 B / 100 ns
  EXPECT_DOUBLE_EQ(r.memory_ops[0].percent, 100.0 * 100 / 510);
  EXPECT_EQ(r.memory_ops[1].kind, "DtoH");
  EXPECT_EQ(r.memory_ops[2].kind, "memset");
  EXPECT_EQ(r.memory_ops[2].bytes, 64);

  // Device time the ops launched: matmul's two gemms, relu's kernel.
  for (const TimeStat& op : r.ops) {
    if (op.name == "matmul") {
      EXPECT_EQ(op.device_ns, 300);
    }
    if (op.name == "relu") {
      EXPECT_EQ(op.device_ns, 50);
    }
  }
}

TEST(ProfilerReport, UtilisationIdleSplitAndOverlap) {
  const Report r = compute_report(device_stream());
  EXPECT_EQ(r.busy_ns, 510);
  EXPECT_DOUBLE_EQ(r.utilisation, 0.51);
  EXPECT_EQ(r.idle_ns, 490);
  EXPECT_EQ(r.idle_data_ns, 60);
  EXPECT_EQ(r.idle_sync_ns, 60);
  EXPECT_EQ(r.idle_launch_ns, 370);
  EXPECT_EQ(r.overlap_ns, 250);
  EXPECT_DOUBLE_EQ(r.overlap, 250.0 / 510.0);
}

TEST(ProfilerReport, ConcurrentKernelsCountOnceInBusyTime) {
  ProfileData d;
  d.windows = {{0, 400}};
  d.activities = {kernel("a", 1, 0, 100, 0), kernel("b", 2, 50, 150, 0), kernel("c", 1, 300, 500, 0)};
  const Report r = compute_report(d);
  EXPECT_TRUE(r.device_observed);
  EXPECT_EQ(r.device_ns, 400);  // sum of durations
  EXPECT_EQ(r.busy_ns, 250);    // [0,150) + [300,400): clipped to the window
  EXPECT_EQ(r.idle_ns, 150);
  EXPECT_EQ(r.idle_launch_ns, 150);
  EXPECT_EQ(r.overlap_ns, 0);  // no launch records: nothing counts as issued ahead
}

// tid 1: step [0,1000) = data [0,100) + forward [100,400) + backward [400,800) + optimizer [800,950) + 50 other;
// forward holds op conv [120,300) which holds op copy [200,250): conv self 130, copy self 50.
// A second step [1000,1500) has no phases (500 other). Covered = 950 of 1500.
TEST(ProfilerReport, StepSplitAndSelfTimes) {
  ProfileData d;
  d.windows = {{0, 1500}};
  d.ranges = {range(1, "step", RangeKind::Step, 0, 1000),       range(1, "data", RangeKind::DataWait, 0, 100),
              range(1, "forward", RangeKind::Phase, 100, 400),  range(1, "conv2d", RangeKind::Op, 120, 300),
              range(1, "copy", RangeKind::Op, 200, 250),        range(1, "backward", RangeKind::Phase, 400, 800),
              range(1, "optimizer", RangeKind::Phase, 800, 950), range(1, "step", RangeKind::Step, 1000, 1500)};
  const Report r = compute_report(d);
  EXPECT_FALSE(r.device_observed);
  EXPECT_EQ(r.step.steps, 2);
  EXPECT_EQ(r.step.step_ns, 1500);
  EXPECT_EQ(r.step.data_ns, 100);
  EXPECT_EQ(r.step.forward_ns, 300);
  EXPECT_EQ(r.step.backward_ns, 400);
  EXPECT_EQ(r.step.optimizer_ns, 150);
  EXPECT_EQ(r.step.other_ns, 550);
  EXPECT_DOUBLE_EQ(r.step.coverage, 950.0 / 1500.0);
  ASSERT_EQ(r.ops.size(), 2u);
  EXPECT_EQ(r.ops[0].name, "conv2d");
  EXPECT_EQ(r.ops[0].total_ns, 180);
  EXPECT_EQ(r.ops[0].self_ns, 130);
  EXPECT_EQ(r.ops[1].self_ns, 50);
  EXPECT_EQ(r.op_self_ns, 180);
  EXPECT_EQ(r.op_calls, 2);
  EXPECT_DOUBLE_EQ(r.ops[0].percent, 100.0 * 130 / 1500);

  const std::string text = format_report(r);
  EXPECT_NE(text.find("no CUDA activity was observed"), std::string::npos);
  EXPECT_NE(text.find("conv2d"), std::string::npos);
  const nlohmann::json j = report_to_json(r);
  EXPECT_EQ(j["step"]["forward_ns"], 300);
  EXPECT_EQ(j["ops"][0]["self_ns"], 130);
  EXPECT_FALSE(j["device"]["observed"].get<bool>());
}

TEST(ProfilerReport, PausedWindowsOnlyCountProfiledTime) {
  ProfileData d;
  d.windows = {{0, 100}, {300, 400}};
  d.activities = {kernel("k", 0, 50, 350, 0)};  // spans the gap: only [50,100) + [300,350) is inside
  const Report r = compute_report(d);
  EXPECT_EQ(r.wall_ns, 200);
  EXPECT_EQ(r.busy_ns, 100);
  EXPECT_EQ(r.idle_ns, 100);
}

TEST(ProfilerReport, IntervalArithmetic) {
  const auto u = interval_union({{5, 10}, {0, 3}, {2, 4}, {10, 12}, {20, 20}});
  EXPECT_EQ(u, (std::vector<Interval>{{0, 4}, {5, 12}}));
  EXPECT_EQ(interval_length(u), 11);
  EXPECT_EQ(interval_intersect(u, {{3, 6}, {11, 30}}), (std::vector<Interval>{{3, 4}, {5, 6}, {11, 12}}));
  EXPECT_EQ(interval_subtract({{0, 20}}, u), (std::vector<Interval>{{4, 5}, {12, 20}}));
  EXPECT_EQ(interval_subtract(u, {{0, 100}}), (std::vector<Interval>{}));
}

}  // namespace
}  // namespace ampforge::profiler
