// Tests of the BF16 compute choice (bf16_compute.h): AMPFORGE_CPU_BF16 pins it, a bad value is a clear error, `auto`
// gives one answer per process and kind and says why, and the choice reaches the matrix products (the oneDNN BF16
// matmul runs exactly when the choice is native, on a CPU that has native BF16). Convolutions:
// conv_onednn_test.cpp (OneDnnConv.Bf16AsF32CopiesIsTheF32ProblemRounded).
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "ampforge/backends/cpu/bf16_compute.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/core/tolerance_testutil.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/env_test_util.h"

using namespace ampforge;
using ampforge::testutil::ScopedEnv;
using cpu::Bf16Compute;
using cpu::Bf16Kind;

TEST(Bf16Compute, TheVariablePinsTheWay) {
  for (Bf16Kind k : {Bf16Kind::Matmul, Bf16Kind::Conv}) {
    {
      ScopedEnv env("AMPFORGE_CPU_BF16", "native");
      EXPECT_EQ(cpu::cpu_bf16_compute(k), Bf16Compute::Native);
      EXPECT_EQ(cpu::cpu_bf16_summary(k), "native (AMPFORGE_CPU_BF16=native)");
    }
    {
      ScopedEnv env("AMPFORGE_CPU_BF16", "f32");
      EXPECT_EQ(cpu::cpu_bf16_compute(k), Bf16Compute::F32);
      EXPECT_EQ(cpu::cpu_bf16_summary(k), "F32 copies (AMPFORGE_CPU_BF16=f32)");
    }
  }
}

TEST(Bf16Compute, BadValueIsAnErrorNamingTheVariable) {
  ScopedEnv env("AMPFORGE_CPU_BF16", "amx");
  try {
    cpu::cpu_bf16_compute(Bf16Kind::Conv);
    ADD_FAILURE() << "AMPFORGE_CPU_BF16=amx did not raise";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("AMPFORGE_CPU_BF16=amx: expected auto, native or f32"), std::string::npos)
        << e.what();
  }
}

// `auto`: the same answer every time in a process, and a summary that names it and why: measured times (both
// positive, native chosen exactly when not slower), or a reason that needs no measurement.
TEST(Bf16Compute, AutoIsOneChoicePerProcessAndSaysWhy) {
  for (const char* value : {"", "auto"}) {
    ScopedEnv env("AMPFORGE_CPU_BF16", *value ? std::optional<std::string>(value) : std::nullopt);
    for (Bf16Kind k : {Bf16Kind::Matmul, Bf16Kind::Conv}) {
      const Bf16Compute first = cpu::cpu_bf16_compute(k);
      EXPECT_EQ(cpu::cpu_bf16_compute(k), first);
      const std::string s = cpu::cpu_bf16_summary(k);
      std::smatch m;
      const std::regex measured(R"(^(native|F32 copies) \(measured: native ([0-9.]+) ms, F32 ([0-9.]+) ms\)$)");
      const std::regex fixed(R"(^(native|F32 copies) \((AMX|no AVX512_BF16|this build has no oneDNN|oneDNN has no BF16 kernel for it here)\)$)");
      if (std::regex_match(s, m, measured)) {
        const double native = std::stod(m[2].str()), f32 = std::stod(m[3].str());
        EXPECT_GT(native, 0.0) << s;
        EXPECT_GT(f32, 0.0) << s;
        // The printed values are rounded to 0.01 ms: compare only where they differ.
        if (native != f32) {
          EXPECT_EQ(first == Bf16Compute::Native, native < f32) << s;
        }
      } else {
        ASSERT_TRUE(std::regex_match(s, m, fixed)) << "unexpected summary: " << s;
        EXPECT_EQ(m[2].str() == "AMX", first == Bf16Compute::Native) << s;
      }
      EXPECT_EQ(m[1].str() == "native", first == Bf16Compute::Native) << s;
    }
  }
}

// The choice reaches ops::matmul: with f32 no BF16 product runs on oneDNN's BF16 matmul; with native it does on a
// CPU with native BF16 (the F32 SGEMM counter moves instead on the F32 way); both ways agree within the BF16 row.
TEST(Bf16Compute, MatmulFollowsTheChoice) {
  ScopedEnv path("AMPFORGE_CPU_MATMUL", std::nullopt);
  Generator gen(7);
  const Tensor a = ops::to_dtype(ops::randn({64, 96}, DType::F32, kCPU, &gen), DType::BF16);
  const Tensor b = ops::to_dtype(ops::randn({96, 80}, DType::F32, kCPU, &gen), DType::BF16);
  Tensor as_f32, native;
  {
    ScopedEnv env("AMPFORGE_CPU_BF16", "f32");
    const int64_t before = cpu::onednn_matmul_executions();
    as_f32 = ops::matmul(a, b);
    EXPECT_EQ(cpu::onednn_matmul_executions(), before) << "AMPFORGE_CPU_BF16=f32 ran oneDNN's BF16 matmul";
    EXPECT_FALSE(cpu::onednn_bf16_matmul_active());
  }
  {
    ScopedEnv env("AMPFORGE_CPU_BF16", "native");
    const bool active = cpu::onednn_bf16_matmul_active();
    const int64_t before = cpu::onednn_matmul_executions();
    native = ops::matmul(a, b);
    EXPECT_EQ(cpu::onednn_matmul_executions() - before, active ? 1 : 0);
    if (!active) std::cout << "note: no native BF16 matmul here (no oneDNN, or no AVX512_BF16): both ways convert\n";
  }
  ASSERT_EQ(as_f32.dtype(), DType::BF16);
  const ToleranceEntry t = tolerance(DType::BF16);
  EXPECT_TRUE(testutil::within_tolerance(native, as_f32, t.rtol, t.atol, "native", "F32 copies"));
}
