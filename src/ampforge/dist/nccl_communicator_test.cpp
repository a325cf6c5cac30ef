// The NCCL communicator without a GPU: the worker (tests/dist_worker, mode fake-nccl) runs a torchrun-style world
// of one against a fake NCCL + CUDA driver (tests/fake_nccl/fake_nccl.c), so the bootstrap through the TCP store,
// the host helpers, the watchdog (timeout, asynchronous error, abort) and the release of every stream, event,
// buffer and context reference are checked in CI. The device collectives need CUDA tensors: nccl_gpu_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "ampforge/dist/dist_test_util.h"

namespace ampforge::dist {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::run_shell;

testing::Run fake_nccl(const std::string& scenario, const std::string& knobs, const std::string& args = "") {
  const std::string env = "env -u MASTER_ADDR -u MASTER_PORT -u OMPI_COMM_WORLD_RANK -u PMIX_RANK -u PMI_RANK "
                          "RANK=0 WORLD_SIZE=1 AMPFORGE_NCCL_LIBRARY=" AMPFORGE_FAKE_NCCL
                          " AMPFORGE_CUDA_DRIVER_LIBRARY=" AMPFORGE_FAKE_NCCL " " + knobs + " ";
  return run_shell(env + AMPFORGE_DIST_WORKER " fake-nccl " + scenario + " " + args, 60);
}

TEST(DistNcclFake, AWorldOfOneBootstrapsRunsTheHostHelpersAndGivesEverythingBack) {
  const testing::Run r = fake_nccl("ok", "");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("backend nccl, rank 0 of 1"));
  EXPECT_THAT(r.out, HasSubstr("ok: every call returned"));
  EXPECT_THAT(r.out, Not(HasSubstr("later call")));
  EXPECT_THAT(r.out, HasSubstr("live 0"));  // streams, events, scratch memory, communicator, context reference
}

TEST(DistNcclFake, ACollectiveThatNeverCompletesEndsAfterTheLimitAndIsNamed) {
  // The third collective (broadcast_string's first all-gather) hangs: the watchdog aborts it after 1 s, the blocked
  // host wait returns, and the error names it.
  const testing::Run r = fake_nccl("hang", "FAKE_NCCL_HANG_AFTER=2", "--timeout 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("(I/O error): ncclAllGather of host values of 8 bytes (collective #3) has not "
                               "completed after 1."));
  EXPECT_THAT(r.out, HasSubstr("on rank 0 (cuda:0)"));
  EXPECT_THAT(r.out, HasSubstr("The communicator was aborted"));
  EXPECT_LT(r.seconds, 20) << r.out;
  EXPECT_THAT(r.out, HasSubstr("live 0"));  // an aborted communicator is not destroyed twice; the rest goes back
}

TEST(DistNcclFake, AnAsynchronousErrorFailsTheNextCall) {
  const testing::Run r = fake_nccl("async", "FAKE_NCCL_ASYNC_ERROR=1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("(I/O error): the collective engine reported an error on rank 0 (cuda:0): remote "
                               "process exited or there was a network error"));
  EXPECT_THAT(r.out, HasSubstr("live 0"));
}

TEST(DistNcclFake, AFailedInitialisationReleasesWhatItTook) {
  const testing::Run r = fake_nccl("initfail", "FAKE_NCCL_INIT_FAIL=1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("(I/O error): ncclCommInitRank failed on rank 0 (device cuda:0): unhandled system "
                               "error: fake NCCL"));
  EXPECT_THAT(r.out, HasSubstr("live 0"));  // the stream and the context reference of the failed constructor
}

}  // namespace
}  // namespace ampforge::dist
