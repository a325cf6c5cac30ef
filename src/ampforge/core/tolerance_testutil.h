// For tests: two tensors compared elementwise with core/tolerance.h's rule (tolerance_close on their values as F64),
// as a gtest assertion whose failure message names how many elements missed, the worst one (flat index, both values)
// and how far beyond the bound it is. `got_name` / `want_name` say what the two sides are ("oneDNN", "im2col", ...).
#pragma once

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <vector>

#include "ampforge/core/tensor.h"
#include "ampforge/core/tolerance.h"

namespace ampforge::testutil {

inline ::testing::AssertionResult within_tolerance(const Tensor& got, const Tensor& want, double rtol, double atol,
                                                   const char* got_name = "got", const char* want_name = "want") {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shapes differ: [" << fmt::format("{}", fmt::join(got.shape(), ", "))
                                         << "] against [" << fmt::format("{}", fmt::join(want.shape(), ", ")) << "]";
  const std::vector<double> g = got.tolist<double>(), e = want.tolist<double>();
  const CloseResult r = tolerance_close(
      static_cast<int64_t>(g.size()), [&](int64_t i) { return g[i]; }, [&](int64_t i) { return e[i]; }, rtol, atol);
  if (r.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.mismatches << " of " << g.size() << " elements beyond rtol " << rtol
                                       << ", atol " << atol << "; worst element " << r.worst << ": " << got_name << " "
                                       << r.actual_at_worst << ", " << want_name << " " << r.expected_at_worst
                                       << " (error / bound " << r.max_ratio << ")";
}

}  // namespace ampforge::testutil
