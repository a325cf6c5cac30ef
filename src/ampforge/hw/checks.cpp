// The doctor's checks: pure functions from the gathered report to verdicts. Each says what it found in one
// line and, unless it passed, one line of what to do. docs/DOCTOR.md lists them.
#include <unistd.h>

#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ampforge/hw/doctor.h"
#include "ampforge/hw/versions.h"

namespace ampforge::hw {

namespace {

struct Checks {
  std::vector<CheckResult>& out;
  void add(std::string id, std::optional<unsigned> gpu, Verdict v, std::string message, std::string fix = {}) {
    out.push_back(CheckResult{std::move(id), gpu, v, std::move(message), std::move(fix)});
  }
};

std::string gib(uint64_t bytes) { return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1ull << 30)); }

std::string process_name(unsigned pid) {
  std::ifstream f(fmt::format("/proc/{}/comm", pid));
  std::string name;
  if (f && std::getline(f, name) && !name.empty()) return name;
  return "?";
}

// The driver version the CUDA runtime found here needs, for the install hint.
std::string driver_needed_hint(const LibrariesReport& libs) {
  if (!libs.runtime_version) return "the newest driver for your GPU";
  const Version v = Version::from_cuda_int(*libs.runtime_version);
  if (auto req = cuda_driver_requirement(v.major(), v.minor()))
    return fmt::format("a driver >= {} (for CUDA {}, the runtime found here)", req->min_driver, v.str());
  return fmt::format("a driver that supports CUDA {}", v.str());
}

void check_driver(const DoctorReport& r, Checks& c) {
  const auto& d = r.driver;
  if (!d.nvml_loaded) {
    const bool absent = d.error.find("could not be loaded") != std::string::npos;
    if (absent)
      c.add("driver.present", std::nullopt, Verdict::Fail,
            fmt::format("No NVIDIA GPU driver found: {}", d.error),
            fmt::format("install {} (Debian: apt install nvidia-driver from non-free; or NVIDIA's installer), "
                        "reboot, then check with nvidia-smi",
                        driver_needed_hint(r.libraries)));
    else
      c.add("driver.present", std::nullopt, Verdict::Fail, fmt::format("The NVIDIA driver is installed but unusable: {}", d.error),
            "load the kernel module (sudo modprobe nvidia; see dmesg), or reinstall the driver and reboot; "
            "the user-space library and kernel module versions must match");
    return;
  }
  if (!d.gpu_count.ok() || *d.gpu_count == 0) {
    c.add("driver.present", std::nullopt, Verdict::Fail,
          fmt::format("NVIDIA driver {} is loaded but reports no GPU{}", d.driver_version.ok() ? *d.driver_version : "n/a",
                      d.gpu_count.ok() ? "" : " (" + d.gpu_count.na + ")"),
          "check that the GPU is seated and powered (lspci | grep -i nvidia) and not hidden by a container");
    return;
  }
  c.add("driver.present", std::nullopt, Verdict::Pass,
        fmt::format("NVIDIA driver {} ({} GPU{})", d.driver_version.ok() ? *d.driver_version : "n/a", *d.gpu_count,
                    *d.gpu_count == 1 ? "" : "s"));
}

void check_driver_runtime(const DoctorReport& r, Checks& c) {
  const std::string id = "driver.cuda_runtime";
  const auto& d = r.driver;
  if (!r.libraries.runtime_version) {
    c.add(id, std::nullopt, Verdict::Skip,
          fmt::format("No CUDA runtime found ({})", r.libraries.cudart.error.empty() ? "unknown" : r.libraries.cudart.error),
          "install the CUDA runtime (cuda-cudart package of the CUDA toolkit) to use the GPU from ampforge");
    return;
  }
  const int rt = *r.libraries.runtime_version;
  if (!d.nvml_loaded) {
    c.add(id, std::nullopt, Verdict::Skip, fmt::format("CUDA runtime {} found, but no driver to run it", cuda_version_string(rt)),
          "install " + driver_needed_hint(r.libraries));
    return;
  }
  auto drv = d.driver_version.ok() ? Version::parse(*d.driver_version) : std::nullopt;
  if (!drv) {
    c.add(id, std::nullopt, Verdict::Skip, fmt::format("The driver version is unknown ({})", d.driver_version.na));
    return;
  }
  std::optional<int> drv_cuda;
  if (d.cuda_version.ok()) drv_cuda = *d.cuda_version;
  const std::string supports = drv_cuda ? fmt::format(" (supports CUDA <= {})", cuda_version_string(*drv_cuda)) : "";
  const std::string& drv_text = *d.driver_version;
  const Version v = Version::from_cuda_int(rt);
  const auto req = cuda_driver_requirement(v.major(), v.minor());
  const std::string need = req ? fmt::format(" (CUDA {} needs >= {})", v.str(), req->min_driver) : "";
  switch (driver_fits_cuda(*drv, rt, drv_cuda)) {
    case DriverFit::Full:
      c.add(id, std::nullopt, Verdict::Pass,
            fmt::format("Driver {}{} runs CUDA runtime {}", drv_text, supports, v.str()));
      break;
    case DriverFit::MinorCompat:
      c.add(id, std::nullopt, Verdict::Warn,
            fmt::format("Driver {}{} runs CUDA runtime {} only under minor-version compatibility{}", drv_text, supports,
                        v.str(), need),
            "kernels that need PTX JIT of newer PTX will fail; update the driver" +
                (req ? fmt::format(" to >= {}", req->min_driver) : std::string()));
      break;
    case DriverFit::TooOld:
      c.add(id, std::nullopt, Verdict::Fail,
            fmt::format("Driver {}{} is too old for CUDA runtime {}{}", drv_text, supports, v.str(), need),
            fmt::format("update the NVIDIA driver{}, or use a CUDA runtime the driver supports",
                        req ? fmt::format(" to >= {}", req->min_driver) : std::string()));
      break;
    case DriverFit::Unknown:
      c.add(id, std::nullopt, Verdict::Skip,
            fmt::format("CUDA runtime {} is newer than ampforge's driver table and the driver does not say what it "
                        "supports",
                        v.str()));
      break;
  }
}

// Can the CUDA runtime use the GPUs NVML shows? NVML answers from the kernel module, so every GPU check can pass
// while training cannot start: the commonest causes each have their own cudaGetDeviceCount status.
void check_cuda_devices(const DoctorReport& r, Checks& c) {
  const std::string id = "driver.cuda_devices";
  const auto& cd = r.cuda_devices;
  if (!cd.asked) return;  // no GPU, or no usable CUDA runtime library (driver.cuda_runtime says which)
  unsigned shown = 0;
  for (const auto& g : r.gpus) shown += !g.lost;
  const std::string hidden_by =
      cd.visible_devices ? fmt::format(" (CUDA_VISIBLE_DEVICES='{}')", *cd.visible_devices) : std::string();
  if (cd.count > 0) {
    if (static_cast<unsigned>(cd.count) >= r.gpus.size())
      c.add(id, std::nullopt, Verdict::Pass,
            fmt::format("The CUDA runtime sees the {} GPU{} the driver shows{}", r.gpus.size(),
                        r.gpus.size() == 1 ? "" : "s", hidden_by));
    else if (static_cast<unsigned>(cd.count) >= shown || cd.visible_devices)
      c.add(id, std::nullopt, Verdict::Pass,
            fmt::format("The CUDA runtime sees {} of the {} GPUs the driver shows{}", cd.count, r.gpus.size(),
                        cd.visible_devices ? hidden_by : " (the others are lost: gpuN.status)"));
    else
      c.add(id, std::nullopt, Verdict::Warn,
            fmt::format("The CUDA runtime sees {} of the {} working GPUs the driver shows", cd.count, shown),
            "a GPU the runtime leaves out is usually in a bad state: look for Xid messages in `dmesg` and at "
            "`nvidia-smi -q`; MIG mode also hides a GPU until instances are created");
    return;
  }
  // The cudaError_t values are the CUDA runtime's (driver_types.h).
  std::string fix;
  switch (cd.status) {
    case 35:  // cudaErrorInsufficientDriver
      fix = "install " + driver_needed_hint(r.libraries) + ", or use a CUDA runtime this driver supports";
      break;
    case 46:  // cudaErrorDevicesUnavailable
      fix = "every GPU is in exclusive-process or prohibited compute mode and taken: stop the process holding it "
            "(gpuN.processes), or `sudo nvidia-smi -c DEFAULT`";
      break;
    case 100:  // cudaErrorNoDevice
      fix = cd.visible_devices
                ? "CUDA_VISIBLE_DEVICES hides every GPU: unset it, or list GPUs by index or UUID (nvidia-smi -L)"
                : "this process cannot open the GPUs' device nodes: in a container, start it with the NVIDIA "
                  "container toolkit (docker run --gpus all); otherwise check the permissions of /dev/nvidia*";
      break;
    case 802:  // cudaErrorSystemNotReady
      fix = "an NVSwitch system (HGX/DGX) needs the fabric manager before CUDA can start: `sudo systemctl enable "
            "--now nvidia-fabricmanager` (the same version as the driver); `nvidia-smi -q | grep -A2 Fabric` shows "
            "its state";
      break;
    case 803:  // cudaErrorSystemDriverMismatch
      fix = "the user-mode driver (libcuda.so) and the kernel module are different versions: reboot after a driver "
            "update, or in a container use the host's libcuda (NVIDIA container toolkit) instead of one in the image";
      break;
    case 804:  // cudaErrorCompatNotSupportedOnDevice
      fix = "the CUDA forward-compatibility package works on data-centre GPUs only: remove cuda-compat from "
            "LD_LIBRARY_PATH, or update the driver";
      break;
    default:  // 3 (initialisation), 999 (unknown), ...
      fix = "look for Xid messages in `dmesg`, make sure `nvidia-smi` works, then reload the driver or reboot";
      break;
  }
  c.add(id, std::nullopt, Verdict::Fail,
        fmt::format("The driver shows {} GPU{}, but the CUDA runtime can use none: {}{}", r.gpus.size(),
                    r.gpus.size() == 1 ? "" : "s", cd.error.empty() ? "it reports 0 devices" : cd.error, hidden_by),
        fix);
}

void check_cudnn(const DoctorReport& r, Checks& c) {
  const std::string id = "cudnn.runtime";
  const auto& l = r.libraries;
  if (!l.cudnn.found) {
    c.add(id, std::nullopt, Verdict::Skip, fmt::format("cuDNN not found ({})", l.cudnn.error),
          fmt::format("install cuDNN for your CUDA major version (e.g. the cudnn9-cuda-{} package) for GPU convolutions",
                      l.runtime_version ? Version::from_cuda_int(*l.runtime_version).major() : 12));
    return;
  }
  if (!l.runtime_version) {
    c.add(id, std::nullopt, Verdict::Skip, fmt::format("cuDNN {} found, but no CUDA runtime to compare with", l.cudnn.version));
    return;
  }
  if (!l.cudnn.built_for_cuda) {
    c.add(id, std::nullopt, Verdict::Skip, fmt::format("cuDNN {} does not say which CUDA it was built for", l.cudnn.version));
    return;
  }
  const Version built = Version::from_cuda_int(*l.cudnn.built_for_cuda);
  const Version rt = Version::from_cuda_int(*l.runtime_version);
  if (built.major() == rt.major())
    c.add(id, std::nullopt, Verdict::Pass,
          fmt::format("cuDNN {} (built for CUDA {}) matches CUDA runtime {}", l.cudnn.version, built.str(), rt.str()));
  else
    c.add(id, std::nullopt, Verdict::Fail,
          fmt::format("cuDNN {} was built for CUDA {}, but the CUDA runtime is {}", l.cudnn.version, built.str(), rt.str()),
          fmt::format("install the cuDNN build for CUDA {} (e.g. cudnn9-cuda-{})", rt.major(), rt.major()));
}

// GEMM speed on the CPU depends on which of OpenBLAS's kernel sets runs (see backends/cpu/blas_kernels.h).
void check_blas(const DoctorReport& r, Checks& c) {
  const std::string id = "host.blas_kernels";
  const BlasReport& b = r.blas;
  if (!b.known) return;
  if (b.source == "unavailable") {
    c.add(id, std::nullopt, Verdict::Skip, fmt::format("{}: {}", b.library.empty() ? "BLAS" : b.library, b.note));
    return;
  }
  // Where ampforge's own F32 products run on oneDNN, OpenBLAS's kernels still matter for F64 and for other programs.
  const std::string products = b.products.empty() ? "" : "; ampforge's products: " + b.products;
  if (b.below_cpu) {
    c.add(id, std::nullopt, Verdict::Warn,
          fmt::format("OpenBLAS runs its {} kernels, but this CPU can run {} ({}){}", b.core, b.cpu_best, b.note,
                      products),
          b.source == "user-env"
              ? fmt::format("unless it was pinned on purpose (some systems pin older kernels because an older OpenBLAS "
                            "miscomputes on newer CPUs), set OPENBLAS_CORETYPE={} (or unset it)",
                            b.cpu_best)
                                 : fmt::format("unset AMPFORGE_BLAS_CORETYPE, or set OPENBLAS_CORETYPE={}", b.cpu_best));
    return;
  }
  c.add(id, std::nullopt, Verdict::Pass,
        b.source == "ampforge"
            ? fmt::format("OpenBLAS runs {} kernels (it chose {} for this unknown CPU model; ampforge re-selected){}",
                          b.core, b.loaded_core, products)
            : fmt::format("OpenBLAS runs {} kernels, the strongest this CPU allows{}", b.core, products));
}

void check_framework(const PythonReport& py, const FrameworkInfo& f, const std::string& id, const char* min_version,
                     const std::string& pip_name, Checks& c) {
  if (!py.found && !f.installed.has_value()) {
    c.add(id, std::nullopt, Verdict::Skip,
          fmt::format("{} not checked: {}", f.name, py.error.empty() ? "python3 not usable" : py.error));
    return;
  }
  if (f.installed == false) {
    c.add(id, std::nullopt, Verdict::Skip, fmt::format("{} is not installed for {}", f.name, py.executable),
          fmt::format("pip install '{}>={}' if you train with {}", pip_name, min_version, f.name));
    return;
  }
  auto v = Version::parse(f.version);
  if (!v) {
    c.add(id, std::nullopt, Verdict::Skip,
          fmt::format("{} version unknown: {}", f.name, f.error.empty() ? "the probe gave none" : f.error),
          f.timed_out ? "raise --python-timeout, or check that the framework imports (python3 -c 'import ...')" : "");
    return;
  }
  const Version min = *Version::parse(min_version);
  if (*v < min)
    c.add(id, std::nullopt, Verdict::Fail, fmt::format("{} {} is older than {}", f.name, f.version, min_version),
          fmt::format("pip install --upgrade '{}>={}'", pip_name, min_version));
  else
    c.add(id, std::nullopt, Verdict::Pass, fmt::format("{} {} (>= {})", f.name, f.version, min_version));
}

void check_torch_cuda(const DoctorReport& r, Checks& c) {
  const std::string id = "python.torch_cuda";
  const auto& t = r.python.torch;
  if (t.installed != true || !t.cuda.has_value()) {
    c.add(id, std::nullopt, Verdict::Skip,
          t.installed == true ? fmt::format("PyTorch's CUDA build unknown ({})", t.error.empty() ? "no answer" : t.error)
                              : "PyTorch not available");
    return;
  }
  if (t.cuda->empty()) {
    c.add(id, std::nullopt, Verdict::Warn, fmt::format("PyTorch {} is a CPU-only build", t.version),
          "install a CUDA build: pip install torch --index-url https://download.pytorch.org/whl/cu121 (pick the "
          "cuXXX your driver supports)");
    return;
  }
  auto tv = Version::parse(*t.cuda);
  if (!tv) {
    c.add(id, std::nullopt, Verdict::Skip, fmt::format("PyTorch's CUDA version '{}' is not a version", *t.cuda));
    return;
  }
  if (!r.driver.nvml_loaded || !r.driver.driver_version.ok()) {
    c.add(id, std::nullopt, Verdict::Skip, fmt::format("PyTorch built for CUDA {}, but no driver to check against", *t.cuda),
          "install " + driver_needed_hint(r.libraries));
    return;
  }
  auto drv = Version::parse(*r.driver.driver_version);
  if (!drv) {
    c.add(id, std::nullopt, Verdict::Skip, "The driver version is not a version: " + *r.driver.driver_version);
    return;
  }
  const int cuda_int = tv->major() * 1000 + tv->minor() * 10;
  std::optional<int> drv_cuda;
  if (r.driver.cuda_version.ok()) drv_cuda = *r.driver.cuda_version;
  const auto req = cuda_driver_requirement(tv->major(), tv->minor());
  switch (driver_fits_cuda(*drv, cuda_int, drv_cuda)) {
    case DriverFit::Full:
      c.add(id, std::nullopt, Verdict::Pass, fmt::format("PyTorch's CUDA {} is supported by driver {}", *t.cuda, *r.driver.driver_version));
      break;
    case DriverFit::MinorCompat:
      c.add(id, std::nullopt, Verdict::Warn,
            fmt::format("PyTorch's CUDA {} runs on driver {} only under minor-version compatibility", *t.cuda, *r.driver.driver_version),
            req ? fmt::format("update the driver to >= {}", req->min_driver) : "update the driver");
      break;
    case DriverFit::TooOld:
      c.add(id, std::nullopt, Verdict::Fail,
            fmt::format("PyTorch was built for CUDA {}; driver {} is too old for it", *t.cuda, *r.driver.driver_version),
            req ? fmt::format("update the driver to >= {}, or install a PyTorch build for an older CUDA", req->min_driver)
                : "update the driver, or install a PyTorch build for an older CUDA");
      break;
    case DriverFit::Unknown:
      c.add(id, std::nullopt, Verdict::Skip, fmt::format("PyTorch's CUDA {} is not in ampforge's driver table", *t.cuda));
      break;
  }
}

std::string link(unsigned gen, unsigned width) { return fmt::format("Gen{} x{}", gen, width); }

void check_gpu(const GpuReport& g, double alert_temp_c, Checks& c) {
  const unsigned i = g.index;
  auto id = [&](const char* what) { return fmt::format("gpu{}.{}", i, what); };
  const std::string who = g.name.ok() ? *g.name : fmt::format("GPU {}", i);

  // Status.
  if (g.lost)
    c.add(id("status"), i, Verdict::Fail, fmt::format("{} is lost (fell off the bus): {}", who, g.error),
          "check dmesg for Xid 79, reseat the card and its power cables; the GPU needs a reset or a reboot");
  else if (!g.error.empty())
    c.add(id("status"), i, Verdict::Warn, fmt::format("{} answered with an error: {}", who, g.error),
          "see dmesg and nvidia-smi -q for this GPU");
  else
    c.add(id("status"), i, Verdict::Pass, fmt::format("{} responds", who));

  // PCIe link: downtrained?
  const auto& gen = g.pcie_gen();
  const auto& width = g.pcie_width();
  // The GPU+slot maximum comes from the port above the GPU. In a virtual machine that port is the hypervisor's
  // (or absent) and may claim less than the link is seen running at: a maximum the link exceeds, or 0, is not
  // believed, and the GPU's own maximum (else the spec database) stands in for it.
  const auto contradicted = [](const Field<unsigned>& max, const Field<unsigned>& seen) {
    return max.ok() && (*max == 0 || (seen.ok() && *seen > *max));
  };
  const bool system_gen_wrong = contradicted(g.pcie_gen_max_system, gen);
  const bool system_width_wrong = contradicted(g.pcie_width_max, width);
  std::optional<unsigned> max_gen, max_width;
  std::string max_src;
  if (g.pcie_gen_max_system.ok() && !system_gen_wrong) max_gen = *g.pcie_gen_max_system, max_src = "GPU and slot";
  else if (g.pcie_gen_max_gpu.ok() && *g.pcie_gen_max_gpu > 0) max_gen = *g.pcie_gen_max_gpu, max_src = "GPU";
  else if (g.spec) max_gen = static_cast<unsigned>(g.spec->pcie_gen), max_src = "spec database";
  if (g.pcie_width_max.ok() && !system_width_wrong) max_width = *g.pcie_width_max;
  else if (g.spec) max_width = static_cast<unsigned>(g.spec->pcie_lanes);
  else if (system_width_wrong && width.ok()) max_width = *width;
  if (!gen.ok() || !width.ok() || !max_gen || !max_width) {
    c.add(id("pcie_link"), i, Verdict::Skip,
          fmt::format("PCIe link not readable (current: {}; maximum: {})", gen.ok() && width.ok() ? "ok" : (gen.ok() ? width.na : gen.na),
                      max_gen && max_width ? "ok" : "unknown"));
  } else {
    const std::string now = link(*gen, *width), best = link(*max_gen, *max_width);
    const std::string when = g.link_read_busy() ? "under load" : "while idle";
    const std::string fix =
        "reseat the GPU in a CPU-attached x16 slot, remove riser cables, set the slot to Auto/Gen" +
        std::to_string(*max_gen) + " in the BIOS";
    if (*width < *max_width)
      c.add(id("pcie_link"), i, Verdict::Fail, fmt::format("PCIe link is downtrained: {} {}, the {} support {}", now, when, max_src, best), fix);
    else if (*gen < *max_gen && g.link_read_busy())
      c.add(id("pcie_link"), i, Verdict::Fail, fmt::format("PCIe link is downtrained: {} under load, the {} support {}", now, max_src, best), fix);
    else if (*gen < *max_gen)
      // Idle GPUs lower the link generation to save power (an idle H100 or H200 sits at Gen1): without a load
      // the generation says nothing, so it is not judged.
      c.add(id("pcie_link"), i, Verdict::Skip,
            fmt::format("PCIe link at {} while idle (power saving lowers the generation), {} possible; not read "
                        "under load: {}",
                        now, best, g.link_busy_error.empty() ? "unknown" : g.link_busy_error),
            "install the CUDA runtime so doctor can read the link under load, or watch `ampforge monitor` while training");
    else
      c.add(id("pcie_link"), i, Verdict::Pass, fmt::format("PCIe {} {} (maximum {}, from the {})", now, when, best, max_src));
  }

  // The slot holds the GPU back?
  std::optional<unsigned> gpu_gen;
  std::string gpu_src;
  if (g.pcie_gen_max_gpu.ok() && *g.pcie_gen_max_gpu > 0) gpu_gen = *g.pcie_gen_max_gpu, gpu_src = "NVML";
  else if (g.spec) gpu_gen = static_cast<unsigned>(g.spec->pcie_gen), gpu_src = "spec database";
  if (system_gen_wrong) {
    c.add(id("pcie_slot"), i, Verdict::Skip,
          fmt::format("The slot's maximum is not known: NVML gives Gen{}{} (a virtual or unreadable port above the "
                      "GPU, as in a virtual machine)",
                      *g.pcie_gen_max_system,
                      gen.ok() && *gen > *g.pcie_gen_max_system ? fmt::format(", but the link runs at Gen{}", *gen)
                                                                : std::string()));
  } else if (g.pcie_gen_max_system.ok() && gpu_gen) {
    if (*g.pcie_gen_max_system < *gpu_gen)
      c.add(id("pcie_slot"), i, Verdict::Warn,
            fmt::format("The slot allows PCIe Gen{}, the GPU supports Gen{} ({})", *g.pcie_gen_max_system, *gpu_gen, gpu_src),
            fmt::format("move the GPU to a Gen{} slot attached to the CPU, or check the BIOS PCIe speed setting", *gpu_gen));
    else
      c.add(id("pcie_slot"), i, Verdict::Pass, fmt::format("The slot supports the GPU's PCIe Gen{}", *gpu_gen));
  } else {
    c.add(id("pcie_slot"), i, Verdict::Skip,
          fmt::format("Slot vs GPU PCIe generation not known ({})",
                      !g.pcie_gen_max_system.ok() ? g.pcie_gen_max_system.na : "GPU not in the spec database"));
  }

  // Bandwidth against the link's theoretical rate.
  if (!g.bandwidth) {
    c.add(id("pcie_bandwidth"), i, Verdict::Skip,
          fmt::format("Copy bandwidth not measured: {}", g.bandwidth_error.empty() ? "no CUDA runtime" : g.bandwidth_error));
  } else if (!max_gen || !max_width || pcie_link_gbps(*max_gen, *max_width) <= 0) {
    c.add(id("pcie_bandwidth"), i, Verdict::Skip,
          fmt::format("H2D {:.1f} GB/s, D2H {:.1f} GB/s; the link's maximum is unknown", g.bandwidth->h2d_gbps, g.bandwidth->d2h_gbps));
  } else {
    const double peak = pcie_link_gbps(*max_gen, *max_width);
    const double worst = std::min(g.bandwidth->h2d_gbps, g.bandwidth->d2h_gbps) / peak;
    const std::string msg =
        fmt::format("Pinned H2D {:.1f} GB/s, D2H {:.1f} GB/s: {:.0f}% / {:.0f}% of {} ({:.1f} GB/s per direction)",
                    g.bandwidth->h2d_gbps, g.bandwidth->d2h_gbps, 100 * g.bandwidth->h2d_gbps / peak,
                    100 * g.bandwidth->d2h_gbps / peak, link(*max_gen, *max_width), peak);
    if (worst >= 0.6)
      c.add(id("pcie_bandwidth"), i, Verdict::Pass, msg);
    else
      c.add(id("pcie_bandwidth"), i, worst >= 0.35 ? Verdict::Warn : Verdict::Fail, msg,
            "check the link (above), other traffic on the bus, IOMMU settings, and that the GPU sits on the CPU "
            "socket that runs the process (numactl)");
  }

  // Temperature.
  if (!g.temperature_c.ok()) {
    c.add(id("temperature"), i, Verdict::Skip, "Temperature n/a (" + g.temperature_c.na + ")");
  } else {
    const unsigned t = *g.temperature_c;
    const std::string limits =
        fmt::format("slowdown at {}, shutdown at {}", g.slowdown_c.ok() ? fmt::format("{} °C", *g.slowdown_c) : "n/a",
                    g.shutdown_c.ok() ? fmt::format("{} °C", *g.shutdown_c) : "n/a");
    const std::string fix =
        "improve airflow (clean dust, add case fans, open slot spacing), lower the power limit (nvidia-smi -pl), or "
        "raise the fan curve";
    if (g.slowdown_c.ok() && t + kSlowdownMarginC >= *g.slowdown_c)
      c.add(id("temperature"), i, Verdict::Fail, fmt::format("{} °C is at or near the slowdown threshold ({})", t, limits), fix);
    else if (t >= alert_temp_c)
      c.add(id("temperature"), i, Verdict::Warn, fmt::format("{} °C >= the {:.0f} °C alert threshold ({})", t, alert_temp_c, limits), fix);
    else
      c.add(id("temperature"), i, Verdict::Pass, fmt::format("{} °C ({})", t, limits));
  }

  // Throttling.
  if (!g.throttle_reasons.ok()) {
    c.add(id("throttle"), i, Verdict::Skip, "Clock-event reasons n/a (" + g.throttle_reasons.na + ")");
  } else {
    const uint64_t m = *g.throttle_reasons;
    const uint64_t severe = nvml::kReasonSwThermalSlowdown | nvml::kReasonHwThermalSlowdown | nvml::kReasonHwSlowdown |
                            nvml::kReasonHwPowerBrakeSlowdown;
    std::string names;
    for (const auto& n : throttle_reason_names(m)) names += (names.empty() ? "" : ", ") + n;
    if (names.empty()) names = "none";
    if (m & severe)
      c.add(id("throttle"), i, Verdict::Fail, fmt::format("Clocks are being slowed down: {}", names),
            (m & (nvml::kReasonSwThermalSlowdown | nvml::kReasonHwThermalSlowdown))
                ? "cool the GPU (airflow, fan curve, lower power limit)"
                : "hardware slowdown: check the power supply and its cables (HW slowdown / power brake are raised by the board)");
    else if (m & nvml::kReasonSwPowerCap)
      c.add(id("throttle"), i, Verdict::Warn, fmt::format("Clocks are held by the power limit: {}", names),
            "normal at full load; if the limit is below the board default, raise it (nvidia-smi -pl)");
    else
      c.add(id("throttle"), i, Verdict::Pass, fmt::format("No throttling (reasons: {})", names));
  }

  // Power at the limit.
  if (!g.power_mw.ok() || !g.power_limit_mw.ok() || *g.power_limit_mw == 0) {
    c.add(id("power"), i, Verdict::Skip,
          fmt::format("Power draw or limit n/a ({})", !g.power_mw.ok() ? g.power_mw.na : g.power_limit_mw.na));
  } else {
    const double w = *g.power_mw / 1000.0, lim = *g.power_limit_mw / 1000.0;
    if (w >= 0.98 * lim)
      c.add(id("power"), i, Verdict::Warn, fmt::format("Power {:.0f} W is at the {:.0f} W limit", w, lim),
            "expected under full load; if clocks drop, raise the limit (nvidia-smi -pl) or improve cooling");
    else
      c.add(id("power"), i, Verdict::Pass, fmt::format("Power {:.0f} W of {:.0f} W", w, lim));
  }

  // ECC.
  if (!g.ecc_enabled.ok()) {
    c.add(id("ecc"), i, Verdict::Skip, "ECC n/a (" + g.ecc_enabled.na + ")");
  } else if (!*g.ecc_enabled) {
    c.add(id("ecc"), i, Verdict::Skip, "ECC is disabled on this GPU");
  } else if (g.ecc_uncorrected_volatile.ok() && *g.ecc_uncorrected_volatile > 0) {
    c.add(id("ecc"), i, Verdict::Fail,
          fmt::format("{} uncorrected ECC errors since the last driver load", *g.ecc_uncorrected_volatile),
          "results on this GPU may be corrupt: drain it, reset it (nvidia-smi -r), and if errors return, RMA it");
  } else if (g.ecc_uncorrected_aggregate.ok() && *g.ecc_uncorrected_aggregate > 0) {
    c.add(id("ecc"), i, Verdict::Warn,
          fmt::format("{} uncorrected ECC errors over the GPU's life (none since the driver loaded)", *g.ecc_uncorrected_aggregate),
          "check nvidia-smi -q -d ECC,PAGE_RETIREMENT; repeated errors mean the board should be replaced");
  } else if (!g.ecc_uncorrected_volatile.ok()) {
    c.add(id("ecc"), i, Verdict::Skip, "ECC error counts n/a (" + g.ecc_uncorrected_volatile.na + ")");
  } else {
    c.add(id("ecc"), i, Verdict::Pass,
          fmt::format("No uncorrected ECC errors ({} corrected since driver load)",
                      g.ecc_corrected_volatile.ok() ? std::to_string(*g.ecc_corrected_volatile) : "n/a"));
  }

  // MIG: with it on, CUDA sees the GPU's MIG instances (as many devices), not the whole GPU. Boards without MIG
  // answer NOT_SUPPORTED: no check.
  if (g.mig_mode.ok()) {
    const auto& m = *g.mig_mode;
    if (m.current != m.pending)
      c.add(id("mig"), i, Verdict::Warn,
            fmt::format("MIG mode is {} now and {} after the next GPU reset", m.current ? "on" : "off",
                        m.pending ? "on" : "off"),
            "reset the GPU (nvidia-smi -r -i N, with no process on it) or reboot for the change to take effect");
    else if (m.current)
      c.add(id("mig"), i, Verdict::Warn,
            "MIG mode is on: CUDA sees only this GPU's MIG instances, each a slice of it (none, if none was created)",
            "train on one instance (CUDA_VISIBLE_DEVICES=MIG-<uuid> from nvidia-smi -L), or turn MIG off for the "
            "whole GPU (nvidia-smi -mig 0 -i N, then a GPU reset)");
    else
      c.add(id("mig"), i, Verdict::Pass, "MIG mode is off: CUDA sees the whole GPU");
  }

  // Other processes holding memory.
  if (!g.processes.ok()) {
    c.add(id("processes"), i, Verdict::Skip, "Process list n/a (" + g.processes.na + ")");
  } else {
    const unsigned self = static_cast<unsigned>(::getpid());
    std::string list;
    uint64_t total = 0;
    int n = 0;
    for (const auto& p : *g.processes) {
      if (p.pid == self) continue;
      ++n;
      total += p.used_bytes.value_or(0);
      if (n <= 4)
        list += fmt::format("{}pid {} ({}, {})", list.empty() ? "" : ", ", p.pid, process_name(p.pid),
                            p.used_bytes ? gib(*p.used_bytes) : "n/a");
    }
    if (n > 4) list += fmt::format(", and {} more", n - 4);
    if (n > 0)
      c.add(id("processes"), i, Verdict::Warn,
            fmt::format("{} other process{} hold{} {} of GPU memory: {}", n, n == 1 ? "" : "es", n == 1 ? "s" : "", gib(total), list),
            "stop them, or train on another GPU (CUDA_VISIBLE_DEVICES)");
    else
      c.add(id("processes"), i, Verdict::Pass, "No other process uses this GPU");
  }
}

bool any_nvlink_up(const GpuReport& g) {
  if (g.lost || !g.nvlinks.ok()) return false;
  for (const auto& l : *g.nvlinks)
    if (l.active) return true;
  return false;
}

// NVLinks that exist but are down (a loose bridge, a link the driver took down): each is bandwidth the GPU's
// peers expect and do not get. A GPU with none up has no NVLink in use, which is how a board with NVLink ports
// and no bridge, or an SXM GPU alone in a virtual machine (no NVSwitch fabric there), reports itself: that is
// judged only where another GPU of this machine does have NVLinks up (a GPU missing from the fabric).
void check_nvlinks(const GpuReport& g, bool other_gpu_has_nvlink, Checks& c) {
  if (g.lost || !g.nvlinks.ok() || g.nvlinks->empty()) return;
  const std::string id = fmt::format("gpu{}.nvlink", g.index);
  std::vector<unsigned> down;
  for (const auto& l : *g.nvlinks)
    if (!l.active) down.push_back(l.link);
  const size_t n = g.nvlinks->size();
  if (down.empty()) {
    c.add(id, g.index, Verdict::Pass, fmt::format("{} NVLink{} up", n, n == 1 ? "" : "s"));
    return;
  }
  if (down.size() == n && !other_gpu_has_nvlink) {
    c.add(id, g.index, Verdict::Skip,
          fmt::format("No NVLink in use: none of the GPU's {} link{} is up, nor any other GPU's here (no bridge, "
                      "or no NVSwitch fabric in this machine or VM); peers, if any, go over PCIe",
                      n, n == 1 ? "" : "s"));
    return;
  }
  c.add(id, g.index, Verdict::Warn,
        fmt::format("NVLink {} down ({} of {} up): peer traffic over the remaining links is slower",
                    fmt::join(down, ", "), n - down.size(), n),
        "check the NVLink bridge or the board's seating, then `nvidia-smi nvlink --status`; the link state resets "
        "with a reboot");
}

// Every pair of GPUs: NVLink, or the PCIe path between them. Across host bridges (NODE) or CPUs (SYS) there is
// no peer-to-peer path: NCCL stages the all-reduce through host memory, several times slower than NVLink or a
// PCIe switch. A warning, because data-parallel ranks on such a pair wait on it every step.
void check_topology(const DoctorReport& r, Checks& c) {
  for (const auto& p : r.topology) {
    const std::string id = fmt::format("topology.gpu{}_gpu{}", p.a, p.b);
    if (p.nvlinks > 0) {
      c.add(id, std::nullopt, Verdict::Pass, fmt::format("GPU {} <-> GPU {}: NVLink x{}", p.a, p.b, p.nvlinks));
      continue;
    }
    if (!p.pcie_ancestor.ok()) {
      c.add(id, std::nullopt, Verdict::Skip,
            fmt::format("GPU {} <-> GPU {}: no NVLink, PCIe path unknown ({})", p.a, p.b, p.pcie_ancestor.na));
      continue;
    }
    const int level = *p.pcie_ancestor;
    const char* name = topology_level_name(level);
    if (level >= nvml::kTopologyNode) {
      c.add(id, std::nullopt, Verdict::Warn,
            fmt::format("GPU {} <-> GPU {}: no NVLink, PCIe path {} ({}): no peer-to-peer, all-reduce goes through "
                        "host memory",
                        p.a, p.b, name, level == nvml::kTopologySystem ? "across CPU sockets" : "across host bridges"),
            "for data parallel, pick GPUs under one PCIe switch or with NVLink (CUDA_VISIBLE_DEVICES; "
            "`nvidia-smi topo -m` shows the matrix), or expect the gradient exchange to cost more");
    } else {
      c.add(id, std::nullopt, Verdict::Pass,
            fmt::format("GPU {} <-> GPU {}: no NVLink, PCIe path {} ({})", p.a, p.b, name,
                        level == nvml::kTopologySingle     ? "one PCIe switch"
                        : level == nvml::kTopologyMultiple ? "several PCIe switches"
                                                           : "through the CPU's host bridge"));
    }
  }
}

}  // namespace

void evaluate_checks(DoctorReport& r) {
  r.checks.clear();
  Checks c{r.checks};
  check_driver(r, c);
  check_driver_runtime(r, c);
  check_cuda_devices(r, c);
  check_cudnn(r, c);
  check_blas(r, c);
  check_framework(r.python, r.python.torch, "python.torch_version", kMinTorchVersion, "torch", c);
  check_framework(r.python, r.python.tensorflow, "python.tensorflow_version", kMinTensorflowVersion, "tensorflow", c);
  check_torch_cuda(r, c);
  for (const auto& g : r.gpus) {
    check_gpu(g, r.alert_temp_c, c);
    bool other_gpu_has_nvlink = false;
    for (const auto& o : r.gpus) other_gpu_has_nvlink |= &o != &g && any_nvlink_up(o);
    check_nvlinks(g, other_gpu_has_nvlink, c);
  }
  check_topology(r, c);
}

}  // namespace ampforge::hw
