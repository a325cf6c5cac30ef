// Registration functions of the CPU backend, one per op family (called from register_cpu.cpp).
#pragma once

namespace ampforge::cpu {

void register_cpu_runtime();  // runtime_cpu.cpp: the device runtime and the CPU's capabilities (core/runtime.h)
void register_elementwise_cpu();
void register_reduce_cpu();
void register_blas_cpu();
void register_conv_cpu();
void register_pool_cpu();
void register_norm_cpu();
void register_softmax_cpu();
void register_attention_cpu();
void register_index_cpu();
void register_optim_cpu();
void register_amp_cpu();

}  // namespace ampforge::cpu
