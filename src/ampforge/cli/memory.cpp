// `ampforge memory`: fragmentation tools.
//   memory replay TRACE|SNAP.pickle [--policy naive|pytorch|pytorch-expandable|ampforge|all] [--budget BYTES]
//                 [--device N] [--snapshot FILE] [--svg FILE] [--json]
//   memory explain SNAP.pickle [--device N] [--json]
//   memory report SNAPSHOT [-o FILE.svg|FILE.html] [--json]
//   memory fit --model NAME --budget SIZE [...]          (cli/memory_fit.cpp)
// replay reads an ampforge memtrace or a PyTorch memory snapshot pickle (told apart by the first bytes).
// Exit codes: 0 ok; 1 an allocation failed under --budget (the check failed; fit: not even batch 1 fits);
// 2 bad input (the message names the file and line, or the snapshot entry).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/cli/commands.h"
#include "ampforge/memory/report.h"
#include "ampforge/memory/stats.h"
#include "ampforge/memory/torch_report.h"
#include "ampforge/memory/torch_snapshot.h"
#include "ampforge/memory/pickle.h"
#include "ampforge/memory/trace.h"
#include "ampforge/util/error.h"
#include "ampforge/util/file.h"

namespace ampforge::cli {

namespace {

struct ReplayArgs {
  std::string trace, policy = "all", budget, snapshot, svg;
  int device = -1;
  bool json = false;
};

struct ExplainArgs {
  std::string snapshot;
  int device = -1;
  bool json = false;
};

// The first bytes of a file, to tell a pickle from a memtrace.
std::string file_head(const std::string& path) {
  check_readable_file(path, "memory trace or snapshot");
  std::ifstream in(path, std::ios::binary);
  if (!in) AF_THROW(Io, "cannot open '{}': {}", path, std::strerror(errno));
  char buf[8] = {};
  in.read(buf, sizeof buf);
  return std::string(buf, static_cast<size_t>(in.gcount()));
}

void write_chart(const std::string& path, const std::string& svg) {
  AF_CHECK(path.size() >= 4 && path.compare(path.size() - 4, 4, ".svg") == 0, "--svg: '{}' must end in .svg", path);
  write_file_atomically(path, svg, "SVG chart");
}

int run_replay_torch(const ReplayArgs& a, uint64_t budget) {
  using namespace memory;
  AF_CHECK(a.snapshot.empty(), "--snapshot: not available for a PyTorch snapshot (use --svg for a chart)");
  const TorchSnapshot snap = torch_snapshot_read(a.trace);
  const TorchReplayInput in = torch_trace_build(snap, a.device < 0 ? torch_default_device(snap) : a.device);
  const std::vector<std::string> policies =
      a.policy == "all" ? torch_policy_names() : std::vector<std::string>{a.policy};
  const TorchReplayReport r = torch_replay_report(snap, in, policies, budget, a.svg.empty() ? 0 : 400);
  if (!a.svg.empty()) write_chart(a.svg, torch_replay_report_svg(r));
  bool all_fit = true;
  for (const TorchPolicyRun& run : r.runs) all_fit &= run.fits;
  if (a.json) {
    nlohmann::json j = torch_replay_report_json(r);
    if (!a.svg.empty()) j["chart"] = a.svg;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", torch_replay_report_text(r).c_str());
    if (!a.svg.empty()) std::printf("\nwrote %s\n", a.svg.c_str());
  }
  return all_fit ? 0 : 1;
}

int run_explain(const ExplainArgs& a) {
  using namespace memory;
  AF_CHECK(looks_like_pickle(file_head(a.snapshot)),
           "'{}' is not a PyTorch memory snapshot (a pickle written by torch.cuda.memory._dump_snapshot); explain reads "
           "only those",
           a.snapshot);
  const TorchSnapshot snap = torch_snapshot_read(a.snapshot);
  const TorchReplayInput in = torch_trace_build(snap, a.device < 0 ? torch_default_device(snap) : a.device);
  const auto e = torch_explain(snap, in);
  if (a.json) {
    nlohmann::json j = {{"snapshot", a.snapshot}, {"device", in.device}, {"settings", snap.settings.describe()},
                        {"ooms", torch_explain_json(e)}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", torch_explain_text(in, e).c_str());
  }
  return 0;
}

struct ReportArgs {
  std::string snapshot, output;
  bool json = false;
};

int run_replay(const ReplayArgs& a) {
  using namespace memory;
  memory::ReplayOptions opt;
  if (!a.budget.empty()) {
    opt.budget = parse_size(a.budget, "--budget");
    AF_CHECK(opt.budget > 0, "--budget: must be more than 0 bytes");
  }
  const std::string head = file_head(a.trace);
  AF_CHECK(head.rfind("PK\x03\x04", 0) != 0,
           "'{}' is a zip archive (torch.save writes those: a model or a checkpoint), not a memory record: a PyTorch "
           "memory snapshot is what torch.cuda.memory._dump_snapshot(\"snap.pickle\") writes (docs/MEMORY.md)",
           a.trace);
  if (looks_like_pickle(head)) return run_replay_torch(a, opt.budget);
  AF_CHECK(a.device < 0, "--device: only for PyTorch snapshots (an ampforge memtrace records one device)");
  AF_CHECK(a.policy != "pytorch-expandable",
           "--policy pytorch-expandable: only for PyTorch snapshots (the pytorch policy with their settings)");
  opt.series_points = a.svg.empty() ? 0 : 400;
  const Trace trace = trace_read(a.trace);
  std::vector<std::string> policies =
      a.policy == "all" ? std::vector<std::string>{"naive", "pytorch", "ampforge"} : std::vector<std::string>{a.policy};
  std::vector<ReplayResult> results;
  for (const std::string& p : policies) {
    opt.keep_snapshot = !a.snapshot.empty() && (p == "ampforge" || policies.size() == 1);
    results.push_back(trace_replay(trace, PolicyConfig::by_name(p), opt));
    if (opt.keep_snapshot) {
      std::ofstream out(a.snapshot);
      out << results.back().snapshot.dump(1) << "\n";
      if (!out) AF_THROW(Io, "cannot write the snapshot '{}'", a.snapshot);
    }
  }
  bool any_failed = false;
  for (const auto& r : results) any_failed |= r.failed;
  if (!a.svg.empty()) {
    std::vector<ReplayPanel> panels;
    for (const auto& r : results) panels.push_back({r.policy, r.series, r.peak_live, r.peak_reserved});
    write_chart(a.svg, replay_timeline_svg(a.trace + ": live and reserved memory per policy", panels,
                                           static_cast<int64_t>(opt.budget)));
  }
  if (a.json) {
    nlohmann::json j = {{"trace", a.trace}, {"events", trace.events.size()}, {"budget", opt.budget}};
    j["results"] = nlohmann::json::array();
    for (const auto& r : results) j["results"].push_back(replay_result_to_json(r));
    std::printf("%s\n", j.dump(2).c_str());
    return any_failed ? 1 : 0;
  }
  std::printf("trace %s: %zu events%s\n", a.trace.c_str(), trace.events.size(),
              opt.budget ? (", budget " + format_bytes(static_cast<int64_t>(opt.budget))).c_str() : "");
  std::printf("%-9s %12s %14s %8s %10s %10s %10s  %s\n", "policy", "peak live", "peak reserved", "ratio", "prov.calls",
              "allocs", "cache hits", "result");
  for (const auto& r : results) {
    const std::string outcome =
        r.failed ? "OOM at line " + std::to_string(r.failed_line) + " (" +
                       format_bytes(static_cast<int64_t>(r.failed_bytes)) + ")"
                 : "ok";
    std::printf("%-9s %12s %14s %8.3f %10lld %10lld %10lld  %s\n", r.policy.c_str(), format_bytes(r.peak_live).c_str(),
                format_bytes(r.peak_reserved).c_str(), r.ratio, static_cast<long long>(r.stats.provider_calls),
                static_cast<long long>(r.stats.num_allocs), static_cast<long long>(r.stats.cache_hits),
                outcome.c_str());
  }
  std::printf("peak live: the most bytes live at once (what an ideal allocator holds); ratio = peak reserved / "
              "peak live%s\n",
              any_failed ? "; peaks of a failed replay cover the events before the failure" : "");
  for (const auto& r : results)
    if (r.failed) std::printf("\n[%s] first failing event: line %lld\n%s", r.policy.c_str(),
                              static_cast<long long>(r.failed_line), r.oom_report.c_str());
  return any_failed ? 1 : 0;
}

int run_report(const ReportArgs& a) {
  using namespace memory;
  AF_CHECK(!looks_like_pickle(file_head(a.snapshot)),
           "'{}' is a PyTorch memory snapshot; `memory report` draws ampforge's own (`memory replay TRACE --snapshot "
           "S.json`). For PyTorch's: `ampforge memory replay {} --svg timeline.svg` (timeline per policy, sites, "
           "calibration) and `ampforge memory explain {}` (its out-of-memory errors)",
           a.snapshot, a.snapshot, a.snapshot);
  const nlohmann::json snap = snapshot_read(a.snapshot);
  std::string out = a.output;
  if (out.empty()) {
    const auto dot = a.snapshot.rfind('.');
    const auto slash = a.snapshot.rfind('/');
    out = (dot != std::string::npos && (slash == std::string::npos || dot > slash) ? a.snapshot.substr(0, dot)
                                                                                    : a.snapshot) +
          ".svg";
  }
  const bool html = out.size() >= 5 && out.compare(out.size() - 5, 5, ".html") == 0;
  AF_CHECK(html || (out.size() >= 4 && out.compare(out.size() - 4, 4, ".svg") == 0),
           "-o/--output: '{}' must end in .svg or .html", out);
  {
    std::ofstream f(out);
    f << (html ? snapshot_html(snap) : snapshot_svg(snap));
    if (!f) AF_THROW(Io, "cannot write '{}'", out);
  }
  if (a.json) {
    nlohmann::json j = {{"snapshot", a.snapshot}, {"chart", out}, {"stats", snap.at("stats")},
                        {"segments", snap.at("segments").size()}, {"steps", snap.at("timeline").size()}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%swrote %s\n", snapshot_summary(snap).c_str(), out.c_str());
  }
  return 0;
}

}  // namespace

Command add_memory_fit_subcommand(CLI::App& memory);  // cli/memory_fit.cpp

Command add_memory_command(CLI::App& app) {
  auto* sub = app.add_subcommand("memory", "Memory tools: replay allocation traces under allocator policies, report "
                                           "snapshots, find the largest batch that fits a budget");
  sub->require_subcommand(1);
  auto replay_args = std::make_shared<ReplayArgs>();
  auto* replay = sub->add_subcommand(
      "replay", "Replay a memory trace (ampforge-memtrace v1) or a PyTorch memory snapshot "
                "(torch.cuda.memory._dump_snapshot) under allocator policies on a simulated device: peak live, peak "
                "reserved, fragmentation at the peak, the smallest budget that runs it; for a snapshot also the "
                "calibration against the recording and the allocation sites at the peak. Exit 1 when an allocation "
                "fails under --budget.");
  replay->add_option("TRACE", replay_args->trace, "memtrace file or snapshot pickle (told apart by content)")->required();
  replay->add_option("--policy", replay_args->policy,
                     "naive, pytorch, pytorch-expandable (snapshots only), ampforge or all (default all). For a "
                     "snapshot, pytorch uses its recorded allocator settings")
      ->check(CLI::IsMember({"naive", "pytorch", "pytorch-expandable", "ampforge", "all"}));
  replay->add_option("--budget", replay_args->budget, "device memory, e.g. 16GiB or 512MiB (default: unlimited)");
  replay->add_option("--device", replay_args->device, "the snapshot's device to replay (default: the lowest that recorded entries)")
      ->check(CLI::Range(0, 1 << 20));
  replay->add_option("--svg", replay_args->svg, "write a timeline of live and reserved memory per policy (.svg)");
  replay->add_option("--snapshot", replay_args->snapshot,
                     "write the allocator's snapshot at the end of the replay (ampforge policy when --policy all)");
  replay->add_flag("--json", replay_args->json, "print JSON");

  auto explain_args = std::make_shared<ExplainArgs>();
  auto* explain = sub->add_subcommand(
      "explain", "For each out-of-memory error a PyTorch memory snapshot recorded: the request, what PyTorch's cache "
                 "held free, the largest free block and why it could not serve (split rule, size class, stream), what "
                 "CUDA reported free, and the allocator setting that would have avoided it, checked by replaying");
  explain->add_option("SNAPSHOT", explain_args->snapshot, "snapshot pickle (torch.cuda.memory._dump_snapshot)")->required();
  explain->add_option("--device", explain_args->device, "the snapshot's device (default: the lowest that recorded entries)")->check(CLI::Range(0, 1 << 20));
  explain->add_flag("--json", explain_args->json, "print JSON");

  auto report_args = std::make_shared<ReportArgs>();
  auto* report = sub->add_subcommand("report", "Summarise a memory snapshot and draw its timeline and segment map");
  report->add_option("SNAPSHOT", report_args->snapshot, "snapshot JSON file")->required();
  report->add_option("-o,--output", report_args->output, "chart file, .svg or .html (default: SNAPSHOT with .svg)");
  report->add_flag("--json", report_args->json, "print JSON");

  Command fit = add_memory_fit_subcommand(*sub);

  return {sub, [replay, report, explain, replay_args, report_args, explain_args, fit] {
            if (replay->parsed()) return run_replay(*replay_args);
            if (explain->parsed()) return run_explain(*explain_args);
            if (report->parsed()) return run_report(*report_args);
            if (fit.sub->parsed()) return fit.run();
            return 2;
          }};
}

}  // namespace ampforge::cli
