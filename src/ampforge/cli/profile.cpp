// `ampforge profile [--trace FILE] [--json] -- COMMAND ARGS...`: runs any program with the CUPTI injection
// library (CUDA_INJECTION64_PATH) and prints the profile report when it exits — a light alternative to
// `nsys profile --stats=true`. When COMMAND is an ampforge program with profiling on (e.g. `ampforge train
// --profile`), its host ranges are merged in (AMPFORGE_PROFILE_HOST_OUTPUT), so kernels map to ops.
// Exit code: the command's (128 + signal when it was killed), 2 for usage errors, 127 when it cannot run.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/cli/commands.h"
#include "ampforge/profiler/activity_file.h"
#include "ampforge/profiler/chrome_trace.h"
#include "ampforge/profiler/device.h"
#include "ampforge/profiler/report.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"
#include "ampforge/util/timer.h"

namespace ampforge::cli {

namespace {

struct ProfileFlags {
  std::vector<std::string> command;
  std::string trace;
  bool json = false;
  size_t top = 15;
};

// Runs argv with the extra environment; returns the exit status the way a shell reports it.
int run_child(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  AF_CHECK(pid >= 0, "cannot fork to run '{}': {}", argv[0], std::strerror(errno));
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "ampforge profile: cannot run '%s': %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  // Ctrl-C goes to the whole foreground group: let the child decide, and still print the report.
  struct sigaction ignore {}, old_int {}, old_quit {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGINT, &ignore, &old_int);
  ::sigaction(SIGQUIT, &ignore, &old_quit);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGQUIT, &old_quit, nullptr);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool file_exists(const std::string& p) { return ::access(p.c_str(), R_OK) == 0; }

}  // namespace

Command add_profile_command(CLI::App& app) {
  auto flags = std::make_shared<ProfileFlags>();
  auto* sub = app.add_subcommand(
      "profile", "Run a program under CUPTI and print per-kernel / memcpy / overlap statistics when it exits");
  sub->add_option("--trace", flags->trace, "Write a Chrome trace (Perfetto, chrome://tracing) here");
  sub->add_option("--top", flags->top, "Rows per table (0: all)")->capture_default_str();
  sub->add_flag("--json", flags->json, "Print the report as JSON on stdout");
  sub->add_option("command", flags->command, "The program and its arguments (after --)")->required()->expected(-1);
  sub->footer("Example: ampforge profile --trace run.json -- ampforge train --epochs 1 --profile");
  return {sub, [flags] {
            // Before anything starts: a missing program is a usage error (exit 2), not the child's exit 127.
            check_program(flags->command.front(), "profile");  // `command` is required: never empty
            const profiler::CudaPresence cuda = profiler::probe_cuda();
            const std::string injection = profiler::cupti_injection_library();
            if (!cuda.present)
              std::fprintf(stderr, "ampforge profile: %s: there is no CUDA activity to observe; running the command "
                           "anyway (host ranges of ampforge programs are still collected)\n", cuda.reason.c_str());
            else if (injection.empty())
              std::fprintf(stderr, "ampforge profile: this build has no CUPTI injection library (the CUDA toolkit's "
                           "CUPTI headers were not found at build time); only host ranges are collected\n");
            const std::string stem = fmt::format("/tmp/ampforge-profile-{}-{}", ::getpid(), now_ns());
            const std::string device_file = stem + "-cupti.txt", host_file = stem + "-host.txt";
            std::vector<std::pair<std::string, std::string>> env = {{profiler::kHostOutputEnv, host_file}};
            if (!injection.empty()) {
              env.emplace_back("CUDA_INJECTION64_PATH", injection);
              env.emplace_back(profiler::kCuptiOutputEnv, device_file);
            }
            const int64_t t0 = now_ns();
            const int rc = run_child(flags->command, env);
            const int64_t t1 = now_ns();

            profiler::ProfileData data;
            for (const std::string& f : {host_file, device_file}) {
              if (!file_exists(f)) continue;
              try {
                data.merge(profiler::read_activity_file(f));
              } catch (const Error& e) {
                std::fprintf(stderr, "ampforge profile: %s\n", e.what());
              }
              std::remove(f.c_str());
            }
            if (data.windows.empty()) data.windows.emplace_back(t0, t1);  // the command's whole run
            if (data.activities.empty()) {
              data.device_note = !cuda.present      ? cuda.reason
                                 : injection.empty() ? "no CUPTI injection library in this build"
                                                     : "the program made no CUDA calls";
            }
            const profiler::Report report = profiler::compute_report(data);
            if (flags->json) {
              nlohmann::json j = profiler::report_to_json(report, flags->top);
              j["command"] = flags->command;
              j["exit_code"] = rc;
              std::printf("%s\n", j.dump().c_str());
            } else {
              std::printf("\nampforge profile: command exited with %d\n%s", rc,
                          profiler::format_report(report, flags->top).c_str());
            }
            if (!flags->trace.empty()) {
              profiler::write_chrome_trace(data, flags->trace);
              std::fprintf(stderr, "trace: %s\n", flags->trace.c_str());
            }
            return rc;
          }};
}

}  // namespace ampforge::cli
