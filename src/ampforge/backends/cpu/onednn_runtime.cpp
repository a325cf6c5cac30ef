// See onednn_runtime.h.
#include "ampforge/backends/cpu/onednn_runtime.h"

#ifdef AMPFORGE_HAVE_ONEDNN
#include <omp.h>

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
// dnnl_get_effective_cpu_isa() is the strongest ISA oneDNN dispatches to here (the CPU's, capped by ONEDNN_MAX_CPU_ISA).
// Its values are bit sets growing with the ISA: AVX512_BF16's bits are in AMX's too.
bool dispatches_to(dnnl::cpu_isa want) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto w = static_cast<unsigned>(want);
  return (isa & w) == w;
}
}  // namespace

bool native_bf16() {
  static const bool yes = dispatches_to(dnnl::cpu_isa::avx512_core_bf16);
  return yes;
}

bool amx() {
  static const bool yes = dispatches_to(dnnl::cpu_isa::avx512_core_amx);
  return yes;
}

std::string isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "?";
  }
}

std::string describe() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " (" +
         isa_name() + ")";
}

}  // namespace ampforge::cpu::onednn
#endif
