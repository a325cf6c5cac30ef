// Test helper (header-only) for the distributed tests: runs shell commands (mpirun, `ampforge launch`, the
// dist worker, the CLI) with a deadline and the elapsed time, and sets environment variables for one test.
#pragma once

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "ampforge/util/env_test_util.h"
#include "ampforge/util/error.h"

namespace ampforge::dist::testing {

struct Run {
  int code = -1;  // exit status; -1 when not exited normally
  std::string out;  // stdout and stderr
  double seconds = 0;
};

// Runs `cmd` through the shell under coreutils' timeout (a hung job fails the test instead of hanging it).
inline Run run_shell(const std::string& cmd, int timeout_s = 120) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string full = "timeout -k 5 " + std::to_string(timeout_s) + " sh -c '" + [&] {
    std::string q;
    for (char c : cmd) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q;
  }() + "' 2>&1";
  FILE* p = popen(full.c_str(), "r");
  Run r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

inline std::string ampforge_bin() { return std::string(AMPFORGE_BINARY_DIR) + "/bin/ampforge"; }

// `mpirun -n N` with the flags a root container on few cores needs, and a session directory of this test process's
// own: Open MPI 4 creates /tmp/ompi.<host>.<uid> at start-up, and two mpiruns starting at once (ctest -j2) race on
// that mkdir; the loser fails in orte_init ("A call to mkdir was unable to create the desired directory ... File
// exists"), which made a distributed test fail now and then under CI's parallel ctest.
inline std::string mpirun(int n) {
  // Made once per process and removed at its exit (mpirun empties it when it ends).
  static const struct Session {
    std::string dir = "/tmp/ampforge-ompi-" + std::to_string(::getpid());
    Session() { ::mkdir(dir.c_str(), 0700); }
    ~Session() { ::rmdir(dir.c_str()); }
  } session;
  return std::string(AMPFORGE_MPIEXEC) + " -n " + std::to_string(n) + " --oversubscribe --bind-to none" +
         " --mca orte_tmpdir_base " + session.dir + (::geteuid() == 0 ? " --allow-run-as-root" : "");
}

// MPI is part of the build wherever scripts/setup ran; a build without it fails the MPI tests unless MPI was
// turned off on purpose (-DAMPFORGE_MPI=OFF).
#define AF_REQUIRE_MPI()                                                                                    \
  do {                                                                                                      \
    if (!AMPFORGE_TEST_WITH_MPI) {                                                                          \
      if (std::string(AMPFORGE_TEST_MPI_CHOICE) == "OFF") GTEST_SKIP() << "built with -DAMPFORGE_MPI=OFF";  \
      FAIL() << "this build has no MPI (AMPFORGE_MPI=" AMPFORGE_TEST_MPI_CHOICE "): run scripts/setup "       \
                "(libopenmpi-dev openmpi-bin) and reconfigure";                                             \
    }                                                                                                       \
  } while (0)

// Environment variables for a scope (util/env_test_util.h).
using ampforge::testutil::ScopedEnv;

// The message of the ampforge::Error `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The environment of a torchrun-style world of one rank, with no MPI launcher's variables: MPI as a singleton
// for CPU ranks, NCCL through a store on a free port for a GPU.
inline std::map<std::string, std::optional<std::string>> world_of_one_env() {
  return {{"RANK", "0"},          {"WORLD_SIZE", "1"},   {"MASTER_ADDR", std::nullopt},
          {"MASTER_PORT", std::nullopt}, {"OMPI_COMM_WORLD_RANK", std::nullopt}, {"PMIX_RANK", std::nullopt},
          {"PMI_RANK", std::nullopt}};
}

}  // namespace ampforge::dist::testing
