// See onednn_runtime.h.
#include "ampforge/backends/cpu/onednn_runtime.h"

#ifdef AMPFORGE_HAVE_ONEDNN
#include <omp.h>

#include <atomic>
#include <memory>
#include <new>
#include <string>

#include "ampforge/util/thread_pool.h"

namespace ampforge::cpu::onednn {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

int set_threads_for_call(bool parallel) {
  const int n = !parallel || in_parallel_region() ? 1 : get_num_threads();
  // oneDNN sizes a primitive's work partition by this at creation, and runs that many threads at execution.
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
  return n;
}

namespace {
struct FreeAligned {
  void operator()(void* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using Buffer = std::unique_ptr<void, FreeAligned>;
std::atomic<int64_t> g_bytes{0}, g_grows{0};

struct Slots {
  Buffer buf[kSlots];
  size_t cap[kSlots] = {};
  ~Slots() {
    for (size_t c : cap) g_bytes.fetch_sub(static_cast<int64_t>(c), std::memory_order_relaxed);
  }
};
}  // namespace

void* slot_buffer(Slot slot, size_t bytes) {
  if (bytes == 0) return nullptr;
  thread_local Slots slots;
  if (slots.cap[slot] < bytes) {
    slots.buf[slot].reset();  // free first: the old and the new one need not both be resident
    slots.buf[slot] = Buffer(::operator new[](bytes, std::align_val_t{64}));
    g_bytes.fetch_add(static_cast<int64_t>(bytes - slots.cap[slot]), std::memory_order_relaxed);
    g_grows.fetch_add(1, std::memory_order_relaxed);
    slots.cap[slot] = bytes;
  }
  return slots.buf[slot].get();
}

int64_t slot_bytes() { return g_bytes.load(std::memory_order_relaxed); }
int64_t slot_grows() { return g_grows.load(std::memory_order_relaxed); }

bool native_bf16() {
  // dnnl_get_effective_cpu_isa() is the strongest ISA oneDNN dispatches to here (the CPU's, capped by
  // ONEDNN_MAX_CPU_ISA). Its values are bit sets growing with the ISA: AVX512_BF16's bits are in AMX's too.
  static const bool yes = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return yes;
}

std::string describe() {
  const dnnl_version_t* v = dnnl_version();
  const char* isa = "?";
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: isa = "sse41"; break;
    case dnnl::cpu_isa::avx: isa = "avx"; break;
    case dnnl::cpu_isa::avx2: isa = "avx2"; break;
    case dnnl::cpu_isa::avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl::cpu_isa::avx512_core: isa = "avx512_core"; break;
    case dnnl::cpu_isa::avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl::cpu_isa::avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl::cpu_isa::avx512_core_amx: isa = "avx512_core_amx"; break;
    default: break;
  }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " (" +
         isa + ")";
}

}  // namespace ampforge::cpu::onednn
#endif
