// The host: CPU model and cores, RAM, CPU frequency governor, kernel. Read from /proc and /sys; a missing
// file (containers, VMs without cpufreq) gives a Field without a value.
#pragma once

#include <cstdint>
#include <string>

#include "ampforge/hw/field.h"

namespace ampforge::hw {

struct HostInfo {
  Field<std::string> cpu_model;
  Field<int> logical_cpus;
  Field<uint64_t> ram_total_bytes;
  Field<uint64_t> ram_available_bytes;
  Field<std::string> cpu_governor;  // "performance", or "powersave (12), performance (4)" when they differ
  Field<std::string> kernel;
};

HostInfo probe_host();

}  // namespace ampforge::hw
