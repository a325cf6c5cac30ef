// Determinism (docs/ARCHITECTURE.md, "Threads and determinism"):
//   - the same seed gives bit-identical results run after run for a small training-like graph
//     (conv2d, pooling, linear, matmul, losses, reductions, and their backward);
//   - random streams and reductions are bit-identical for 1 and 2 threads (Philox element i depends only
//     on (seed, offset, i); each reduction output is one fixed sequence of additions);
//   - GEMM across thread counts: ampforge splits M or N (never K) over its threads and OpenBLAS runs
//     single-threaded per call, so every output element is one dot product computed by the same kernel
//     whatever the thread count. The test asserts bit-identity and, should a BLAS ever split K, reports
//     the difference against the F32 tolerance in its failure message.
//   - convolutions across thread counts: on the im2col path (AMPFORGE_CPU_CONV=im2col). oneDNN's weight
//     gradients sum per-thread partials, so they are bit-identical run after run for one thread count (the
//     same-seed test runs on the default path) but not across thread counts.
#include <gtest/gtest.h>

#include <cstring>

#include "ampforge/autograd/functions.h"
#include "ampforge/core/generator.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/env_test_util.h"
#include "ampforge/util/thread_pool.h"

using namespace ampforge;

namespace {

bool bit_identical(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = ops::contiguous(a.detach()), cb = ops::contiguous(b.detach());
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(ca.nbytes())) == 0;
}

// Restores the thread count when a test ends (tests share the process-wide pool).
struct ThreadCountGuard {
  int saved = get_num_threads();
  ~ThreadCountGuard() { set_num_threads(saved); }
};

// A small CNN step: parameters and data from one seed; returns the loss and every parameter gradient.
std::vector<Tensor> training_step(uint64_t seed) {
  Generator gen(seed);
  Tensor x = randn({4, 3, 8, 8}, DType::F32, kCPU, &gen);
  Tensor y = Tensor::from_vector<int64_t>({0, 2, 1, 2});
  Tensor w1 = mul(randn({8, 3, 3, 3}, DType::F32, kCPU, &gen), 0.2).detach().requires_grad_();
  Tensor b1 = zeros({8}).requires_grad_();
  Tensor w2 = mul(randn({3, 8 * 4 * 4}, DType::F32, kCPU, &gen), 0.05).detach().requires_grad_();
  Tensor b2 = zeros({3}).requires_grad_();
  Tensor p = mul(randn({3, 3}, DType::F32, kCPU, &gen), 0.1).detach().requires_grad_();
  Conv2dAttrs ca;
  ca.padding[0] = ca.padding[1] = 1;
  Pool2dAttrs pa;
  pa.kernel[0] = pa.kernel[1] = 2;
  pa.stride[0] = pa.stride[1] = 2;
  Tensor h = relu(conv2d(x, w1, b1, ca));
  h = max_pool2d(h, pa);                           // (4, 8, 4, 4)
  Tensor logits = linear(flatten(h, 1), w2, b2);  // (4, 3)
  logits = add(logits, matmul(logits, p));
  Tensor loss = add(cross_entropy(logits, y), mul(mean(mul(logits, logits)), 1e-3));
  loss.backward();
  return {loss.detach(), w1.grad(), b1.grad(), w2.grad(), b2.grad(), p.grad()};
}

}  // namespace

TEST(Determinism, SameSeedSameTrainingStep) {
  const std::vector<Tensor> a = training_step(1234), b = training_step(1234), c = training_step(4321);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_identical(a[i], b[i])) << "result " << i << " differs";
  EXPECT_FALSE(bit_identical(a[0], c[0])) << "another seed must give another loss";
}

TEST(Determinism, SameTrainingStepFor1And2Threads) {
  ThreadCountGuard guard;
  const testutil::ScopedEnv im2col("AMPFORGE_CPU_CONV", "im2col");
  set_num_threads(1);
  const std::vector<Tensor> one = training_step(99);
  set_num_threads(2);
  const std::vector<Tensor> two = training_step(99);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bit_identical(one[i], two[i])) << "result " << i << " differs";
}

TEST(Determinism, RandomStreamsIndependentOfThreads) {
  ThreadCountGuard guard;
  auto draw = [] {
    Generator g(42);
    // Sizes not multiples of 4 or of any chunk size, so partition boundaries fall inside Philox blocks.
    return std::vector<Tensor>{ops::randn({100003}, DType::F32, kCPU, &g), ops::rand({77777}, DType::F64, kCPU, &g),
                               ops::randn({4099}, DType::BF16, kCPU, &g),
                               dropout(ones({50001}), 0.3, true, &g)};
  };
  set_num_threads(1);
  const auto a = draw();
  set_num_threads(2);
  const auto b = draw();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_identical(a[i], b[i])) << "stream " << i << " differs";
}

TEST(Determinism, ReductionsIndependentOfThreads) {
  ThreadCountGuard guard;
  Generator g(7);
  Tensor x = ops::randn({1 << 20}, DType::F32, kCPU, &g);
  Tensor m = ops::randn({257, 1031}, DType::F32, kCPU, &g);
  Tensor h = ops::to_dtype(m, DType::BF16);
  auto reduce_all = [&] {
    return std::vector<Tensor>{sum(x), mean(x), var(x), sum(m, {0}), sum(m, {1}), mean(m, {0, 1}), amax(m, {0}),
                               var(m, {1}), sum(h, {1}), sum(ops::permute(m, {1, 0}), {1})};
  };
  set_num_threads(1);
  const auto a = reduce_all();
  set_num_threads(2);
  const auto b = reduce_all();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_identical(a[i], b[i])) << "reduction " << i << " differs";
}

TEST(Determinism, GemmAcrossThreadCounts) {
  ThreadCountGuard guard;
  Generator g(3);
  Tensor a = ops::randn({192, 320}, DType::F32, kCPU, &g), b = ops::randn({320, 160}, DType::F32, kCPU, &g);
  Tensor a3 = ops::randn({4, 33, 65}, DType::F32, kCPU, &g), b3 = ops::randn({65, 47}, DType::F32, kCPU, &g);
  auto run = [&] { return std::vector<Tensor>{matmul(a, b), matmul(a3, b3), linear(a, ops::permute(b, {1, 0}))}; };
  set_num_threads(1);
  const auto one = run();
  const auto again = run();
  set_num_threads(2);
  const auto two = run();
  const ToleranceEntry tol = tolerance(DType::F32);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(bit_identical(one[i], again[i])) << "GEMM " << i << " differs between runs at 1 thread";
    const auto x = one[i].tolist<float>(), y = two[i].tolist<float>();
    const CloseResult r = tolerance_close(
        static_cast<int64_t>(x.size()), [&](int64_t k) { return double(y[k]); }, [&](int64_t k) { return double(x[k]); },
        tol.rtol, tol.atol);
    EXPECT_TRUE(bit_identical(one[i], two[i]))
        << "GEMM " << i << " differs between 1 and 2 threads (max |diff| " << r.max_abs_err << ", "
        << (r.ok ? "within" : "beyond") << " the F32 tolerance): the BLAS now splits K or the partition changed";
  }
}
