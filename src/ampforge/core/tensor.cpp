#include "ampforge/core/tensor.h"

#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/util/error.h"

namespace ampforge {

TensorImpl::~TensorImpl() = default;

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  check_sizes_nonnegative(shape, "empty");
  const int64_t n = shape_numel(shape);
  Strides strides = format == MemoryFormat::ChannelsLast ? channels_last_strides(shape) : contiguous_strides(shape);
  Storage st = make_storage(static_cast<size_t>(n * dtype_size(dtype)), device);
  return Tensor(std::make_shared<TensorImpl>(std::move(st), shape, strides, 0, dtype));
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         std::function<void(void*)> deleter) {
  check_sizes_nonnegative(shape, "from_blob");
  AF_CHECK(data != nullptr || shape_numel(shape) == 0, "from_blob: null data pointer for shape {}", shape.str());
  const size_t nbytes = static_cast<size_t>(shape_numel(shape) * dtype_size(dtype));
  auto st = std::make_shared<StorageImpl>(data, nbytes, device, std::move(deleter));
  return Tensor(std::make_shared<TensorImpl>(std::move(st), shape, contiguous_strides(shape), 0, dtype));
}

template <>
Tensor Tensor::from_vector<bool>(const std::vector<bool>& values, const Shape& shape) {
  check_sizes_nonnegative(shape, "from_vector");
  AF_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()),
           "from_vector: shape {} has {} elements but {} values were given", shape.str(), shape_numel(shape),
           values.size());
  Tensor t = empty(shape, DType::Bool, kCPU);
  bool* p = t.data<bool>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

int64_t Tensor::size(int64_t d) const { return impl_->shape[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous(MemoryFormat format) const {
  const Shape& s = shape();
  const Strides& st = strides();
  Strides want;
  if (format == MemoryFormat::ChannelsLast) {
    if (s.size() != 4) return false;
    want = channels_last_strides(s);
  } else {
    want = contiguous_strides(s);
  }
  for (int i = 0; i < s.size(); ++i)
    if (s[i] != 1 && st[i] != want[i]) return false;  // strides of size-1 dims do not matter
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  if (dim() != 4 || !is_contiguous(MemoryFormat::ChannelsLast)) return MemoryFormat::Contiguous;
  if (!is_contiguous()) return MemoryFormat::ChannelsLast;
  // Both layouts describe the memory (e.g. C == 1, or H == W == 1): the strides themselves tell which
  // one the tensor was made with, so a channels-last input with one channel keeps its layout downstream.
  return strides()[1] < strides()[2] ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

void* Tensor::data_ptr() const {
  AF_CHECK(defined(), "data_ptr(): the tensor is undefined");
  // A meta storage's address names a range of a simulated device, never memory: refuse, so that no code
  // reads or writes through it.
  AF_CHECK(!impl_->storage->device().is_meta(), "data_ptr(): a tensor on the meta device has no data (shape {}, {}): "
           "meta tensors only carry shapes and sizes", impl_->shape.str(), dtype_name(impl_->dtype));
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * dtype_size(impl_->dtype);
}

Tensor Tensor::as_strided_raw(const Shape& shape, const Strides& strides, int64_t offset) const {
  AF_ASSERT(shape.size() == strides.size(), "shape {} and strides {} differ in rank", shape.str(), strides.str());
  return Tensor(std::make_shared<TensorImpl>(impl_->storage, shape, strides, offset, impl_->dtype));
}

void Tensor::set_data(const Tensor& src) const {
  AF_CHECK(defined() && src.defined(), "set_data: both tensors must be defined");
  AF_CHECK(is_leaf(), "set_data: only leaf tensors (parameters, buffers) can be rebound");
  impl_->storage = src.impl_->storage;
  impl_->shape = src.impl_->shape;
  impl_->strides = src.impl_->strides;
  impl_->offset = src.impl_->offset;
  impl_->dtype = src.impl_->dtype;
}

AutogradMeta& Tensor::autograd_meta() const {
  if (!impl_->autograd) impl_->autograd = std::make_unique<AutogradMeta>();
  return *impl_->autograd;
}

bool Tensor::requires_grad() const { return impl_ && impl_->autograd && impl_->autograd->requires_grad; }

Tensor& Tensor::requires_grad_(bool value) {
  AF_CHECK(defined(), "requires_grad_(): the tensor is undefined");
  AF_CHECK(is_leaf(), "requires_grad_(): only leaf tensors can be marked; this tensor was produced by an op "
                      "(use detach() first to make a new leaf)");
  AF_CHECK(!value || is_floating_point(), "requires_grad_(): only floating-point tensors can require gradients, "
                                          "this one is {}", dtype_name(dtype()));
  autograd_meta().requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const {
  if (!impl_ || !impl_->autograd) return Tensor();
  AutogradMeta& m = *impl_->autograd;
  if (m.grad_zero) {
    m.grad_zero = false;
    const FillAttrs zero{0.0};
    dispatch(OpId::fill, m.grad.device(), {}, {m.grad}, &zero);
    m.grad.storage()->bump_version();
  }
  return m.grad;
}

Tensor Tensor::grad_as_is(bool* zero) const {
  const AutogradMeta* m = impl_ ? impl_->autograd.get() : nullptr;
  if (zero != nullptr) *zero = m != nullptr && m->grad_zero;
  return m != nullptr ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  AutogradMeta& m = autograd_meta();
  m.grad = g;
  m.grad_zero = false;
}

void Tensor::mark_grad_zero() const {
  AutogradMeta& m = autograd_meta();
  AF_CHECK(m.grad.defined(), "mark_grad_zero(): the tensor has no .grad to mark");
  m.grad_zero = true;
}

bool Tensor::is_leaf() const { return !impl_->autograd || impl_->autograd->grad_fn == nullptr; }

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  return impl_ && impl_->autograd ? impl_->autograd->grad_fn : none;
}

uint32_t Tensor::output_nr() const { return impl_ && impl_->autograd ? impl_->autograd->output_nr : 0; }

Tensor Tensor::detach() const {
  AF_CHECK(defined(), "detach(): the tensor is undefined");
  return as_strided_raw(shape(), strides(), offset());
}

Tensor empty_like(const Tensor& like, MemoryFormat format) { return empty_like(like, like.dtype(), format); }

Tensor empty_like(const Tensor& like, DType dtype, MemoryFormat format) {
  if (format == MemoryFormat::Preserve) format = like.suggest_memory_format();
  return Tensor::empty(like.shape(), dtype, like.device(), format);
}

void check_defined(const Tensor& t, const char* what, const char* arg) {
  AF_CHECK(t.defined(), "{}: argument '{}' is an undefined tensor", what, arg);
}

void check_same_device(const Tensor& a, const Tensor& b, const char* what) {
  AF_CHECK(a.device() == b.device(), "{}: expected all tensors on the same device, found {} and {}", what,
           a.device().str(), b.device().str());
}

void check_float(const Tensor& t, const char* what, const char* arg) {
  AF_CHECK(t.is_floating_point(), "{}: argument '{}' must be a floating-point tensor, got {}", what, arg,
           dtype_name(t.dtype()));
}

}  // namespace ampforge
