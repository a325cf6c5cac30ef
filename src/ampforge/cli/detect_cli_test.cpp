// `ampforge data make-detection`, `train --dataset detection --save` and `detect` as a user runs them, on a tiny
// composed set: the data command writes the YOLO layout, a one-step run (of mosaics) writes a checkpoint and
// reports the per-class table (stderr and --json), detect writes one JSON line per image with boxes inside the
// image, and bad input is exit 2 with a message naming it.
#include <gtest/gtest.h>

#include "ampforge/cli/cli_test_util.h"
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {
using ampforge::cli::testing::CmdResult;
using ampforge::cli::testing::run_ampforge;
}  // namespace

TEST(DetectCli, MakeDetectionTrainAndDetect) {
  const fs::path d = fs::temp_directory_path() / ("ampforge_detect_cli_" + std::to_string(::getpid()));
  fs::remove_all(d);
  CmdResult r = run_ampforge("data make-detection " + (d / "set").string() + " --train 4 --val 3 --canvas 64 --max-items 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(d / "set/images/val/val_000002.png"));
  EXPECT_TRUE(fs::exists(d / "set/labels/train/train_000003.txt"));
  const std::string data = (d / "set/data.yaml").string(), ck = (d / "ck.safetensors").string();
  r = run_ampforge("train --model yolov8n --dataset detection --data " + data + " --image-size 64 --epochs 1 --batch 4 "
          "--workers 0 --no-progress --mosaic 1 --close-mosaic 0 --json --save " + ck);
  ASSERT_EQ(r.code, 0) << r.out;
  // stderr (the per-class table) then the JSON summary's one line on stdout.
  EXPECT_NE(r.out.find("per class ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mAP50-95"), std::string::npos) << r.out;
  const auto summary = nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  EXPECT_EQ(summary.at("config").at("mosaic"), 1.0);
  ASSERT_GT(summary.at("per_class").size(), 0u);
  for (const char* key : {"class", "name", "images", "instances", "precision", "recall", "map50", "map50_95"})
    EXPECT_TRUE(summary["per_class"][0].contains(key)) << key;
  const std::string out = (d / "dets.jsonl").string();
  r = run_ampforge("detect --model yolov8n --checkpoint " + ck + " --source " + (d / "set/images/val").string() +
          " --image-size 64 --conf 0.001 --data " + data + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(out);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("width"), 64);
    for (const auto& det : j.at("detections")) {
      const auto box = det.at("box").get<std::vector<double>>();
      ASSERT_EQ(box.size(), 4u);
      EXPECT_TRUE(box[0] >= 0 && box[0] <= box[2] && box[2] <= 64) << line;
      EXPECT_TRUE(det.at("class").get<int>() >= 0 && det.at("class").get<int>() < 10) << line;
      EXPECT_TRUE(det.contains("name")) << line;
    }
  }
  EXPECT_EQ(lines, 3);
  // Bad input: a missing checkpoint, a classification model, a label line with four fields.
  r = run_ampforge("detect --model yolov8n --checkpoint " + (d / "none.safetensors").string() + " --source " + out);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("none.safetensors"), std::string::npos) << r.out;
  r = run_ampforge("detect --model resnet18 --checkpoint " + ck + " --source " + (d / "set/images/val").string());
  EXPECT_EQ(r.code, 2) << r.out;
  std::ofstream(d / "set/labels/train/train_000001.txt") << "1 0.5 0.5 0.2\n";
  r = run_ampforge("train --model yolov8n --dataset detection --data " + data + " --image-size 64 --epochs 1 --batch 4 --no-progress");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("train_000001.txt:1"), std::string::npos) << r.out;
  fs::remove_all(d);
}
