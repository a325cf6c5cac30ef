// Two containers for the allocator's hot path, which runs under its mutex: neither allocates per
// operation once warm (malloc/free would double the cost of a cache hit).
//   NodePool / PoolAllocator  a free list of equal-sized nodes for std::set (stateful allocator).
//   PtrMap                    open addressing with linear probing and backward-shift deletion,
//                             keyed by a non-zero address.
// Not thread-safe: the owner serialises access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

namespace ampforge::memory {

class NodePool {
 public:
  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;
  ~NodePool() {
    for (void* c : chunks_) ::operator delete(c);
  }
  void* get(size_t bytes) {
    if (node_ == 0) node_ = std::max(bytes, sizeof(void*));
    if (bytes != node_) return ::operator new(bytes);  // a node type we did not expect: plain new
    if (free_ == nullptr) refill();
    void* p = free_;
    free_ = *static_cast<void**>(p);
    return p;
  }
  void put(void* p, size_t bytes) noexcept {
    if (bytes != node_) {
      ::operator delete(p);
      return;
    }
    *static_cast<void**>(p) = free_;
    free_ = p;
  }

 private:
  void refill() {
    constexpr size_t kPerChunk = 256;
    const size_t stride = (node_ + alignof(std::max_align_t) - 1) / alignof(std::max_align_t) * alignof(std::max_align_t);
    char* c = static_cast<char*>(::operator new(stride * kPerChunk));
    chunks_.push_back(c);
    for (size_t i = 0; i < kPerChunk; ++i) put(c + i * stride, node_);
  }
  size_t node_ = 0;
  void* free_ = nullptr;
  std::vector<void*> chunks_;
};

template <class T>
class PoolAllocator {
 public:
  using value_type = T;
  explicit PoolAllocator(NodePool* pool) : pool_(pool) {}
  template <class U>
  PoolAllocator(const PoolAllocator<U>& o) : pool_(o.pool()) {}
  T* allocate(size_t n) { return static_cast<T*>(pool_->get(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { pool_->put(p, n * sizeof(T)); }
  NodePool* pool() const { return pool_; }
  template <class U>
  bool operator==(const PoolAllocator<U>& o) const { return pool_ == o.pool(); }

 private:
  NodePool* pool_;
};

template <class V>
class PtrMap {
 public:
  PtrMap() : slots_(64) {}
  size_t size() const { return size_; }

  V* find(uintptr_t key) {
    for (size_t i = hash(key);; i = (i + 1) & mask()) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == 0) return nullptr;
    }
  }
  const V* find(uintptr_t key) const { return const_cast<PtrMap*>(this)->find(key); }
  void insert(uintptr_t key, V value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    size_t i = hash(key);
    while (slots_[i].key != 0 && slots_[i].key != key) i = (i + 1) & mask();
    if (slots_[i].key == 0) ++size_;
    slots_[i] = {key, value};
  }
  bool erase(uintptr_t key) {
    size_t i = hash(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return false;
      i = (i + 1) & mask();
    }
    // Backward shift: move later entries of the probe run into the hole, so no tombstones are needed.
    size_t j = i;
    while (true) {
      j = (j + 1) & mask();
      if (slots_[j].key == 0) break;
      const size_t home = hash(slots_[j].key);
      // Move j to i if its home is not in the cyclic range (i, j].
      const bool in_range = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (!in_range) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {};
    --size_;
    return true;
  }
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.key != 0) f(s.key, s.value);
  }

 private:
  struct Slot {
    uintptr_t key = 0;
    V value{};
  };
  size_t mask() const { return slots_.size() - 1; }
  size_t hash(uintptr_t k) const { return static_cast<size_t>((k >> 9) * 0x9E3779B97F4A7C15ull >> 20) & mask(); }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{});
    size_ = 0;
    for (const Slot& s : old)
      if (s.key != 0) insert(s.key, s.value);
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace ampforge::memory
