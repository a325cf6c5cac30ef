// The CPU backend's entry point: registers every CPU kernel family. One line per family.
#include "ampforge/backends/cpu/blas_kernels.h"
#include "ampforge/backends/cpu/register.h"

namespace ampforge {

void register_cpu_backend() {
  cpu::select_blas_kernels();  // OpenBLAS's kernels for this CPU, before any GEMM (blas_kernels.h)
  cpu::register_cpu_runtime();
  cpu::register_elementwise_cpu();
  cpu::register_reduce_cpu();
  cpu::register_blas_cpu();
  cpu::register_conv_cpu();
  cpu::register_pool_cpu();
  cpu::register_norm_cpu();
  cpu::register_softmax_cpu();
  cpu::register_attention_cpu();
  cpu::register_index_cpu();
  cpu::register_optim_cpu();
  cpu::register_amp_cpu();
}

}  // namespace ampforge
