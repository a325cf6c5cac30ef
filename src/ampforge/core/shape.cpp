#include "ampforge/core/shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ampforge {

std::string Dims::str() const { return fmt::format("[{}]", fmt::join(begin(), end(), ", ")); }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st = Strides::filled(s.size(), 1);
  int64_t acc = 1;
  for (int i = s.size() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

Strides channels_last_strides(const Shape& s) {
  AF_CHECK(s.size() == 4, "channels-last memory format needs a 4-D tensor (N, C, H, W), got shape {}", s.str());
  const int64_t C = std::max<int64_t>(s[1], 1), H = std::max<int64_t>(s[2], 1), W = std::max<int64_t>(s[3], 1);
  return Strides{H * W * C, 1, W * C, C};
}

int wrap_dim(int64_t dim, int ndim, const char* what) {
  const int64_t n = std::max(ndim, 1);  // a 0-d tensor accepts dim 0 and -1, as in PyTorch
  AF_CHECK(dim >= -n && dim < n, "{}: dimension {} is out of range for a {}-D tensor (expected [{}, {}])", what, dim,
           ndim, -n, n - 1);
  return static_cast<int>(dim < 0 ? dim + n : dim);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what) {
  const int n = std::max(a.size(), b.size());
  Shape out = Shape::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    const int ia = a.size() - n + i, ib = b.size() - n + i;
    const int64_t sa = ia >= 0 ? a[ia] : 1, sb = ib >= 0 ? b[ib] : 1;
    AF_CHECK(sa == sb || sa == 1 || sb == 1, "{}: shapes {} and {} cannot be broadcast together (dimension {}: {} vs {})",
             what, a.str(), b.str(), i, sa, sb);
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

void check_sizes_nonnegative(const Shape& s, const char* what) {
  for (int64_t v : s) AF_CHECK(v >= 0, "{}: sizes must be non-negative, got shape {}", what, s.str());
}

}  // namespace ampforge
