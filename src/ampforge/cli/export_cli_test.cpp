// `ampforge export` and `ampforge predict` as a user runs them (the real binary), issue 19's acceptance:
//   1. exported CNN, ResNet-18 and ResNet-50 files pass onnx.checker (Debian's python3-onnx 1.12);
//   2. ONNX Runtime (onnxruntime, Python) on the file gives what `ampforge predict` gives on the same inputs, within
//      1e-4 of the output's magnitude in F32 (and the F16 table's bound for --fp16);
//   3. no weights, another model's checkpoint and unsupported options fail with a clear message, exit 2 and no file.
// The checkpoints are written here: the registry's model with random weights and non-trivial BatchNorm statistics
// (so folding is exercised), saved as a safetensors state dict.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "ampforge/autograd/node.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/export/onnx_testutil.h"
#include "ampforge/hw/cli_test_util.h"
#include "ampforge/models/models.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
using ampforge::hw::testing::run_ampforge;
namespace fs = std::filesystem;
namespace ot = ampforge::onnx_export::testing;

namespace {

const std::map<std::string, std::string> kEnv = {{"NO_COLOR", "1"}};

std::string tmp_path(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("ampforge_export_cli_test_{}", ::getpid());
  fs::create_directories(d);
  return (d / name).string();
}

// The model `name` with every float tensor random (BN variances positive, scales near 1), saved as a state dict.
std::string write_checkpoint(const std::string& name, const models::ModelOptions& o, uint64_t seed) {
  nn::ModulePtr m = models::create(name, o);
  Generator gen(seed);
  autograd::NoGradGuard ng;
  std::vector<std::pair<std::string, Tensor>> state;
  for (auto& [n, t] : m->state_dict()) {
    if (t.is_floating_point()) {
      Tensor r = randn(t.shape(), DType::F32, kCPU, &gen);
      if (n.find("running_var") != std::string::npos) r = add(abs(r), 0.5);
      else if (n.find("running_mean") != std::string::npos) r = mul(r, 0.1);
      else if (t.dim() == 1 && n.find("weight") != std::string::npos) r = add(mul(r, 0.1), 1.0);
      else if (t.dim() > 1) r = mul(r, std::sqrt(2.0 / static_cast<double>(t.numel() / t.size(0))));  // He-like: stable depth
      else r = mul(r, 0.05);
      ops::copy_(t, r);
    }
    state.emplace_back(n, t);
  }
  const std::string path = tmp_path(name + ".safetensors");
  save_safetensors(path, state);
  return path;
}

struct Case {
  std::string model;
  int64_t channels, image, classes;
};

// export -> onnx.checker -> ORT vs predict. Returns the relative error (or -1 when a step failed).
double export_check_compare(const Case& c, const std::vector<std::string>& extra, int64_t batch, DType dt,
                            const std::string& precision) {
  models::ModelOptions o;
  o.in_channels = c.channels, o.image_size = c.image, o.num_classes = c.classes;
  const std::string ckpt = write_checkpoint(c.model, o, 11);
  const std::string stem = fmt::format("{}_{}_{}", c.model, extra.size(), precision);
  const std::string onnx = tmp_path(stem + ".onnx");
  std::vector<std::string> args = {"export", "--model", c.model, "--checkpoint", ckpt, "-o", onnx,
                                   "--image-size", std::to_string(c.image), "--in-channels", std::to_string(c.channels),
                                   "--classes", std::to_string(c.classes), "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  const auto e = run_ampforge(args, kEnv, 300);
  EXPECT_EQ(e.exit_code, 0) << e.err;
  if (e.exit_code != 0) return -1;
  const auto j = nlohmann::json::parse(e.out);
  EXPECT_EQ(j.at("schema"), "ampforge.export/1");
  EXPECT_EQ(j.at("opset"), 17);
  EXPECT_EQ(j.at("ir_version"), 8);
  EXPECT_EQ(j.at("inputs").at(0).at("name"), "images");
  EXPECT_EQ(j.at("outputs").at(0).at("name"), "output0");
  if (ot::python_onnx_available()) {
    const auto chk = ot::check_model(onnx);
    EXPECT_EQ(chk.exit_code, 0) << c.model << ": " << chk.out << chk.error;
  } else {
    ADD_FAILURE() << "python3-onnx is not installed (scripts/setup installs it)";
  }
  Generator gen(5);
  Tensor x = randn(Shape{batch, c.channels, c.image, c.image}, DType::F32, kCPU, &gen).to(dt);
  const std::string in = tmp_path(stem + "_in.safetensors"), ref = tmp_path(stem + "_ref.safetensors"),
                    got = tmp_path(stem + "_ort.safetensors");
  save_safetensors(in, {{"images", x}});
  const auto p = run_ampforge({"predict", "--model", c.model, "--checkpoint", ckpt, "--input", in, "--output", ref,
                               "--image-size", std::to_string(c.image), "--in-channels", std::to_string(c.channels),
                               "--classes", std::to_string(c.classes), "--precision", precision, "--json"},
                              kEnv, 300);
  EXPECT_EQ(p.exit_code, 0) << p.err;
  if (p.exit_code != 0) return -1;
  if (!ot::ort_available()) {
    ADD_FAILURE() << ot::ort_missing_message();
    return -1;
  }
  const auto r = ot::run_ort(onnx, in, got);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.error;
  if (r.exit_code != 0) return -1;
  const Tensor a = load_safetensors(got).at("output0"), b = load_safetensors(ref).at("output0");
  EXPECT_EQ(a.shape(), (Shape{batch, c.classes}));
  EXPECT_EQ(a.dtype(), dt);
  EXPECT_EQ(b.dtype(), dt);
  const double err = ot::max_rel_error(a, b);
  std::printf("%s %s batch %lld: max |ort - predict| / max |predict| = %.3g\n", c.model.c_str(), precision.c_str(),
              static_cast<long long>(batch), err);
  return err;
}

}  // namespace

TEST(ExportCli, CnnMatchesOnnxRuntime) {
  const double err = export_check_compare({"cnn", 1, 28, 10}, {"--batch", "3"}, 3, DType::F32, "fp32");
  EXPECT_GE(err, 0);
  EXPECT_LE(err, 1e-4);
}

TEST(ExportCli, ResNet18MatchesOnnxRuntimeWithDynamicBatch) {
  // Traced at batch 2, run at batch 3.
  const double err = export_check_compare({"resnet18", 3, 64, 10}, {"--dynamic-batch"}, 3, DType::F32, "fp32");
  EXPECT_GE(err, 0);
  EXPECT_LE(err, 1e-4);
}

TEST(ExportCli, ResNet50MatchesOnnxRuntime) {
  const double err = export_check_compare({"resnet50", 3, 64, 20}, {"--batch", "2"}, 2, DType::F32, "fp32");
  EXPECT_GE(err, 0);
  EXPECT_LE(err, 1e-4);
}

TEST(ExportCli, ResNetSmallWithoutFoldingMatchesOnnxRuntime) {
  const double err = export_check_compare({"resnet-small", 1, 28, 10}, {"--no-fold-bn", "--batch", "2"}, 2, DType::F32, "fp32");
  EXPECT_GE(err, 0);
  EXPECT_LE(err, 1e-4);
}

TEST(ExportCli, CnnFp16MatchesOnnxRuntimeWithinTheF16Table) {
  // Both sides round every op's output to F16 (8 eps per op in core/tolerance.h); the CNN chains 8 ops after
  // folding (conv, relu, pool, conv, relu, pool, gemm, relu, gemm), so the bound is 9 x 8 eps of F16.
  const double err = export_check_compare({"cnn", 1, 28, 10}, {"--fp16", "--batch", "2"}, 2, DType::F16, "fp16");
  EXPECT_GE(err, 0);
  EXPECT_LE(err, 9 * 8 * std::ldexp(1.0, -10));
}

TEST(ExportCli, ErrorsExitTwoAndWriteNothing) {
  const std::string out = tmp_path("never.onnx");
  auto expect_error = [&](std::vector<std::string> args, const std::string& what) {
    const auto r = run_ampforge(args, kEnv, 120);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
  };
  // Untrained: no checkpoint and no --random-init.
  expect_error({"export", "--model", "cnn", "-o", out}, "has no weights");
  // A checkpoint of another model.
  models::ModelOptions o;
  o.in_channels = 1, o.image_size = 28, o.num_classes = 10;
  const std::string cnn_ckpt = write_checkpoint("cnn", o, 3);
  expect_error({"export", "--model", "resnet18", "--checkpoint", cnn_ckpt, "-o", out}, "does not fit model 'resnet18'");
  // An `ampforge train --save` checkpoint says which model it holds.
  const std::string train_ckpt = tmp_path("train_ckpt.safetensors");
  {
    nn::ModulePtr m = models::create("cnn", o);
    std::vector<std::pair<std::string, Tensor>> state;
    for (auto& [n, t] : m->state_dict()) state.emplace_back("model." + n, t);
    save_safetensors(train_ckpt, state, {{"format", "ampforge-checkpoint-v1"}, {"model", "cnn"}});
  }
  expect_error({"export", "--model", "resnet-small", "--checkpoint", train_ckpt, "-o", out},
               "was saved from model 'cnn', not 'resnet-small'");
  // Same model, other shapes (10 classes saved, 7 asked for).
  expect_error({"export", "--model", "cnn", "--checkpoint", cnn_ckpt, "--classes", "7", "-o", out}, "11.weight (model [7, 128], state [10, 128])");
  // The right checkpoint loads (the "model." prefix is stripped).
  const auto okr = run_ampforge({"export", "--model", "cnn", "--checkpoint", train_ckpt, "-o", tmp_path("ok.onnx")}, kEnv, 120);
  EXPECT_EQ(okr.exit_code, 0) << okr.err;
  // Unsupported options.
  expect_error({"export", "--model", "cnn", "--random-init", "--opset", "18", "-o", out}, "only opset 17");
  expect_error({"export", "--model", "cnn", "--random-init", "--seq-len", "128", "-o", out}, "--seq-len applies to text");
  expect_error({"export", "--model", "cnn", "--random-init", "--checkpoint", cnn_ckpt, "-o", out}, "exclude each other");
  expect_error({"export", "--model", "nope", "--random-init", "-o", out}, "nope");
  expect_error({"export", "--model", "cnn", "--random-init", "-o", tmp_path("no_such_dir/x.onnx")}, "cannot write");
  // predict: the input must hold the model's input, of its shape.
  const std::string bad_in = tmp_path("bad_in.safetensors");
  save_safetensors(bad_in, {{"pixels", zeros(Shape{1, 1, 28, 28})}});
  const auto p = run_ampforge({"predict", "--model", "cnn", "--random-init", "--input", bad_in, "--output",
                               tmp_path("y.safetensors")}, kEnv, 120);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.err.find("no tensor 'images'"), std::string::npos) << p.err;
  const auto h = run_ampforge({"export", "--help"}, kEnv, 120);
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.out.find("--dynamic-batch"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("trtexec"), std::string::npos) << h.out;
  const auto ph = run_ampforge({"predict", "--help"}, kEnv, 120);
  EXPECT_EQ(ph.exit_code, 0);
  EXPECT_NE(ph.out.find("--precision"), std::string::npos) << ph.out;
}

TEST(ExportCli, RandomInitIsReproducibleBetweenExportAndPredict) {
  // --random-init --seed S builds the same weights in both commands (the runtime check needs no training).
  const std::string onnx = tmp_path("rand.onnx"), in = tmp_path("rand_in.safetensors"),
                    ref = tmp_path("rand_ref.safetensors"), got = tmp_path("rand_ort.safetensors");
  const auto e = run_ampforge({"export", "--model", "resnet-small", "--random-init", "--seed", "4", "--batch", "2", "-o",
                               onnx}, kEnv, 120);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.out.find("BatchNorms folded"), std::string::npos) << e.out;
  Generator gen(2);
  save_safetensors(in, {{"images", randn(Shape{2, 1, 28, 28}, DType::F32, kCPU, &gen)}});
  const auto p = run_ampforge({"predict", "--model", "resnet-small", "--random-init", "--seed", "4", "--input", in,
                               "--output", ref}, kEnv, 120);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  if (!ot::ort_available()) GTEST_FAIL() << ot::ort_missing_message();
  const auto r = ot::run_ort(onnx, in, got);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.error;
  EXPECT_LE(ot::max_rel_error(load_safetensors(got).at("output0"), load_safetensors(ref).at("output0")), 1e-4);
}
