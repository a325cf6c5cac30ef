// Self-describing checkpoints (core/checkpoint_format.h) as a user meets them: a checkpoint written by
// `ampforge train --save` is enough for `export`, `predict`, `detect`, `models --load` and `train --resume` —
// no --model, --classes or --image-size repeated — for each task (classification, masked LM, detection); a flag
// that names another model is one clear message; a plain state dict still needs --model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "ampforge/cli/cli_test_util.h"
#include "ampforge/core/checkpoint_format.h"
#include "ampforge/core/safetensors.h"
#include "ampforge/export/onnx_testutil.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
namespace fs = std::filesystem;
namespace ot = ampforge::onnx_export::testing;
using ampforge::cli::testing::CmdResult;
using ampforge::cli::testing::run_ampforge;

namespace {

fs::path dir() { return ampforge::cli::testing::scratch_dir("ampforge_ckpt_record_test_"); }

nlohmann::json last_json(const std::string& out) {
  const size_t at = out.rfind("\n{");
  return nlohmann::json::parse(at == std::string::npos ? out : out.substr(at + 1));
}

// The record the checkpoint holds, read as export reads it.
checkpoint::ModelRecord record_of(const std::string& ck) {
  const auto r = checkpoint::read_model_record(load_safetensors(ck).metadata, ck);
  EXPECT_TRUE(r.has_value()) << ck << " is not an ampforge checkpoint";
  return r.value_or(checkpoint::ModelRecord{});
}

}  // namespace

TEST(CheckpointRecord, ClassificationExportsAndPredictsFromTheCheckpointAlone) {
  // A ResNet-18 for 7 classes at 32x32: the case a new user hit (export refused it without --classes and
  // --image-size).
  const std::string ck = (dir() / "resnet18.safetensors").string();
  CmdResult r = run_ampforge("train --model resnet18 --dataset synthetic --synthetic-size 16 --synthetic-classes 7 "
                             "--image-size 32 --batch 8 --epochs 1 --workers 0 --no-progress --save " + ck);
  ASSERT_EQ(r.code, 0) << r.out;
  const checkpoint::ModelRecord rec = record_of(ck);
  EXPECT_EQ(rec.model, "resnet18");
  EXPECT_EQ(rec.task, "classification");
  EXPECT_EQ(rec.in_channels, 3);
  EXPECT_EQ(rec.num_classes, 7);
  EXPECT_EQ(rec.image_size, 32);

  const std::string onnx = (dir() / "resnet18.onnx").string();
  r = run_ampforge("export --checkpoint " + ck + " -o " + onnx + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("inputs").at(0).at("shape"), nlohmann::json::array({1, 3, 32, 32})) << j;
  EXPECT_EQ(j.at("outputs").at(0).at("shape"), nlohmann::json::array({1, 7})) << j;

  const std::string in = (dir() / "x.safetensors").string(), out = (dir() / "y.safetensors").string(),
                    got = (dir() / "ort.safetensors").string();
  save_safetensors(in, {{"images", ops::full({1, 3, 32, 32}, 0.25)}});
  r = run_ampforge("predict --checkpoint " + ck + " --input " + in + " --output " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(load_safetensors(out).at("output0").shape(), (Shape{1, 7}));
  // The exported file computes what predict computes (the same weights from the same record).
  ASSERT_TRUE(ot::ort_available()) << ot::ort_missing_message();
  const auto ort = ot::run_ort(onnx, in, got);
  ASSERT_EQ(ort.exit_code, 0) << ort.out << ort.error;
  EXPECT_LT(ot::max_rel_error(load_safetensors(got).at("output0"), load_safetensors(out).at("output0")), 1e-4);

  // models --load needs no name either, and builds the model as trained (7 classes: every key loads).
  r = run_ampforge("models --load " + ck + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("model"), "resnet18");
  EXPECT_EQ(nlohmann::json::parse(r.out).at("ok"), true);

  // train --resume continues the run without --model (the record names it; the default would be cnn).
  r = run_ampforge("train --resume " + ck + " --dataset synthetic --synthetic-size 16 --synthetic-classes 7 "
                   "--image-size 32 --batch 8 --epochs 2 --workers 0 --no-progress --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(last_json(r.out).at("config").at("model"), "resnet18") << r.out;

  // Flags still override; a flag that names another model is one message, exit 2, nothing written.
  const std::string never = (dir() / "never.onnx").string();
  r = run_ampforge("export --checkpoint " + ck + " --model cnn -o " + never);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("was saved from model 'resnet18', not 'cnn'"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(never));
  r = run_ampforge("export --checkpoint " + ck + " --classes 5 -o " + never);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("drop --in-channels/--classes/--image-size"), std::string::npos) << r.out;
  r = run_ampforge("export --checkpoint " + ck + " --image-size 64 -o " + onnx + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("inputs").at(0).at("shape"), nlohmann::json::array({1, 3, 64, 64}))
      << "a ResNet takes any size: --image-size overrides the record";

  // A plain state dict records nothing: --model is still needed, and said so.
  const std::string plain = (dir() / "plain.safetensors").string();
  save_safetensors(plain, {{"fc.bias", ops::zeros({7})}});
  r = run_ampforge("export --checkpoint " + plain + " -o " + never);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--model is required"), std::string::npos) << r.out;
  r = run_ampforge("models --load " + plain);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("name the model to load into"), std::string::npos) << r.out;
}

TEST(CheckpointRecord, MaskedLmExportsAndPredictsFromTheCheckpointAlone) {
  const std::string ck = (dir() / "bert.safetensors").string();
  CmdResult r = run_ampforge("train --model bert-tiny --dataset synthetic --synthetic-size 16 --seq-len 16 --batch 4 "
                             "--epochs 1 --workers 0 --no-progress --save " + ck);
  ASSERT_EQ(r.code, 0) << r.out;
  const checkpoint::ModelRecord rec = record_of(ck);
  EXPECT_EQ(rec.model, "bert-tiny");
  EXPECT_EQ(rec.task, "masked_lm");
  EXPECT_EQ(rec.image_size, 16) << "the sequence length trained on";
  ASSERT_GT(rec.num_classes, 0) << "the vocabulary";

  const std::string onnx = (dir() / "bert.onnx").string();
  r = run_ampforge("export --checkpoint " + ck + " -o " + onnx + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("inputs").at(0).at("name"), "input_ids");
  EXPECT_EQ(j.at("inputs").at(0).at("shape"), nlohmann::json::array({1, 16})) << j;
  EXPECT_EQ(j.at("outputs").at(0).at("shape"), nlohmann::json::array({1, 16, rec.num_classes})) << j;

  const std::string in = (dir() / "ids.safetensors").string(), out = (dir() / "logits.safetensors").string();
  save_safetensors(in, {{"input_ids", ops::to_dtype(ops::full({1, 16}, 5.0), DType::I64)},
                        {"attention_mask", ops::to_dtype(ops::ones({1, 16}), DType::I64)}});
  r = run_ampforge("predict --checkpoint " + ck + " --input " + in + " --output " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(load_safetensors(out).at("logits").shape(), (Shape{1, 16, rec.num_classes}));
}

TEST(CheckpointRecord, DetectionDetectsAndExportsFromTheCheckpointAlone) {
  const fs::path d = dir() / "det";
  fs::remove_all(d);
  CmdResult r = run_ampforge("data make-detection " + (d / "set").string() + " --train 4 --val 2 --canvas 64 --max-items 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string data = (d / "set/data.yaml").string(), ck = (d / "ck.safetensors").string();
  r = run_ampforge("train --model yolov8s --dataset detection --data " + data + " --image-size 64 --epochs 1 --batch 4 "
                   "--workers 0 --no-progress --save " + ck);
  ASSERT_EQ(r.code, 0) << r.out;
  const checkpoint::ModelRecord rec = record_of(ck);
  EXPECT_EQ(rec.model, "yolov8s");
  EXPECT_EQ(rec.task, "detection");
  EXPECT_EQ(rec.image_size, 64);

  // detect: yolov8s at 64 from the record (its defaults would be yolov8n at 320, which does not load).
  const std::string dets = (d / "dets.jsonl").string();
  r = run_ampforge("detect --checkpoint " + ck + " --source " + (d / "set/images/val").string() +
                   " --conf 0.001 --out " + dets);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream lines(dets);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) EXPECT_EQ(nlohmann::json::parse(line).at("width"), 64);
  EXPECT_EQ(n, 2);
  r = run_ampforge("detect --checkpoint " + ck + " --model yolov8n --source " + (d / "set/images/val").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("was saved from model 'yolov8s', not 'yolov8n'"), std::string::npos) << r.out;

  r = run_ampforge("export --checkpoint " + ck + " -o " + (d / "yolo.onnx").string() + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("inputs").at(0).at("shape"), nlohmann::json::array({1, 3, 64, 64}));
  const std::string in = (d / "img.safetensors").string(), out = (d / "out.safetensors").string();
  save_safetensors(in, {{"images", ops::full({1, 3, 64, 64}, 0.5)}});
  r = run_ampforge("predict --checkpoint " + ck + " --input " + in + " --output " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(load_safetensors(out).at("output0").shape()[0], 1);
}
