// Tensor's differentiable methods (declared in core/tensor.h): thin sugar over autograd/functions.h.
#include <sstream>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge {

Tensor Tensor::reshape(const Shape& s) const { return ampforge::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const { return ampforge::view(*this, s); }
Tensor Tensor::flatten(int64_t a, int64_t b) const { return ampforge::flatten(*this, a, b); }
Tensor Tensor::permute(const std::vector<int64_t>& d) const { return ampforge::permute(*this, d); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return ampforge::transpose(*this, a, b); }
Tensor Tensor::t() const {
  AF_CHECK(dim() == 2, "t(): expected a 2-D tensor, got shape {}", shape().str());
  return ampforge::transpose(*this, 0, 1);
}
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t l) const { return ampforge::narrow(*this, d, s, l); }
Tensor Tensor::slice(int64_t d, int64_t s, int64_t e, int64_t st) const { return ampforge::slice(*this, d, s, e, st); }
Tensor Tensor::select(int64_t d, int64_t i) const { return ampforge::select(*this, d, i); }
Tensor Tensor::expand(const Shape& s) const { return ampforge::expand(*this, s); }
Tensor Tensor::squeeze(int64_t d) const { return ampforge::squeeze(*this, d); }
Tensor Tensor::squeeze() const {
  Tensor r = *this;
  for (int d = dim() - 1; d >= 0; --d)
    if (shape()[d] == 1) r = ampforge::squeeze(r, d);
  return r;
}
Tensor Tensor::unsqueeze(int64_t d) const { return ampforge::unsqueeze(*this, d); }
Tensor Tensor::contiguous(MemoryFormat f) const { return ampforge::contiguous(*this, f); }
Tensor Tensor::to(DType d) const { return ampforge::to(*this, d); }
Tensor Tensor::to(Device d) const { return ampforge::to(*this, d); }
Tensor Tensor::clone() const { return ampforge::clone(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& d, bool k) const { return ampforge::sum(*this, d, k); }
Tensor Tensor::mean(const std::vector<int64_t>& d, bool k) const { return ampforge::mean(*this, d, k); }

double Tensor::item() const {
  AF_CHECK(defined(), "item(): the tensor is undefined");
  AF_CHECK(numel() == 1, "item(): expected a one-element tensor, got shape {}", shape().str());
  Tensor h = ops::to_dtype(ops::to_device(*this, kCPU), DType::F64);
  return *static_cast<const double*>(h.data_ptr());
}

template <class T>
std::vector<T> Tensor::tolist() const {
  AF_CHECK(defined(), "tolist(): the tensor is undefined");
  Tensor h = ops::contiguous(ops::to_dtype(ops::to_device(*this, kCPU), DType::F64));
  const double* p = static_cast<const double*>(h.data_ptr());
  std::vector<T> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(p[i]);
  return out;
}
template std::vector<float> Tensor::tolist<float>() const;
template std::vector<double> Tensor::tolist<double>() const;
template std::vector<int64_t> Tensor::tolist<int64_t>() const;
template std::vector<int32_t> Tensor::tolist<int32_t>() const;

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(shape=" << shape().str() << ", dtype=" << dtype_name(dtype()) << ", device=" << device().str();
  if (requires_grad()) os << ", requires_grad";
  os << ")";
  if (device().is_meta()) return os.str();  // no values to print
  os << "\n";
  std::vector<double> v = tolist<double>();
  const int64_t n = static_cast<int64_t>(v.size());
  const int64_t last = dim() > 0 ? std::max<int64_t>(size(-1), 1) : 1;
  const int64_t show = 1000;  // elements printed before eliding
  os << "[";
  for (int64_t i = 0; i < n && i < show; ++i) {
    if (i > 0) os << (i % last == 0 ? ",\n " : ", ");
    os << fmt::format("{:.6g}", v[i]);
  }
  if (n > show) os << ", ... (" << n - show << " more)";
  os << "]";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace ampforge
