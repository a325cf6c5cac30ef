// OpenBLAS kernel selection (see blas_kernels.h for why).
#include "ampforge/backends/cpu/blas_kernels.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "ampforge/util/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
}

namespace ampforge::cpu {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

struct CoreRank {
  const char* name;
  int rank;
};
// OpenBLAS's x86-64 core names (driver/others/dynamic.c) by the instruction sets their kernels use.
constexpr std::array<CoreRank, 26> kCores{{
    {"katmai", 0},      {"coppermine", 0}, {"northwood", 0},   {"banias", 0},     {"athlon", 0},
    {"prescott", 0},    {"core2", 0},      {"penryn", 0},      {"dunnington", 0}, {"atom", 0},
    {"nano", 0},        {"opteron", 0},    {"opteron_sse3", 0}, {"barcelona", 0}, {"bobcat", 0},
    {"nehalem", 1},     {"sandybridge", 2}, {"bulldozer", 2},  {"piledriver", 3}, {"steamroller", 3},
    {"excavator", 3},   {"haswell", 4},    {"zen", 4},         {"skylakex", 5},   {"cooperlake", 6},
    {"sapphirerapids", 6},
}};

std::string text(const char* p) { return p ? std::string(p) : std::string(); }

// One attempt: ask OpenBLAS's dynamic-arch code for `core`; true when it is the active one afterwards.
using VoidFn = void (*)();
bool reselect(const std::string& core, VoidFn quit, VoidFn init) {
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  quit();  // gotoblas = NULL
  init();  // reads OPENBLAS_CORETYPE, sets gotoblas, runs its parameter init
  return lower(text(openblas_get_corename())) == lower(core);
}

BlasKernels select() {
  BlasKernels r;
  r.library = text(openblas_get_config());
  const size_t first = r.library.find(' ');
  r.version = r.library.substr(0, first == std::string::npos ? first : r.library.find(' ', first + 1));
  r.loaded_core = r.core = text(openblas_get_corename());
  r.cpu_best = best_openblas_core(host_isa());
  if (r.core.empty() || r.library.find("DYNAMIC_ARCH") == std::string::npos) {
    r.source = BlasKernels::Source::Unavailable;
    r.note = "OpenBLAS built for one target (no DYNAMIC_ARCH): its kernels cannot be chosen at run time";
    return r;
  }
  if (const char* user = std::getenv("OPENBLAS_CORETYPE"); user && *user) {
    r.source = BlasKernels::Source::UserEnv;
    r.note = "OPENBLAS_CORETYPE=" + std::string(user) + " set by the user";
    return r;
  }
  const int have = openblas_core_rank(r.core), best = openblas_core_rank(r.cpu_best);
  if (have < 0 || best <= have) {
    r.note = have < 0 ? "OpenBLAS chose a core ampforge does not rank; kept" : "OpenBLAS's own choice matches this CPU";
    return r;
  }
  if (const char* keep = std::getenv("AMPFORGE_BLAS_CORETYPE"); keep && lower(keep) == "keep") {
    r.source = BlasKernels::Source::Kept;
    r.note = "AMPFORGE_BLAS_CORETYPE=keep: OpenBLAS's " + r.core + " kept although this CPU runs " + r.cpu_best;
    return r;
  }
  auto quit = reinterpret_cast<VoidFn>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<VoidFn>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (!quit || !init) {
    r.source = BlasKernels::Source::Unavailable;
    r.note = "this OpenBLAS has no gotoblas_dynamic_init: " + r.core + " kept although this CPU runs " + r.cpu_best +
             " (set OPENBLAS_CORETYPE=" + r.cpu_best + " before starting)";
    return r;
  }
  // Candidates, strongest first, from the CPU's best down to one rank above what loaded. Only Intel kernel sets:
  // AMD's older cores of the same ranks use instructions (FMA4, XOP) that Intel CPUs lack, and an older OpenBLAS
  // may lack the newest set, hence the fall-through.
  constexpr std::array<const char*, 5> kCandidates{"Cooperlake", "SkylakeX", "Haswell", "Sandybridge", "Nehalem"};
  std::vector<std::string> candidates;
  for (const char* c : kCandidates)
    if (const int rank = openblas_core_rank(c); rank <= best && rank > have) candidates.emplace_back(c);
  for (const std::string& c : candidates) {
    if (reselect(c, quit, init)) {
      r.core = text(openblas_get_corename());
      r.source = BlasKernels::Source::Ampforge;
      r.note = "OpenBLAS chose " + r.loaded_core + " (it does not know this CPU model); ampforge selected " + r.core +
               " (OPENBLAS_CORETYPE, AMPFORGE_BLAS_CORETYPE=keep to keep OpenBLAS's choice)";
      return r;
    }
  }
  // Nothing took: restore the load-time choice.
  ::unsetenv("OPENBLAS_CORETYPE");
  quit();
  init();
  r.core = text(openblas_get_corename());
  r.note = "OpenBLAS chose " + r.loaded_core + " and refused every stronger core; kept";
  return r;
}

}  // namespace

CpuIsa host_isa() {
  CpuIsa isa;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return isa;
  const bool osxsave = (c >> 27) & 1u;
  isa.sse42 = (c >> 20) & 1u;
  uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool os_avx = (xcr0 & 0x6) == 0x6;        // XMM and YMM state saved by the OS
  const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;   // plus opmask and ZMM state
  isa.avx = os_avx && ((c >> 28) & 1u);
  isa.fma = os_avx && ((c >> 12) & 1u);
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    isa.avx2 = os_avx && ((b >> 5) & 1u);
    isa.avx512f = os_avx512 && ((b >> 16) & 1u);
    isa.avx512dq = os_avx512 && ((b >> 17) & 1u);
    isa.avx512cd = os_avx512 && ((b >> 28) & 1u);
    isa.avx512bw = os_avx512 && ((b >> 30) & 1u);
    isa.avx512vl = os_avx512 && ((b >> 31) & 1u);
    const unsigned max_sub = a;
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      isa.avx512bf16 = os_avx512 && ((a >> 5) & 1u);
    }
  }
#endif
  return isa;
}

int openblas_core_rank(std::string_view core) {
  const std::string l = lower(core);
  for (const CoreRank& c : kCores)
    if (l == c.name) return c.rank;
  return -1;
}

std::string best_openblas_core(const CpuIsa& isa) {
  const bool avx512 = isa.avx512f && isa.avx512bw && isa.avx512dq && isa.avx512vl && isa.avx512cd;
  if (avx512 && isa.avx512bf16) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (isa.avx2 && isa.fma) return "Haswell";
  if (isa.avx) return "Sandybridge";
  if (isa.sse42) return "Nehalem";
  return "";
}

bool BlasKernels::below_cpu() const {
  const int have = openblas_core_rank(core), best = openblas_core_rank(cpu_best);
  return have >= 0 && best > have;
}

const char* blas_source_name(BlasKernels::Source s) {
  switch (s) {
    case BlasKernels::Source::OpenBLAS: return "openblas";
    case BlasKernels::Source::UserEnv: return "user-env";
    case BlasKernels::Source::Ampforge: return "ampforge";
    case BlasKernels::Source::Kept: return "kept";
    case BlasKernels::Source::Unavailable: return "unavailable";
  }
  return "?";
}

const BlasKernels& select_blas_kernels() {
  static const BlasKernels result = [] {
    BlasKernels r = select();
    if (r.source == BlasKernels::Source::Ampforge) log(LogLevel::Info, "BLAS: {}", r.note);
    return r;
  }();
  return result;
}

}  // namespace ampforge::cpu
