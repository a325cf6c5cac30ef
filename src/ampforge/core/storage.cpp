#include "ampforge/core/storage.h"

#include "ampforge/core/dispatch.h"
#include "ampforge/util/error.h"

namespace ampforge {

StorageImpl::StorageImpl(size_t nbytes, Device device, Allocator* allocator)
    : nbytes_(nbytes), device_(device), allocator_(allocator) {
  data_ = allocator_->allocate(nbytes, device);
}

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

StorageImpl::~StorageImpl() {
  if (allocator_ != nullptr) {
    allocator_->deallocate(data_, nbytes_, device_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

Storage make_storage(size_t nbytes, Device device) {
  Allocator* a = get_allocator(device.type);
  if (a == nullptr && !device.is_cpu()) {
    // The CUDA and meta backends install their allocators when they register, which happens on the first
    // op; a tensor may be created on the device before any op ran.
    ensure_backends_registered();
    a = get_allocator(device.type);
  }
  if (a == nullptr) {
    AF_THROW(NotImplemented, "no memory allocator for device {}: {}", device.str(),
             device.is_cuda() ? "this build of ampforge has no CUDA backend, or no CUDA device was found"
                              : "none was installed");
  }
  return std::make_shared<StorageImpl>(nbytes, device, a);
}

}  // namespace ampforge
