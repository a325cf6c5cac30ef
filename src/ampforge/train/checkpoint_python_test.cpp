// A checkpoint written by ampforge is valid safetensors for Python: scripts/check_checkpoint.py reads it
// with only json + numpy and must find the same names, dtypes, shapes and values. Skipped when no
// python3 with numpy is installed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ampforge/core/safetensors.h"
#include "ampforge/train/recipe.h"

using namespace ampforge;
namespace fs = std::filesystem;

namespace {
std::string python_with_numpy() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    std::string cmd = std::string(py) + " -c 'import numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return "";
}
}  // namespace

TEST(CheckpointPython, ReadableWithOnlyJsonAndNumpy) {
  const std::string py = python_with_numpy();
  if (py.empty()) GTEST_SKIP() << "no python3 with numpy (scripts/setup installs python3-numpy)";
  const fs::path dir = fs::temp_directory_path() / ("ampforge_ckpt_py_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  train::TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 64;
  c.batch_size = 32;
  c.max_steps = 2;
  c.precision = DType::BF16;
  c.master_weights = true;  // BF16 parameters: exercises the format's BF16 encoding
  c.progress = false;
  c.verbose = false;
  c.save = (dir / "ckpt.safetensors").string();
  train::train(c);

  nlohmann::json expect;
  for (auto& [name, t] : load_safetensors(c.save).tensors) {
    auto v = t.tolist<double>();
    nlohmann::json e;
    e["dtype"] = safetensors_dtype_name(t.dtype());
    e["shape"] = t.shape().vec();
    e["numel"] = t.numel();
    const size_t k = std::min<size_t>(8, v.size());
    e["head"] = std::vector<double>(v.begin(), v.begin() + static_cast<long>(k));
    e["tail"] = std::vector<double>(v.end() - static_cast<long>(k), v.end());
    double s = 0;
    for (double x : v) s += x;
    e["sum"] = s;
    expect[name] = e;
  }
  ASSERT_TRUE(expect.contains("model.0.weight"));
  EXPECT_EQ(expect["model.0.weight"]["dtype"], "BF16");
  std::ofstream(dir / "expect.json") << expect.dump();
  const std::string cmd = py + " " AMPFORGE_SOURCE_DIR "/scripts/check_checkpoint.py " + c.save + " --expect " +
                          (dir / "expect.json").string() + " > " + (dir / "out.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir / "out.txt");
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("OK"), std::string::npos) << out;
  // A truncated file is rejected by the script too.
  fs::resize_file(c.save, 100);
  EXPECT_NE(std::system((py + " " AMPFORGE_SOURCE_DIR "/scripts/check_checkpoint.py " + c.save + " >/dev/null 2>&1").c_str()), 0);
}
