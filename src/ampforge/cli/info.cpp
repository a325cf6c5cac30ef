// `ampforge info`: what this build contains (backends, kernels per device, threads, the CUPTI injection library).
#include <cstdio>
#include <string>

#include "ampforge/backends/cpu/blas_kernels.h"
#include "ampforge/backends/cpu/conv_onednn.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/core/runtime.h"
#include "ampforge/cli/commands.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/profiler/device.h"
#include "ampforge/util/build_info.h"
#include "ampforge/util/thread_pool.h"

namespace ampforge::cli {

Command add_info_command(CLI::App& app) {
  auto* sub = app.add_subcommand("info", "Show what this build of ampforge contains");
  return {sub, [] {
            ensure_backends_registered();
            int cpu = 0, cuda = 0;
            for (int i = 0; i < kNumOps; ++i) {
              cpu += has_kernel(static_cast<OpId>(i), DeviceType::CPU);
              cuda += has_kernel(static_cast<OpId>(i), DeviceType::CUDA);
            }
            std::printf("ampforge %s (%s, %s)\n", AMPFORGE_VERSION_STRING, AMPFORGE_BUILD_TYPE, AMPFORGE_CXX_COMPILER);
            std::printf("ops: %d; CPU kernels: %d; CUDA kernels: %d\n", kNumOps, cpu, cuda);
            std::printf("CPU threads: %d\n", get_num_threads());
            const cpu::BlasKernels& blas = cpu::select_blas_kernels();
            std::printf("BLAS: %s; kernels: %s (%s)\n", blas.version.empty() ? "?" : blas.version.c_str(),
                        blas.core.empty() ? "?" : blas.core.c_str(), blas.note.c_str());
            const bool f32_on_onednn = cpu::onednn_f32_gemm_active();
            std::printf("CPU matrix products: %s\n", cpu::cpu_gemm_summary().c_str());
            std::printf("CPU convolutions: %s\n", cpu::cpu_conv_summary().c_str());
            if (blas.below_cpu())
              std::printf("WARNING: these BLAS kernels are weaker than this CPU allows (%s): %s run slower than they "
                          "could\n",
                          blas.cpu_best.c_str(),
                          f32_on_onednn ? "F64 products (and every product with AMPFORGE_CPU_MATMUL=blas)"
                                        : "GEMMs, and so convolutions and linear layers,");
            const runtime::DeviceRuntime& gpu = runtime::device_runtime(DeviceType::CUDA);
            if (const int devices = gpu.device_count(); devices > 0)
              std::printf("CUDA devices: %d\n", devices);
            else
              std::printf("CUDA: not available (%s)\n", gpu.unavailable_reason().c_str());
            for (const std::string& line : gpu.library_lines()) std::printf("%s\n", line.c_str());
            if (const std::string lib = profiler::cupti_injection_library(); !lib.empty()) {
              std::printf("CUPTI injection library: %s\n", lib.c_str());
            } else if (const auto looked = profiler::cupti_injection_candidates(); !looked.empty()) {
              std::string where;
              for (const std::string& c : looked) where += (where.empty() ? "" : ", ") + c;
              std::printf("CUPTI injection library: not found (looked for %s)\n", where.c_str());
            } else {
              std::printf("CUPTI injection library: not in this build\n");
            }
            return 0;
          }};
}

}  // namespace ampforge::cli
