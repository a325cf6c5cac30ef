// The numbers below were checked against the vendor documents named in each entry (see also the
// "Corrections" section of the project brief, ../shared/docs/MISSION.md: the RTX 4080 has 16 GB, not 24).
#include "ampforge/hw/gpu_specs.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

namespace ampforge::hw {

namespace {

constexpr std::string_view kAdaWp = "NVIDIA Ada Lovelace GPU Architecture whitepaper v2.1, Appendix A (GeForce RTX 4090/4080)";
constexpr std::string_view kAmpereWp = "NVIDIA Ampere GA102 GPU Architecture whitepaper v2.0, Appendix A (GeForce RTX 3090/3080)";

const std::array kSpecs = {
    GpuSpec{"rtx4090", "GeForce RTX 4090", "Ada Lovelace", 82.6, 82.6, 165.2, 24, 1008, 4, 16, kAdaWp},
    GpuSpec{"rtx4080", "GeForce RTX 4080", "Ada Lovelace", 48.7, 48.7, 97.5, 16, 716.8, 4, 16, kAdaWp},
    GpuSpec{"rtx3090", "GeForce RTX 3090", "Ampere", 35.6, 35.6, 71.0, 24, 936, 4, 16, kAmpereWp},
    GpuSpec{"rtx3080", "GeForce RTX 3080 (10 GB)", "Ampere", 29.8, 29.8, 59.5, 10, 760, 4, 16, kAmpereWp},
    GpuSpec{"titanrtx", "NVIDIA TITAN RTX", "Turing", 16.3, std::nullopt, 130.5, 24, 672, 3, 16,
            "NVIDIA Turing GPU Architecture whitepaper, Appendix A (TITAN RTX: FP16 tensor with FP32 accumulate "
            "at full rate)"},
    GpuSpec{"a100-sxm4-80gb", "NVIDIA A100 80GB SXM4", "Ampere", 19.5, 156, 312, 80, 2039, 4, 16,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)"},
    GpuSpec{"a100-sxm4-40gb", "NVIDIA A100 40GB SXM4", "Ampere", 19.5, 156, 312, 40, 1555, 4, 16,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)"},
    GpuSpec{"a100-pcie-80gb", "NVIDIA A100 80GB PCIe", "Ampere", 19.5, 156, 312, 80, 1935, 4, 16,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)"},
    GpuSpec{"a100-pcie-40gb", "NVIDIA A100 40GB PCIe", "Ampere", 19.5, 156, 312, 40, 1555, 4, 16,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)"},
    GpuSpec{"h100-sxm", "NVIDIA H100 SXM5 80GB", "Hopper", 67, 494.7, 989.4, 80, 3350, 5, 16,
            "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM; sparse rates halved)"},
    GpuSpec{"h100-pcie", "NVIDIA H100 PCIe 80GB", "Hopper", 51, 378, 756.5, 80, 2000, 5, 16,
            "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe; sparse rates halved)"},
    GpuSpec{"h100-nvl", "NVIDIA H100 NVL", "Hopper", 60, 417.5, 835.5, 94, 3938, 5, 16,
            "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL; sparse rates halved)"},
    GpuSpec{"h200", "NVIDIA H200 SXM", "Hopper", 67, 494.7, 989.4, 141, 4800, 5, 16,
            "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM; sparse rates halved)"},
    GpuSpec{"h200-nvl", "NVIDIA H200 NVL", "Hopper", 60, 417.5, 835.5, 141, 4800, 5, 16,
            "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL; sparse rates halved)"},
    GpuSpec{"l40s", "NVIDIA L40S", "Ada Lovelace", 91.6, 183, 362.05, 48, 864, 4, 16,
            "NVIDIA L40S datasheet (sparse rates halved)"},
};

// NVML names, lower case, most specific first. Each pattern's words must all appear in the name.
struct Pattern {
  std::array<std::string_view, 3> words;
  std::string_view key;
  std::string_view unless = {};  // a word that rules the pattern out (a different board of the same family)
};
const std::array kPatterns = {
    Pattern{{"rtx 4090", "", ""}, "rtx4090"},
    Pattern{{"rtx 4080", "", ""}, "rtx4080", "super"},  // the 4080 SUPER has more SMs: not in the table
    Pattern{{"rtx 3090", "", ""}, "rtx3090"},
    Pattern{{"rtx 3080", "", ""}, "rtx3080", "ti"},
    Pattern{{"titan rtx", "", ""}, "titanrtx"},
    Pattern{{"a100", "sxm", "80gb"}, "a100-sxm4-80gb"},
    Pattern{{"a100", "sxm", ""}, "a100-sxm4-40gb"},
    Pattern{{"a100", "80gb", "pcie"}, "a100-pcie-80gb"},
    Pattern{{"a100", "pcie", ""}, "a100-pcie-40gb"},
    Pattern{{"h100", "nvl", ""}, "h100-nvl"},
    Pattern{{"h100", "pcie", ""}, "h100-pcie"},
    Pattern{{"h100", "", ""}, "h100-sxm"},
    Pattern{{"h200", "nvl", ""}, "h200-nvl"},
    Pattern{{"h200", "", ""}, "h200"},
    Pattern{{"l40s", "", ""}, "l40s"},
};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::span<const GpuSpec> gpu_specs() { return kSpecs; }

const GpuSpec* find_gpu_spec_by_key(std::string_view key) {
  for (const auto& s : kSpecs)
    if (s.key == key) return &s;
  return nullptr;
}

const GpuSpec* find_gpu_spec(std::string_view nvml_name) {
  const std::string n = lower(nvml_name);
  for (const auto& p : kPatterns) {
    bool all = p.unless.empty() || n.find(p.unless) == std::string::npos;
    for (auto w : p.words)
      if (!w.empty() && n.find(w) == std::string::npos) all = false;
    if (all) return find_gpu_spec_by_key(p.key);
  }
  return nullptr;
}

}  // namespace ampforge::hw
