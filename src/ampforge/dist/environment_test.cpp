// dist/environment.h: reading the launcher's environment, and the errors for bad values.
#include "ampforge/dist/environment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ampforge/dist/dist_test_util.h"
#include "ampforge/util/error.h"

namespace ampforge::dist {
namespace {

using ::testing::HasSubstr;
using testing::ScopedEnv;
using Vars = std::map<std::string, std::optional<std::string>>;

// Every variable detect_world reads, unset, plus the given ones.
Vars clean(Vars set) {
  Vars v;
  for (const char* k : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE",
                        "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
                        "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"})
    v[k] = std::nullopt;
  for (auto& [k, x] : set) v[k] = x;
  return v;
}

std::string error_of_detect(const Vars& set) {
  ScopedEnv env(clean(set));
  return testing::error_of([] { detect_world(); });
}

TEST(DistEnvironment, NoLauncherIsOneProcess) {
  ScopedEnv env(clean({}));
  const WorldInfo w = detect_world();
  EXPECT_FALSE(w.distributed());
  EXPECT_EQ(w.size, 1);
}

TEST(DistEnvironment, TorchrunStyleVariables) {
  ScopedEnv env(clean({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                       {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}}));
  const WorldInfo w = detect_world();
  EXPECT_EQ(w.launcher, Launcher::Env);
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.size, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_size, 2);
  EXPECT_EQ(w.master_addr, "node0");
  EXPECT_EQ(w.master_port, 29500);
}

TEST(DistEnvironment, SlurmVariablesStandInForTorchrunOnes) {
  ScopedEnv env(clean({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"MASTER_ADDR", "n0"},
                       {"MASTER_PORT", "29501"}}));
  const WorldInfo w = detect_world();
  EXPECT_EQ(w.launcher, Launcher::Env);
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 1);
}

TEST(DistEnvironment, MpiLaunchersWinOverTorchrunVariables) {
  ScopedEnv env(clean({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}}));
  const WorldInfo w = detect_world();
  EXPECT_EQ(w.launcher, Launcher::Mpi);
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.size, 2);
  EXPECT_EQ(w.local_rank, 1);
}

TEST(DistEnvironment, BadValuesAreNamed) {
  const Vars ok{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& k, std::optional<std::string> v) {
    Vars x = ok;
    x[k] = std::move(v);
    return x;
  };
  EXPECT_THAT(error_of_detect(with("WORLD_SIZE", "abc")), HasSubstr("WORLD_SIZE=abc: the world size must be an integer"));
  EXPECT_THAT(error_of_detect(with("WORLD_SIZE", "0")), HasSubstr("WORLD_SIZE=0"));
  EXPECT_THAT(error_of_detect(with("RANK", "2")), HasSubstr("RANK=2: the rank (0 <= rank < world size) must be an "
                                                            "integer in [0, 1]"));
  EXPECT_THAT(error_of_detect(with("RANK", std::nullopt)), HasSubstr("WORLD_SIZE is set but RANK is not"));
  EXPECT_THAT(error_of_detect(with("MASTER_ADDR", std::nullopt)), HasSubstr("MASTER_ADDR is not set"));
  EXPECT_THAT(error_of_detect(with("MASTER_PORT", "70000")), HasSubstr("MASTER_PORT=70000"));
  EXPECT_THAT(error_of_detect(with("MASTER_PORT", std::nullopt)), HasSubstr("MASTER_PORT is not set"));
  EXPECT_EQ(error_of_detect(ok), "");
}

TEST(DistEnvironment, CpuRanksFromATorchrunEnvironmentAreToldToUseMpi) {
  ScopedEnv env(clean({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}));
  const std::string e = testing::error_of([] { init_process_group(detect_world(), {}); });
  EXPECT_THAT(e, HasSubstr("rank 1 of 2 runs on the CPU"));
  EXPECT_THAT(e, HasSubstr("ampforge launch -n 2"));
  EXPECT_THAT(e, HasSubstr("mpirun -n 2"));
}

}  // namespace
}  // namespace ampforge::dist
