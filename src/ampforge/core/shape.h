// Dims: a small inline vector of int64 (sizes or strides), at most kMaxDims entries, no heap.
// Shape helpers: element counts, contiguous strides, broadcasting, dim wrapping.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ampforge/util/error.h"

namespace ampforge {

inline constexpr int kMaxDims = 8;

class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> v) { assign(v.begin(), v.end()); }
  explicit Dims(const std::vector<int64_t>& v) { assign(v.begin(), v.end()); }
  static Dims filled(int n, int64_t value) {
    Dims d;
    d.resize(n, value);
    return d;
  }

  template <class It>
  void assign(It first, It last) {
    n_ = 0;
    for (; first != last; ++first) push_back(*first);
  }
  void push_back(int64_t v) {
    AF_CHECK(n_ < kMaxDims, "tensors have at most {} dimensions", kMaxDims);
    d_[n_++] = v;
  }
  void insert(int pos, int64_t v) {
    AF_CHECK(n_ < kMaxDims, "tensors have at most {} dimensions", kMaxDims);
    for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
    d_[pos] = v;
    ++n_;
  }
  void erase(int pos) {
    for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
    --n_;
  }
  void resize(int n, int64_t fill = 0) {
    AF_CHECK(n >= 0 && n <= kMaxDims, "tensors have at most {} dimensions (asked for {})", kMaxDims, n);
    for (int i = n_; i < n; ++i) d_[i] = fill;
    n_ = n;
  }
  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t back() const { return d_[n_ - 1]; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  int64_t* begin() { return d_.data(); }
  int64_t* end() { return d_.data() + n_; }
  const int64_t* data() const { return d_.data(); }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }

  bool operator==(const Dims& o) const {
    if (n_ != o.n_) return false;
    for (int i = 0; i < n_; ++i)
      if (d_[i] != o.d_[i]) return false;
    return true;
  }
  bool operator!=(const Dims& o) const { return !(*this == o); }

  std::string str() const;  // "[2, 3, 4]"

 private:
  std::array<int64_t, kMaxDims> d_{};
  int n_ = 0;
};

using Shape = Dims;
using Strides = Dims;

int64_t shape_numel(const Shape& s);
Strides contiguous_strides(const Shape& s);
// Channels-last strides of a 4-D (N, C, H, W) shape: memory order N, H, W, C.
Strides channels_last_strides(const Shape& s);
// Wraps a possibly negative dim into [0, ndim); `what` names the op for the error message.
int wrap_dim(int64_t dim, int ndim, const char* what);
// Broadcast two shapes (numpy rules); throws naming `what` and both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what);
// Checks that every size is >= 0.
void check_sizes_nonnegative(const Shape& s, const char* what);

}  // namespace ampforge
