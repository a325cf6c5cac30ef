// Which OpenBLAS kernels run our GEMMs, and choosing better ones when OpenBLAS does not know the CPU.
//
// Why: an OpenBLAS built with DYNAMIC_ARCH (Debian's, and most distributions') picks its kernel set when the
// library loads, by the CPU's family/model number. A CPU released after that OpenBLAS is not in its table and
// gets the generic fallback, Prescott (SSE3). Measured on a 2-vCPU Xeon of model 207 (Emerald Rapids) with
// Debian's OpenBLAS 0.3.21: SGEMM 1024^3 on one thread runs at 16.6 GFLOP/s with the Prescott kernels it
// picks, 102 with SkylakeX and 120 with Cooperlake (`OPENBLAS_CORETYPE=...`). Every convolution and linear
// layer of ampforge's CPU backend is a GEMM, so this decides the CPU backend's speed.
//
// What select_blas_kernels() does, once, when the CPU backend registers (before any GEMM of ours):
//   - reads the core OpenBLAS chose at load (openblas_get_corename());
//   - ranks it against the best OpenBLAS core that this CPU's instruction sets can run (CPUID);
//   - when the loaded core is weaker, the user has not set OPENBLAS_CORETYPE, and AMPFORGE_BLAS_CORETYPE is not
//     "keep", sets OPENBLAS_CORETYPE (so child processes, e.g. the PyTorch peer of `ampforge bench`, which uses
//     the same system OpenBLAS, run the same kernels) and re-runs OpenBLAS's own dynamic-arch selection
//     (gotoblas_dynamic_quit + gotoblas_dynamic_init, looked up with dlsym: a BLAS without them is left alone);
//   - checks that the core it asked for is the one now active, else tries the next weaker candidate.
// The result is reported by `ampforge info`, `ampforge doctor`, the bench's header and its JSON.
#pragma once

#include <string>
#include <string_view>

namespace ampforge::cpu {

// The x86 instruction-set extensions that separate OpenBLAS's kernel sets.
struct CpuIsa {
  bool sse42 = false, avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512cd = false;
  bool avx512bf16 = false;
};
CpuIsa host_isa();  // CPUID of the running CPU (all false on non-x86 hosts)

// OpenBLAS's x86-64 core names ordered by the instruction sets their kernels use: 0 SSE2/SSE3 (Prescott, Core2,
// Opteron, ...), 1 SSE4 (Nehalem), 2 AVX (Sandybridge, Bulldozer), 3 AVX+FMA (Piledriver, Steamroller, Excavator),
// 4 AVX2+FMA (Haswell, Zen), 5 AVX-512 (SkylakeX), 6 AVX-512+BF16 (Cooperlake, SapphireRapids). Case-insensitive;
// -1 for a name not in the table (never replaced).
int openblas_core_rank(std::string_view core);
// The strongest core of that table this ISA can run, "" when none applies (e.g. not x86).
std::string best_openblas_core(const CpuIsa& isa);

struct BlasKernels {
  enum class Source {
    OpenBLAS,     // OpenBLAS's own choice at load, kept (it is as good as the CPU allows, or nothing better worked)
    UserEnv,      // OPENBLAS_CORETYPE was set by the user: never overridden
    Ampforge,     // ampforge re-selected a stronger core (see above)
    Kept,         // AMPFORGE_BLAS_CORETYPE=keep: the load-time choice kept on request
    Unavailable,  // not a DYNAMIC_ARCH OpenBLAS (no core name or no re-selection entry points)
  };
  std::string library;      // openblas_get_config(), e.g. "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..." (built at
                            // load time: it names the load-time core, not a re-selected one)
  std::string version;      // its first two words, e.g. "OpenBLAS 0.3.21"
  std::string loaded_core;  // the core OpenBLAS chose when it loaded
  std::string core;         // the core that runs GEMMs now
  std::string cpu_best;     // the strongest core this CPU can run ("" if unknown)
  Source source = Source::OpenBLAS;
  std::string note;         // one line: what was done or why nothing was

  // True when the active kernels are weaker than the CPU allows (e.g. the user forced an old core).
  bool below_cpu() const;
};
const char* blas_source_name(BlasKernels::Source s);  // "openblas", "user-env", "ampforge", "kept", "unavailable"

// Selects once (thread-safe) and returns the result; later calls return the same object. Called by the CPU
// backend's registration, so any program that runs an op has it done before its first GEMM.
const BlasKernels& select_blas_kernels();

}  // namespace ampforge::cpu
