// Every option of every subcommand, run as a user would with boundary values: 0, -1, a huge number, NaN, inf, an
// empty string, a missing file, a directory where a file is expected, a file of garbage. The options come from the
// CLI's own definitions (`ampforge --cli-schema`, cli/option_schema.h), so a new option is swept without editing
// this file; a new subcommand fails CommandsAreAllSwept until it is given its short base arguments here.
//
// Each run must end with exit 0, 1 or 2 within its time limit, never with a signal, an abort, a hang or exit 3
// (main's "internal error": a bug), and a run that fails must say why (a message on stdout or stderr) in text: no
// control bytes from a file echoed into it. Each subcommand runs from base arguments that keep the work short (tiny
// synthetic data, one step); the swept option replaces the base's value of the same option.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ampforge/core/safetensors.h"
#include "ampforge/hw/subprocess.h"
#include "ampforge/ops/ops.h"

namespace fs = std::filesystem;
using namespace ampforge;

namespace {

const std::string kBin = AMPFORGE_BINARY_DIR "/bin/ampforge";
constexpr double kRunLimitS = 120;  // a run past this is a hang

// The scratch directory every run works in (outputs named "0" or "-1" land here) and its fixtures.
fs::path& dir() {
  static fs::path d;
  return d;
}

hw::SubprocessResult run(const std::vector<std::string>& args, double limit = kRunLimitS) {
  std::vector<std::string> argv{kBin};
  argv.insert(argv.end(), args.begin(), args.end());
  return hw::run_subprocess(argv, limit, true);
}

// One subcommand's short, valid invocation: its options (name, value; value "" for a flag) and its positionals (name,
// values), and whether positionals follow "--" (a command line of its own: profile, launch).
struct Base {
  std::vector<std::pair<std::string, std::string>> options = {};
  std::vector<std::pair<std::string, std::vector<std::string>>> positionals = {};
  bool dashdash = false;
};

// Options whose huge value is long work on purpose (a user asking for it gets it), not a hang: not given the huge
// values. Every other option must refuse them or finish in time.
const std::set<std::pair<std::string, std::string>>& long_on_purpose() {
  static const std::set<std::pair<std::string, std::string>> s = {
      {"bench", "--steps"},         {"bench", "--warmup"},        {"bench", "--rounds"},
      {"bench", "--peer-timeout"},  {"monitor", "--count"},       {"monitor", "--interval"},
      {"data make-detection", "--train"}, {"data make-detection", "--val"},
      {"launch", "--grace"},        {"doctor", "--python-timeout"},
      {"train", "--dist-timeout"},  {"train", "--collective-timeout"},
  };
  return s;
}

std::map<std::string, Base> bases() {
  const std::string d = dir().string();
  const std::string memtrace = std::string(AMPFORGE_TEST_DATA_DIR) + "/memtrace/cnn.txt";
  return {
      {"info", {}},
      {"train",
       {{{"--model", "cnn"}, {"--dataset", "synthetic"}, {"--synthetic-size", "16"}, {"--batch", "8"},
         {"--epochs", "1"}, {"--max-steps", "1"}, {"--no-progress", ""}, {"--workers", "0"}, {"--threads", "1"}}}},
      {"doctor", {{{"--no-bandwidth", ""}, {"--python-timeout", "20"}}}},
      {"monitor", {{{"--count", "1"}, {"--interval", "0.05"}}}},
      {"memory replay", {{{"--policy", "ampforge"}}, {{"TRACE", {memtrace}}}}},
      {"memory report", {{}, {{"SNAPSHOT", {d + "/snap.json"}}}}},
      {"memory explain", {{}, {{"SNAPSHOT", {std::string(AMPFORGE_TEST_DATA_DIR) + "/torch_snapshots/oom.pickle"}}}}},
      {"memory fit", {{{"--model", "cnn"}, {"--budget", "1GiB"}, {"--device", "meta"}, {"--threads", "1"}}}},
      {"profile", {{}, {{"command", {"true"}}}, true}},
      {"models", {{}, {{"names", {"cnn"}}}}},
      {"bench",
       {{{"--models", "cnn"}, {"--precisions", "fp32"}, {"--steps", "1"}, {"--warmup", "0"}, {"--peer", "none"},
         {"--threads", "1"}}}},
      {"export", {{{"--model", "cnn"}, {"--random-init", ""}, {"--output", d + "/m.onnx"}}}},
      {"predict",
       {{{"--model", "cnn"}, {"--random-init", ""}, {"--input", d + "/in.safetensors"},
         {"--output", d + "/out.safetensors"}}}},
      {"data make-detection",
       {{{"--train", "2"}, {"--val", "1"}, {"--canvas", "64"}, {"--max-items", "1"}}, {{"out", {d + "/set2"}}}}},
      {"detect",
       {{{"--model", "yolov8n"}, {"--checkpoint", d + "/yolo.safetensors"}, {"--source", d + "/set/images/val"},
         {"--image-size", "64"}, {"--out", d + "/dets.jsonl"}}}},
      {"launch", {{{"--nproc", "1"}}, {{"program", {"true"}}}, true}},
  };
}

// The boundary values for an option of CLI11 type `type` ("INT", "FLOAT:FLOAT in [0 - 1]", "TEXT:{a,b}", ...).
std::vector<std::string> values_for(const std::string& type, bool huge) {
  const std::string d = dir().string();
  std::vector<std::string> v;
  const bool integer = type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0;
  const bool real = type.rfind("FLOAT", 0) == 0;
  if (integer) {
    v = {"0", "-1", "nan", ""};
    if (huge) v.insert(v.end(), {"2147483647", "99999999999999999999"});
  } else if (real) {
    v = {"0", "-1", "nan", "inf", ""};
    if (huge) v.push_back("1e308");
  } else {
    v = {"", "0", "-1", d + "/missing/file", d, d + "/garbage.bin"};
    if (huge) v.push_back("99999999999999999999");
  }
  return v;
}

// Text a person can read: no control bytes other than newline, tab, carriage return (progress) and escape (colour).
bool printable(const std::string& s) {
  for (unsigned char c : s)
    if (c == 0 || (c < 0x20 && c != '\n' && c != '\t' && c != '\r' && c != 0x1b) || c == 0x7f) return false;
  return true;
}

std::string tail(const std::string& s, size_t n = 600) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

std::string join(const std::vector<std::string>& a) {
  std::string s;
  for (const std::string& x : a) s += (s.empty() ? "" : " ") + (x.empty() ? std::string("''") : x);
  return s;
}

const nlohmann::json& schema() {
  static const nlohmann::json j = [] {
    const hw::SubprocessResult r = hw::run_subprocess({kBin, "--cli-schema"}, 60, false);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return nlohmann::json::parse(r.out);
  }();
  return j;
}

class OptionSweep : public ::testing::TestWithParam<std::string> {
 public:
  // Fixtures: a memory snapshot, a predict input, a detection set and a one-step YOLOv8n checkpoint on it, a file
  // of garbage. Made once per test process (each subcommand's test is a process of its own under ctest).
  static void SetUpTestSuite() {
    // Every run (a child: the limit is inherited) may hold at most 8 GiB of data: a huge value that makes the program
    // allocate without bound must fail there, with a message, instead of taking the machine's memory (24 GiB) from
    // the tests beside it.
    const rlimit data{8LL << 30, 8LL << 30};
    ASSERT_EQ(::setrlimit(RLIMIT_DATA, &data), 0);
    dir() = fs::temp_directory_path() / ("ampforge_option_sweep_" + std::to_string(::getpid()));
    fs::remove_all(dir());
    fs::create_directories(dir());
    ASSERT_EQ(::chdir(dir().c_str()), 0);
    const std::string d = dir().string();
    {
      std::ofstream g(dir() / "garbage.bin", std::ios::binary);
      for (int i = 0; i < 4096; ++i) g.put(static_cast<char>((i * 7919 + 13) & 0xff));
    }
    Generator gen(3);
    save_safetensors(d + "/in.safetensors", {{"images", ops::randn(Shape{2, 1, 28, 28}, DType::F32, kCPU, &gen)}});
    auto must = [](const std::vector<std::string>& args) {
      const hw::SubprocessResult r = run(args, 600);
      ASSERT_EQ(r.exit_code, 0) << join(args) << "\n" << tail(r.out, 2000);
    };
    must({"memory", "replay", std::string(AMPFORGE_TEST_DATA_DIR) + "/memtrace/cnn.txt", "--policy", "ampforge",
          "--snapshot", d + "/snap.json"});
    must({"data", "make-detection", d + "/set", "--train", "2", "--val", "1", "--canvas", "64", "--max-items", "1"});
    must({"train", "--model", "yolov8n", "--dataset", "detection", "--data", d + "/set/data.yaml", "--image-size", "64",
          "--epochs", "1", "--batch", "2", "--max-steps", "1", "--workers", "0", "--threads", "1", "--no-progress",
          "--mosaic", "0", "--save", d + "/yolo.safetensors"});
  }
  static void TearDownTestSuite() {
    if (::chdir("/") != 0) return;
    fs::remove_all(dir());
  }
};

// The command line of `path` from its base, with `swept` given `value` ("" for a flag: present) in place of the
// base's own; `positional` set when the swept option is a positional.
std::vector<std::string> command_line(const std::string& path, const Base& base, const std::string& swept,
                                      const std::vector<std::string>& value, bool is_flag) {
  std::vector<std::string> args;
  for (size_t p = 0, q; p < path.size(); p = q + 1) {
    q = path.find(' ', p);
    if (q == std::string::npos) q = path.size();
    args.push_back(path.substr(p, q - p));
  }
  for (const auto& [name, v] : base.options) {
    if (name == swept) continue;
    args.push_back(name);
    if (!v.empty()) args.push_back(v);
  }
  bool swept_positional = false;
  for (const auto& [name, v] : base.positionals) swept_positional |= name == swept;
  if (!swept.empty() && !swept_positional) {
    args.push_back(swept);
    if (!is_flag) args.insert(args.end(), value.begin(), value.end());
  }
  if (base.dashdash && !base.positionals.empty()) args.push_back("--");
  for (const auto& [name, v] : base.positionals) {
    const auto& vals = name == swept ? value : v;
    args.insert(args.end(), vals.begin(), vals.end());
  }
  return args;
}

TEST_P(OptionSweep, EveryOptionWithBoundaryValuesEndsCleanly) {
  const std::string path = GetParam();
  const auto all = bases();
  const Base& base = all.at(path);
  const nlohmann::json* cmd = nullptr;
  for (const auto& c : schema().at("commands"))
    if (c.at("path") == path) cmd = &c;
  ASSERT_NE(cmd, nullptr) << "`ampforge --cli-schema` has no command '" << path << "'";
  // The base itself must run cleanly (exit 0, or 1 where a check fails on this machine: doctor, monitor without a
  // GPU), else every case below would only test the base's failure.
  const hw::SubprocessResult b = run(command_line(path, base, "", {}, false));
  ASSERT_TRUE(!b.timed_out && b.signal == 0 && (b.exit_code == 0 || b.exit_code == 1))
      << "base `ampforge " << join(command_line(path, base, "", {}, false)) << "`: exit " << b.exit_code << "\n"
      << tail(b.out);
  int runs = 0, options = 0;
  for (const auto& o : cmd->at("options")) {
    const std::string name = o.at("name");
    ++options;
    const bool flag = !o.at("takes_value").get<bool>();
    std::vector<std::vector<std::string>> cases;
    if (flag) {
      cases.push_back({});
    } else {
      const bool huge = !long_on_purpose().count({path, name});
      for (const std::string& v : values_for(o.at("type"), huge)) cases.push_back({v});
    }
    for (const auto& value : cases) {
      const std::vector<std::string> args = command_line(path, base, name, value, flag);
      const hw::SubprocessResult r = run(args);
      ++runs;
      const std::string what = "`ampforge " + join(args) + "`";
      if (r.timed_out) {
        ADD_FAILURE() << what << ": still running after " << kRunLimitS << " s (a hang)\n" << tail(r.out);
        continue;
      }
      if (!r.started || r.signal != 0) {
        ADD_FAILURE() << what << ": ended by signal " << r.signal << " " << r.error << "\n" << tail(r.out);
        continue;
      }
      EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1 || r.exit_code == 2)
          << what << ": exit " << r.exit_code << " (3 is an internal error: a bug)\n" << tail(r.out);
      if (r.exit_code != 0) {
        EXPECT_NE(r.out.find_first_not_of(" \n\t\r"), std::string::npos) << what << ": failed without a message";
      }
      EXPECT_TRUE(printable(r.out)) << what << ": raw bytes in its output\n" << tail(r.out);
    }
  }
  std::printf("option sweep: ampforge %s: %d options, %d runs\n", path.c_str(), options, runs);
}

std::vector<std::string> swept_commands() {
  std::vector<std::string> v;
  for (const auto& [path, base] : bases()) v.push_back(path);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Commands, OptionSweep, ::testing::ValuesIn(swept_commands()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& c : n)
                             if (c == ' ' || c == '-') c = '_';
                           return n;
                         });

// A subcommand with options that has no base above would go unswept: each must be listed.
TEST(OptionSweepCoverage, CommandsAreAllSwept) {
  const auto all = bases();
  for (const auto& c : schema().at("commands")) {
    if (c.at("options").empty()) continue;  // a group (`memory`, `data`) or a command without options
    EXPECT_TRUE(all.count(c.at("path").get<std::string>()))
        << "`ampforge " << c.at("path").get<std::string>() << "` has options but no base arguments in "
        << "option_sweep_test.cpp (bases()): add a short valid invocation";
  }
}

}  // namespace
