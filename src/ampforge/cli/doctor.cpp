// `ampforge doctor`: versions, PCIe, thermals, throttling — every check PASS / WARN / FAIL / SKIP with a fix.
// Exit status: 0 when nothing FAILs, 1 otherwise, 2 for usage errors. See docs/DOCTOR.md.
#include <unistd.h>

#include <cstdio>

#include "ampforge/backends/cpu/blas_kernels.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/cli/commands.h"
#include "ampforge/hw/doctor.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"

namespace ampforge::cli {

namespace {
struct DoctorArgs {
  bool json = false;
  bool no_bandwidth = false;
  double alert_temp = 80;
  double python_timeout = 6;
};

bool use_colour() {
  auto no_colour = env_get("NO_COLOR");
  return ::isatty(STDOUT_FILENO) && !(no_colour && !no_colour->empty());
}

// The CPU's BLAS kernels, for the host.blas_kernels check (hw sits below the backends, so the CLI passes them in).
hw::BlasReport blas_report() {
  const cpu::BlasKernels& k = cpu::select_blas_kernels();
  return hw::BlasReport{.known = true,
                        .library = k.library,
                        .version = k.version,
                        .loaded_core = k.loaded_core,
                        .core = k.core,
                        .cpu_best = k.cpu_best,
                        .source = cpu::blas_source_name(k.source),
                        .note = k.note,
                        .below_cpu = k.below_cpu(),
                        .products = cpu::cpu_gemm_summary()};
}
}  // namespace

Command add_doctor_command(CLI::App& app) {
  auto* sub = app.add_subcommand("doctor", "Check the driver, CUDA libraries, GPUs (PCIe, thermals, throttling) and Python frameworks");
  auto args = std::make_shared<DoctorArgs>();
  sub->add_flag("--json", args->json, "Print the report as JSON (schema ampforge.doctor/2, see docs/DOCTOR.md)");
  sub->add_option("--alert-temp", args->alert_temp, "Temperature (°C) at or above which the temperature check warns")
      ->check(CLI::Range(20.0, 120.0))
      ->capture_default_str();
  sub->add_option("--python-timeout", args->python_timeout, "Seconds each Python framework probe may take")
      ->check(CLI::Range(0.5, 120.0))
      ->capture_default_str();
  sub->add_flag("--no-bandwidth", args->no_bandwidth, "Do not measure host<->device copy bandwidth");
  sub->footer("Exit status: 0 when no check FAILs, 1 when one does, 2 for usage errors.");
  return {sub, [args] {
            hw::DoctorOptions o;
            o.alert_temp_c = args->alert_temp;
            o.python_timeout_s = args->python_timeout;
            o.measure_bandwidth = !args->no_bandwidth;
            o.blas = blas_report();
            const hw::DoctorReport r = hw::run_doctor(o);
            if (args->json)
              std::fputs((hw::doctor_report_json(r).dump(2) + "\n").c_str(), stdout);
            else
              std::fputs(hw::doctor_report_text(r, use_colour()).c_str(), stdout);
            std::fflush(stdout);
            return r.exit_code();
          }};
}

}  // namespace ampforge::cli
