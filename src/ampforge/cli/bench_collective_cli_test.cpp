// `ampforge bench --collective` between two MPI ranks: every size of the sweep for both operations, nccl-tests'
// bus bandwidth factors, and the values checked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ampforge/dist/dist_test_util.h"

namespace ampforge::cli {
namespace {

using dist::testing::ampforge_bin;
using dist::testing::mpirun;
using dist::testing::run_shell;

TEST(BenchCollective, TwoRanksReportAlgorithmAndBusBandwidth) {
  AF_REQUIRE_MPI();
  const dist::testing::Run r = run_shell(mpirun(2) + " " + ampforge_bin() + " bench --collective --min-bytes 1024 "
                                         "--max-bytes 65536 --warmup 1 --steps 3 --json 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);  // rank 0 alone prints
  EXPECT_EQ(j["schema"], "ampforge.bench.collective/1");
  EXPECT_EQ(j["backend"], "mpi");
  EXPECT_EQ(j["world_size"], 2);
  ASSERT_EQ(j["results"].size(), 8u);  // 1, 4, 16, 64 KiB x {all_reduce, all_gather}
  int64_t bytes = 1024;
  for (size_t i = 0; i < 8; i += 2, bytes *= 4) {
    for (size_t k = 0; k < 2; ++k) {
      const auto& e = j["results"][i + k];
      EXPECT_EQ(e["op"], k == 0 ? "all_reduce" : "all_gather");
      EXPECT_EQ(e["bytes"], bytes);
      EXPECT_EQ(e["wrong"], 0);
      EXPECT_GT(e["time_us"].get<double>(), 0);
      const double algbw = e["algbw_gbps"], busbw = e["busbw_gbps"];
      EXPECT_NEAR(algbw, bytes / (e["time_us"].get<double>() * 1e-6) / 1e9, 1e-9 * algbw);
      // nccl-tests: all-reduce 2 (n - 1) / n = 1, all-gather (n - 1) / n = 0.5 with two ranks.
      EXPECT_DOUBLE_EQ(busbw, k == 0 ? algbw : algbw * 0.5);
    }
  }
}

}  // namespace
}  // namespace ampforge::cli
