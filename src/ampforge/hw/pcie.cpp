#include "ampforge/hw/pcie.h"

#include <atomic>
#include <thread>

#include <fmt/format.h>

#include "ampforge/hw/libraries.h"
#include "ampforge/util/timer.h"

namespace ampforge::hw {

namespace {
constexpr int kMemcpyHostToDevice = 1;  // cudaMemcpyHostToDevice
constexpr int kMemcpyDeviceToHost = 2;  // cudaMemcpyDeviceToHost
}  // namespace

double pcie_lane_gbps(unsigned gen) {
  switch (gen) {
    case 1: return 2.5 * 8 / 10 / 8;      // 2.5 GT/s, 8b/10b
    case 2: return 5.0 * 8 / 10 / 8;      // 5 GT/s, 8b/10b
    case 3: return 8.0 * 128 / 130 / 8;   // 8 GT/s, 128b/130b
    case 4: return 16.0 * 128 / 130 / 8;  // 16 GT/s
    case 5: return 32.0 * 128 / 130 / 8;  // 32 GT/s
    case 6: return 64.0 * 242 / 256 / 8;  // 64 GT/s PAM4, 242 of 256 FLIT bytes carry data
    default: return 0;
  }
}

double pcie_link_gbps(unsigned gen, unsigned width) { return pcie_lane_gbps(gen) * width; }

std::unique_ptr<CudaRuntime> CudaRuntime::open() {
  auto rt = std::unique_ptr<CudaRuntime>(new CudaRuntime());
  rt->lib_ = DynLib::open_first(cudart_candidates());
  if (!rt->lib_.loaded()) {
    rt->error_ = fmt::format("the CUDA runtime could not be loaded ({})", rt->lib_.error());
    return rt;
  }
  auto& a = rt->api_;
  const DynLib& l = rt->lib_;
  a.cudaGetDeviceCount = l.function<decltype(a.cudaGetDeviceCount)>("cudaGetDeviceCount");
  a.cudaDeviceGetByPCIBusId = l.function<decltype(a.cudaDeviceGetByPCIBusId)>("cudaDeviceGetByPCIBusId");
  a.cudaSetDevice = l.function<decltype(a.cudaSetDevice)>("cudaSetDevice");
  a.cudaMalloc = l.function<decltype(a.cudaMalloc)>("cudaMalloc");
  a.cudaFree = l.function<decltype(a.cudaFree)>("cudaFree");
  a.cudaMallocHost = l.function<decltype(a.cudaMallocHost)>("cudaMallocHost");
  a.cudaFreeHost = l.function<decltype(a.cudaFreeHost)>("cudaFreeHost");
  a.cudaMemcpy = l.function<decltype(a.cudaMemcpy)>("cudaMemcpy");
  a.cudaDeviceSynchronize = l.function<decltype(a.cudaDeviceSynchronize)>("cudaDeviceSynchronize");
  a.cudaGetErrorString = l.function<decltype(a.cudaGetErrorString)>("cudaGetErrorString");
  if (!a.cudaGetDeviceCount || !a.cudaSetDevice || !a.cudaMalloc || !a.cudaFree || !a.cudaMallocHost ||
      !a.cudaFreeHost || !a.cudaMemcpy || !a.cudaDeviceSynchronize) {
    rt->error_ = fmt::format("{} lacks a required runtime function", rt->lib_.path());
    return rt;
  }
  rt->loaded_ = true;
  int n = 0;
  const int e = a.cudaGetDeviceCount(&n);
  rt->count_status_ = e;
  if (e != 0) {
    rt->error_ = fmt::format("the CUDA runtime found no usable GPU: {}", rt->err(e));
    return rt;
  }
  rt->device_count_ = n;
  rt->ok_ = n > 0;
  if (n == 0) rt->error_ = "the CUDA runtime reports 0 devices";
  return rt;
}

std::string CudaRuntime::err(int code) const {
  const char* s = api_.cudaGetErrorString ? api_.cudaGetErrorString(code) : nullptr;
  return s ? fmt::format("{} (cudaError {})", s, code) : fmt::format("cudaError {}", code);
}

std::optional<int> CudaRuntime::device_for_bus_id(const std::string& bus_id, std::string* error) const {
  if (!ok_) {
    *error = error_;
    return std::nullopt;
  }
  if (!api_.cudaDeviceGetByPCIBusId) {
    *error = "cudaDeviceGetByPCIBusId is missing from the runtime";
    return std::nullopt;
  }
  int dev = -1;
  int e = api_.cudaDeviceGetByPCIBusId(&dev, bus_id.c_str());
  // NVML's busId has an 8-digit domain ("00000000:18:00.0"), CUDA's own form 4 ("0000:18:00.0"): both are hex
  // numbers to cudaDeviceGetByPCIBusId, but the form CUDA prints is tried too before giving up.
  if (e != 0 && bus_id.find(':') == 8 && bus_id.compare(0, 4, "0000") == 0) {
    int dev4 = -1;
    if (api_.cudaDeviceGetByPCIBusId(&dev4, bus_id.substr(4).c_str()) == 0) e = 0, dev = dev4;
  }
  if (e != 0) {
    *error = fmt::format("no CUDA device at PCI bus id {} ({}; CUDA_VISIBLE_DEVICES may hide it)", bus_id, err(e));
    return std::nullopt;
  }
  return dev;
}

std::string CudaRuntime::with_link_busy(int device, const std::function<void()>& while_busy) const {
  if (!ok_) return error_;
  constexpr size_t kBytes = 32u << 20;
  void* host = nullptr;
  void* dev = nullptr;
  int e = api_.cudaSetDevice(device);
  if (e == 0) e = api_.cudaMallocHost(&host, kBytes);
  if (e == 0) e = api_.cudaMalloc(&dev, kBytes);
  if (e != 0) {
    if (host) api_.cudaFreeHost(host);
    return fmt::format("could not prepare copies on CUDA device {}: {}", device, err(e));
  }
  std::atomic<bool> stop{false};
  std::atomic<int> copy_error{0};
  std::atomic<int> copies{0};
  std::thread load([&] {
    if (int se = api_.cudaSetDevice(device); se != 0) {
      copy_error = se;
      return;
    }
    while (!stop.load()) {
      if (int ce = api_.cudaMemcpy(dev, host, kBytes, kMemcpyHostToDevice); ce != 0) {
        copy_error = ce;
        return;
      }
      ++copies;
    }
  });
  // Give the link time to retrain to its working speed (tens of milliseconds on current GPUs).
  const Stopwatch sw;
  while (copies.load() < 4 && copy_error.load() == 0 && sw.seconds() < 2.0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (copy_error.load() == 0) while_busy();
  stop = true;
  load.join();
  api_.cudaDeviceSynchronize();
  api_.cudaFree(dev);
  api_.cudaFreeHost(host);
  if (copy_error.load() != 0) return fmt::format("host-to-device copy failed: {}", err(copy_error.load()));
  return {};
}

std::optional<BandwidthResult> CudaRuntime::measure_bandwidth(int device, size_t bytes, int copies,
                                                              std::string* error) const {
  if (!ok_) {
    *error = error_;
    return std::nullopt;
  }
  void* host = nullptr;
  void* dev = nullptr;
  int e = api_.cudaSetDevice(device);
  if (e == 0) e = api_.cudaMallocHost(&host, bytes);
  if (e == 0) e = api_.cudaMalloc(&dev, bytes);
  auto cleanup = [&] {
    if (dev) api_.cudaFree(dev);
    if (host) api_.cudaFreeHost(host);
  };
  if (e != 0) {
    cleanup();
    *error = fmt::format("could not allocate {} MiB for the copy test: {}", bytes >> 20, err(e));
    return std::nullopt;
  }
  auto timed = [&](int kind) -> double {
    void* dst = kind == kMemcpyHostToDevice ? dev : host;
    const void* src = kind == kMemcpyHostToDevice ? host : dev;
    if ((e = api_.cudaMemcpy(dst, src, bytes, kind)) != 0) return -1;  // warm-up: page tables, link wake-up
    api_.cudaDeviceSynchronize();
    const Stopwatch sw;
    for (int i = 0; i < copies; ++i)
      if ((e = api_.cudaMemcpy(dst, src, bytes, kind)) != 0) return -1;
    if ((e = api_.cudaDeviceSynchronize()) != 0) return -1;
    return static_cast<double>(bytes) * copies / sw.seconds() / 1e9;
  };
  BandwidthResult r;
  r.bytes = bytes;
  r.copies = copies;
  r.h2d_gbps = timed(kMemcpyHostToDevice);
  if (r.h2d_gbps > 0) r.d2h_gbps = timed(kMemcpyDeviceToHost);
  cleanup();
  if (e != 0) {
    *error = fmt::format("copy failed: {}", err(e));
    return std::nullopt;
  }
  return r;
}

}  // namespace ampforge::hw
