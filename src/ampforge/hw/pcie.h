// PCIe: theoretical link rates, and what needs the CUDA runtime: waking a link from power saving (GPUs drop
// to Gen1 when idle, so a link read while idle says nothing about training) and measuring pinned
// host-to-device / device-to-host bandwidth.
//
// The CUDA runtime is loaded with dlopen (libcudart.so.13, .12, .11, plain; or AMPFORGE_CUDART_LIBRARY), so
// ampforge never depends on CUDA at link time. Only documented runtime entry points are used.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ampforge/hw/dynlib.h"

namespace ampforge::hw {

// Usable bytes per second per lane and direction, after line coding (8b/10b for Gen1-2, 128b/130b for
// Gen3-5, FLIT for Gen6), in GB/s; 0 for an unknown generation.
double pcie_lane_gbps(unsigned gen);
double pcie_link_gbps(unsigned gen, unsigned width);

struct BandwidthResult {
  double h2d_gbps = 0, d2h_gbps = 0;
  size_t bytes = 0;  // per copy
  int copies = 0;    // timed copies per direction
};

class CudaRuntime {
 public:
  // Loads the runtime and counts devices. Never throws; error() says why it is unusable.
  static std::unique_ptr<CudaRuntime> open();
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // The library loaded with every function doctor needs (device counting was then tried).
  bool loaded() const { return loaded_; }
  // cudaGetDeviceCount's status (a cudaError_t: 0 success, 100 no device, 802 system not ready, ...); 0 when it
  // was not called (the library is missing or incomplete).
  int count_status() const { return count_status_; }
  // "system not yet initialized (cudaError 802)": the runtime's text for a cudaError_t.
  std::string error_text(int code) const { return err(code); }
  std::string library_path() const { return lib_.path(); }
  int device_count() const { return device_count_; }

  // The CUDA device index of the GPU at an NVML PCI bus id ("00000000:01:00.0"), or an error message.
  std::optional<int> device_for_bus_id(const std::string& bus_id, std::string* error) const;
  // Runs `while_busy` while another thread keeps host-to-device copies going on `device`, so the link is
  // at its working speed when read. Returns an error message, or empty on success.
  std::string with_link_busy(int device, const std::function<void()>& while_busy) const;
  // Pinned-memory copy bandwidth; an error message in *error when something failed.
  std::optional<BandwidthResult> measure_bandwidth(int device, size_t bytes, int copies, std::string* error) const;

 private:
  std::string err(int code) const;

  DynLib lib_;
  bool ok_ = false;
  bool loaded_ = false;
  int count_status_ = 0;
  std::string error_;
  int device_count_ = 0;
  struct Api {
    int (*cudaGetDeviceCount)(int*) = nullptr;
    int (*cudaDeviceGetByPCIBusId)(int*, const char*) = nullptr;
    int (*cudaSetDevice)(int) = nullptr;
    int (*cudaMalloc)(void**, size_t) = nullptr;
    int (*cudaFree)(void*) = nullptr;
    int (*cudaMallocHost)(void**, size_t) = nullptr;
    int (*cudaFreeHost)(void*) = nullptr;
    int (*cudaMemcpy)(void*, const void*, size_t, int) = nullptr;  // cudaMemcpyKind as int
    int (*cudaDeviceSynchronize)() = nullptr;
    const char* (*cudaGetErrorString)(int) = nullptr;
  } api_;
};

}  // namespace ampforge::hw
