// Storage: a reference-counted byte buffer on one device. Tensors are views into a Storage.
// Ownership: the storage owns its bytes when it came from an Allocator (given back on destruction);
// storages over external buffers call the caller's deleter (or nothing) instead.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "ampforge/core/allocator.h"
#include "ampforge/core/device.h"

namespace ampforge {

class StorageImpl {
 public:
  StorageImpl(size_t nbytes, Device device, Allocator* allocator);
  StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // Bumped by every in-place write; autograd uses it to detect a saved tensor modified after saving.
  uint32_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  std::function<void(void*)> deleter_;
  std::atomic<uint32_t> version_{0};
};

using Storage = std::shared_ptr<StorageImpl>;

Storage make_storage(size_t nbytes, Device device);

}  // namespace ampforge
