// ampforge's CPU matrix products per shape, on each path AMPFORGE_CPU_MATMUL offers: OpenBLAS ("blas": F32 as is,
// BF16 through F32 copies) against oneDNN ("onednn": its SGEMM for F32); and BF16 both ways bf16_compute.h chooses
// between on oneDNN: F32 copies + its SGEMM (AMPFORGE_CPU_BF16=f32) and its BF16 matmul (=native, where the CPU has
// AVX512_BF16/AMX). The measurements behind backends/cpu/matmul_onednn.h and bf16_compute.h (docs/PERFORMANCE.md).
// Every path runs in this process, alternating shape by shape; F32 ratio = OpenBLAS time / oneDNN time, BF16 ratio =
// F32-copies time / native time (> 1: the native BF16 matmul is faster).
//
// Shapes: BERT-base's layers at batch 4 x seq 64 (256 rows), forward and both gradients, and the masked-LM head's
// vocabulary product (~15% of 256 rows x 30522). The products run through ops::matmul on tensors, as the engine
// calls them (transposed operands are views).
//
// Usage: gemm_shapes [--threads N] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ampforge/ampforge.h"
#include "ampforge/backends/cpu/conv_onednn.h"
#include "ampforge/backends/cpu/matmul_onednn.h"

namespace af = ampforge;

namespace {

struct Shape3 {
  const char* what;
  int64_t M, N, K;
  bool a_transposed;  // A is the transpose of a (K, M) tensor (a weight gradient's gy^T)
};

af::Tensor operand(int64_t rows, int64_t cols, bool transposed, af::DType dt) {
  af::Tensor t = af::ops::to_dtype(af::ops::randn(transposed ? af::Shape{cols, rows} : af::Shape{rows, cols}), dt);
  return transposed ? af::ops::permute(t, {1, 0}) : t;
}

// Best-of-reps milliseconds of C = A @ B on the path `path` (AMPFORGE_CPU_MATMUL) and the BF16 way `bf16`
// (AMPFORGE_CPU_BF16), after one untimed call.
double time_ms(const char* path, const char* bf16, const af::Tensor& a, const af::Tensor& b, int reps) {
  ::setenv("AMPFORGE_CPU_MATMUL", path, 1);
  ::setenv("AMPFORGE_CPU_BF16", bf16, 1);
  (void)af::ops::matmul(a, b);
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)af::ops::matmul(a, b);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, reps = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (f == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: gemm_shapes [--threads N] [--reps N]\n");
      return 2;
    }
  }
  if (threads > 0) af::set_num_threads(threads);
  // As `ampforge train` and `bench` run: without it, every product's output of tens of MB is a fresh glibc mmap
  // whose pages fault in during the product (the MLM head's weight gradient: ~50 ms instead of ~8).
  af::memory::install_host_caching_allocator();
  if (!af::cpu::onednn_built()) {
    std::fprintf(stderr, "gemm_shapes: this build has no oneDNN (AMPFORGE_ONEDNN): nothing to compare\n");
    return 1;
  }
  const Shape3 shapes[] = {
      {"QKV/out projection fwd", 256, 768, 768, false}, {"FFN up fwd", 256, 3072, 768, false},
      {"FFN down fwd", 256, 768, 3072, false},           {"FFN up weight grad", 3072, 768, 256, true},
      {"FFN down input grad", 256, 3072, 768, false},    {"projection weight grad", 768, 768, 256, true},
      {"MLM head fwd (vocab)", 40, 30522, 768, false},   {"MLM head weight grad", 30522, 768, 40, true},
  };
  std::printf("ampforge CPU products, %d thread(s), best of %d; %s\n", af::get_num_threads(), reps,
              af::cpu::cpu_gemm_summary().c_str());
  std::printf("%-26s %6s %6s %6s | %9s %9s %6s | %9s %9s %9s %6s\n", "product", "M", "N", "K", "F32 blas", "onednn",
              "ratio", "BF16 blas", "F32 copy", "native", "ratio");
  for (const Shape3& s : shapes) {
    std::printf("%-26s %6lld %6lld %6lld |", s.what, static_cast<long long>(s.M), static_cast<long long>(s.N),
                static_cast<long long>(s.K));
    {
      const af::Tensor a = operand(s.M, s.K, s.a_transposed, af::DType::F32), b = operand(s.K, s.N, false, af::DType::F32);
      const double blas = time_ms("blas", "auto", a, b, reps), dnn = time_ms("onednn", "auto", a, b, reps);
      std::printf(" %7.3f ms %6.3f ms %5.2fx |", blas, dnn, blas / dnn);
    }
    {
      const af::Tensor a = operand(s.M, s.K, s.a_transposed, af::DType::BF16);
      const af::Tensor b = operand(s.K, s.N, false, af::DType::BF16);
      const double blas = time_ms("blas", "f32", a, b, reps), copies = time_ms("onednn", "f32", a, b, reps),
                   native = time_ms("onednn", "native", a, b, reps);
      std::printf(" %7.3f ms %6.3f ms %6.3f ms %5.2fx |", blas, copies, native, copies / native);
    }
    std::printf("\n");
  }
  ::unsetenv("AMPFORGE_CPU_MATMUL");
  ::unsetenv("AMPFORGE_CPU_BF16");
  return 0;
}
