#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "ampforge/profiler/activity_file.h"
#include "ampforge/profiler/chrome_trace.h"
#include "ampforge/profiler/trace_check.h"
#include "ampforge/util/error.h"

namespace ampforge::profiler {
namespace {

ProfileData sample() {
  ProfileData d;
  d.windows = {{1000, 9000}};
  d.thread_names[7] = "main";
  d.ranges = {{7, "step", RangeKind::Step, 1000, 8000, 0},
              {7, "forward", RangeKind::Phase, 1100, 5000, 0},
              {7, "matmul", RangeKind::Op, 1200, 3000, 0},
              {7, "cudaLaunchKernel", RangeKind::CudaApi, 1300, 1400, 42},
              {8, "data", RangeKind::DataWait, 1000, 2000, 0}};
  DeviceActivity k;
  k.kind = ActivityKind::Kernel;
  k.name = "gemm_kernel";
  k.stream = 3;
  k.begin_ns = 2000;
  k.end_ns = 4000;
  k.correlation_id = 42;
  d.activities.push_back(k);
  DeviceActivity c;
  c.kind = ActivityKind::Memcpy;
  c.copy = CopyKind::DtoH;
  c.stream = 3;
  c.begin_ns = 4000;
  c.end_ns = 4500;
  c.bytes = 4096;
  d.activities.push_back(c);
  d.counters = {{"allocated", 1000, 1024.0}, {"allocated", 8000, 2048.0}};
  d.memory = {true, "host allocator", 2048, -1, -1};
  return d;
}

TEST(ProfilerTrace, EventsNestFlowsPairAndCountersExist) {
  const nlohmann::json t = nlohmann::json::parse(chrome_trace(sample()).dump());  // survives a round trip
  const testing::TraceCheck chk = testing::check_trace(t);
  EXPECT_EQ(chk.error, "");
  EXPECT_EQ(chk.complete_events, 7u);
  EXPECT_EQ((chk.per_track.at({kTraceHostPid, 7})), 4u);
  EXPECT_EQ((chk.per_track.at({kTraceDevicePidBase, 3})), 2u);
  EXPECT_EQ(chk.op_self_ns, 1800);  // the nested API call is part of the op's own time
  std::set<std::string> phases, names;
  int flows_s = 0, flows_f = 0, counters = 0;
  for (const auto& ev : t["traceEvents"]) {
    phases.insert(ev["ph"].get<std::string>());
    if (ev["ph"] == "M" && ev["name"] == "thread_name") names.insert(ev["args"]["name"].get<std::string>());
    if (ev["ph"] == "s") {
      ++flows_s;
      EXPECT_EQ(ev["id"], 42);
      EXPECT_EQ(ev["tid"], 7);
      EXPECT_DOUBLE_EQ(ev["ts"].get<double>(), 0.3);  // 1300 ns after the window began, in us
    }
    if (ev["ph"] == "f") {
      ++flows_f;
      EXPECT_EQ(ev["pid"], kTraceDevicePidBase);
      EXPECT_EQ(ev["tid"], 3);
      EXPECT_EQ(ev["bp"], "e");
    }
    if (ev["ph"] == "C") ++counters;
    if (ev["ph"] == "X" && ev["cat"] == "memcpy") {
      EXPECT_EQ(ev["name"], "Memcpy DtoH");
      EXPECT_EQ(ev["args"]["bytes"], 4096);
    }
  }
  EXPECT_EQ(flows_s, 1);
  EXPECT_EQ(flows_f, 1);
  EXPECT_EQ(counters, 2);
  EXPECT_TRUE(names.count("main (7)"));
  EXPECT_TRUE(names.count("thread 8"));
  EXPECT_TRUE(names.count("stream 3"));
}

TEST(ProfilerTrace, CheckerRejectsBadNesting) {
  nlohmann::json t = {{"traceEvents",
                       {{{"ph", "X"}, {"pid", 1}, {"tid", 1}, {"ts", 0.0}, {"dur", 10.0}, {"cat", "op"}},
                        {{"ph", "X"}, {"pid", 1}, {"tid", 1}, {"ts", 5.0}, {"dur", 10.0}, {"cat", "op"}}}}};
  EXPECT_NE(testing::check_trace(t).error, "");
}

TEST(ProfilerActivityFile, RoundTripsAndResolvesThreads) {
  const std::string path = ::testing::TempDir() + "/af_activity_roundtrip.txt";
  ProfileData d = sample();
  d.device_note = "note with\ttab";
  write_activity_file(d, path);
  {
    std::ofstream f(path, std::ios::app);
    f << "A\t123\t10\t20\t77\tcudaMemcpy\n";
    f << "Y\t0\t30\t40\t77\tcudaStreamSynchronize\n";
    f << "I\t77\t9\n";
    f << "K\t0\t1\t50\t";  // truncated by a crash: skipped, the rest kept
  }
  const ProfileData r = read_activity_file(path);
  ASSERT_EQ(r.ranges.size(), d.ranges.size() + 2);
  EXPECT_EQ(r.ranges[3].correlation_id, 42u);
  EXPECT_EQ(r.ranges[3].kind, RangeKind::CudaApi);
  EXPECT_EQ(r.ranges[5].tid, 9);  // resolved through the I line
  EXPECT_EQ(r.ranges[5].kind, RangeKind::CudaApi);
  EXPECT_EQ(r.ranges[6].tid, 9);
  EXPECT_EQ(r.ranges[6].kind, RangeKind::Sync);
  ASSERT_EQ(r.activities.size(), 2u);
  EXPECT_EQ(r.activities[0].name, "gemm_kernel");
  EXPECT_EQ(r.activities[1].copy, CopyKind::DtoH);
  EXPECT_EQ(r.activities[1].bytes, 4096);
  EXPECT_EQ(r.windows, d.windows);
  EXPECT_EQ(r.thread_names.at(7), "main");
  EXPECT_EQ(r.counters.size(), 2u);
  EXPECT_EQ(r.memory.peak_allocated, 2048);
  EXPECT_NE(r.device_note.find("note with tab"), std::string::npos);
  EXPECT_NE(r.device_note.find("1 unreadable lines"), std::string::npos);
  std::remove(path.c_str());
}

TEST(ProfilerActivityFile, CuptiWindowFromBeginEndLines) {
  const std::string path = ::testing::TempDir() + "/af_activity_be.txt";
  {
    std::ofstream f(path);
    f << "ampforge-activity 1\nB\t100\nK\t0\t7\t150\t250\t1\tk\n";  // no E line: ends at the last record
  }
  const ProfileData r = read_activity_file(path);
  EXPECT_TRUE(r.device_observed);
  EXPECT_EQ(r.windows, (std::vector<std::pair<int64_t, int64_t>>{{100, 250}}));
  {
    std::ofstream f(path);
    f << "not an activity file\n";
  }
  EXPECT_THROW(read_activity_file(path), Error);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ampforge::profiler
