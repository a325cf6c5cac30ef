// Test helpers shared by the CPU kernel tests (norm_test, softmax_test, index_test): a finite-difference
// gradient check and tensor comparisons. Header-only, test code only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/thread_pool.h"

namespace ampforge::testutil {

// Checks the autograd gradients of L = sum(f(inputs) * R) (R a fixed random F64 tensor, so that functions whose
// plain sum is constant, like softmax, still get a non-trivial check) against central differences with step
// 1e-6, for every input that requires grad. Inputs must be contiguous F64 leaves.
inline void expect_gradients_match(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                   const std::vector<Tensor>& inputs, double tol = 1e-6, const std::string& what = "") {
  Generator gen(1234);
  Tensor out0 = f(inputs);
  Tensor r = ops::randn(out0.shape(), DType::F64, kCPU, &gen);
  auto loss_of = [&]() { return ampforge::sum(ampforge::mul(f(inputs), r)); };
  std::vector<Tensor> diff;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) diff.push_back(t);
  ASSERT_FALSE(diff.empty());
  Tensor loss = loss_of();
  std::vector<Tensor> grads = autograd::grad({loss}, diff, {});
  autograd::NoGradGuard no_grad;
  const double h = 1e-6;
  for (size_t k = 0; k < diff.size(); ++k) {
    const Tensor& x = diff[k];
    ASSERT_EQ(x.dtype(), DType::F64);
    ASSERT_TRUE(x.is_contiguous());
    double* p = x.data<double>();
    std::vector<double> analytic =
        grads[k].defined() ? grads[k].tolist<double>() : std::vector<double>(static_cast<size_t>(x.numel()), 0.0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = p[i];
      p[i] = saved + h;
      const double lp = loss_of().item();
      p[i] = saved - h;
      const double lm = loss_of().item();
      p[i] = saved;
      const double num = (lp - lm) / (2 * h);
      ASSERT_NEAR(analytic[i], num, tol * std::max(1.0, std::abs(num)))
          << what << ": input " << k << " element " << i;
    }
  }
}

// A leaf F64 tensor of standard-normal values that requires grad.
inline Tensor leaf(const Shape& s, Generator& gen, double scale = 1.0) {
  Tensor t = ops::mul_scalar(ops::randn(s, DType::F64, kCPU, &gen), scale);
  t.requires_grad_();
  return t;
}

inline void expect_close(const Tensor& a, const Tensor& b, double atol, double rtol, const std::string& what = "") {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<double> x = a.tolist<double>(), y = b.tolist<double>();
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(x[i], y[i], atol + rtol * std::abs(y[i])) << what << " element " << i;
}

inline void expect_bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what = "") {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  Tensor ca = ops::contiguous(a), cb = ops::contiguous(b);
  ASSERT_EQ(0, std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(ca.nbytes()))) << what;
}

// Waits (bounded, best effort) until every pool worker has taken part in a job. Works around a race in
// util/thread_pool.cpp: a worker that starts running only after stop() has bumped the generation counter
// reads the bumped value as "seen", sleeps forever, and set_num_threads() hangs in join(). A worker that has
// run a part is past that point. Remove once the pool captures the generation before spawning workers.
inline void settle_pool() {
  const int n = get_num_threads();
  if (n <= 1) return;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::vector<std::thread::id> ids(static_cast<size_t>(n));
    std::atomic<int> arrived{0};
    parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ids[i] = std::this_thread::get_id();
      arrived.fetch_add(1);
      const auto t0 = std::chrono::steady_clock::now();
      while (arrived.load() < n && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(20))
        std::this_thread::yield();
    });
    std::sort(ids.begin(), ids.end());
    if (std::unique(ids.begin(), ids.end()) == ids.end()) return;
  }
}

// Runs fn with the given pool size and restores the previous one.
template <class F>
auto with_threads(int n, F&& fn) {
  const int prev = get_num_threads();
  settle_pool();
  set_num_threads(n);
  auto r = fn();
  settle_pool();
  set_num_threads(prev);
  return r;
}

// The message of the Error thrown by fn ("" when none was thrown).
template <class F>
std::string error_message(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace ampforge::testutil
