// GPU spec database: vendor peak rates per board, each entry with its source. Doctor uses it for the
// expected PCIe generation; the benchmark uses it for % of peak. All rates are dense (no 2:4 sparsity).
// Mixed-precision training runs its matmuls as FP16/BF16 inputs with FP32 accumulation, so that is the
// tensor rate recorded (GeForce boards run it at half the FP16-accumulate rate).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace ampforge::hw {

struct GpuSpec {
  std::string_view key;           // stable id, e.g. "rtx4080"
  std::string_view name;          // marketing name
  std::string_view architecture;  // "Ada Lovelace", "Hopper", ...
  double fp32_tflops;
  std::optional<double> tf32_tensor_tflops;  // nullopt: no TF32 (before Ampere)
  double fp16_tensor_fp32acc_tflops;         // FP16/BF16 tensor cores, FP32 accumulate (Turing: FP16 only)
  double memory_gb;                          // as the vendor states it
  double memory_bandwidth_gbps;              // GB/s
  int pcie_gen;
  int pcie_lanes;
  std::string_view source;
};

std::span<const GpuSpec> gpu_specs();
// The entry whose name patterns match an NVML device name ("NVIDIA GeForce RTX 4080", "NVIDIA H200", ...).
// Case-insensitive; the most specific pattern wins; nullptr when the board is not in the database.
const GpuSpec* find_gpu_spec(std::string_view nvml_name);
const GpuSpec* find_gpu_spec_by_key(std::string_view key);

}  // namespace ampforge::hw
