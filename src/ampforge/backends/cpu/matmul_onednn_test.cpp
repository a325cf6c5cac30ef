// Tests of the matrix products on oneDNN (matmul_onednn.h), through ops::matmul and ops::linear:
//   - F32: every product runs on oneDNN's SGEMM in a build with oneDNN (the counter says so), on OpenBLAS with
//     AMPFORGE_CPU_MATMUL=blas, and both match F64 within the F32 row of the tolerance table, small products (one
//     thread) and large ones (the team), transposed operands included;
//   - AMPFORGE_CPU_MATMUL switches the path: the oneDNN execution counter moves exactly when BF16 products are
//     oneDNN's here (a build with oneDNN on a CPU with AVX512_BF16 or AMX), never with "blas"; a bad value, or
//     "onednn" in a build without oneDNN, is a clear error;
//   - on both paths, every operand layout the engine hands the kernels (plain, transposed views as the backward
//     pass makes them, batches with a broadcast operand, a padded row stride, 4-D attention-like batches, vectors,
//     linear with and without a bias of any stride) gives the product of the BF16 inputs computed in F64, within
//     the BF16 row of the tolerance table; the two paths also agree with each other at that row;
//   - a layout oneDNN cannot describe (a zero stride inside a matrix) is declined and computed by the other path.
// The oneDNN side runs with AMPFORGE_CPU_BF16=native, so that its BF16 kernels are tested on every CPU that has them,
// also where `auto` measured the F32 copies faster (bf16_compute_test.cpp tests that choice).
// On a CPU without native BF16 the counter must stay still: the tests then check the fallback, and say so.
//   - signals arriving every 100 us while F32 products run leave the heap and the results intact: oneDNN's JIT GEMM
//     points the stack pointer at heap memory, and a handler run there writes its frame into the heap (oneDNN issue
//     #4845); util/signals.h takes watched signals off the compute threads. With a plain std::signal handler
//     instead, this test's process aborts ("corrupted size vs. prev_size") within about 0.15 s here.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "ampforge/backends/cpu/conv_onednn.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/core/tolerance_testutil.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/env_test_util.h"
#include "ampforge/util/signals.h"

using namespace ampforge;
using ampforge::testutil::ScopedEnv;
using ampforge::testutil::within_tolerance;

namespace {

Generator& gen() {
  static Generator g(4242);
  return g;
}

Tensor rnd_bf16(const Shape& s) { return ops::to_dtype(ops::randn(s, DType::F32, kCPU, &gen()), DType::BF16); }

// The transpose of the last two dims, as a view (what autograd's backward hands matmul).
Tensor mT(const Tensor& t) {
  std::vector<int64_t> p(static_cast<size_t>(t.dim()));
  for (int i = 0; i < t.dim(); ++i) p[static_cast<size_t>(i)] = i;
  std::swap(p[p.size() - 1], p[p.size() - 2]);
  return ops::permute(t, p);
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what, DType row = DType::BF16) {
  const ToleranceEntry t = tolerance(row);
  EXPECT_TRUE(within_tolerance(got, want, t.rtol, t.atol)) << what;
}

struct Case {
  std::string name;
  // The product on BF16 operands (the case builds its operands once; called once per path).
  std::function<Tensor()> bf16;
  // The same product on F64 copies of those operands.
  std::function<Tensor()> f64;
  bool onednn_describes = true;  // false: a layout oneDNN is not given (the kernel must decline it)
};

Tensor f64(const Tensor& t) { return ops::to_dtype(t, DType::F64); }

std::vector<Case> cases() {
  std::vector<Case> c;
  auto mm = [&](std::string name, Tensor a, Tensor b, bool describes = true) {
    c.push_back({std::move(name), [a, b] { return ops::matmul(a, b); },
                 [a, b] { return ops::matmul(f64(a), f64(b)); }, describes});
  };
  auto lin = [&](std::string name, Tensor x, Tensor w, Tensor bias, bool describes = true) {
    c.push_back({std::move(name), [x, w, bias] { return ops::linear(x, w, bias); },
                 [x, w, bias] { return ops::linear(f64(x), f64(w), bias.defined() ? f64(bias) : Tensor()); },
                 describes});
  };
  mm("plain", rnd_bf16({37, 70}), rnd_bf16({70, 45}));
  mm("a_transposed", mT(rnd_bf16({70, 37})), rnd_bf16({70, 45}));  // gy^T @ x of a weight gradient
  mm("b_transposed", rnd_bf16({37, 70}), mT(rnd_bf16({45, 70})));  // gy @ W of an input gradient
  mm("both_transposed", mT(rnd_bf16({70, 37})), mT(rnd_bf16({45, 70})));
  mm("batched", rnd_bf16({3, 19, 33}), rnd_bf16({3, 33, 21}));
  mm("batched_b_broadcast", rnd_bf16({3, 19, 33}), rnd_bf16({33, 21}));  // B's batch stride is 0
  mm("batched_a_broadcast", rnd_bf16({19, 33}), rnd_bf16({3, 33, 21}));
  // Attention: q (B, H, S, D) @ k^T with q and k strided views of (B, S, H, D) projections.
  {
    Tensor q = ops::permute(rnd_bf16({2, 17, 3, 16}), {0, 2, 1, 3});
    Tensor k = ops::permute(rnd_bf16({2, 17, 3, 16}), {0, 2, 3, 1});
    mm("attention_scores", q, k);
  }
  mm("padded_rows", ops::narrow(rnd_bf16({37, 96}), 1, 5, 70), ops::narrow(rnd_bf16({70, 64}), 1, 3, 45));
  mm("vector_matrix", rnd_bf16({70}), rnd_bf16({70, 45}));
  mm("matrix_vector", rnd_bf16({37, 70}), rnd_bf16({70}));
  mm("k_is_1", rnd_bf16({37, 1}), rnd_bf16({1, 45}));
  // A row repeated down the matrix: stride 0 inside A, which oneDNN's descriptors cannot say.
  mm("zero_row_stride", ops::expand(rnd_bf16({1, 70}), {37, 70}), rnd_bf16({70, 45}), false);
  lin("linear_bias", rnd_bf16({29, 70}), rnd_bf16({45, 70}), rnd_bf16({45}));
  lin("linear_no_bias", rnd_bf16({29, 70}), rnd_bf16({45, 70}), Tensor());
  lin("linear_transposed_weight", rnd_bf16({29, 70}), mT(rnd_bf16({70, 45})), rnd_bf16({45}));
  // oneDNN 2.6 reads a bias as dense whatever its stride (this case caught it): declined.
  lin("linear_strided_bias", rnd_bf16({29, 70}), rnd_bf16({45, 70}), ops::slice(rnd_bf16({90}), 0, 0, 90, 2), false);
  lin("linear_one_row", rnd_bf16({1, 70}), rnd_bf16({45, 70}), rnd_bf16({45}));
  return c;
}

TEST(CpuMatmulOneDnn, EveryLayoutMatchesF64OnBothPaths) {
  const ScopedEnv native("AMPFORGE_CPU_BF16", "native");
  const bool active = [] {
    ScopedEnv env("AMPFORGE_CPU_MATMUL", std::nullopt);
    return cpu::onednn_bf16_matmul_active();
  }();
  if (!active)
    std::cout << "note: BF16 products are not oneDNN's here (no oneDNN in this build, or no AVX512_BF16/AMX): "
                 "checking that the conversion path answers every case and oneDNN is never called\n";
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name);
    const Tensor want = k.f64();
    Tensor on_blas, on_auto;
    {
      ScopedEnv env("AMPFORGE_CPU_MATMUL", "blas");
      const int64_t before = cpu::onednn_matmul_executions();
      on_blas = k.bf16();
      EXPECT_EQ(cpu::onednn_matmul_executions(), before) << "AMPFORGE_CPU_MATMUL=blas still ran oneDNN";
    }
    {
      ScopedEnv env("AMPFORGE_CPU_MATMUL", std::nullopt);
      const int64_t before = cpu::onednn_matmul_executions();
      on_auto = k.bf16();
      const int64_t ran = cpu::onednn_matmul_executions() - before;
      EXPECT_EQ(ran, active && k.onednn_describes ? 1 : 0)
          << "last oneDNN implementation: '" << cpu::onednn_matmul_last_impl() << "'";
      if (active && !k.onednn_describes) {
        EXPECT_NE(cpu::onednn_matmul_last_impl().find("declined"), std::string::npos)
            << cpu::onednn_matmul_last_impl();
      }
    }
    ASSERT_EQ(on_auto.dtype(), DType::BF16);
    expect_close(on_blas, want, "conversion path against F64");
    expect_close(on_auto, want, "default path against F64");
    expect_close(on_auto, on_blas, "default path against the conversion path");
  }
}

// Larger products, the sizes of BERT's layers at a short sequence, where a wrong blocking or tail would show.
TEST(CpuMatmulOneDnn, ModelSizedProductsMatchTheConversionPath) {
  const Tensor x = rnd_bf16({96, 768}), w = rnd_bf16({3072, 768}), b = rnd_bf16({3072});
  const Tensor gy = rnd_bf16({96, 3072});
  auto products = [&] {
    return std::vector<Tensor>{ops::linear(x, w, b), ops::matmul(gy, w), ops::matmul(mT(gy), x)};
  };
  const ScopedEnv native("AMPFORGE_CPU_BF16", "native");
  std::vector<Tensor> blas, dflt;
  {
    ScopedEnv env("AMPFORGE_CPU_MATMUL", "blas");
    blas = products();
  }
  {
    ScopedEnv env("AMPFORGE_CPU_MATMUL", std::nullopt);
    dflt = products();
  }
  // K = 768 or 3072 or 96 terms: the table's BF16 row holds for the rounding of the output, the F32 sums differ
  // by far less.
  const char* what[] = {"linear forward", "input gradient", "weight gradient"};
  for (size_t i = 0; i < blas.size(); ++i) expect_close(dflt[i], blas[i], what[i]);
}

TEST(CpuMatmulOneDnn, F32ProductsRunOnOneDnnSgemmUnlessAskedForBlas) {
  auto rnd = [](const Shape& sh) { return ops::randn(sh, DType::F32, kCPU, &gen()); };
  // (name, product, F64 product): a small one (one thread), a large one split over the team, transposed operands,
  // a batch (parallel over the batch: one thread per product), linear with its bias.
  const Tensor a = rnd({13, 20}), b = rnd({20, 7}), x = rnd({150, 300}), w = rnd({200, 300}), bias = rnd({200});
  const Tensor q = rnd({6, 32, 16}), k = rnd({6, 32, 16});
  struct F32Case {
    const char* name;
    std::function<Tensor()> f32, f64;
  };
  const std::vector<F32Case> cases = {
      {"small", [&] { return ops::matmul(a, b); }, [&] { return ops::matmul(f64(a), f64(b)); }},
      {"large_linear", [&] { return ops::linear(x, w, bias); },
       [&] { return ops::linear(f64(x), f64(w), f64(bias)); }},
      {"large_transposed", [&] { return ops::matmul(mT(x), x); }, [&] { return ops::matmul(mT(f64(x)), f64(x)); }},
      {"batched_scores", [&] { return ops::matmul(q, mT(k)); }, [&] { return ops::matmul(f64(q), mT(f64(k))); }},
  };
  for (const F32Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor want = c.f64();
    {
      ScopedEnv env("AMPFORGE_CPU_MATMUL", "blas");
      const int64_t before = cpu::onednn_sgemm_executions();
      expect_close(c.f32(), want, "OpenBLAS against F64", DType::F32);
      EXPECT_EQ(cpu::onednn_sgemm_executions(), before) << "AMPFORGE_CPU_MATMUL=blas still ran oneDNN";
    }
    {
      ScopedEnv env("AMPFORGE_CPU_MATMUL", std::nullopt);
      const int64_t before = cpu::onednn_sgemm_executions();
      expect_close(c.f32(), want, "default path against F64", DType::F32);
      if (cpu::onednn_built())
        EXPECT_GT(cpu::onednn_sgemm_executions(), before) << "a build with oneDNN ran an F32 product on OpenBLAS";
      else
        EXPECT_EQ(cpu::onednn_sgemm_executions(), before);
    }
  }
}

TEST(CpuMatmulOneDnn, BadPathValueIsAClearError) {
  const Tensor a = rnd_bf16({4, 5}), b = rnd_bf16({5, 3});
  {
    ScopedEnv env("AMPFORGE_CPU_MATMUL", "mkl");
    try {
      (void)ops::matmul(a, b);
      FAIL() << "AMPFORGE_CPU_MATMUL=mkl was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("AMPFORGE_CPU_MATMUL=mkl"), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv env("AMPFORGE_CPU_MATMUL", "onednn");
    if (cpu::onednn_built()) {
      EXPECT_EQ(cpu::cpu_matmul_path(), cpu::CpuMatmulPath::OneDnn);
      EXPECT_NO_THROW((void)ops::matmul(a, b));
    } else {
      try {
        (void)ops::matmul(a, b);
        FAIL() << "AMPFORGE_CPU_MATMUL=onednn was accepted by a build without oneDNN";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no oneDNN"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(CpuMatmulOneDnn, SignalsDuringProductsLeaveTheHeapAndTheResultsIntact) {
  // A signal no other test in this binary watches (the watch lasts as long as the process), counted in a static:
  // the callback outlives the test.
  static std::atomic<int> handled{0};
  watch_signal(SIGVTALRM, [](int) { handled.fetch_add(1); });
  // The CNN's classifier product, a shape that runs on oneDNN's JIT SGEMM in a build with oneDNN; a fresh output
  // (heap workspace and allocations) every time.
  const Tensor x = ops::randn({64, 1024}, DType::F32, kCPU, &gen());
  const Tensor w = ops::randn({512, 1024}, DType::F32, kCPU, &gen());
  const Tensor want = ops::linear(x, w, Tensor());
  const int64_t sgemm_before = cpu::onednn_sgemm_executions();
  std::atomic<bool> done{false};
  std::thread sender([&] {
    while (!done.load()) {
      kill(getpid(), SIGVTALRM);  // to the process, as Ctrl-C is: the kernel picks the thread
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  int products = 0, differing = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (; std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1); ++products) {
    const Tensor y = ops::linear(x, w, Tensor());
    differing += std::memcmp(y.data_ptr(), want.data_ptr(), static_cast<size_t>(want.numel()) * sizeof(float)) != 0;
  }
  done.store(true);
  sender.join();
  EXPECT_EQ(differing, 0) << "of " << products;
  EXPECT_GT(handled.load(), 100) << "the signals did not arrive: the test tested nothing";
  if (cpu::onednn_built()) {
    EXPECT_GE(cpu::onednn_sgemm_executions() - sgemm_before, products);
  }
}

}  // namespace
