// What the oneDNN-backed CPU kernels share (conv_onednn.cpp, matmul_onednn.cpp): the engine, the calling
// thread's OpenMP team size and stream, the primitive cache, and whether the CPU multiplies BF16 natively.
// Internal to backends/cpu; empty in a build without oneDNN (AMPFORGE_HAVE_ONEDNN is defined for the files that use
// it only, src/CMakeLists.txt).
//
// Threads: Debian builds oneDNN on OpenMP (dnnl_config.h: DNNL_CPU_RUNTIME_OMP; no threadpool interface to hand it
// our pool), so a call sets the calling thread's OpenMP thread count to get_num_threads() (1 when the caller is
// itself a pool worker: nested parallel_for calls are serial) and executes on the calling thread, whose OpenMP team
// then does the work; a PoolIdleScope around the execution sends our pool's spinning workers to sleep meanwhile.
//
// Memory: primitives are created with scratchpad_mode::user, so the scratch they need and the copies a call makes are
// per-thread buffers reused from call to call (thread_scratch.h), outside the caching allocator.
#pragma once

#ifdef AMPFORGE_HAVE_ONEDNN
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

namespace ampforge::cpu::onednn {

dnnl::engine& engine();
// The calling thread's in-order CPU stream (executes synchronously on the calling thread's OpenMP team).
dnnl::stream& thread_stream();

// The OpenMP thread count the next primitive creation and execution on this thread use: get_num_threads(), or 1
// inside a parallel region of ours or when `parallel` is false. Sets it (an ICV of the calling thread only) and
// returns it.
int set_threads_for_call(bool parallel = true);

// The strongest ISA oneDNN dispatches to here (the CPU's, capped by ONEDNN_MAX_CPU_ISA): "avx2", "avx512_core_bf16",
// ...; "?" for one this list does not name.
std::string isa_name();
// "oneDNN 2.6.3 (avx512_core_bf16)": the library's version and isa_name().
std::string describe();

// True when oneDNN may dispatch to AVX512_BF16 (or AMX) on this CPU: BF16 products on the BF16 dot-product
// instructions, F32 accumulation. False elsewhere (there oneDNN's BF16 kernels emulate them or do not exist).
bool native_bf16();

// True when oneDNN may dispatch to AMX (avx512_core_amx: BF16 tile products) on this CPU.
bool amx();

// Created primitives, per problem, for the process. Creating a primitive descriptor walks oneDNN's implementation
// list and JIT-compiles kernels (0.1-10 ms each) against ~1 ms for a typical execution, so each problem (its key:
// everything the primitive depends on, the thread count included) is created once and kept, problems oneDNN
// declines too, so the fallback decision is made once. Bounded: a model fed ever-new shapes would otherwise grow it
// without end; at kMaxEntries it is emptied and refilled, which costs one creation per problem again.
// Prim: default-constructible with `bool usable` (false by default) and `std::string impl`.
template <class Prim>
class PrimitiveCache {
 public:
  static constexpr size_t kMaxEntries = 4096;

  // The entry for `key`, made by create() (returning std::shared_ptr<Prim>) on first use. A descriptor oneDNN
  // rejects (dnnl::error from create) is kept as an unusable entry whose impl says why.
  template <class Create>
  std::shared_ptr<const Prim> get(std::vector<int64_t> key, Create&& create) {
    std::lock_guard<std::mutex> lk(mutex_);
    if (auto it = map_.find(key); it != map_.end()) return it->second;
    if (map_.size() >= kMaxEntries) map_.clear();
    std::shared_ptr<const Prim> prim;
    try {
      prim = create();
    } catch (const dnnl::error& e) {
      auto r = std::make_shared<Prim>();
      r->impl = std::string("rejected: ") + e.what();
      prim = r;
    }
    return map_.emplace(std::move(key), std::move(prim)).first->second;
  }

 private:
  std::mutex mutex_;
  std::map<std::vector<int64_t>, std::shared_ptr<const Prim>> map_;
};

}  // namespace ampforge::cpu::onednn
#endif
