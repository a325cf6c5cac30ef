// The MPI communicator across real processes: the dist worker (tests/dist_worker) checks every collective,
// dtype and op on each rank; these tests start it with mpirun (2 and 3 ranks) and alone (a world of one,
// MPI as a singleton).
#include "ampforge/dist/mpi_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ampforge/dist/dist_test_util.h"

namespace ampforge::dist {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::mpirun;
using testing::run_shell;

TEST(DistMpi, BuiltWithMpi) {
  AF_REQUIRE_MPI();
  EXPECT_TRUE(mpi_built());
  EXPECT_FALSE(std::string(AMPFORGE_MPIEXEC).empty());
}

TEST(DistMpi, CollectivesOnTwoRanks) {
  AF_REQUIRE_MPI();
  const testing::Run r = run_shell(mpirun(2) + " " AMPFORGE_DIST_WORKER " collectives", 60);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("rank 0/2 ok"));
  EXPECT_THAT(r.out, HasSubstr("rank 1/2 ok"));
}

TEST(DistMpi, CollectivesOnThreeRanks) {
  AF_REQUIRE_MPI();
  const testing::Run r = run_shell(mpirun(3) + " " AMPFORGE_DIST_WORKER " collectives", 60);
  EXPECT_EQ(r.code, 0) << r.out;
  for (int k = 0; k < 3; ++k) EXPECT_THAT(r.out, HasSubstr("rank " + std::to_string(k) + "/3 ok"));
}

// A rank that stops taking part (alive, silent: no launcher notices) ends the job after the collective limit,
// with an error naming the collective and the rank that waited, instead of a job that waits forever.
TEST(DistMpi, ARankThatHangsEndsTheJobAfterTheCollectiveLimit) {
  AF_REQUIRE_MPI();
  testing::Run r = run_shell(mpirun(2) + " " AMPFORGE_DIST_WORKER " hang --absent-rank 1 --timeout 1", 60);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_LT(r.seconds, 30) << r.out;  // not the absent rank's 60 s sleep
  EXPECT_THAT(r.out, HasSubstr("error: all_reduce of 16 bytes (mpi) (collective #2) has not completed after 1."));
  EXPECT_THAT(r.out, HasSubstr("on rank 0: another rank stopped taking part"));
  EXPECT_THAT(r.out, Not(HasSubstr("completed without")));
  // The host-side helpers (the trainer's barrier before a checkpoint, its stop votes) have the same limit.
  r = run_shell(mpirun(2) + " " AMPFORGE_DIST_WORKER " hang --absent-rank 1 --timeout 1 --barrier", 60);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_LT(r.seconds, 30) << r.out;
  EXPECT_THAT(r.out, HasSubstr("error: barrier (mpi) (collective #2) has not completed after 1."));
}

TEST(DistMpi, WorldOfOneRunsAsASingleton) {
  AF_REQUIRE_MPI();
  const testing::Run r = run_shell(AMPFORGE_DIST_WORKER " collectives", 60);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("rank 0/1 ok"));
}

}  // namespace
}  // namespace ampforge::dist
