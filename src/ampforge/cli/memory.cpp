// `ampforge memory`: fragmentation tools.
//   memory replay TRACE [--policy naive|pytorch|ampforge|all] [--budget BYTES] [--snapshot FILE] [--json]
//   memory report SNAPSHOT [-o FILE.svg|FILE.html] [--json]
//   memory fit --model NAME --budget SIZE [...]          (cli/memory_fit.cpp)
// Exit codes: 0 ok; 1 an allocation failed under --budget (the check failed; fit: not even batch 1 fits);
// 2 bad input (the message names the file and line).
#include <cstdio>
#include <fstream>
#include <string>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/cli/commands.h"
#include "ampforge/memory/report.h"
#include "ampforge/memory/stats.h"
#include "ampforge/memory/trace.h"
#include "ampforge/util/error.h"

namespace ampforge::cli {

namespace {

struct ReplayArgs {
  std::string trace, policy = "all", budget, snapshot;
  bool json = false;
};

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
      "replay", "Replay a memory trace (ampforge-memtrace v1) under allocator policies on a simulated device and "
                "compare peak reserved with peak live. Exit 1 when an allocation fails under --budget.");
  replay->add_option("TRACE", replay_args->trace, "trace file")->required();
  replay->add_option("--policy", replay_args->policy, "naive, pytorch, ampforge or all (default all)")
      ->check(CLI::IsMember({"naive", "pytorch", "ampforge", "all"}));
  replay->add_option("--budget", replay_args->budget, "device memory, e.g. 16GiB or 512MiB (default: unlimited)");
  replay->add_option("--snapshot", replay_args->snapshot,
                     "write the allocator's snapshot at the end of the replay (ampforge policy when --policy all)");
  replay->add_flag("--json", replay_args->json, "print JSON");

  auto report_args = std::make_shared<ReportArgs>();
  auto* report = sub->add_subcommand("report", "Summarise a memory snapshot and draw its timeline and segment map");
  report->add_option("SNAPSHOT", report_args->snapshot, "snapshot JSON file")->required();
  report->add_option("-o,--output", report_args->output, "chart file, .svg or .html (default: SNAPSHOT with .svg)");
  report->add_flag("--json", report_args->json, "print JSON");

  Command fit = add_memory_fit_subcommand(*sub);

  return {sub, [replay, report, replay_args, report_args, fit] {
            if (replay->parsed()) return run_replay(*replay_args);
            if (report->parsed()) return run_report(*report_args);
            if (fit.sub->parsed()) return fit.run();
            return 2;
          }};
}

}  // namespace ampforge::cli
