// `ampforge launch`: the spawned processes' environment, the TCP-store rendezvous over loopback between real
// processes, and stopping the job when one rank fails or never arrives (both launch modes).
#include "ampforge/dist/launch.h"

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ampforge/cli/cli_test_util.h"
#include "ampforge/dist/dist_test_util.h"

namespace ampforge::dist {
namespace {

using ::testing::HasSubstr;
using testing::ampforge_bin;
using testing::run_shell;

TEST(DistLaunch, SpawnGivesEachRankATorchrunEnvironment) {
  const auto dir = cli::testing::scratch_dir("af_launch_env_");
  const testing::Run r = run_shell(ampforge_bin() + " launch -n 3 --spawn -- sh -c 'echo \"$RANK $WORLD_SIZE "
                                   "$LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT\" > " + dir.string() +
                                   "/rank_$RANK'");
  ASSERT_EQ(r.code, 0) << r.out;
  std::string port;
  for (int k = 0; k < 3; ++k) {
    std::ifstream f(dir / ("rank_" + std::to_string(k)));
    int rank = -1, world = 0, local = -1, local_world = 0;
    std::string addr, p;
    f >> rank >> world >> local >> local_world >> addr >> p;
    EXPECT_EQ(rank, k);
    EXPECT_EQ(world, 3);
    EXPECT_EQ(local, k);
    EXPECT_EQ(local_world, 3);
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_GT(std::stoi(p), 0);
    if (k > 0) {
      EXPECT_EQ(p, port);
    }
    port = p;
  }
  std::filesystem::remove_all(dir);
}

TEST(DistLaunch, StoreRendezvousOverLoopback) {
  const testing::Run r = run_shell(ampforge_bin() + " launch -n 3 --spawn -- " AMPFORGE_DIST_WORKER " store");
  EXPECT_EQ(r.code, 0) << r.out;
  for (int k = 0; k < 3; ++k) EXPECT_THAT(r.out, HasSubstr("rank " + std::to_string(k) + " store ok"));
}

TEST(DistLaunch, RankThatNeverArrivesIsNamedByTheOthersWithinTheTimeout) {
  const testing::Run r =
      run_shell(ampforge_bin() + " launch -n 3 --spawn -- " AMPFORGE_DIST_WORKER " store --absent-rank 2 --timeout 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("rank 2 did not arrive at 'first' within 2 s"));
  EXPECT_THAT(r.out, HasSubstr("exited with code 2; stopping the other"));
  EXPECT_LT(r.seconds, 20);
}

TEST(DistLaunch, FailedRankStopsTheOthersWithItsExitCode) {
  const testing::Run r = run_shell(ampforge_bin() + " launch -n 3 --spawn --grace 2 -- sh -c 'if [ \"$RANK\" = 1 ]; "
                                   "then exit 7; fi; sleep 60'");
  EXPECT_EQ(r.code, 7) << r.out;
  EXPECT_THAT(r.out, HasSubstr("rank 1 (pid"));
  EXPECT_THAT(r.out, HasSubstr("exited with code 7; stopping the other 2 processes"));
  EXPECT_LT(r.seconds, 20);  // not the 60 s the others would sleep
}

TEST(DistLaunch, RankThatExitsEarlyFromTheRendezvousIsNamed) {
  const testing::Run r =
      run_shell(ampforge_bin() + " launch -n 2 --spawn -- " AMPFORGE_DIST_WORKER " store --exit-rank 1 --timeout 30");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_THAT(r.out, HasSubstr("rank 1 (pid"));
  EXPECT_LT(r.seconds, 20);
}

TEST(DistLaunch, MpirunModeStopsTheJobWhenARankFails) {
  AF_REQUIRE_MPI();
  const testing::Run r = run_shell(ampforge_bin() + " launch -n 2 -- sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; "
                                   "then exit 7; fi; sleep 60'");
  EXPECT_EQ(r.code, 7) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--oversubscribe"));  // the launcher's mpirun line
  // mpirun names the process (rank 1) in a help block of its own, which Open MPI 4.1 sometimes fails to print
  // ("ORTE_ERROR_LOG: Out of resource in file show_help.c", seen about one run in three on the 2-core build
  // machine): when it is there, it must name rank 1; the exit code above is the launcher's contract.
  if (r.out.find("Exit code:") != std::string::npos) {
    EXPECT_THAT(r.out, HasSubstr("Exit code:    7"));
    EXPECT_THAT(r.out, HasSubstr(",1]"));
  }
  EXPECT_LT(r.seconds, 30);
}

TEST(DistLaunch, UsageErrors) {
  EXPECT_EQ(run_shell(ampforge_bin() + " launch -n 2").code, 2);
  EXPECT_EQ(run_shell(ampforge_bin() + " launch -n 0 -- true").code, 2);
  const testing::Run r = run_shell(ampforge_bin() + " launch -n 2 --spawn -- no-such-program-af");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("'no-such-program-af' is not a program on PATH"));
}

TEST(DistLaunch, MpirunCommandLine) {
  LaunchOptions o;
  o.nproc = 4;
  o.command = {"ampforge", "train"};
  const std::vector<std::string> argv = mpirun_command("/usr/bin/mpirun", o);
  ASSERT_GE(argv.size(), 8u);
  EXPECT_EQ(argv[0], "/usr/bin/mpirun");
  EXPECT_EQ(argv[2], "4");
  EXPECT_EQ(argv[argv.size() - 2], "ampforge");
  EXPECT_EQ(argv.back(), "train");
}

}  // namespace
}  // namespace ampforge::dist
