// OpenBLAS kernel selection (blas_kernels.h): the rank table, the ISA -> core rule, and that after selection the
// kernels that run are as strong as this CPU allows (unless the environment asked otherwise).
#include "ampforge/backends/cpu/blas_kernels.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

extern "C" char* openblas_get_corename(void);

namespace ampforge::cpu {
namespace {

TEST(BlasKernels, CoreRanksFollowTheInstructionSetsTheKernelsUse) {
  EXPECT_EQ(openblas_core_rank("Prescott"), 0);
  EXPECT_EQ(openblas_core_rank("Core2"), 0);
  EXPECT_EQ(openblas_core_rank("Nehalem"), 1);
  EXPECT_EQ(openblas_core_rank("Sandybridge"), 2);
  EXPECT_EQ(openblas_core_rank("Haswell"), 4);
  EXPECT_EQ(openblas_core_rank("Zen"), 4) << "Zen runs the Haswell kernels: never 'upgraded' to Haswell";
  EXPECT_EQ(openblas_core_rank("SkylakeX"), 5);
  EXPECT_EQ(openblas_core_rank("skylakex"), 5) << "case-insensitive, as OPENBLAS_CORETYPE";
  EXPECT_EQ(openblas_core_rank("Cooperlake"), 6);
  EXPECT_EQ(openblas_core_rank("NEOVERSEN1"), -1) << "an unranked core is never replaced";
  EXPECT_EQ(openblas_core_rank(""), -1);
}

TEST(BlasKernels, BestCoreIsTheStrongestTheIsaRuns) {
  CpuIsa isa;
  EXPECT_EQ(best_openblas_core(isa), "");
  isa.sse42 = true;
  EXPECT_EQ(best_openblas_core(isa), "Nehalem");
  isa.avx = true;
  EXPECT_EQ(best_openblas_core(isa), "Sandybridge");
  isa.avx2 = true;
  EXPECT_EQ(best_openblas_core(isa), "Sandybridge") << "Haswell's kernels need FMA too";
  isa.fma = true;
  EXPECT_EQ(best_openblas_core(isa), "Haswell");
  isa.avx512f = isa.avx512dq = isa.avx512cd = isa.avx512bw = true;
  EXPECT_EQ(best_openblas_core(isa), "Haswell") << "SkylakeX's kernels need AVX512VL";
  isa.avx512vl = true;
  EXPECT_EQ(best_openblas_core(isa), "SkylakeX");
  isa.avx512bf16 = true;
  EXPECT_EQ(best_openblas_core(isa), "Cooperlake");
}

TEST(BlasKernels, HostIsaIsConsistent) {
  const CpuIsa isa = host_isa();
  // Each level implies the previous one on every x86-64 CPU made.
  EXPECT_TRUE(!isa.avx512f || isa.avx2);
  EXPECT_TRUE(!isa.avx2 || isa.avx);
  EXPECT_TRUE(!isa.avx512bf16 || isa.avx512f);
#if defined(__AVX2__) && defined(__FMA__)
  EXPECT_TRUE(isa.avx2 && isa.fma) << "this binary was compiled for AVX2+FMA and runs, so CPUID must say so";
#endif
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
  const std::string best = best_openblas_core(isa);
  EXPECT_TRUE(best == "SkylakeX" || best == "Cooperlake") << best;
#endif
}

TEST(BlasKernels, ActiveKernelsAreAsStrongAsTheCpuAllows) {
  const BlasKernels& k = select_blas_kernels();
  ASSERT_FALSE(k.library.empty()) << "openblas_get_config() returned nothing";
  EXPECT_EQ(k.core, std::string(openblas_get_corename())) << "the report names the kernels that run";
  EXPECT_EQ(&k, &select_blas_kernels()) << "selected once";
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const char* keep = std::getenv("AMPFORGE_BLAS_CORETYPE");
  if (k.source == BlasKernels::Source::Ampforge) {
    // ampforge changed the core: the new one is stronger and the child processes inherit it.
    EXPECT_GT(openblas_core_rank(k.core), openblas_core_rank(k.loaded_core)) << k.note;
    ASSERT_NE(user, nullptr);
    EXPECT_EQ(std::string(user), k.core);
  }
  const bool asked = (user && *user && k.source == BlasKernels::Source::UserEnv) ||
                     (keep && std::string(keep) == "keep") || k.source == BlasKernels::Source::Unavailable;
  if (!asked) {
    EXPECT_FALSE(k.below_cpu()) << k.core << " runs on a CPU that allows " << k.cpu_best << ": " << k.note;
  }
}

}  // namespace
}  // namespace ampforge::cpu
