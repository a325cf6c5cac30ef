// `ampforge memory fit`: the largest batch size whose training step fits a memory budget.
//   memory fit --model NAME --budget 16GiB [--device cpu|meta] [--stands-for cuda|cpu] [--image-size S]
//              [--precision fp32|fp16|bf16] [--master-weights] [--optimizer adamw|sgd] [--max-batch N]
//              [--steps N] [--batch N] [--threads N] [--json]
// Each probe runs training steps (the trainer's train_step) of the model on synthetic input, with every tensor
// coming from a caching allocator of capacity = budget: over host memory (--device cpu), or on the meta device
// (backends/meta/meta.h: no data, no arithmetic, the allocator rules of the device it stands for). The search and
// the breakdown are memory/fit.h; docs/MEMORY.md ("Fit finder") describes the figures.
// Exit codes: 0 a batch fits (with --batch: that batch fits); 1 not even batch 1 fits (with --batch: that
// batch does not fit), as `memory replay` exits 1 when its budget is exceeded; 2 bad input.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/amp/grad_scaler.h"
#include "ampforge/cli/commands.h"
#include "ampforge/core/allocator.h"
#include "ampforge/core/generator.h"
#include "ampforge/core/runtime.h"
#include "ampforge/memory/budgeted_provider.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/fit.h"
#include "ampforge/memory/host_provider.h"
#include "ampforge/memory/stats.h"
#include "ampforge/models/models.h"
#include "ampforge/ops/ops.h"
#include "ampforge/tasks/classification.h"
#include "ampforge/train/recipe.h"
#include "ampforge/train/fit_probe.h"
#include "ampforge/train/step.h"
#include "ampforge/train/workload.h"
#include "ampforge/util/error.h"
#include "ampforge/util/thread_pool.h"
#include "ampforge/util/timer.h"

namespace ampforge::cli {

namespace {


struct FitArgs {
  std::string model, budget, precision = "fp32", optimizer = "adamw";
  std::string device = "cpu", stands_for = "cuda";  // --device meta: the device type the meta device models
  bool master_weights = false;
  bool recompute = false;
  int64_t max_batch = 65536;
  int64_t steps = 2;
  int64_t batch = 0;  // > 0: check this one batch size instead of searching
  int64_t image_size = 0;  // 0: the model's default input (its registry entry)
  int threads = 0;
  bool json = false;
};

std::string percent_of(int64_t n, int64_t budget) {
  return fmt::format("{:.1f}%", budget > 0 ? 100.0 * static_cast<double>(n) / static_cast<double>(budget) : 0.0);
}

int run_fit(const FitArgs& a) {
  using memory::format_bytes;
  // Validate everything before the first probe (bad input is exit 2 through AF_CHECK).
  const uint64_t budget_u = memory::parse_size(a.budget, "--budget");
  AF_CHECK(budget_u > 0, "--budget: must be more than 0 bytes");
  AF_CHECK(budget_u <= (uint64_t{1} << 50), "--budget: {} is more than 1 PiB", a.budget);
  const auto names = models::names();
  if (std::find(names.begin(), names.end(), a.model) == names.end())
  {
    std::string known;
    for (const auto& name : names) known += (known.empty() ? "" : ", ") + name;
    AF_THROW(InvalidArgument, "--model: unknown model '{}': available models are {}", a.model, known);
  }
  // The probe runs the model's task on a synthetic batch (train/workload.h); tasks without one are refused.
  {
    const std::string& task = models::model_registry().at(a.model).task;
    AF_CHECK(train::has_workload(task), "--model {}: memory fit has no synthetic {} batch to probe it with", a.model,
             task);
  }
  AF_CHECK(a.steps >= 1 && a.steps <= 10, "--steps must be in [1, 10], got {}", a.steps);
  AF_CHECK(a.max_batch >= 1 && a.max_batch <= (int64_t{1} << 40), "--max-batch must be in [1, 2^40], got {}",
           a.max_batch);
  AF_CHECK(a.batch >= 0 && a.batch <= (int64_t{1} << 40), "--batch must be in [1, 2^40], got {}", a.batch);
  AF_CHECK(a.threads >= 0 && a.threads <= 1024, "--threads must be in [0, 1024], got {}", a.threads);
  train::FitProbeSetup s;
  AF_CHECK(a.device == "cpu" || a.device == "meta", "--device must be cpu or meta, got '{}'", a.device);
  AF_CHECK(a.stands_for == "cpu" || a.stands_for == "cuda", "--stands-for must be cpu or cuda, got '{}'", a.stands_for);
  s.device = Device::parse(a.device);
  s.stands_for = a.stands_for == "cpu" ? DeviceType::CPU : DeviceType::CUDA;
  s.budget = static_cast<int64_t>(budget_u);
  s.steps = a.steps;
  AF_CHECK(a.image_size == 0 || (a.image_size >= 8 && a.image_size <= 4096),
           "--image-size must be 0 (the model's default) or in [8, 4096], got {}", a.image_size);
  s.image_size = a.image_size;
  s.cfg.model = a.model;
  s.cfg.optimizer = a.optimizer;
  s.cfg.precision = dtype_from_string(a.precision);
  s.cfg.master_weights = a.master_weights;
  s.cfg.recompute = a.recompute;
  AF_CHECK(s.cfg.precision == DType::F32 || s.cfg.precision == DType::F16 || s.cfg.precision == DType::BF16,
           "--precision must be fp32, fp16 or bf16, got '{}'", a.precision);
  AF_CHECK(!s.cfg.master_weights || s.cfg.precision != DType::F32, "--master-weights needs --precision fp16 or bf16");
  if (a.threads > 0) set_num_threads(a.threads);

  const int64_t physical = static_cast<int64_t>(memory::HostProvider().capacity());
  if (!s.device.is_meta() && physical > 0 && s.budget > physical)
    std::fprintf(stderr,
                 "ampforge memory fit: warning: the budget (%s) is more than this machine's memory (%s); probes "
                 "use real memory and may be killed by the system first (lower --max-batch to stay below it)\n",
                 format_bytes(s.budget).c_str(), format_bytes(physical).c_str());

  const std::string what = fmt::format("{}, {}{}, {}{}", a.model, a.precision,
                                       a.master_weights ? " with master weights" : "", a.optimizer,
                                       a.recompute ? ", recompute" : "");
  // Where the probes run, for the headline: the allocator and what it stands for.
  const std::string where =
      !s.device.is_meta()
          ? std::string("ampforge allocator over a budgeted host provider")
          : fmt::format("meta device standing for {}: the ampforge policy over {}, no data", a.stands_for,
                        runtime::plans_expandable_segments(s.stands_for) ? "expandable segments"
                                                                                      : "plain segments (cudaMalloc)");
  std::fprintf(stderr, "ampforge memory fit: %s, budget %s, %s, %d threads\n", what.c_str(),
               format_bytes(s.budget).c_str(), where.c_str(), get_num_threads());
  int n = 0;
  auto progress = [&](const memory::FitProbe& p, const char* phase) {
    ++n;
    const int64_t steps = p.full ? a.steps : 1;
    std::fprintf(stderr, "  probe %2d %-7s batch %8lld  %lld step%s  %-13s  peak reserved %11s (%6s)  %6.2fs\n", n,
                 phase, static_cast<long long>(p.batch), static_cast<long long>(steps), steps == 1 ? " " : "s",
                 p.fits ? "fits" : "out of memory", format_bytes(p.peak_reserved).c_str(),
                 percent_of(p.peak_reserved, s.budget).c_str(), p.seconds);
    std::fflush(stderr);
  };
  const Stopwatch clock;
  memory::FitResult r;
  if (a.batch > 0) {  // one batch size: does it fit?
    memory::FitProbe p = train::run_fit_probe(s, a.batch, true);
    progress(p, "check");
    (p.fits ? r.best : r.first_failing) = a.batch;
    r.probes.push_back(std::move(p));
  } else {
    memory::FitSearchOptions o;
    o.budget = s.budget;
    o.max_batch = a.max_batch;
    o.granule = static_cast<int64_t>(memory::kHostGranule);
    o.quick = a.steps > 1;  // search with one step per probe; confirm the answer with all of them
    r = memory::fit_search([&](int64_t b, bool full) { return train::run_fit_probe(s, b, full); }, o, progress);
  }
  const double seconds = clock.seconds();
  const bool ok = a.batch > 0 ? r.best == a.batch : r.best > 0;
  // What --recompute would buy, when it is cheap to find out (the meta device plans in a fraction of a second):
  // the first thing to try when a batch does not fit.
  std::optional<memory::FitResult> with_recompute;
  if (a.batch == 0 && !a.recompute && s.device.is_meta()) {
    train::FitProbeSetup sr = s;
    sr.cfg.recompute = true;
    memory::FitSearchOptions o;
    o.budget = s.budget;
    o.max_batch = a.max_batch;
    o.granule = static_cast<int64_t>(memory::kHostGranule);
    o.quick = a.steps > 1;
    with_recompute = memory::fit_search([&](int64_t b, bool full) { return train::run_fit_probe(sr, b, full); }, o,
                                        [](const memory::FitProbe&, const char*) {});
  }

  if (a.json) {
    nlohmann::json j = memory::fit_result_to_json(r, s.budget);
    j["model"] = a.model;
    j["precision"] = a.precision;
    j["master_weights"] = a.master_weights;
    j["recompute"] = a.recompute;
    j["optimizer"] = a.optimizer;
    j["steps"] = a.steps;  // of full probes (the answer; search probes marked "full": false run one)
    j["max_batch"] = a.max_batch;
    j["mode"] = a.batch > 0 ? "check" : "search";
    j["policy"] = "ampforge";
    j["device"] = a.device;
    if (s.device.is_meta()) {
      j["stands_for"] = a.stands_for;
      j["expandable_segments"] = runtime::plans_expandable_segments(s.stands_for);
    }
    j["seconds"] = seconds;
    if (with_recompute)
      j["with_recompute"] = {{"largest_batch", with_recompute->best}, {"limited", with_recompute->limited}};
    if (a.batch > 0) {
      j["fits"] = ok;
      if (!ok) j["oom_report"] = r.probes.back().oom_report;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return ok ? 0 : 1;
  }

  std::printf("memory fit: %s, budget %s (%s; the answer checked with %lld training step%s)\n", what.c_str(),
              format_bytes(s.budget).c_str(), where.c_str(), static_cast<long long>(a.steps), a.steps == 1 ? "" : "s");
  if (!ok) {
    const memory::FitProbe& f = r.probes.back();
    std::printf("batch %lld does not fit in %s.\n%s", static_cast<long long>(f.batch), format_bytes(s.budget).c_str(),
                f.oom_report.c_str());
    if (a.batch == 0)
      std::printf("  even one example needs more than the budget: give it more memory, or shrink the persistent state "
                  "(sgd keeps one F32 buffer per parameter, adamw two; master weights add one more)\n");
    if (s.budget < 4 * static_cast<int64_t>(memory::kHostGranule))
      std::printf("  note: memory is reserved in %s granules (as on a GPU), so a budget of a few MiB holds very little\n",
                  format_bytes(static_cast<int64_t>(memory::kHostGranule)).c_str());
    std::printf("%zu probe%s in %.1fs\n", r.probes.size(), r.probes.size() == 1 ? "" : "s", seconds);
    return 1;
  }
  if (a.batch > 0)
    std::printf("batch %lld fits\n", static_cast<long long>(r.best));
  else if (r.limited)
    std::printf("largest batch that fits: %lld, the --max-batch limit: the budget may hold more (raise --max-batch)\n",
                static_cast<long long>(r.best));
  else
    std::printf("largest batch that fits: %lld (batch %lld does not)\n", static_cast<long long>(r.best),
                static_cast<long long>(r.first_failing));
  const memory::FitProbe& bp = *r.best_probe();
  const memory::FitBreakdown b = memory::fit_breakdown(bp.measure);
  std::printf("memory at batch %lld:\n%s", static_cast<long long>(r.best),
              memory::fit_breakdown_format(b, s.budget).c_str());
  std::printf("peak live %s; %zu probe%s in %.1fs\n", format_bytes(bp.measure.peak_live).c_str(), r.probes.size(),
              r.probes.size() == 1 ? "" : "s", seconds);
  if (with_recompute && with_recompute->best > r.best)
    std::printf("with --recompute (batch norm, relu and residual outputs rebuilt in backward; the same gradients, a "
                "few %% slower): largest batch %lld%s\n",
                static_cast<long long>(with_recompute->best), with_recompute->limited ? " (the --max-batch limit)" : "");
  return 0;
}

}  // namespace

// Registered by add_memory_command (cli/memory.cpp) under `memory`.
Command add_memory_fit_subcommand(CLI::App& memory) {
  auto a = std::make_shared<FitArgs>();
  auto* fit = memory.add_subcommand(
      "fit", "Find the largest batch size whose training step fits a memory budget, and where the memory goes");
  fit->add_option("--model", a->model, "Model, as `ampforge train --model` (`ampforge models` lists them)")->required();
  fit->add_option("--image-size", a->image_size, "Square input size (0: the model's default, e.g. 224 for resnet50)")
      ->capture_default_str();
  fit->add_option("--budget", a->budget, "Device memory to fit in, e.g. 16GiB or 512MiB")->required();
  fit->add_option("--device", a->device, "cpu: real steps in budgeted host memory | meta: steps without data "
                                         "(seconds, any budget)")
      ->check(CLI::IsMember({"cpu", "meta"}))
      ->capture_default_str();
  fit->add_option("--stands-for", a->stands_for, "With --device meta: cuda (the CUDA backend's allocator rules and "
                                                 "kernel workspace) | cpu (the host's rules)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  fit->add_option("--precision", a->precision, "fp32 | fp16 | bf16 (autocast; fp16 adds a GradScaler)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  fit->add_flag("--master-weights", a->master_weights, "16-bit parameters with F32 master weights (Apex O2)");
  fit->add_flag("--recompute", a->recompute, "Steps as `ampforge train --recompute` runs them: batch-norm, relu and "
                "residual-sum outputs rebuilt in backward instead of kept");
  fit->add_option("--optimizer", a->optimizer, "adamw | sgd")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  fit->add_option("--max-batch", a->max_batch, "Never probe a batch above this (bounds the time)")->capture_default_str();
  fit->add_option("--steps", a->steps, "Training steps of the confirming probe (1-10; search probes run one)")
      ->capture_default_str();
  fit->add_option("--batch", a->batch, "Check this one batch size instead of searching (exit 0 fits, 1 does not)");
  fit->add_option("--threads", a->threads, "CPU threads (0: all cores)")->capture_default_str();
  fit->add_flag("--json", a->json, "Print one JSON object on stdout (progress stays on stderr)");
  fit->footer(
      "Each probe builds the model and runs full training steps (forward, backward, optimizer step; autocast and "
      "GradScaler as `ampforge train`) on a synthetic batch of the model's input (the registry's, or "
      "--image-size), with every tensor in a fresh caching allocator limited to the budget.\n"
      "--device cpu (default): real steps in host memory; the budget is real host memory.\n"
      "--device meta: the same steps on the meta device, whose tensors have shapes and sizes but no data and whose "
      "kernels compute nothing. --stands-for cuda "
      "(default) applies the CUDA backend's allocator rules (plain cudaMalloc segments, or expandable ones with "
      "AMPFORGE_CUDA_EXPANDABLE_SEGMENTS=1) and the scratch its kernels take (cuBLASLt and estimated cuDNN "
      "workspace); --stands-for cpu the host's rules, so its peaks equal --device cpu's. Where a step reads values "
      "on the host, meta assumes the common case (finite loss, no overflow, the expected number of masked tokens, "
      "foreground anchors): docs/ARCHITECTURE.md (\"The meta device\"). A GPU's own context (a few hundred MiB) "
      "is not part of the budget: give the memory tensors can use.\n"
      "Time: a --device cpu probe costs about one real training step at its batch (a 16GiB search for a large "
      "model takes many minutes); a --device meta probe builds the model and runs the step without arithmetic, "
      "well under a second at any batch (ResNet-50 at 16GiB: seconds in all).\n"
      "The search doubles the batch from 1 until a probe runs out of memory (such a probe stops early), predicts "
      "the limit from the memory per example it measured and settles it with a few more probes: typically 3-5 "
      "probes near the answer. Search probes run one step (a probe that fails there fails with more steps too); "
      "the answer is then confirmed with --steps steps, which catches memory only later steps use. --max-batch "
      "caps the cost: when it fits, the result is the cap, not the limit. --steps 1 skips the confirmation.\n"
      "CPU kernels' scratch buffers (e.g. convolution columns, at most 64 MiB) come from the heap, not the "
      "allocator, and are not counted; on a GPU (and on meta standing for cuda) such workspace is.\n"
      "Exit status: 0 a batch fits; 1 not even batch 1 fits (with --batch: that batch does not); 2 bad input.");
  return {fit, [a] { return run_fit(*a); }};
}

}  // namespace ampforge::cli
