// Test helper (header-only) for the cli/ tests: runs the built ampforge binary through the shell, as a user
// would, and gives each test process its own scratch directory.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace ampforge::cli::testing {

struct CmdResult {
  int code;         // exit status; -1 when the process did not exit normally
  std::string out;  // stdout, and stderr after it when merge_stderr
};

// `args` go to the shell after the binary (they may hold quoting or redirections); `env` is prefixed to the
// command line ("NAME=value ..."). Without merge_stderr, stderr is discarded (stdout parses as JSON).
inline CmdResult run_ampforge(const std::string& args, bool merge_stderr = true, const std::string& env = "") {
  const std::string cmd = (env.empty() ? "" : env + " ") + AMPFORGE_BINARY_DIR "/bin/ampforge " + args +
                          (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// Starts the built ampforge with `args` (no shell) and returns its pid, for tests that signal it while it runs;
// stdout / stderr go to the files given (else they stay the test's). The caller waits for it (waitpid).
// `ampforge ARGS` whose stdout is one JSON object: its exit code must be `expect_code` (a failed expectation names
// the command and its output); a stdout that is not JSON is a failure and gives null.
inline nlohmann::json run_ampforge_json(const std::string& args, int expect_code = 0) {
  const CmdResult r = run_ampforge(args, false);
  EXPECT_EQ(r.code, expect_code) << args << "\n" << r.out;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not one JSON object: " << e.what() << "\n" << r.out;
    return {};
  }
}

inline pid_t spawn_ampforge(const std::vector<std::string>& args, const std::filesystem::path& out = {},
                            const std::filesystem::path& err = {}) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (!out.empty() && !std::freopen(out.c_str(), "w", stdout)) ::_exit(127);
  if (!err.empty() && !std::freopen(err.c_str(), "w", stderr)) ::_exit(127);
  const std::string bin = AMPFORGE_BINARY_DIR "/bin/ampforge";
  std::vector<char*> argv{const_cast<char*>(bin.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(bin.c_str(), argv.data());
  ::_exit(127);
}

// The whole file ("" when it cannot be read).
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// <tmp>/<prefix><pid>, created.
inline std::filesystem::path scratch_dir(const std::string& prefix) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace ampforge::cli::testing
