// Tensor: a shared handle to (storage, shape, strides, offset, dtype) plus autograd metadata.
// Copying a Tensor copies the handle (both refer to the same data), as in PyTorch.
//
// Where things are defined (one header, several layers — see docs/ARCHITECTURE.md):
//   - metadata, raw views (as_strided_raw) and factories that need no kernel: core/tensor.cpp
//   - differentiable methods (views, reductions, to(), ...): autograd/tensor_methods.cpp
//   - backward(): autograd/engine.cpp
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "ampforge/core/device.h"
#include "ampforge/core/dtype.h"
#include "ampforge/core/shape.h"
#include "ampforge/core/storage.h"

namespace ampforge {

namespace autograd {
class Node;
}

// Physical layout requests. ChannelsLast applies to 4-D (N, C, H, W) tensors: memory order N, H, W, C.
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast, Preserve };

class Tensor;
struct AutogradMeta;

class TensorImpl {
 public:
  TensorImpl(Storage storage, Shape shape, Strides strides, int64_t offset, DType dtype)
      : storage(std::move(storage)), shape(shape), strides(strides), offset(offset), dtype(dtype) {}
  ~TensorImpl();

  Storage storage;
  Shape shape;
  Strides strides;  // in elements
  int64_t offset;   // in elements, from the start of storage
  DType dtype;
  std::unique_ptr<AutogradMeta> autograd;  // created on first use
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories that need no kernel (the rest are in ops/factory.h) -----------------------------
  // Uninitialised memory.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = kCPU,
                      MemoryFormat format = MemoryFormat::Contiguous);
  // Wraps an external buffer (not copied). `deleter` runs when the last tensor referring to it dies.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = kCPU,
                          std::function<void(void*)> deleter = nullptr);
  // Copies `values` into a new CPU tensor of the given shape (numel must match).
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values) {
    return from_vector(values, Shape{static_cast<int64_t>(values.size())});
  }

  // ---- metadata -----------------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int dim() const { return impl_->shape.size(); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t offset() const { return impl_->offset; }
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  int64_t element_size() const { return dtype_size(dtype()); }
  int64_t nbytes() const { return numel() * element_size(); }
  const Storage& storage() const { return impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  // ChannelsLast when 4-D and laid out so (ties, e.g. one channel, go by the strides), else Contiguous.
  MemoryFormat suggest_memory_format() const;
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  bool is_floating_point() const { return dtype_is_float(dtype()); }

  // ---- raw data access (no autograd, no device check beyond the dtype) ----------------------------
  void* data_ptr() const;
  template <class T>
  T* data() const;

  // ---- raw view (shares storage; no autograd edge) -------------------------------------------------
  Tensor as_strided_raw(const Shape& shape, const Strides& strides, int64_t offset) const;
  // Makes this tensor (every handle to it) refer to src's data: storage, shape, strides, offset, dtype.
  // Autograd metadata (requires_grad, grad) stays. Used to move parameters into flat buffers, or to
  // another dtype/device, without breaking the handles modules and optimizers hold.
  void set_data(const Tensor& src) const;

  // ---- autograd -----------------------------------------------------------------------------------
  bool requires_grad() const;
  // Only leaves (tensors not produced by a differentiable op) can be marked; floating dtypes only.
  Tensor& requires_grad_(bool value = true);
  // The accumulated gradient of a leaf (undefined until backward() reached it). A gradient marked zero
  // (mark_grad_zero) gets its zeros written here, on this first read, so a reader always sees its values.
  Tensor grad() const;
  // Replaces .grad (and clears a zero mark).
  void set_grad(const Tensor& g) const;
  // Marks the defined .grad as all zeros without writing them (Optimizer::zero_grad): the next backward's
  // AccumulateGrad then copies the incoming gradient over it instead of adding it to written zeros (one fill and
  // one read of the zeros saved per step: 102 MB each for ResNet-50), and grad() writes the zeros first when it is
  // read before that.
  void mark_grad_zero() const;
  // The .grad as it lies, without writing a pending zero; *zero (optional) tells whether it is marked zero.
  Tensor grad_as_is(bool* zero = nullptr) const;
  bool is_leaf() const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  uint32_t output_nr() const;
  // Shares data, drops the autograd history.
  Tensor detach() const;
  // Reverse-mode autodiff from this tensor. `grad` defaults to 1 for a one-element tensor.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

  // ---- gradient hooks (autograd/hooks.cpp; PyTorch's Tensor.register_hook and friends) -------------
  // `hook(grad)` runs each time backward computes this tensor's gradient, before the gradient is used
  // (for a leaf: before it is accumulated into .grad; for a leaf used k times, once with the sum of the
  // k contributions). A defined return value replaces the gradient; an undefined one keeps it. Hooks run
  // in registration order. Requires requires_grad(). Returns a handle for remove_hook().
  using GradHook = std::function<Tensor(const Tensor&)>;
  uint64_t register_hook(GradHook hook) const;
  // Leaf tensors only: `hook(leaf)` runs after a backward pass has accumulated a gradient into leaf.grad()
  // (where data-parallel training starts reducing a finished gradient).
  using PostAccumulateHook = std::function<void(const Tensor&)>;
  uint64_t register_post_accumulate_grad_hook(PostAccumulateHook hook) const;
  // Removes a hook registered on this tensor; false when the handle is unknown (already removed).
  bool remove_hook(uint64_t handle) const;
  // A non-leaf tensor keeps its gradient in grad() after backward (leaves always do: no-op there).
  void retain_grad() const;
  bool retains_grad() const;

  // ---- differentiable methods (autograd/tensor_methods.cpp) ---------------------------------------
  Tensor reshape(const Shape& shape) const;  // a view when strides allow, else a copy
  Tensor view(const Shape& shape) const;     // always a view; errors when strides do not allow
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor clone() const;
  Tensor sum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  // Single-element tensor to a host double (copies from the device when needed).
  double item() const;
  // All elements, converted to T, in logical (row-major) order.
  template <class T>
  std::vector<T> tolist() const;

  std::string str() const;

 private:
  AutogradMeta& autograd_meta() const;
  std::shared_ptr<TensorImpl> impl_;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  bool grad_zero = false;  // grad's values are zeros not yet written (Tensor::mark_grad_zero)
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  // Leaves: the one AccumulateGrad node of this tensor, shared by every use in the graph (weak: the graph
  // owns it, and it owns the tensor), and the hooks it runs. A non-leaf's hooks live on its grad_fn.
  std::weak_ptr<autograd::Node> grad_accumulator;
  std::vector<std::pair<uint64_t, Tensor::GradHook>> hooks;
  std::vector<std::pair<uint64_t, Tensor::PostAccumulateHook>> post_accumulate_hooks;
  bool retains_grad = false;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Makes a tensor with a fresh storage of the same shape, dtype and device as `like`;
// Preserve keeps a channels-last layout.
Tensor empty_like(const Tensor& like, MemoryFormat format = MemoryFormat::Preserve);
Tensor empty_like(const Tensor& like, DType dtype, MemoryFormat format = MemoryFormat::Preserve);

// Checks shared by ops: `what` names the op.
void check_defined(const Tensor& t, const char* what, const char* arg);
void check_same_device(const Tensor& a, const Tensor& b, const char* what);
void check_float(const Tensor& t, const char* what, const char* arg);

template <class T>
T* Tensor::data() const {
  AF_CHECK(dtype_of<T>::value == dtype(), "data<T>(): tensor has dtype {}, asked for {}", dtype_name(dtype()),
           dtype_name(dtype_of<T>::value));
  return static_cast<T*>(data_ptr());
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  check_sizes_nonnegative(shape, "from_vector");
  AF_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()),
           "from_vector: shape {} has {} elements but {} values were given", shape.str(), shape_numel(shape),
           values.size());
  Tensor t = empty(shape, dtype_of<T>::value, kCPU);
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}
template <>
Tensor Tensor::from_vector<bool>(const std::vector<bool>& values, const Shape& shape);

}  // namespace ampforge
